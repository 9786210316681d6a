"""CAM explainers (``--model.explainer``, :mod:`xbench.models.explainers`), on tiny random models.

- XBench's map equals the grad-cam library's own call on the same model, layer, input and class
  score, for every method, on a ViT's tokens (CLIP's declared layer) and on a convolutional layer
  (a small convolutional model: Score-CAM runs a forward pass per channel, and a ResNet's layers
  have thousands). Each model's own declaration is checked where its tests build it
  (``conftest.assert_cam_declaration``).
- CLIP's native map against the library's GradCAM: where the definitions agree (see the test).
- One ``python -m xbench.test`` run per explainer, in the test's process: the results, the
  results folder, the report and the W&B run name the explainer.
"""

from __future__ import annotations

import typing
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest
import pytorch_grad_cam
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.plugins.precision import MixedPrecision
from pytorch_grad_cam.utils.image import scale_cam_image
from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
from safetensors.torch import save_file
from torch import nn

from conftest import CONFIGS, run_args, tiny_clip_state
from xbench import catalog
from xbench.models.base import XBenchModel
from xbench.models.baselines import CentrePrior, GazeCentreBias, Oracle, RandomSaliency
from xbench.models.clip import CLIP
from xbench.models.explainers import CAM_METHODS, NATIVE, CamTarget, ClassScores, Explainer, check_explainer
from xbench.models.precomputed import PrecomputedSaliency
from xbench.models.readers import HumanReader
from xbench.reporting.benchmark import Benchmark

CLASSES = ["nodule", "mass", "consolidation"]  # the phantom's
TINY_CLIP = "xbench-explainers-tiny-clip"


@pytest.fixture(scope="module")
def clip_folder(tmp_path_factory):
    """Tiny random CLIP weights (a 4x4 patch grid at 32 px) in CLIP's file layout."""
    folder = tmp_path_factory.mktemp("clip")
    save_file(tiny_clip_state(folder, TINY_CLIP, vision_layers=2), folder / "open_clip_model.safetensors")
    return folder


@pytest.fixture(scope="module")
def clip(clip_folder):
    """CLIP built on CLASSES, and an input of two images."""
    model = CLIP(checkpoint_dir=str(clip_folder), arch=TINY_CLIP)
    model.build(CLASSES)
    return model.eval(), torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


class TinyConvNet(XBenchModel):
    """A convolutional model small enough for Score-CAM: a strided convolution to 6 channels on a
    4x4 grid (the layer a CAM reads), a 1x1 convolution and tanh (so that gradients vary over the
    grid), then a linear head on the pooled channels."""

    cam_target = CamTarget("features", "the linear head's logit")

    def __init__(self, explainer: str = NATIVE) -> None:
        super().__init__(explainer=explainer)
        self.features = nn.Sequential(nn.Conv2d(3, 6, kernel_size=8, stride=8), nn.Tanh())
        self.mix = nn.Conv2d(6, 6, kernel_size=1)
        self.head = nn.Linear(6, len(CLASSES))
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for parameter in self.parameters():
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
        self.requires_grad_(False)  # as a built model's weights

    def forward(self, x):
        features = self.features(x)
        logits = self.head(torch.tanh(self.mix(features)).mean((2, 3)))
        return logits, features.mean(1, keepdim=True).expand(-1, len(CLASSES), -1, -1)


@contextmanager
def explaining(model, explainer: str):
    """``model`` with ``explainer`` inside the block (the fixtures' models are shared)."""
    saved, model.explainer = model.explainer, explainer
    try:
        yield model
    finally:
        model.explainer = saved


@contextmanager
def trainable(model):
    """The library's backward needs the layer's output to require gradients: the weights do inside."""
    model.requires_grad_(True)
    try:
        yield
    finally:
        model.requires_grad_(False)


def librarys_maps(model, model_input: torch.Tensor) -> np.ndarray:
    """The library's own call on the model's declared layer, one per class score: maps [B, K, s, s]
    as it returns them (each min-max scaled and resized to the input by OpenCV). Score-CAM is
    called one image at a time, as XBench calls it: batched, its channel weights differ in the last
    float bit (4e-9), which a Score-CAM map's cancellation magnifies to 1e-4."""
    method = getattr(pytorch_grad_cam, CAM_METHODS[model.explainer][0])
    target = model.cam_target
    batches = [model_input[i : i + 1] for i in range(len(model_input))] if model.explainer == "scorecam" else [model_input]
    with trainable(model), method(ClassScores(model), [target.module(model)], reshape_transform=target.reshape) as cam:
        return np.stack([np.concatenate([cam(batch, [ClassifierOutputTarget(k)] * len(batch)) for batch in batches])
                         for k in range(len(CLASSES))], axis=1)


