"""BioViL: the authors' two files loaded strictly, their 8-bit stretch, score and smoothed map.
Equality with the authors' code on real radiographs is ``test_parity_biovil.py``."""

import json
from dataclasses import fields

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import ndimage
from transformers import BertConfig

from xbench.models.biovil import IMAGE_FILE, BioViL, gaussian_smooth
from xbench.models.checkpoints import CheckpointMismatchError, manifest
from xbench.models.explainers import CamTarget
from xbench.geometry.preprocess import Preprocess
from xbench.models.random_weights import LETTER_VOCAB, MANIFESTS, write_biovil

MANIFEST = json.loads((MANIFESTS / "biovil.keys.json").read_text())
CLASSES = ["pneumonia", "pleural_effusion"]
RESNET_STEPS = [f"image tower: {stage}" for stage in ("layer4", "layer3", "layer2", "layer1", "stem")]


def load(folder, classes=CLASSES, **kwargs) -> BioViL:
    model = BioViL(checkpoint_dir=str(folder), **kwargs)
    model.build(classes)
    return model.eval()


def test_published_layout_equals_the_manifest_offline(tmp_path, no_network):
    """Files holding exactly the tensors of the authors' ``ImageModel`` and ``CXRBertModel`` at the
    published shapes (the manifest, made from their classes) load without network, every value in
    place; the ``position_ids`` buffer older transformers saved is accepted and dropped."""
    generator = torch.Generator().manual_seed(0)

    def draw(key: str, shape: list[int]) -> torch.Tensor:
        if key.endswith("num_batches_tracked"):  # batch norm's step counter is an integer
            return torch.randint(0, 1000, shape, generator=generator)
        return torch.randn(shape, generator=generator)

    files = {name: {key: draw(key, shape) for key, shape in shapes.items()} for name, shapes in MANIFEST.items()}
    torch.save(files[IMAGE_FILE], tmp_path / IMAGE_FILE)
    text_file = dict(files["pytorch_model.bin"], **{"bert.embeddings.position_ids": torch.arange(512)[None]})
    torch.save(text_file, tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text(json.dumps({**BertConfig().to_dict(), "projection_size": 128}))
    (tmp_path / "vocab.txt").write_text("\n".join(LETTER_VOCAB) + "\n")
    model = BioViL(checkpoint_dir=str(tmp_path))
    image = model.load_image_model().state_dict()
    assert manifest(image) == MANIFEST[IMAGE_FILE]
    assert all(torch.equal(image[key], value) for key, value in files[IMAGE_FILE].items())
    _, text = model.load_text()
    loaded = text.state_dict()
    kept = {key: value for key, value in files["pytorch_model.bin"].items() if not key.startswith("cls.predictions.")}
    assert manifest(loaded) == manifest(kept)
    assert all(torch.equal(loaded[key], value) for key, value in kept.items())


@pytest.mark.parametrize(
    "file, edit, pattern",
    [
        (
            IMAGE_FILE, lambda s: s.pop("projector.model.3.bias"),
            r"missing in the file \(1\): projector\.model\.\{3\.bias\}",
        ),
        ("pytorch_model.bin", lambda s: s.update({"bert.pooler.dense.bias": torch.zeros(64)}),
         r"unexpected in the file \(1\): bert\.pooler\.\{dense\.bias\}"),
    ],
    ids=["image-missing", "text-extra"],
)
def test_checkpoint_mismatch_names_the_key(tmp_path, file, edit, pattern):
    folder = write_biovil(tmp_path)
    state = torch.load(folder / file, weights_only=True)
    edit(state)
    torch.save(state, folder / file)
    with pytest.raises(CheckpointMismatchError, match=pattern):
        load(folder)


def test_missing_text_files_are_named(tmp_path):
    folder = write_biovil(tmp_path)
    (folder / "vocab.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"vocab\.txt not found"):
        load(folder)


def test_score_and_map_are_the_authors_cosines(biovil_folder):
    """Logit = cos(global, pos) - cos(global, neg), the global embedding being the mean projected
    patch; map = smoothed cosine of each projected patch with the positive prompt. A trailing
    full stop is cut from a prompt as the authors' tokenisation does."""
    from conftest import check_layer_groups

    model = load(biovil_folder)
    assert [s.name for s in check_layer_groups(model)] == ["projector", *RESNET_STEPS]  # the sanity check's cascade
    dotted = load(biovil_folder, pos_template="{}.", neg_template="no {}!")
    torch.testing.assert_close(dotted.pos_text, model.pos_text, atol=0, rtol=0)
    torch.testing.assert_close(dotted.neg_text, model.neg_text, atol=0, rtol=0)
    inputs = torch.rand(1, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, maps = model(inputs)
        patches = model.image_model(inputs)
    image = F.normalize(patches.mean(dim=(2, 3)), dim=-1)
    torch.testing.assert_close(logits, image @ model.pos_text.T - image @ model.neg_text.T, atol=1e-6, rtol=0)
    cosine = torch.einsum("bdhw,cd->bchw", F.normalize(patches, dim=1), model.pos_text)
    torch.testing.assert_close(maps, gaussian_smooth(cosine), atol=1e-6, rtol=0)
    assert maps.shape == (1, 2, 3, 3)


@pytest.mark.parametrize("shape", [(15, 15), (14, 16), (4, 5)])
def test_smoothing_equals_scipy_gaussian_filter(shape):
    maps = torch.randn(2, 3, *shape, generator=torch.Generator().manual_seed(0))
    expected = np.stack([[ndimage.gaussian_filter(m, sigma=1.5) for m in batch] for batch in maps.numpy()])
    np.testing.assert_allclose(gaussian_smooth(maps).numpy(), expected, atol=1e-6, rtol=0)


def test_stretch_is_the_authors_on_the_files_integers():
    """``load_image``: ``floor((v - min) * 255 / (max - min))`` on the file's values, the same for an
    8-bit file and its 16-bit twin; then the shorter side to 512, the centre 480, no mean/std."""
    values = np.random.default_rng(0).integers(10, 201, size=(512, 600))
    values[0, 0], values[0, 1] = 10, 200
    expected = (values - 10) * 255 // 190
    preprocess = BioViL.preprocess
    plain = Preprocess(**{field.name: getattr(preprocess, field.name) for field in fields(Preprocess)})
    for decoded in (values / 255, values * 257 / 65535):
        inputs, window = preprocess(decoded.astype(np.float32), frame=224)
        reference, _ = plain((expected / 255).astype(np.float32), frame=224)
        torch.testing.assert_close(inputs, reference, atol=0, rtol=0)
    assert inputs.shape == (3, 480, 480) and 0 <= inputs.min() and inputs.max() <= 1
    expected_window = [16 * 224 / 512, 60 * 224 / 600, 480 * 224 / 512, 480 * 224 / 600]
    torch.testing.assert_close(window, torch.tensor(expected_window))
    with pytest.raises(ValueError, match="constant image"):
        preprocess(np.full((64, 64), 0.5, dtype=np.float32), frame=224)


def test_biovil_t_published_image_layout_loads_and_drops_only_the_prior_image_pooler(tmp_path):
    """BioViL-T's image file (the manifest, from the authors' multi-image ``ImageModel``) loads into
    the single-image module; the ViT pooler's tensors are dropped only at their declared shapes,
    and the missing-prior embedding is used."""
    from xbench.models.biovil import BIOVIL_T_IMAGE_FILE, BioViLT

    shapes = json.loads((MANIFESTS / "biovil_t.keys.json").read_text())[BIOVIL_T_IMAGE_FILE]
    generator = torch.Generator().manual_seed(0)
    state = {
        key: torch.randint(0, 9, shape, generator=generator) if key.endswith("num_batches_tracked")
        else torch.randn(shape, generator=generator) * 0.1
        for key, shape in shapes.items()
    }
    torch.save(state, tmp_path / BIOVIL_T_IMAGE_FILE)
    image = BioViLT(checkpoint_dir=str(tmp_path)).load_image_model()
    from conftest import check_layer_groups  # the sanity check's cascade, on the module BioViL-T holds

    holder = torch.nn.Module()
    holder.image_model = image
    steps = check_layer_groups(holder, BioViLT.layer_groups)
    assert [s.name for s in steps] == ["projector", "pooler input", *RESNET_STEPS]
    loaded = image.state_dict()
    assert set(loaded) == {key for key in shapes if not key.startswith("encoder.vit_pooler.")}
    assert all(torch.equal(loaded[key], state[key]) for key in loaded)
    inputs = torch.rand(1, 3, 64, 64, generator=generator)
    # the CAM layer BioViL-T declares (as BioViL's, from the model: image_model.<path>) runs once, on a grid
    kept = []
    layer = CamTarget(BioViLT.cam_target.layer.removeprefix("image_model."), "").module(image)
    handle = layer.register_forward_hook(lambda module, args, output: kept.append(output.shape))
    with torch.no_grad():
        before = image(inputs)
    handle.remove()
    assert BioViLT.cam_target.layer.startswith("image_model.") and len(kept) == 1 and len(kept[0]) == 4
    with torch.no_grad():
        image.encoder.missing_previous_emb.add_(1.0)
        assert not torch.allclose(image(inputs), before)
    key = next(key for key in shapes if key.startswith("encoder.vit_pooler."))
    state[key] = torch.zeros(3)
    torch.save(state, tmp_path / BIOVIL_T_IMAGE_FILE)
    with pytest.raises(ValueError, match=rf"declared drop {key} .* failed its check"):
        BioViLT(checkpoint_dir=str(tmp_path)).load_image_model()


@pytest.mark.parametrize("variant", ["biovil", "biovil_t"])
def test_transform_runs_in_the_datamodule_workers(variant, tmp_path, monkeypatch):
    """BioViL's and BioViL-T's transforms pickle into a DataLoader worker and give there what they
    give when called directly."""
    from xbench.data.io import read_image
    from xbench.data.phantom import Phantom
    from xbench.models.biovil import BioViLT

    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    datamodule = Phantom(num_images=2, native_size=96, image_size=40, batch_size=2, num_workers=1)
    datamodule.prepare_data()
    datamodule.setup("test")
    preprocess = (BioViL if variant == "biovil" else BioViLT).preprocess
    datamodule.set_model_transform(preprocess)
    (batch,) = list(datamodule.test_dataloader())
    assert batch["model_input"].shape == (2, 3, preprocess.size, preprocess.size)
    for row, index in enumerate(batch["index"].tolist()):
        expected, window = preprocess(read_image(datamodule.samples[index].path), 40)
        torch.testing.assert_close(batch["model_input"][row], expected, atol=0, rtol=0)
        torch.testing.assert_close(batch["window"][row], window, atol=0, rtol=0)


@pytest.mark.slow  # a full-size network through the CLI, its CAM explainer and checks
@pytest.mark.parametrize("variant, data", [("biovil", "phantom"), ("biovil", "ms_cxr"), ("biovil_t", "chestx_det10")])
def test_cli_end_to_end(variant, data, phantom_root, biovil_folder, tmp_path, no_network):
    """``python -m xbench.test`` with the authors' layouts (random weights) on the phantom and on
    ChestX-Det10 and MS-CXR fixtures; every image evaluated, metrics in range, MS-CXR's
    phrases grounded; both checks, of the maps of the model's CAM explainer (``conftest.CLI_EXPLAINERS``),
    on the phantom and on ChestX-Det10."""
    from conftest import explainer_args, run_model_cli
    from xbench.models.random_weights import write_biovil_t

    folder = biovil_folder if variant == "biovil" else write_biovil_t(tmp_path / variant)
    checks = () if data == "ms_cxr" else explainer_args(variant)
    run_model_cli(variant, data, tmp_path, phantom_root, "--model.checkpoint_dir", str(folder), "--data.batch_size", "4",
                  *checks)
