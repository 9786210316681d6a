"""A transformers CLIP/SigLIP folder as a model: the processor's own output from the native image,
each model's score and map against transformers' modules, the padding rule, clear refusals, and
``python -m xbench.test`` with the three configs. Equality with transformers' whole path on real
radiographs at the published shapes is ``test_parity.py``."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import AutoImageProcessor

from conftest import assert_bf16_mixed_close_to_fp32
from xbench.data.io import read_image
from xbench.models.hf_dual_encoder import HFDualEncoder, processor_preprocess
from xbench.geometry.preprocess import Preprocess
from xbench.models.random_weights import HF_DUAL_ENCODERS, write_hf_dual_encoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "parity"))
import common  # noqa: E402
import hf_dual_encoder as parity  # noqa: E402

CLASSES = ["pneumonia", "pleural_effusion", "nodule"]
LAYERS = {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 2}
TINY = {
    "siglip": ({"model_type": "siglip", "architectures": ["SiglipModel"],
                "text_config": {**LAYERS, "num_hidden_layers": 1, "max_position_embeddings": 64},
                "vision_config": {**LAYERS, "num_hidden_layers": 2, "image_size": 32, "patch_size": 8}},
               {**HF_DUAL_ENCODERS["medsiglip"]["preprocessor"], "size": {"height": 32, "width": 32}}),
    "clip": ({"model_type": "clip", "architectures": ["CLIPModel"], "projection_dim": 16,
              "text_config": {**LAYERS, "num_hidden_layers": 1, "max_position_embeddings": 77, "eos_token_id": 2},
              "vision_config": {**LAYERS, "num_hidden_layers": 2, "image_size": 32, "patch_size": 8}},
             {**HF_DUAL_ENCODERS["xray_clip"]["preprocessor"], "size": {"shortest_edge": 36},
              "crop_size": {"height": 32, "width": 32}}),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny SigLIP and a tiny CLIP folder (4x4 patch grids), as transformers saves them."""
    root = tmp_path_factory.mktemp("hf")
    return {family: write_hf_dual_encoder(root / family, *TINY[family], seed=0) for family in TINY}


def load(folder, classes=CLASSES, **kwargs) -> HFDualEncoder:
    model = HFDualEncoder(str(folder), **kwargs)
    model.build(classes)
    return model.eval()


def transformers_model(folder):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(folder), local_files_only=True).eval()


# -- the processor ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, backend", [("medsiglip", "torchvision"), ("xray_siglip", "torchvision"),
                                           ("xray_clip", "torchvision"), ("xray_clip", "pil")])
