"""CheXzero: the authors' file layout loaded strictly, their letterbox geometry and their score.
Equality with the authors' code on real radiographs is ``test_parity_chexzero.py``."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import CLI_DATASETS
from xbench.models.checkpoints import CheckpointMismatchError, manifest
from xbench.models.chexzero import CHECKPOINT_FILE, CheXzero
from xbench.models.random_weights import MANIFESTS, clip_state, register_small_chexzero, write_chexzero

MANIFEST = json.loads((MANIFESTS / "chexzero.keys.json").read_text())
CLASSES = ["pneumonia", "pleural_effusion", "nodule"]


@pytest.fixture(scope="module")
def small_arch(tmp_path_factory):
    return register_small_chexzero(tmp_path_factory.mktemp("arch"))


@pytest.fixture(scope="module")
def small_folder(small_arch, tmp_path_factory):
    return write_chexzero(tmp_path_factory.mktemp("chexzero"), arch=small_arch, seed=0)


def load(folder, arch, classes=CLASSES) -> CheXzero:
    model = CheXzero(checkpoint_dir=str(folder), arch=arch)
    model.build(classes)
    return model.eval()


def test_published_layout_equals_the_manifest_offline(tmp_path, no_network):
    """A file with the 302 tensors of the authors' ViT-B/32 (the manifest, made from their class)
    loads into the default architecture without network, every value where the file put it."""
    generator = torch.Generator().manual_seed(0)
    state = {key: torch.randn(shape, generator=generator) * 0.02 for key, shape in MANIFEST.items()}
    torch.save(state, tmp_path / CHECKPOINT_FILE)
    network, _ = CheXzero(checkpoint_dir=str(tmp_path)).load_model()
    loaded = network.state_dict()
    assert manifest(loaded) == MANIFEST and len(MANIFEST) == 302
    assert all(torch.equal(loaded[key], value) for key, value in state.items())
    assert tuple(network.visual.grid_size) == (7, 7)


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda s: s.pop("visual.ln_post.bias"), r"missing in the file \(1\): visual\.ln_post\.\{bias\}"),
        (
            lambda s: s.update({"input_resolution": torch.tensor(224)}),
            r"unexpected in the file \(1\): input_resolution",
        ),
    ],
    ids=["missing", "extra"],
)
def test_checkpoint_mismatch_names_the_key(small_arch, tmp_path, edit, pattern):
    state = clip_state(small_arch, 0)
    edit(state)
    torch.save(state, tmp_path / CHECKPOINT_FILE)
    with pytest.raises(CheckpointMismatchError, match=pattern):
        load(tmp_path, small_arch)


def test_missing_file_names_folder_and_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{CHECKPOINT_FILE} found in {tmp_path}"):
        CheXzero(checkpoint_dir=str(tmp_path)).load_model()


def test_score_is_the_temperature_free_pair_margin(small_folder, small_arch, tmp_path):
    """log-odds = cos(image, "{}") - cos(image, "no {}"), whatever the file's logit_scale; the sanity
    check's cascade (CLIP's layer groups) fits the network."""
    from conftest import check_layer_groups

    model = load(small_folder, small_arch)
    assert check_layer_groups(model)[0].name == "projections"
    inputs = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, maps = model(inputs)
        network, tokenizer = model.model, model.tokenizer
        image = F.normalize(network.encode_image(inputs)[0], dim=-1)
        prompts = [model.prompts[key] for key in CLASSES]
        positive = F.normalize(network.encode_text(tokenizer([p for p, _ in prompts])), dim=-1)
        negative = F.normalize(network.encode_text(tokenizer([n for _, n in prompts])), dim=-1)
    assert model.prompts["pleural_effusion"] == ("pleural effusion", "no pleural effusion")
    torch.testing.assert_close(logits, image @ positive.T - image @ negative.T, atol=1e-6, rtol=0)
    assert maps.shape == (2, 3, 7, 7)
    rescaled = clip_state(small_arch, 0)
    rescaled["logit_scale"] = torch.tensor(math.log(100.0))
    torch.save(rescaled, write_chexzero(tmp_path, arch=small_arch) / CHECKPOINT_FILE)
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path, small_arch)(inputs)[0], logits, atol=0, rtol=0)


@pytest.mark.parametrize(
    "height, width, rows, columns",
    [(1162, 800, 319, 220), (800, 1162, 220, 319), (1024, 1024, 320, 320), (2828, 2320, 320, 262)],
)
def test_letterbox_truncates_both_sides_as_the_authors(height, width, rows, columns):
    """``data_process.preprocess``: both sides times 320 / longer side, truncated (1162 px -> 319,
    padded by one row), centred at the floor of half the margin; the window is that letterbox's."""
    preprocess = CheXzero.preprocess
    assert preprocess.resized_shape(height, width) == (rows, columns)
    inputs, window = preprocess(np.full((height, width), 0.5, dtype=np.float32), frame=224)
    assert inputs.shape == (3, 224, 224)
    top, left = (320 - rows) // 2, (320 - columns) // 2
    expected = [-top * 224 / rows, -left * 224 / columns, 320 * 224 / rows, 320 * 224 / columns]
    torch.testing.assert_close(window, torch.tensor(expected), atol=1e-4, rtol=0)


