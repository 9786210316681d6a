"""CLIP through open_clip: strict offline loading, QuickGELU, maps and logits against hand computations."""

import json
import math
import warnings
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import load_file, save_file

from conftest import assert_bf16_mixed_close_to_fp32, run_args
from xbench.findings import FINDINGS, PAPER_CLASSES
from xbench.models.checkpoints import CheckpointMismatchError, manifest
from xbench.models.clip import CLIP, finding_text
from xbench.geometry.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from xbench.models.random_weights import clip_state
from xbench.test import main

MANIFEST = json.loads((Path(__file__).parent / "clip.keys.json").read_text())
# OpenAI CLIP's statistics, as specs/models/clip.md states them.
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)
TINY = {
    "embed_dim": 16,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}
CLASSES = ["pneumonia", "pleural_effusion", "nodule"]


@pytest.fixture(scope="module")
def tiny_arch(tmp_path_factory):
    """A tiny open_clip architecture (4x4 patch grid) registered as ``xbench-tiny-clip``, and its GELU twin."""
    folder = tmp_path_factory.mktemp("archs")
    (folder / "xbench-tiny-clip.json").write_text(json.dumps(TINY))
    (folder / "xbench-tiny-clip-gelu.json").write_text(json.dumps({**TINY, "quick_gelu": False}))
    open_clip.add_model_config(folder)
    return "xbench-tiny-clip"


@pytest.fixture(scope="module")
def tiny_folder(tiny_arch, tmp_path_factory):
    folder = tmp_path_factory.mktemp("clip")
    save_file(clip_state(tiny_arch, 0), folder / "open_clip_model.safetensors")
    return folder


def load(folder, arch="xbench-tiny-clip", classes=CLASSES, **kwargs) -> CLIP:
    model = CLIP(checkpoint_dir=str(folder), arch=arch, **kwargs)
    model.build(classes)
    return model


def reference(arch: str, folder: Path) -> torch.nn.Module:
    model = open_clip.create_model(arch)
    model.load_state_dict(load_file(folder / "open_clip_model.safetensors"))
    return model.eval()


def distinct_tensors(shapes: dict) -> dict:
    """Cheap random-looking tensors of the given shapes, no two alike (a swapped key would show)."""
    base = torch.randn(max(math.prod(shape) for shape in shapes.values())) * 0.02
    return {key: (base[: math.prod(shape)] + i * 1e-3).view(shape).clone() for i, (key, shape) in enumerate(shapes.items())}


def to_input(image: torch.Tensor) -> torch.Tensor:
    """A batch image already at the model's input size -> normalised RGB, by hand."""
    return (image.repeat(1, 3, 1, 1) - MEAN) / STD


def test_full_size_checkpoint_equals_manifest_offline(tmp_path_factory, no_network):
    """Random weights under the official name, shapes from the spec's manifest, loaded without network."""
    folder = tmp_path_factory.mktemp("clip_full")
    state = distinct_tensors(MANIFEST)
    state["logit_scale"] = torch.tensor(math.log(100.0))
    save_file(state, folder / "open_clip_model.safetensors")
    network, _ = CLIP(checkpoint_dir=str(folder)).load_model()
    loaded = network.state_dict()
    assert manifest(loaded) == MANIFEST
    assert all(torch.equal(loaded[key], value) for key, value in state.items())
    assert tuple(network.visual.grid_size) == (14, 14) and network.visual.output_tokens
    # ViT-B/32 is the same layout with a 32-pixel patch: the B/16 file is refused, naming the two tensors.
    with pytest.raises(CheckpointMismatchError) as error:
        CLIP(checkpoint_dir=str(folder), arch="ViT-B-32-quickgelu").load_model()
    message = str(error.value)
    assert "shape of visual.conv1.weight: file [768, 3, 16, 16] vs model [768, 3, 32, 32]" in message
    assert "shape of visual.positional_embedding: file [197, 768] vs model [50, 768]" in message
    assert "missing" not in message and "unexpected" not in message


def test_bin_format_and_preference(tiny_arch, tmp_path, no_network):
    bin_state, safetensors_state = clip_state(tiny_arch, 1), clip_state(tiny_arch, 2)
    torch.save(bin_state, tmp_path / "open_clip_pytorch_model.bin")
    loaded = load(tmp_path).model.state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in bin_state.items())
    save_file(safetensors_state, tmp_path / "open_clip_model.safetensors")
    loaded = load(tmp_path).model.state_dict()
    assert all(torch.equal(loaded[key], value) for key, value in safetensors_state.items())