def test_preprocess_gives_the_processors_own_output(name, backend, real_data, tmp_path):
    """On the three radiographs and the two extreme-aspect crops, the ``Preprocess`` made from the published
    ``preprocessor_config.json`` gives from the decoded native image what transformers' own processor
    (its default torchvision backend; PIL's for the crop) gives from the PIL image: equal to 1e-6, the
    float32 rounding of the normalisation, far below one 8-bit step (0.0078 or more after mean/std),
    so every 8-bit value is the same."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(HF_DUAL_ENCODERS[name]["preprocessor"]))
    processor = AutoImageProcessor.from_pretrained(str(tmp_path), local_files_only=True, backend=backend)
    preprocess = processor_preprocess(tmp_path)
    assert preprocess.library == "torchvision"  # transformers' default backend
    preprocess = dataclasses.replace(preprocess, library=backend)
    for path in (item.path for item in common.golden_inputs(real_data, common.INPUTS, tmp_path / "inputs")):
        expected = processor(images=Image.open(path), return_tensors="pt")["pixel_values"][0]
        found, window = preprocess(read_image(path), frame=224)
        assert found.shape == expected.shape
        torch.testing.assert_close(found, expected, rtol=0, atol=1e-6, msg=f"{name} {backend} {path.name}")
        np.testing.assert_allclose(window.numpy(), parity.window(path, processor), atol=1e-4, rtol=0)


@pytest.mark.parametrize("edit, message", [
    ({"do_resize": False}, "do_resize is false"),
    ({"rescale_factor": 1 / 127.5}, "scales 8-bit values by 1/255"),
    ({"resample": 5}, "resample 5 has no counterpart"),
    ({"size": {"height": 448, "width": 320}}, "one square size"),
    ({"size": {"shortest_edge": 448}}, "without a centre crop"),
    ({"do_center_crop": True, "crop_size": {"height": 512, "width": 512}}, "no larger than the resized image"),
    ({"resample": 4}, "has no 'area' filter"),
])
def test_a_processor_setting_preprocess_cannot_state_is_refused(edit, message, tmp_path):
    config = {**HF_DUAL_ENCODERS["medsiglip"]["preprocessor"], **edit}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=message):
        processor_preprocess(tmp_path)


@pytest.mark.parametrize("width, height", [(300, 200), (200, 300), (250, 250)])
def test_a_crop_smaller_than_the_resize_cuts_both_sides(width, height, tmp_path):
    """``shortest_edge`` 256 then a 224 crop (a folder the docs invite a user to run): the processor's
    own output, XBench's window and the parity tool's are the geometry worked by hand. 300 x 200 resizes
    to 384 x 256; the crop starts 16 rows and 80 columns in, the floor of half of each margin."""
    config = {**HF_DUAL_ENCODERS["xray_clip"]["preprocessor"], "size": {"shortest_edge": 256}}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    processor = AutoImageProcessor.from_pretrained(str(tmp_path), local_files_only=True)
    ramp = np.add.outer(np.arange(height), 2 * np.arange(width)) % 256
    Image.fromarray(ramp.astype(np.uint8)).save(tmp_path / "image.png")
    found, window = processor_preprocess(tmp_path)(read_image(tmp_path / "image.png"), frame=224)
    expected = processor(images=Image.open(tmp_path / "image.png"), return_tensors="pt")["pixel_values"][0]
    torch.testing.assert_close(found, expected, rtol=0, atol=1e-6)
    rows, columns = (256, 384) if width > height else (384, 256) if height > width else (256, 256)
    by_hand = [(rows - 224) // 2 * 224 / rows, (columns - 224) // 2 * 224 / columns, 224 * 224 / rows,
               224 * 224 / columns]
    np.testing.assert_allclose(window.numpy(), by_hand, rtol=1e-6)
    np.testing.assert_allclose(parity.window(tmp_path / "image.png", processor), by_hand, rtol=1e-6)


def test_transformers_crop_offset_is_floored_where_torchvision_rounds():
    """A margin of 51 pixels: transformers crops at 25, torchvision's CenterCrop at round(25.5) = 26."""
    image = np.tile(np.arange(275, dtype=np.float32)[None] / 275, (224, 1))
    floor = Preprocess(224, "shorter_side", library="pil", crop_rounding="floor")
    rounded = dataclasses.replace(floor, crop_rounding="round")
    assert floor(image, 275)[1][1] == 25 and rounded(image, 275)[1][1] == 26


# -- scores and maps ----------------------------------------------------------------------------------

def test_siglip_scores_and_maps_are_transformers_own(folders):
    """SigLIP: the logit is transformers' ``logits_per_image`` (scale and bias included) for the prompt
    padded to 64 positions without a mask; the map is each patch token through the model's own pooling
    head on its own, cosine with the prompt. The mask transformers 5's tokenizer offers would change
    the text embedding: the padding rule is not a formality."""
    model, reference = load(folders["siglip"]), transformers_model(folders["siglip"])
    assert model.prompts["pleural_effusion"] == ("pleural effusion",) and model.cam_target.prefix_tokens == 0
    image = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tokens = model.tokenizer([finding.replace("_", " ") for finding in CLASSES], padding="max_length",
                             max_length=64, return_tensors="pt")
    with torch.no_grad():
        logits, maps = model(image)
        output = reference(input_ids=tokens["input_ids"], pixel_values=image)
        torch.testing.assert_close(logits, output.logits_per_image, rtol=0, atol=1e-5)
        hidden = reference.vision_model(pixel_values=image).last_hidden_state
        patches = F.normalize(reference.vision_model.head(hidden.reshape(-1, 1, 32)).reshape(2, 16, 32), dim=-1)
        expected = (patches @ output.text_embeds.T).transpose(1, 2).unflatten(-1, (4, 4))
        torch.testing.assert_close(maps, expected, rtol=0, atol=1e-6)
        masked = F.normalize(reference.get_text_features(**tokens).pooler_output, dim=-1)
    assert (masked - output.text_embeds).abs().max() > 1e-3