def as_the_library_returns(maps: torch.Tensor, side: int) -> np.ndarray:
    """Maps [B, K, h, w] through the library's post-processing of one layer's map: min-max scaled and
    resized to the input (``compute_cam_per_layer``), then scaled again (``aggregate_multi_layers``)."""
    return np.stack([scale_cam_image(scale_cam_image(maps[:, k].numpy(), (side, side)))
                     for k in range(maps.shape[1])], axis=1)


# -- the choices and the declarations ----------------------------------------------------------------


def test_the_choices_and_who_may_use_them():
    assert typing.get_args(Explainer) == (NATIVE, *CAM_METHODS)
    assert all(hasattr(pytorch_grad_cam, method) for method, _ in CAM_METHODS.values())
    without = {cls for cls in catalog.models() if cls.cam_target is None}
    # no network to explain
    assert without == {CentrePrior, Oracle, RandomSaliency, PrecomputedSaliency, HumanReader, GazeCentreBias}
    for cls in without:
        with pytest.raises(ValueError, match=f"{cls.__name__} declares no layer.*--model.explainer must be native"):
            check_explainer(cls, "gradcam")
    with pytest.raises(ValueError, match="CentrePrior declares no layer"):
        CentrePrior(explainer="gradcam")
    with pytest.raises(ValueError, match="must be one of native, gradcam, gradcam\\+\\+"):
        CLIP(explainer="grad-cam")


def test_every_method_runs_through_the_cli_on_a_shipped_model():
    """The phantom CLI tests of ``conftest.CLI_EXPLAINERS`` together run every CAM method, each with a
    model config whose class declares a layer for it."""
    import importlib

    import yaml

    from conftest import CLI_EXPLAINERS

    assert set(CLI_EXPLAINERS.values()) == set(CAM_METHODS)
    for name in CLI_EXPLAINERS:
        config = yaml.safe_load((CONFIGS / "models" / f"{name}.yaml").read_text())
        module, _, cls = config["model"]["class_path"].rpartition(".")
        assert getattr(importlib.import_module(module), cls).cam_target is not None, name


def test_a_wrong_declaration_is_named(clip):
    model = clip[0]
    with pytest.raises(ValueError, match="declares the CAM layer 'model.visual.blocks', but it has no 'blocks' there"):
        CamTarget("model.visual.blocks", "x").module(model)
    target = CamTarget("layer", "x", prefix_tokens=1)
    with pytest.raises(ValueError, match="17 do not fill a square grid"):
        target.reshape(torch.zeros(1, 18, 8))
    with pytest.raises(ValueError, match="a convolutional layer gives \\[B, C, h, w\\]"):
        CamTarget("layer", "x").reshape(torch.zeros(1, 17, 8))
    tokens = torch.arange(2 * 17 * 3.0).view(2, 17, 3)
    grid = target.reshape(tokens)  # as the library's vit_reshape_transform
    assert torch.equal(grid, tokens[:, 1:].reshape(2, 4, 4, 3).permute(0, 3, 1, 2))


# -- equal to the library's own call -----------------------------------------------------------------


@pytest.fixture(scope="module")
def conv():
    return TinyConvNet().eval(), torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("explainer", list(CAM_METHODS))
@pytest.mark.parametrize("family", ["clip", "conv"])
def test_xbench_maps_equal_the_librarys_own_call(family, explainer, request):
    model, model_input = request.getfixturevalue(family)
    if explainer == "scorecam":  # a forward pass per channel, per image and class: one image
        model_input = model_input[:1]
    with explaining(model, explainer), torch.no_grad():  # as Lightning's test loop runs it
        logits, maps = model.explain(model_input)
        # the model's own scores (to float rounding: with gradients, attention takes its unfused kernel)
        torch.testing.assert_close(logits, model(model_input)[0], rtol=1e-5, atol=1e-6)
        assert maps.shape == (len(model_input), len(CLASSES), 4, 4) and (maps >= 0).all() and maps.amax() > 0
        if explainer == "eigencam":  # class-agnostic: one map for every class
            assert all(torch.equal(maps[:, k], maps[:, 0]) for k in range(len(CLASSES)))
        else:
            assert not torch.allclose(maps[:, 0], maps[:, 1])
    with explaining(model, explainer):
        expected = librarys_maps(model, model_input)
    np.testing.assert_allclose(as_the_library_returns(maps, 32), expected, rtol=0, atol=2e-5)


