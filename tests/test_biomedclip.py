"""BiomedCLIP through open_clip: the official config unedited, offline, strict with one declared drop."""

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertTokenizer

from conftest import assert_bf16_mixed_close_to_fp32, run_args
from xbench.models.biomedclip import BiomedCLIP
from xbench.models.checkpoints import CheckpointMismatchError, manifest
from xbench.models.random_weights import (
    BIOMEDCLIP_CONFIG,
    BIOMEDCLIP_POSITION_IDS,
    biomedclip_state,
    write_biomedclip_files,
)
from xbench.test import main

MANIFEST = json.loads((Path(__file__).parent / "biomedclip.keys.json").read_text())
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
CLASSES = ["pneumonia", "pleural_effusion", "nodule"]


def tiny_config() -> dict:
    model_cfg = BIOMEDCLIP_CONFIG["model_cfg"]
    vision_cfg = {**model_cfg["vision_cfg"], "timm_model_name": "test_vit"}
    return {**BIOMEDCLIP_CONFIG, "model_cfg": {**model_cfg, "embed_dim": 16, "vision_cfg": vision_cfg}}


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    bert = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    folder = write_biomedclip_files(tmp_path_factory.mktemp("biomedclip"), tiny_config(), bert, vocab_size=64)
    torch.save(biomedclip_state(folder, 0), folder / "open_clip_pytorch_model.bin")
    return folder


def load(folder, classes=CLASSES, **kwargs) -> BiomedCLIP:
    model = BiomedCLIP(checkpoint_dir=str(folder), **kwargs)
    model.build(classes)
    return model


def to_input(image: torch.Tensor) -> torch.Tensor:
    return (image.repeat(1, 3, 1, 1) - MEAN) / STD


def test_full_size_checkpoint_equals_manifest_offline(tmp_path_factory, no_network):
    """Random weights in the official format (with ``position_ids``), the official json, no network."""
    folder = write_biomedclip_files(
        tmp_path_factory.mktemp("biomedclip_full"), BIOMEDCLIP_CONFIG, BertConfig(), vocab_size=30522
    )
    # Each tensor a different window of one random vector: cheap to make, no two alike.
    base = torch.randn(max(math.prod(shape) for shape in MANIFEST.values()) + len(MANIFEST)) * 0.02
    state = {key: base[i : i + math.prod(shape)].view(shape) for i, (key, shape) in enumerate(MANIFEST.items())}
    position_ids = torch.arange(512).unsqueeze(0)
    torch.save({**state, BIOMEDCLIP_POSITION_IDS: position_ids}, folder / "open_clip_pytorch_model.bin")
    network, tokenizer = BiomedCLIP(checkpoint_dir=str(folder)).load_model()
    loaded = network.state_dict()
    assert manifest(loaded) == MANIFEST
    assert all(torch.equal(loaded[key], value) for key, value in state.items())
    assert tokenizer(["this is a photo of pneumonia"]).shape == (1, 256)
    assert tuple(network.visual.trunk.patch_embed.grid_size) == (14, 14)


@pytest.mark.parametrize(
    "edit, error, pattern",
    [
        (lambda s: s.pop("visual.head.proj.weight"), CheckpointMismatchError, r"missing in the file \(1\): visual\.head\.\{proj\.weight\}"),
        (lambda s: s.update({"text.transformer.pooler.dense.weight": torch.zeros(2)}), CheckpointMismatchError,
         r"unexpected in the file \(1\): text\.transformer\.\{pooler\.dense\.weight\}"),
        (lambda s: s.update({"text.proj.0.weight": torch.zeros(24, 30)}), CheckpointMismatchError,
         r"shape of text\.proj\.0\.weight: file \[24, 30\] vs model \[24, 32\]"),
        (lambda s: s.update({BIOMEDCLIP_POSITION_IDS: torch.zeros(1, 512, dtype=torch.long)}), ValueError,
         r"declared drop text\.transformer\.embeddings\.position_ids .* failed its check"),
    ],
    ids=["missing", "extra", "reshaped", "position_ids-not-arange"],
)
def test_checkpoint_mismatch_names_the_key(tiny_folder, tmp_path, edit, error, pattern):
    folder = tmp_path / "copy"
    folder.mkdir()
    for name in ("open_clip_config.json", "config.json", "vocab.txt"):
        (folder / name).write_bytes((tiny_folder / name).read_bytes())
    state = biomedclip_state(folder, 1)
    edit(state)
    torch.save(state, folder / "open_clip_pytorch_model.bin")
    with pytest.raises(error, match=pattern):
        load(folder)