def test_clip_scores_and_maps_are_transformers_own(folders):
    """CLIP: the logit is the positive minus the negative prompt's ``logits_per_image`` (the log-odds of
    the pair's softmax); the map is each patch token through ``post_layernorm`` and ``visual_projection``."""
    model, reference = load(folders["clip"]), transformers_model(folders["clip"])
    assert model.prompts["nodule"] == ("nodule", "no nodule") and model.cam_target.prefix_tokens == 1
    image = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    texts = [text for key in CLASSES for text in (key.replace("_", " "), "no " + key.replace("_", " "))]
    tokens = model.tokenizer(texts, padding="longest", return_tensors="pt")
    with torch.no_grad():
        logits, maps = model(image)
        output = reference(**tokens, pixel_values=image)
        pairs = output.logits_per_image.view(2, len(CLASSES), 2)
        torch.testing.assert_close(logits, pairs[..., 0] - pairs[..., 1], rtol=0, atol=1e-5)
        vision = reference.vision_model
        patches = reference.visual_projection(vision.post_layernorm(vision(pixel_values=image).last_hidden_state))
        positive = output.text_embeds.view(len(CLASSES), 2, -1)[:, 0]
        expected = (F.normalize(patches[:, 1:], dim=-1) @ positive.T).transpose(1, 2).unflatten(-1, (4, 4))
        torch.testing.assert_close(maps, expected, rtol=0, atol=1e-6)


def test_a_phrase_is_grounded_as_a_finding_text_is(folders):
    for family in ("siglip", "clip"):
        model = load(folders[family])
        rows = model.encode_phrases(["pleural effusion"])
        assert sorted(rows) == (["neg_text", "pos_text"] if family == "clip" else ["pos_text"])
        torch.testing.assert_close(rows["pos_text"][0], model.pos_text[1])


