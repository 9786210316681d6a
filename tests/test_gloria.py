"""GLoRIA: the authors' Lightning file loaded strictly, their letterbox and crop, their word slots.
Equality with the authors' code on real radiographs is ``test_parity.py``."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertModel

from conftest import CLI_DATASETS
from xbench.models.checkpoints import CheckpointMismatchError, manifest, safe_load
from xbench.models.gloria import CHECKPOINT_FILE, GLoRIA, GLoRIANetwork, local_similarity

MANIFEST = json.loads((Path(__file__).parent / "gloria.keys.json").read_text())
CLASSES = ["pneumonia", "pleural_effusion", "nodule"]
POSITION_IDS = "gloria.text_encoder.model.embeddings.position_ids"


@pytest.fixture(scope="module")
def small_model(gloria_folder):
    return load(gloria_folder)


def load(folder, classes=CLASSES, **kwargs) -> GLoRIA:
    model = GLoRIA(checkpoint_dir=str(folder), **kwargs)
    model.build(classes)
    return model.eval()


def rewritten(folder: Path, target: Path, edit, section: str = "state_dict") -> Path:
    """A copy of ``folder`` whose checkpoint's ``section`` went through ``edit``."""
    (target / "Bio_ClinicalBERT").mkdir(parents=True)
    for name in ("config.json", "vocab.txt"):
        (target / "Bio_ClinicalBERT" / name).write_bytes((folder / "Bio_ClinicalBERT" / name).read_bytes())
    saved = safe_load(folder / CHECKPOINT_FILE)
    edit(saved[section])
    torch.save(saved, target / CHECKPOINT_FILE)
    return target


def test_full_size_network_has_the_authors_keys_and_shapes():
    """XBench's towers at Bio_ClinicalBERT's shape hold exactly the tensors of the authors' GLoRIA
    class (the manifest, made from it by ``tools/parity/gloria.py --manifest``)."""
    with torch.device("meta"):
        network = GLoRIANetwork(BertModel(BertConfig(vocab_size=28996)))
    assert len(MANIFEST) == 520 and manifest(network.state_dict()) == MANIFEST


def test_loads_the_authors_lightning_file(gloria_folder, small_model, no_network):
    """Every tensor of the file under ``gloria.`` lands where the file put it; the old
    ``position_ids`` buffer is the only key dropped, and the file's keys are the manifest's (its
    BERT has 4 of the 12 layers)."""
    state = safe_load(gloria_folder / CHECKPOINT_FILE)["state_dict"]
    deeper = re.compile(r"text_encoder\.model\.encoder\.layer\.([4-9]|1[01])\.")
    four_layers = {key for key in MANIFEST if not deeper.match(key)}
    assert {key.removeprefix("gloria.") for key in state} == four_layers | {POSITION_IDS.removeprefix("gloria.")}
    loaded = small_model.network.state_dict()
    assert all(torch.equal(loaded[key.removeprefix("gloria.")], value) for key, value in state.items()
               if key != POSITION_IDS)


@pytest.mark.parametrize(
    "edit, error, pattern",
    [
        (lambda s: s.pop("gloria.img_encoder.local_embedder.weight"), CheckpointMismatchError,
         r"missing in the file \(1\): img_encoder\.local_embedder\.\{weight\}"),
        (lambda s: s.update({"gloria.img_encoder.model.fc.weight": torch.zeros(1, 2048)}), CheckpointMismatchError,
         r"unexpected in the file \(1\): img_encoder\.model\.\{fc\.weight\}"),
        (lambda s: s.update({POSITION_IDS: torch.zeros(1, 128, dtype=torch.long)}), ValueError,
         r"declared drop text_encoder\.model\.embeddings\.position_ids .* failed its check"),
        (lambda s: s.update({"model.temp": torch.zeros(())}), ValueError, r"without the expected prefix 'gloria\.'"),
    ],
    ids=["missing", "extra", "bad-buffer", "prefix"],
)
def test_checkpoint_mismatch_names_the_key(gloria_folder, tmp_path, edit, error, pattern):
    folder = rewritten(gloria_folder, tmp_path / "edited", edit)
    with pytest.raises(error, match=pattern):
        GLoRIA(checkpoint_dir=str(folder)).load_weights()


def test_layer_groups_fit_the_network(small_model):
    """The sanity check's cascade: the image projections first, the BERT's blocks last."""
    from conftest import check_layer_groups

    names = [step.name for step in check_layer_groups(small_model)]
    assert names[0] == "image projections" and names[-2:] == ["text tower: block 0", "text tower: other layers"]


def test_missing_file_names_folder_and_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"{CHECKPOINT_FILE} not found in {tmp_path}"):
        GLoRIA(checkpoint_dir=str(tmp_path)).load_weights()


def test_prompt_word_slots_follow_the_authors_character_count(small_model):
    """``cap_lens`` counts characters: "there is pleural effusion" lets slots 1..25 into the local
    score (4 words, ``[SEP]`` and 20 empty slots); the map takes the 4 words."""
    assert small_model.prompts == ["there is pneumonia", "there is pleural effusion", "there is nodule"]
    assert small_model.word_lengths == [18, 25, 15] and small_model.word_counts == [3, 4, 3]
    words = small_model.words[1]
    assert words[1:6].norm(dim=-1).min() > 0 and not words[6:].any()  # 4 words and [SEP], then empty slots