@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda s: s.pop("visual.ln_post.bias"), r"missing in the file \(1\): visual\.ln_post\.\{bias\}"),
        (lambda s: s.update({"visual.attnpool.weight": torch.zeros(2)}), r"unexpected in the file \(1\): visual\.attnpool\.\{weight\}"),
        (lambda s: s.update({"text_projection": torch.zeros(32, 8)}), r"shape of text_projection: file \[32, 8\] vs model \[32, 16\]"),
    ],
    ids=["missing", "extra", "reshaped"],
)
def test_checkpoint_mismatch_names_the_key(tiny_arch, tmp_path, edit, pattern):
    state = clip_state(tiny_arch, 0)
    edit(state)
    save_file(state, tmp_path / "open_clip_model.safetensors")
    with pytest.raises(CheckpointMismatchError, match=pattern):
        load(tmp_path)


def test_missing_files_and_unknown_arch_are_clear(tiny_folder, tmp_path):
    with pytest.raises(FileNotFoundError, match="open_clip_model.safetensors, open_clip_pytorch_model.bin found in"):
        load(tmp_path)
    with pytest.raises(ValueError, match="unknown open_clip architecture 'ViT-B-16-openai'"):
        load(tiny_folder, arch="ViT-B-16-openai")


def test_quick_gelu_is_used_even_when_the_arch_says_gelu(tiny_arch, tiny_folder):
    """The same tensors in a plain-GELU build give other features; CLIP always builds QuickGELU."""
    image = torch.rand(2, 1, 32, 32)
    right = reference(tiny_arch, tiny_folder).encode_image(to_input(image))
    wrong = reference("xbench-tiny-clip-gelu", tiny_folder).encode_image(to_input(image))
    assert (right - wrong).abs().max() > 1e-3, "QuickGELU and GELU builds must differ for the check to mean anything"
    for arch in (tiny_arch, "xbench-tiny-clip-gelu"):
        model = load(tiny_folder, arch=arch)
        ours, _ = model.embed_image(to_input(image))
        torch.testing.assert_close(ours, right, rtol=0, atol=1e-6)


def test_maps_and_logits_equal_a_hand_computation(tiny_folder):
    model = load(tiny_folder)
    image = torch.rand(2, 1, 32, 32)
    with torch.inference_mode():
        logits, maps = model(to_input(image))

        clip = reference("xbench-tiny-clip", tiny_folder)
        visual = clip.visual
        tokens = visual.conv1(to_input(image)).flatten(2).transpose(1, 2)
        tokens = torch.cat([visual.class_embedding.expand(2, 1, -1), tokens], dim=1) + visual.positional_embedding
        tokens = visual.transformer(visual.ln_pre(tokens))
        tokens = visual.ln_post(tokens) @ visual.proj
        image_embedding, patches = tokens[:, 0], tokens[:, 1:]
        texts = {key: (FINDINGS[key].display.lower(), "no " + FINDINGS[key].display.lower()) for key in CLASSES}
        scale = 50.0
        for c, key in enumerate(CLASSES):
            pos, neg = clip.encode_text(open_clip.tokenize(list(texts[key])))
            for b in range(2):
                cos_pos = F.cosine_similarity(image_embedding[b], pos, dim=0)
                cos_neg = F.cosine_similarity(image_embedding[b], neg, dim=0)
                log_p = torch.log_softmax(torch.stack([scale * cos_pos, scale * cos_neg]), dim=0)
                assert logits[b, c].item() == pytest.approx((log_p[0] - log_p[1]).item(), abs=1e-4)
                for row in range(4):
                    for col in range(4):
                        expected = F.cosine_similarity(patches[b, row * 4 + col], pos, dim=0)
                        assert maps[b, c, row, col].item() == pytest.approx(expected.item(), abs=1e-5)
    assert model.prompts["pleural_effusion"] == ("pleural effusion", "no pleural effusion")


@pytest.mark.parametrize("shape", [(40, 40), (50, 36), (36, 61)])
def test_transform_is_open_clips_own(tiny_folder, shape):
    """open_clip's eval transform on the 8-bit image (shorter side, bicubic, centre crop) gives the
    same input, and the window is the crop: the ends of the longer side are not seen."""
    model = load(tiny_folder)
    pixels = np.random.default_rng(0).integers(0, 256, shape).astype(np.uint8)
    inputs, window = model.preprocess(pixels.astype(np.float32) / 255, 64)
    transform = open_clip.image_transform(32, is_train=False, mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)
    assert torch.equal(inputs, transform(Image.fromarray(pixels)))
    height, width = shape
    scale = 32 / min(height, width)  # the crop covers 32 / scale native pixels of each side, centred
    expected = [(height - 32 / scale) / 2 * 64 / height, (width - 32 / scale) / 2 * 64 / width,
                32 / scale * 64 / height, 32 / scale * 64 / width]
    torch.testing.assert_close(window, torch.tensor(expected), atol=64 / min(shape), rtol=0)