def test_siglip_gradcam_reads_the_last_block_without_a_class_token(folders):
    """``--model.explainer gradcam`` on SigLIP: its logit on the last block's first norm, over all
    tokens (no class token), by hand; a CLIP folder's declaration (after its class token) is on its
    scores' path too."""
    from conftest import assert_cam_declaration

    assert_cam_declaration(load(folders["clip"]), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    model = load(folders["siglip"], explainer="gradcam")
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    logits, maps = model.explain(image)
    captured = {}
    layer = model.model.vision_model.encoder.layers[-1].layer_norm1
    handle = layer.register_forward_hook(lambda module, inputs, output: captured.setdefault("x", output))
    with torch.enable_grad():
        model.model.requires_grad_(True)
        output = model.model.vision_model(pixel_values=image)
        pooled = F.normalize(output.pooler_output, dim=-1)
        scores = model.model.logit_scale.exp() * pooled @ model.pos_text.T + model.model.logit_bias
        (gradient,) = torch.autograd.grad(scores[0, 2], captured["x"])
    handle.remove()
    model.model.requires_grad_(False)
    torch.testing.assert_close(logits[0, 2], scores[0, 2].detach())
    expected = torch.relu(captured["x"][0].detach() @ gradient[0].mean(0)).view(4, 4)
    torch.testing.assert_close(maps[0, 2], expected, rtol=1e-4, atol=1e-7)


def test_bf16_mixed_stays_close_to_fp32(folders):
    image = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    assert_bf16_mixed_close_to_fp32(load(folders["siglip"]), image)


# -- refusals -----------------------------------------------------------------------------------------

def copy_folder(source: Path, target: Path, **edits) -> Path:
    """``source``'s files in ``target``, ``config.json`` updated by ``edits`` (``text_config`` merged)."""
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    config = json.loads((target / "config.json").read_text())
    text = {**config["text_config"], **edits.pop("text_config", {})}
    (target / "config.json").write_text(json.dumps({**config, **edits, "text_config": text}))
    return target


def test_what_a_folder_cannot_be_run_with_is_said(folders, tmp_path, no_network):
    with pytest.raises(FileNotFoundError, match="config.json not found"):
        load(tmp_path)
    with pytest.raises(ValueError, match="drop --model.neg_template"):
        load(folders["siglip"], neg_template="no {}")
    with pytest.raises(ValueError, match="model_type 'siglip2'"):
        load(copy_folder(folders["siglip"], tmp_path / "siglip2", model_type="siglip2"))
    with pytest.raises(ValueError, match="pools id 5 \\(config.json eos_token_id\\)"):
        load(copy_folder(folders["clip"], tmp_path / "eos", text_config={"eos_token_id": 5}))
    with pytest.raises(ValueError, match="reshaped weights"):
        load(copy_folder(folders["clip"], tmp_path / "wide", projection_dim=8))
    weightless = copy_folder(folders["clip"], tmp_path / "weightless")
    (weightless / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index.json"):
        load(weightless)
    (tmp_path / "small").mkdir()
    small = copy_folder(folders["clip"], tmp_path / "small" / "clip")
    processor = {**TINY["clip"][1], "size": {"shortest_edge": 24}, "crop_size": {"height": 24, "width": 24}}
    (small / "preprocessor_config.json").write_text(json.dumps(processor))
    with pytest.raises(ValueError, match="makes 24-pixel inputs but the vision tower takes 32"):
        load(small)


def saved_by_transformers(source: Path, target: Path) -> Path:
    """``source`` as transformers 5's ``save_pretrained`` writes it: the model's ``config.json`` and
    ``model.safetensors``, the processor's ``processor_config.json`` (the image processor nested in it,
    no ``preprocessor_config.json``) and the tokenizer's files."""
    from transformers import AutoProcessor

    transformers_model(source).save_pretrained(target)
    AutoProcessor.from_pretrained(str(source), local_files_only=True).save_pretrained(target)
    return target


def test_a_folder_as_save_pretrained_writes_it_runs_as_the_hubs_layout_does(folders, tmp_path):
    """Both layouts of the image processor's settings (``processor_config.json``, which transformers 5
    writes; ``preprocessor_config.json``, the hub's) give the same input and the same scores."""
    for family in ("clip", "siglip"):
        saved = saved_by_transformers(folders[family], tmp_path / family)
        assert (saved / "processor_config.json").is_file() and not (saved / "preprocessor_config.json").exists()
        assert processor_preprocess(saved) == processor_preprocess(folders[family])
        image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(load(saved)(image), load(folders[family])(image), rtol=0, atol=0)


def test_processor_config_json_comes_first_as_transformers_reads_it(folders, tmp_path):
    """With both files, the nested settings of ``processor_config.json`` decide, as in transformers;
    without an ``image_processor`` entry, ``preprocessor_config.json`` does."""
    folder = copy_folder(folders["siglip"], tmp_path / "both")
    nested = {**TINY["siglip"][1], "image_mean": [0.25, 0.25, 0.25]}
    (folder / "processor_config.json").write_text(json.dumps({"image_processor": nested}))
    assert processor_preprocess(folder).mean == (0.25, 0.25, 0.25)
    (folder / "processor_config.json").write_text(json.dumps({"processor_class": "SiglipProcessor"}))
    assert processor_preprocess(folder).mean == (0.5, 0.5, 0.5)


# -- the command line ---------------------------------------------------------------------------------

@pytest.mark.parametrize("config, family, data", [
    ("medsiglip", "siglip", "phantom"), ("xray_siglip", "siglip", "phantom"), ("xray_clip", "clip", "rsna"),
    ("medsiglip", "siglip", "ms_cxr"),
])
def test_cli_end_to_end(config, family, data, folders, phantom_root, tmp_path, no_network):
    """``python -m xbench.test`` with each config on a tiny folder of its family: the phantom, an RSNA
    fixture (DICOMs) and MS-CXR's phrases; the run is named by the config's ``name``. (A CLIP folder on
    the phantom: the next test.)"""
    from conftest import CHECK_ARGS, run_model_cli

    checks = CHECK_ARGS if (config, data) in (("medsiglip", "phantom"), ("xray_clip", "rsna")) else ()  # each family
    results = run_model_cli(config, data, tmp_path, phantom_root, *checks, "--model.checkpoint_dir",
                            str(folders[family]), "--data.batch_size", "4")
    assert results["preprocess"]["library"] == "torchvision" and results["preprocess"]["crop_rounding"] == "floor"


def test_a_folder_runs_with_only_its_path_and_is_named_after_it(folders, phantom_root, tmp_path, no_network):
    from conftest import run_args
    from xbench.test import main

    args = run_args("medsiglip", "phantom", phantom_root, tmp_path, "--model.checkpoint_dir", str(folders["clip"]))
    args[1] = str(tmp_path / "bare.yaml")  # the class and the folder, nothing else
    (tmp_path / "bare.yaml").write_text(
        "model:\n  class_path: xbench.models.hf_dual_encoder.HFDualEncoder\n")
    results = main(args)
    assert results["model"] == "clip" and results["data"]["images_evaluated"] == 9
