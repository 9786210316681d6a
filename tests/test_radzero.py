"""RadZero: the published layout (the key manifest of the authors' class), the recipe check, the
authors' 8-bit stretch and squash, VL-CABS' score and map, and runs through ``python -m xbench.test``.
Equality with the authors' code on real radiographs is ``tests/test_parity.py`` (``radzero.npz``)."""

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from xbench.models.radzero import RadZero, RadZeroNet, architecture, processor_preprocess, published_key
from xbench.models.random_weights import MANIFESTS, RADZERO_PREPROCESSOR, radzero_config, write_radzero

CLASSES = ["pneumonia", "pleural_effusion"]
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def radzero_folder(tmp_path_factory):
    """A RadZero folder with one vision block, the two extra blocks and one text block."""
    return write_radzero(tmp_path_factory.mktemp("radzero"), vision_layers=1, text_layers=1)


def load(folder, classes=CLASSES) -> RadZero:
    model = RadZero(checkpoint_dir=str(folder))
    model.build(classes)
    return model.eval()


def test_published_layout_is_the_manifest(tmp_path):
    """At the published sizes the network's tensors, under the file's names, are exactly those of the
    authors' ``CxrAlignModel`` (the manifest, made from their class by ``tools/parity/radzero.py``)."""
    (tmp_path / "config.json").write_text(json.dumps(radzero_config()))
    net = RadZeroNet(*architecture(tmp_path))
    found = {published_key(key): list(value.shape) for key, value in net.state_dict().items()}
    assert found == json.loads((MANIFESTS / "radzero.keys.json").read_text())


def test_a_config_of_another_recipe_is_named(radzero_folder, tmp_path):
    import shutil

    folder = shutil.copytree(radzero_folder, tmp_path / "dot")
    config = json.loads((folder / "config.json").read_text())
    config["loss"]["RadZeroLoss"]["sim_op"] = "dot"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"loss\.RadZeroLoss\.sim_op = 'dot', the published recipe's is 'cos'"):
        load(folder)


@pytest.mark.parametrize("bits", [8, 16])
def test_input_is_the_authors_stretch_and_squash(bits, tmp_path):
    """``collate_fn``'s ``cv2.normalize`` to 0..255 on the file's integers, then the
    ``BlipImageProcessor``'s squash (PIL bicubic) and CLIP's mean/std; the window is the whole frame."""
    rng = np.random.default_rng(0)
    top = 255 if bits == 8 else 65535
    values = rng.integers(top // 10, top // 2, size=(60, 90)).astype(np.uint8 if bits == 8 else np.uint16)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**RADZERO_PREPROCESSOR,
                                                                   "size": {"height": 64, "width": 64}}))
    preprocess = processor_preprocess(tmp_path)
    inputs, window = preprocess(values.astype(np.float32) / top, 224)
    stretched = cv2.normalize(values, None, 0, 255, norm_type=cv2.NORM_MINMAX, dtype=cv2.CV_8U)
    resized = np.asarray(Image.fromarray(stretched).convert("RGB").resize((64, 64), Image.BICUBIC), np.float32) / 255
    mean, std = np.array(RADZERO_PREPROCESSOR["image_mean"]), np.array(RADZERO_PREPROCESSOR["image_std"])
    expected = ((resized - mean) / std).transpose(2, 0, 1)
    np.testing.assert_allclose(inputs.numpy(), expected, atol=1e-5, rtol=0)
    assert window.tolist() == [0.0, 0.0, 224.0, 224.0]


def test_score_and_map_are_vl_cabs(radzero_folder):
    """The logit is ``cos(text, softmax(s) @ tokens) / tau`` with ``s = cos(text, token) / tau`` over the
    class token and the patches (both through the shared layer norm); the map is ``s`` on the patches;
    a phrase is encoded as written."""
    from conftest import check_layer_groups

    model = load(radzero_folder)
    steps = check_layer_groups(model)
    assert [s.name for s in steps][:3] == ["VL-CABS", "align transformer: block 1", "align transformer: block 0"]
    image = torch.randn(2, 3, 70, 70, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, maps = model(image)
        net = model.net
        tokens = net.align_transformer(net.vision_model(pixel_values=image).last_hidden_state)
    head = net.loss_fns["RadZeroLoss"]
    keys = F.normalize(head.layer_norm(tokens), dim=-1)
    tau = math.exp(head.loss_temperature.item())
    text = model.text_features
    scores = keys @ text.T / tau  # [B, T, C]
    attended = F.normalize(torch.softmax(scores, dim=1).transpose(1, 2) @ keys, dim=-1)
    torch.testing.assert_close(logits, (attended * text).sum(-1) / tau, atol=1e-5, rtol=0)
    torch.testing.assert_close(maps, scores[:, 1:].transpose(1, 2).unflatten(-1, (5, 5)), atol=1e-5, rtol=0)
    phrase = model.encode_phrases(["There is Pneumonia"])["text_features"]
    torch.testing.assert_close(phrase[0], text[0], atol=1e-6, rtol=0)
    assert model.prompts == {"pneumonia": "There is Pneumonia", "pleural_effusion": "There is Pleural Effusion"}


def test_cam_declaration_and_bf16_mixed(radzero_folder):
    from conftest import assert_bf16_mixed_close_to_fp32, assert_cam_declaration

    model = load(radzero_folder)
    assert_cam_declaration(model, torch.randn(1, 3, 70, 70, generator=torch.Generator().manual_seed(1)))
    assert_bf16_mixed_close_to_fp32(model, torch.randn(2, 3, 70, 70, generator=torch.Generator().manual_seed(2)))


def test_prompts_tokenise_as_the_authors_did(radzero_folder):
    """The folder's tokenizer under XBench's transformers gives the golden file's token ids, which the
    authors' transformers (4.39.3) gave for the same prompts and files."""
    import sys

    sys.path.insert(0, str(REPO / "tools" / "parity"))
    import common

    _, _, meta = common.load_golden(REPO / "tests" / "golden" / "radzero.npz")
    model = RadZero(checkpoint_dir=str(radzero_folder))
    model.net, model.tokenizer = model.load()
    assert model.tokenizer(meta["prompts"])["input_ids"] == meta["token_ids"]


@pytest.mark.parametrize("data", [
    pytest.param("phantom", marks=pytest.mark.slow),  # 9 inputs of 518 pixels, its CAM explainer and the checks
    "ms_cxr",
])
def test_cli_end_to_end(data, radzero_folder, phantom_root, tmp_path, no_network):
    """``python -m xbench.test`` with ``radzero.yaml``: the phantom with its CAM explainer and the
    checks, and MS-CXR's phrases, each encoded as written."""
    from conftest import explainer_args, run_model_cli, run_on_ms_cxr

    if data == "phantom":
        results = run_model_cli("radzero", data, tmp_path, phantom_root, "--model.checkpoint_dir", str(radzero_folder),
                                "--data.batch_size", "4", *explainer_args("radzero"))
    else:
        results = run_on_ms_cxr("radzero", tmp_path, "phrase", "--model.checkpoint_dir", str(radzero_folder))
    assert results["preprocess"]["size"] == 518 and results["preprocess"]["interpolation"] == "bicubic"