def test_gradcam_equals_a_hand_computation(tiny_folder):
    """``--model.explainer gradcam`` on CLIP's declared layer (the tokens entering the last block's
    attention), explaining the pair logit, restated by hand."""
    model = load(tiny_folder, explainer="gradcam")
    image = torch.rand(2, 1, 32, 32)
    logits, maps = model.explain(to_input(image))
    assert maps.shape == (2, 3, 4, 4) and maps.abs().sum() > 0

    clip = reference("xbench-tiny-clip", tiny_folder).requires_grad_(False)
    visual = clip.visual
    tokens = visual.conv1(to_input(image)).flatten(2).transpose(1, 2)
    tokens = torch.cat([visual.class_embedding.expand(2, 1, -1), tokens], dim=1) + visual.positional_embedding
    tokens = visual.ln_pre(tokens)
    for block in visual.transformer.resblocks[:-1]:
        tokens = block(tokens)
    last = visual.transformer.resblocks[-1]
    activation = last.ln_1(tokens).requires_grad_(True)
    out = tokens + last.attention(q_x=activation)
    out = out + last.mlp(last.ln_2(out))
    image_embedding = F.normalize(visual.ln_post(out)[:, 0] @ visual.proj, dim=-1)
    for c, key in enumerate(CLASSES):
        text = FINDINGS[key].display.lower()
        pos, neg = F.normalize(clip.encode_text(open_clip.tokenize([text, "no " + text])), dim=-1)
        logit = 50.0 * (image_embedding @ pos - image_embedding @ neg)
        torch.testing.assert_close(logits[:, c], logit.detach(), rtol=0, atol=1e-4)
        (gradient,) = torch.autograd.grad(logit.sum(), activation, retain_graph=True)
        weights = gradient[:, 1:].mean(dim=1)
        for b in range(2):
            cam = torch.relu(activation[b, 1:].detach() @ weights[b]).view(4, 4)
            torch.testing.assert_close(maps[b, c], cam, rtol=1e-4, atol=1e-6)


def test_bf16_mixed_stays_close_to_fp32(tiny_folder):
    image = torch.rand(2, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    assert_bf16_mixed_close_to_fp32(load(tiny_folder), to_input(image))


def test_every_paper_class_has_prompt_text():
    pairs = [(dataset, key) for dataset, keys in PAPER_CLASSES.items() for key in keys]
    assert len(pairs) == 55
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _, key in pairs:
            assert finding_text(key) == FINDINGS[key].display.lower()
    with pytest.warns(UserWarning, match="not in xbench/findings.py"):
        assert finding_text("hilar_enlargement") == "hilar enlargement"
    with pytest.raises(ValueError, match="exactly one"):
        CLIP(pos_template="a photo")


@pytest.mark.parametrize("extra", [[], ["--trainer.precision", "bf16-mixed"]], ids=["fp32", "bf16"])
def test_cli_end_to_end(tiny_folder, phantom_root, tmp_path, extra, no_network):
    """In float32 with CLIP's CAM explainer of ``conftest.CLI_EXPLAINERS`` (Score-CAM) and both checks."""
    from conftest import CLI_EXPLAINERS, check_explanation_sections, explainer_args, only_folder

    checks = explainer_args("clip") if not extra else ()  # the explainer and checks once, in float32
    results = main(run_args("clip", "phantom", phantom_root, tmp_path, *extra, *checks, "--model.checkpoint_dir",
                            str(tiny_folder), "--model.arch", "xbench-tiny-clip", "--data.batch_size", "4"))
    if checks:
        check_explanation_sections(results, only_folder(tmp_path))
    assert results["model"] == ("clip" if extra else f"clip+{CLI_EXPLAINERS['clip']}")
    assert results["data"]["images_evaluated"] == 9
    assert results["config"]["trainer"]["precision"] == ("bf16-mixed" if "--trainer.precision" in extra else "32-true")
    graded = [v for v in results["grounding"]["per_class"].values() if v["pairs"]]
    assert graded and all(0 <= v["pointing_game"] <= 1 for v in graded)
    assert all(v["auroc"] is None or 0 <= v["auroc"] <= 1 for v in results["classification"]["per_class"].values())


def test_cli_grounds_ms_cxr_phrases(tiny_folder, tmp_path, no_network):
    from conftest import run_on_ms_cxr

    run_on_ms_cxr("clip", tmp_path, "phrase", "--model.checkpoint_dir", str(tiny_folder),
                  "--model.arch", "xbench-tiny-clip")