def test_clips_grad_cam_is_the_one_it_replaced(clip):
    """The Grad-CAM CLIP computed by hand before the library's (its former ``saliency: gradcam``),
    restated: for class c, w = the patch-averaged gradient of the pair logit with respect to the
    tokens entering the last block's attention (class token left out), map = ReLU(sum_d w_d * token_d)."""
    model, model_input = clip
    with explaining(model, "gradcam"), torch.no_grad():
        maps = model.explain(model_input)[1]
    kept = []
    handle = model.cam_target.module(model).register_forward_hook(
        lambda module, inputs, output: kept.append(output.detach().requires_grad_(True)) or kept[-1])
    with torch.enable_grad():
        logits = model(model_input)[0]
    handle.remove()
    for c in range(len(CLASSES)):
        (gradient,) = torch.autograd.grad(logits[:, c].sum(), kept[0], retain_graph=True)
        weights = gradient[:, 1:].mean(dim=1, keepdim=True)
        former = torch.relu((weights * kept[0][:, 1:]).sum(-1)).detach().view(2, 4, 4)
        torch.testing.assert_close(maps[:, c], former, rtol=1e-5, atol=1e-6)


class MeanPatchCosine(nn.Module):
    """CLIP's input -> for each class, the mean over the patches of cos(patch, positive prompt). The
    normalised patch embeddings pass through ``patches``, the layer the library reads."""

    def __init__(self, model: CLIP) -> None:
        super().__init__()
        self.model, self.patches = model, nn.Identity()

    def forward(self, model_input):
        unit = self.patches(F.normalize(self.model.embed_image(model_input)[1].float(), dim=-1))
        return (unit @ F.normalize(self.model.pos_text.float(), dim=-1).T).mean(1)


def test_clips_native_map_is_a_grad_cam_of_another_score(clip):
    """Where CLIP's native map and the library's GradCAM agree.

    They do not on the zero-shot score: the native map is each patch's cosine with the positive
    prompt, after the last block, the final norm and the projection, without gradients or ReLU; the
    pair logit a CAM explains reads the class token only, so at that layer its gradient with respect
    to every patch is zero, and at the declared layer (before the last attention) GradCAM weighs
    other activations by the gradient of the pair's margin, the negative prompt included.

    They agree on another score: the patch-mean cosine with the positive prompt, S_c = mean_i
    cos(p_i, t_c), on the layer of the normalised patch embeddings u_i = p_i / |p_i|. Its gradient
    with respect to u_i is t_c / (|t_c| N) for every patch, so GradCAM's channel weights are that
    vector and its map is ReLU(u_i . t_c / |t_c|) / N = ReLU(native map) / N: after the library's
    min-max scaling, the library's GradCAM equals ReLU of XBench's native map."""
    model, model_input = clip
    with torch.no_grad():
        native = model(model_input)[1]
    scorer = MeanPatchCosine(model).eval()
    with trainable(model), pytorch_grad_cam.GradCAM(scorer, [scorer.patches],
                                                    reshape_transform=CamTarget("patches", "", 0).reshape) as cam:
        library = np.stack([cam(model_input, [ClassifierOutputTarget(k)] * 2) for k in range(len(CLASSES))], axis=1)
    assert (native < 0).any() and (native > 0).any()  # the ReLU matters: both signs present
    np.testing.assert_allclose(as_the_library_returns(native.clamp(min=0), 32), library, rtol=0, atol=2e-5)


def test_cam_needs_gradients_runs_in_float32_and_grounds_phrases(clip):
    model, model_input = clip
    with explaining(model, "gradcam++"):
        with torch.inference_mode(), pytest.raises(RuntimeError, match="--trainer.inference_mode false"):
            model.explain(model_input)
        with torch.no_grad():
            expected = model.explain(model_input)
            with MixedPrecision("bf16-mixed", "cpu").forward_context(), pytest.warns(UserWarning, match="float32"):
                outputs = model.explain(model_input)
            assert all(torch.equal(got, want) for got, want in zip(outputs, expected))
            # a phrase whose prompt is a class's gets that class's map: its own logit is explained
            phrase_maps = model.phrase_maps(model_input, model.encode_phrases(["mass", "nodule"]))
        torch.testing.assert_close(phrase_maps, expected[1][:, [1, 0]], rtol=1e-5, atol=1e-6)


# -- through python -m xbench.test ---------------------------------------------------------------------