def test_input_statistics_are_the_authors_on_0_to_255():
    """A uniform grey of 8-bit value 128 becomes (128 - 101.48761) / 83.43944 in every channel."""
    inputs, _ = CheXzero.preprocess(np.full((320, 320), 128 / 255, dtype=np.float32), frame=224)
    torch.testing.assert_close(inputs, torch.full((3, 224, 224), (128 - 101.48761) / 83.43944), atol=1e-5, rtol=0)



def test_model_input_from_the_datamodule_workers(small_folder, small_arch, tmp_path, monkeypatch):
    """The model's own transform runs in a DataLoader worker (it pickles) and its batches feed
    ``forward``: logits [B, C] and 7x7 maps, as from the transform called directly."""
    from xbench.data.io import read_image
    from xbench.data.phantom import Phantom

    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    datamodule = Phantom(num_images=3, native_size=96, image_size=40, batch_size=3, num_workers=1)
    datamodule.prepare_data()
    datamodule.setup("test")
    model = load(small_folder, small_arch, classes=datamodule.classes)
    datamodule.set_model_transform(model.preprocess)
    (batch,) = list(datamodule.test_dataloader())
    with torch.no_grad():
        logits, maps = model(batch["model_input"])
    assert logits.shape == (3, len(datamodule.classes)) and maps.shape == (3, len(datamodule.classes), 7, 7)
    for row, index in enumerate(batch["index"].tolist()):
        expected, window = model.preprocess(read_image(datamodule.samples[index].path), 40)
        torch.testing.assert_close(batch["model_input"][row], expected, atol=0, rtol=0)
        torch.testing.assert_close(batch["window"][row], window, atol=0, rtol=0)


def test_gradcam_keeps_the_authors_score(small_folder, small_arch):
    """With a CAM explainer (CLIP's layer) the logits are still the temperature-free pair margin."""
    from conftest import assert_cam_declaration

    assert_cam_declaration(load(small_folder, small_arch).eval(),
                           torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2)))


@pytest.mark.slow  # ViT-B/32 blocks through the CLI, its CAM explainer and checks
@pytest.mark.parametrize("data", CLI_DATASETS)
def test_cli_end_to_end(data, small_folder, small_arch, phantom_root, tmp_path, no_network):
    """``python -m xbench.test`` with the authors' layout (random weights) on the phantom and on
    the MS-CXR fixture (``CLI_DATASETS``): every image evaluated, metrics in range, MS-CXR's
    phrases grounded; both checks, on the phantom of the maps of CheXzero's CAM explainer
    (``conftest.CLI_EXPLAINERS``)."""
    from conftest import explainer_args, run_model_cli

    run_model_cli("chexzero", data, tmp_path, phantom_root, "--model.checkpoint_dir", str(small_folder),
                  "--model.arch", small_arch, "--data.batch_size", "4",
                  *(explainer_args("chexzero") if data == "phantom" else ()))