def test_an_empty_slot_scores_cosine_zero_and_attention_sums_to_one():
    """The authors' empty word slots: cosine 0, so the local score is at least log(exp(0)) = 0."""
    generator = torch.Generator().manual_seed(0)
    regions = torch.randn(2, 8, 3, 3, generator=generator)
    words = torch.randn(3, 8, generator=generator)
    score, attention = local_similarity(torch.cat([words, torch.zeros(1, 8)]), regions)
    assert (score >= 0).all() and attention.shape == (2, 4, 3, 3)
    torch.testing.assert_close(attention.sum(dim=(2, 3)), torch.ones(2, 4))


@pytest.mark.parametrize(
    "template, pattern", [("{}", "empty after GLoRIA's cleaning"), ("a" * 90 + " {}", "characters")]
)
def test_prompts_the_authors_code_cannot_take_are_refused(gloria_folder, template, pattern):
    with pytest.raises(ValueError, match=pattern):
        load(gloria_folder, template=template)


@pytest.mark.parametrize(
    "height, width, rows, columns",
    [(1162, 800, 256, 176), (800, 1162, 176, 256), (1024, 1024, 256, 256), (2828, 2320, 256, 210)],
)
def test_letterbox_and_crop_are_the_authors(height, width, rows, columns):
    """``_resize_img``: the longer side to 256, the shorter truncated (800 * 256 / 1162 -> 176),
    padded floor/ceil; ``CenterCrop(224)`` at offset 16; ``Normalize(0.5, 0.5)``."""
    preprocess = GLoRIA.preprocess
    assert preprocess.resized_shape(height, width) == (rows, columns)
    inputs, window = preprocess(np.full((height, width), 128 / 255, dtype=np.float32), frame=224)
    assert inputs.shape == (3, 224, 224)
    top, left = (256 - rows) // 2, (256 - columns) // 2
    expected = [(16 - top) * 224 / rows, (16 - left) * 224 / columns, 224 * 224 / rows, 224 * 224 / columns]
    torch.testing.assert_close(window, torch.tensor(expected), atol=1e-4, rtol=0)
    centre = inputs[:, 112, 112]
    torch.testing.assert_close(centre, torch.full((3,), (128 / 255 - 0.5) / 0.5))


@pytest.mark.slow  # a full-size network through the CLI, its CAM explainer and checks
@pytest.mark.parametrize("data", CLI_DATASETS)
def test_cli_end_to_end(data, gloria_folder, phantom_root, tmp_path, no_network):
    """``python -m xbench.test`` with the authors' layout (random weights) on the phantom and on
    the MS-CXR fixture (``CLI_DATASETS``): every image evaluated, metrics in range, MS-CXR's
    phrases grounded; both checks, on the phantom of the maps of GLoRIA's CAM explainer
    (``conftest.CLI_EXPLAINERS``)."""
    from conftest import explainer_args, run_model_cli

    run_model_cli("gloria", data, tmp_path, phantom_root, "--model.checkpoint_dir", str(gloria_folder),
                  "--data.batch_size", "5", *(explainer_args("gloria") if data == "phantom" else ()))


def test_bf16_mixed_runs_the_trunk_in_bf16_and_the_heads_in_float32(small_model, real_data):
    """Under Lightning's bf16-mixed the image trunk runs in bf16 and the scores and attention in
    float32. The reference is computed the same way on any CPU: the float32 heads, autocast off, on
    the very trunk outputs the bf16 pass produced; the bf16 run must equal it exactly. (A bound on the
    distance to a float32 trunk would depend on the CPU's bf16 kernels: a random ResNet-50 moves the
    regions by ~2 % in bf16, and GLoRIA's attention temperature amplifies that several times.)"""
    from lightning.pytorch.plugins.precision import MixedPrecision

    from conftest import BF16_LOGITS, real_file
    from xbench.data.io import read_image

    inputs, _ = small_model.preprocess(read_image(real_file(real_data, "nih/00000001_000.png")), frame=224)
    trunk, captured = small_model.network.img_encoder, []
    handle = trunk.register_forward_hook(lambda module, args, output: captured.append(output))
    with torch.inference_mode():
        expected_logits, _ = small_model(inputs[None])
        with MixedPrecision("bf16-mixed", "cpu").forward_context():
            logits, maps = small_model(inputs[None])
    handle.remove()
    image, regions = captured[1]
    assert image.dtype == regions.dtype == torch.bfloat16, "the trunk did not run in bf16"
    assert logits.dtype == maps.dtype == torch.float32

    class Replay(torch.nn.Module):
        def forward(self, model_input):
            return image, regions

    small_model.network.img_encoder = Replay()
    try:
        with torch.inference_mode():
            reference_logits, reference_maps = small_model(inputs[None])
    finally:
        small_model.network.img_encoder = trunk
    assert torch.equal(logits, reference_logits) and torch.equal(maps, reference_maps)
    torch.testing.assert_close(logits, expected_logits, **BF16_LOGITS)


def test_a_file_trained_with_other_settings_is_refused(gloria_folder, tmp_path):
    """The file's ``hyper_parameters`` are checked against what XBench hard-codes: another value
    is an error naming it; a config without the key only a warning (the weights matched)."""
    other = rewritten(gloria_folder, tmp_path / "other", lambda c: c["model"]["text"].update(last_n_layers=1),
                      section="hyper_parameters")
    with pytest.raises(ValueError, match=r"other settings: model\.text\.last_n_layers = 1, expected 4"):
        GLoRIA(checkpoint_dir=str(other)).load_weights()
    partial = rewritten(gloria_folder, tmp_path / "partial", lambda c: c.pop("transforms"), section="hyper_parameters")
    with pytest.warns(UserWarning, match=r"lack transforms\.norm, transforms\.random_crop\.crop_size"):
        GLoRIA(checkpoint_dir=str(partial)).load_weights()