class RecordedRun(SimpleNamespace):
    """What ``log_run`` sets on a W&B run, kept (no W&B process)."""

    def __init__(self) -> None:
        super().__init__(name=None, config={}, summary={}, logged={})
        self.config = SimpleNamespace(update=lambda values, allow_val_change=False: self.configured.update(values))
        self.configured: dict = {}
        self.summary = {}
        self.log = self.logged.update


class RecordingWandbLogger(WandbLogger):
    def __init__(self) -> None:
        self.run = RecordedRun()

    @property
    def experiment(self):
        return self.run


@pytest.fixture(scope="module")
def clip_runs(clip_folder, phantom_root, tmp_path_factory):
    """CLIP's native maps and Grad-CAM's, each through ``python -m xbench.test``, into one folder."""
    from xbench.test import main

    results = tmp_path_factory.mktemp("runs")
    return results, {explainer: main(run_args(
        "clip", "phantom", phantom_root, results, "--model.checkpoint_dir", str(clip_folder), "--model.arch",
        TINY_CLIP, "--model.explainer", explainer, "--data.image_size", "32", "--data.batch_size", "9",
        "--trainer.logger", "false")) for explainer in (NATIVE, "gradcam")}


def test_an_explainer_is_a_run_of_its_own(clip_runs, no_network):
    from xbench.reporting.wandb import log_run

    results, payloads = clip_runs
    native, gradcam = payloads[NATIVE], payloads["gradcam"]
    assert native["model"] == "clip" and native["explainer"] == {"name": NATIVE, "label": None}
    assert native["config"]["trainer"]["inference_mode"] is True
    assert gradcam["model"] == "clip+gradcam" and gradcam["data"]["images_evaluated"] == 9
    assert gradcam["config"]["trainer"]["inference_mode"] is False  # turned off for the CAM, and recorded
    assert gradcam["explainer"] == {"name": "gradcam", "label": "Grad-CAM", "library": "grad-cam 1.5.7",
                                    "method": "GradCAM", "layer": CLIP.cam_target.layer, "prefix_tokens": 1,
                                    "score": CLIP.cam_target.score}
    # the same scores (to float rounding: a forward with gradients takes other kernels), other maps
    assert gradcam["classification"]["macro"] == pytest.approx(native["classification"]["macro"], abs=1e-6)
    assert gradcam["grounding"]["macro"] != native["grounding"]["macro"]
    folders = {path.name.split("__")[0]: path for path in results.iterdir() if not path.name.startswith(".")}
    assert sorted(folders) == ["clip", "clip+gradcam"]
    summary = (folders["clip+gradcam"] / "summary.md").read_text()
    assert f"Maps: Grad-CAM (grad-cam 1.5.7) on the layer {CLIP.cam_target.layer}" in summary
    bench = Benchmark.from_folders([results])
    assert sorted(bench.models) == ["clip", "clip+gradcam"]
    assert bench.model_label("clip") == "CLIP" and bench.model_label("clip+gradcam") == "CLIP · Grad-CAM"
    logger = RecordingWandbLogger()
    overlays = {"image_id": [], "image": [], "saliency": [], "mask": [], "finding": []}
    log_run([logger], gradcam, overlays, None)
    assert logger.run.name == "clip+gradcam__phantom" and logger.run.configured["explainer"] == gradcam["explainer"]


def test_a_suite_tells_the_explainers_runs_apart(clip_runs, clip_folder, phantom_root, tmp_path):
    """A suite's model entries differing only in ``model.explainer``: labelled by it, and each finds
    only its own results (a third explainer's pair still runs)."""
    import yaml

    from xbench.suite import load_suite, plan

    results, _ = clip_runs
    model = {"model.checkpoint_dir": str(clip_folder), "model.arch": TINY_CLIP}
    suite = {
        "results_dir": str(results),
        "settings": {"data.image_size": 32, "data.batch_size": 9, "data.num_workers": 0},
        "models": [{"config": str(CONFIGS / "models" / "clip.yaml"), "settings": {**model, "model.explainer": name}}
                   for name in (NATIVE, "gradcam", "hirescam")],
        "datasets": [{"config": str(CONFIGS / "data" / "phantom.yaml"), "settings": {"data.root": str(phantom_root)}}],
    }
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(suite))
    found = {pair.model.label: (pair.status, pair.detail) for pair in plan(load_suite(tmp_path / "suite.yaml"))}
    assert sorted(found) == ["clip", "clip+gradcam", "clip+hirescam"]
    assert found["clip"][0] == "done" and "/clip__phantom__" in found["clip"][1]
    assert found["clip+gradcam"][0] == "done" and "/clip+gradcam__phantom__" in found["clip+gradcam"][1]
    assert found["clip+hirescam"] == ("run", "")