def test_loads_offline_and_says_what_is_missing(tiny_folder, tmp_path, no_network):
    model = load(tiny_folder)
    assert model.grid == (10, 10) and model.input_size == 160
    (tmp_path / "open_clip_config.json").write_bytes((tiny_folder / "open_clip_config.json").read_bytes())
    with pytest.raises(FileNotFoundError, match=r"open_clip_pytorch_model.bin, config.json, vocab.txt not found in"):
        load(tmp_path)


@pytest.mark.parametrize("key, value", [("hf_pooler_type", None), ("hf_proj_type", "linear")])
def test_a_config_that_changes_the_text_tower_silently_is_refused(tiny_folder, tmp_path, key, value):
    for name in ("config.json", "vocab.txt", "open_clip_pytorch_model.bin"):
        (tmp_path / name).symlink_to(tiny_folder / name)
    config = tiny_config()
    text_cfg = {k: v for k, v in config["model_cfg"]["text_cfg"].items() if k != key}
    if value is not None:
        text_cfg[key] = value
    config["model_cfg"]["text_cfg"] = text_cfg
    (tmp_path / "open_clip_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=key):
        load(tmp_path)


def reference_text(model, folder: Path, prompts: list[str]) -> torch.Tensor:
    """[CLS] of BERT's last hidden state through the MLP head, with transformers' own tokenizer."""
    tokenizer = BertTokenizer(str(folder / "vocab.txt"), do_lower_case=True)
    encoded = tokenizer(prompts, padding="max_length", max_length=256, return_tensors="pt")
    text = model.model.text
    hidden = text.transformer(input_ids=encoded.input_ids, attention_mask=encoded.attention_mask).last_hidden_state
    first, _, second = text.proj
    return F.normalize(F.gelu(hidden[:, 0] @ first.weight.T) @ second.weight.T, dim=-1)


def test_maps_and_logits_equal_a_hand_computation(tiny_folder):
    model = load(tiny_folder)
    image = torch.rand(2, 1, 160, 160)
    with torch.inference_mode():
        logits, maps = model(to_input(image))
        trunk, head = model.model.visual.trunk, model.model.visual.head.proj.weight
        features = trunk.forward_features(to_input(image)) @ head.T
        image_embedding, patches = F.normalize(features[:, 0], dim=-1), F.normalize(features[:, 1:], dim=-1)
        for c, key in enumerate(CLASSES):
            text = key.replace("_", " ")
            pos, neg = reference_text(model, tiny_folder, [f"this is a photo of {text}", f"this is a photo of no {text}"])
            expected_logit = 50.0 * (image_embedding @ pos - image_embedding @ neg)
            torch.testing.assert_close(logits[:, c], expected_logit, rtol=0, atol=1e-4)
            torch.testing.assert_close(maps[:, c], (patches @ pos).view(2, 10, 10), rtol=0, atol=1e-5)


def test_gradcam_reads_the_last_block_attention_input(tiny_folder):
    """``--model.explainer gradcam`` on BiomedCLIP's declared layer, explaining the pair logit, by hand."""
    model = load(tiny_folder, explainer="gradcam")
    image = torch.rand(2, 1, 160, 160)
    logits, maps = model.explain(to_input(image))
    assert maps.shape == (2, 3, 10, 10) and maps.abs().sum() > 0

    trunk, head = model.model.visual.trunk, model.model.visual.head.proj.weight
    tokens = trunk.norm_pre(trunk._pos_embed(trunk.patch_embed(to_input(image))))
    for block in trunk.blocks[:-1]:
        tokens = block(tokens)
    last = trunk.blocks[-1]
    activation = last.norm1(tokens).requires_grad_(True)
    out = tokens + last.ls1(last.attn(activation))
    out = out + last.ls2(last.mlp(last.norm2(out)))
    image_embedding = F.normalize(trunk.norm(out)[:, 0] @ head.T, dim=-1)
    with torch.inference_mode():
        texts = [key.replace("_", " ") for key in CLASSES]
        pos = reference_text(model, tiny_folder, [f"this is a photo of {t}" for t in texts])
        neg = reference_text(model, tiny_folder, [f"this is a photo of no {t}" for t in texts])
    for c in range(len(CLASSES)):
        logit = 50.0 * (image_embedding @ pos[c].clone() - image_embedding @ neg[c].clone())
        torch.testing.assert_close(logits[:, c], logit.detach(), rtol=0, atol=1e-4)
        (gradient,) = torch.autograd.grad(logit.sum(), activation, retain_graph=True)
        weights = gradient[:, 1:].mean(dim=1, keepdim=True)
        cam = torch.relu((weights * activation[:, 1:]).sum(-1)).detach().view(2, 10, 10)
        torch.testing.assert_close(maps[:, c], cam, rtol=1e-4, atol=1e-7)


def test_bf16_mixed_stays_close_to_fp32(tiny_folder):
    image = torch.rand(2, 1, 160, 160, generator=torch.Generator().manual_seed(0))
    assert_bf16_mixed_close_to_fp32(load(tiny_folder), to_input(image))


def test_cli_end_to_end(tiny_folder, phantom_root, tmp_path, no_network):
    """With BiomedCLIP's CAM explainer of ``conftest.CLI_EXPLAINERS`` and both checks."""
    from conftest import check_explanation_sections, explainer_args, only_folder

    results = main(run_args("biomedclip", "phantom", phantom_root, tmp_path, *explainer_args("biomedclip"),
                            "--model.checkpoint_dir", str(tiny_folder), "--data.batch_size", "4"))
    check_explanation_sections(results, only_folder(tmp_path))
    assert results["model"] == "biomedclip+gradcam" and results["data"]["images_evaluated"] == 9
    graded = [v for v in results["grounding"]["per_class"].values() if v["pairs"]]
    assert graded and all(0 <= v["pointing_game"] <= 1 for v in graded)


def test_cli_grounds_ms_cxr_phrases(tiny_folder, tmp_path, no_network):
    from conftest import CHECK_ARGS, run_on_ms_cxr

    run_on_ms_cxr("biomedclip", tmp_path, "phrase", "--model.checkpoint_dir", str(tiny_folder), *CHECK_ARGS)


def test_a_hub_id_reads_the_text_towers_config_from_the_repository_its_json_names(tiny_folder, hub_cache,
                                                                                  no_network):
    """BiomedCLIP's hub repository holds no BiomedBERT ``config.json``: it comes from the cache's
    snapshot of the repository ``open_clip_config.json`` names, as open_clip would fetch it."""
    from conftest import write_snapshot
    from xbench.models.random_weights import BIOMEDBERT_HUB_NAME

    repository = "microsoft/BiomedCLIP-PubMedBERT_256-vit_base_patch16_224"
    names = ("open_clip_config.json", "open_clip_pytorch_model.bin", "vocab.txt")
    files = {name: (tiny_folder / name).read_bytes() for name in names}
    write_snapshot(hub_cache, repository, files)
    with pytest.raises(FileNotFoundError, match=f"hf download {repository} tokenizer_config.json --revision"):
        load(f"hf-hub:{repository}")
    tokenizer = b'{"tokenizer_class": "BertTokenizer", "do_lower_case": true}'
    write_snapshot(hub_cache, repository, {"tokenizer_config.json": tokenizer})  # a file more, the same snapshot
    missing_bert = f"does not hold {BIOMEDBERT_HUB_NAME}.*hf download {BIOMEDBERT_HUB_NAME}"
    with pytest.raises(FileNotFoundError, match=missing_bert):
        load(f"hf-hub:{repository}")
    write_snapshot(hub_cache, BIOMEDBERT_HUB_NAME, {"config.json": (tiny_folder / "config.json").read_bytes()})
    from_hub, from_folder = load(f"hf-hub:{repository}"), load(tiny_folder)
    image = torch.rand(1, 3, 160, 160)
    assert all(torch.equal(a, b) for a, b in zip(from_hub(image), from_folder(image)))
