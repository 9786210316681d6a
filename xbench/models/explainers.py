"""Which method makes a model's maps: its own (``native``) or a CAM method of the grad-cam library.

``--model.explainer`` picks one for every model. ``native`` is the map the model defines (cross-
attention, patch–text similarity, word–region attention, ...). The others are the class activation
map (CAM) family of the kept library ``grad-cam`` (pytorch-grad-cam, imported as
``pytorch_grad_cam``): a map from one layer's activations, weighted by the gradients of a class
score (Grad-CAM, Grad-CAM++, HiResCAM, XGrad-CAM, LayerCAM), by the score of the input masked with
each activation channel (Score-CAM), or by no score at all (EigenCAM: the activations' first
principal component, one map for every class, its sign SVD's).

Each model class says where a CAM reads it, as data
([`CamTarget`][xbench.models.explainers.CamTarget], its ``cam_target``): the layer, the reshape of
that layer's output into channels on a grid, and the class score its zero-shot rule gives, which is
the logit the model reports for the class. This module reads the declaration for every model; the
maps then go through the same placement in the frame and the same metrics as native maps.

How a batch is explained: one forward pass with the layer's output kept (a leaf that requires
gradients, so the backward passes stop there), then per class one backward pass of its score to
that layer, and the library's own method (``get_cam_image``) turns the activations and gradients
into the map, followed by the library's ReLU. The library's own call (``cam(input, targets)``) runs
a forward and a backward per class and then min-max scales each map and resizes it to the input
with OpenCV; XBench keeps the map on the layer's grid and places it into the frame by the model's
map rule, as every map, and normalises it there. ``tests/test_explainers.py`` holds the two equal.
Score-CAM runs the library's weights one image at a time (it holds one masked copy of the input per
channel) and, as the library asks for one target per call, once per class.

A CAM needs gradients, so it runs with the trainer's inference mode off (``python -m xbench.test``
turns it off for a CAM explainer) and in float32, also under ``bf16-mixed``: a map sums gradient x
activation terms that cancel, and bf16 gradients leave errors larger than the map.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from functools import partial
from importlib.metadata import version
from types import SimpleNamespace
from typing import Literal
from unittest import mock

import numpy as np
import torch
from torch import Tensor, nn

from xbench.geometry.precision import float32

#: ``--model.explainer`` value -> (the library's class, the label reports show).
CAM_METHODS: dict[str, tuple[str, str]] = {
    "gradcam": ("GradCAM", "Grad-CAM"),
    "gradcam++": ("GradCAMPlusPlus", "Grad-CAM++"),
    "hirescam": ("HiResCAM", "HiResCAM"),
    "xgradcam": ("XGradCAM", "XGrad-CAM"),
    "layercam": ("LayerCAM", "LayerCAM"),
    "eigencam": ("EigenCAM", "EigenCAM"),
    "scorecam": ("ScoreCAM", "Score-CAM"),
}
NATIVE = "native"
#: Every value ``--model.explainer`` takes.
Explainer = Literal[(NATIVE, *CAM_METHODS)]  # type: ignore[valid-type]
#: Methods whose weights come from gradients (the others need no backward pass).
GRADIENT_METHODS = frozenset({"gradcam", "gradcam++", "hirescam", "xgradcam", "layercam"})
#: Methods whose map ignores the class score: computed once and given to every class.
CLASS_AGNOSTIC = frozenset({"eigencam"})


@dataclass(frozen=True)
class CamTarget:
    """Where a CAM explainer reads a model; each model class declares one as ``cam_target``.

    Args:
        layer: the module whose output the CAM weighs, as a dotted path from the model (``-1``: the
            last of a list), e.g. ``model.visual.transformer.resblocks.-1.ln_1``. It must run once
            per forward pass.
        score: the class score the CAM explains, in words: the model's logit for the class, which
            its zero-shot rule gives (recorded in the results and on the docs' Explainers page).
        prefix_tokens: ``None`` for a convolutional layer, whose output [B, C, h, w] is already
            channels on a grid. For a ViT layer's tokens [B, T, D]: how many tokens precede the
            patches (class and register tokens), which are left out; the rest fill a square grid.
    """

    layer: str
    score: str
    prefix_tokens: int | None = None

    def module(self, model: nn.Module) -> nn.Module:
        """The declared layer of ``model`` (built: its weights loaded)."""
        found: object = model
        for part in self.layer.split("."):
            try:
                found = found[int(part)] if part.lstrip("-").isdigit() else getattr(found, part)
            except (AttributeError, IndexError, KeyError, TypeError):
                found = None
            if found is None:
                raise ValueError(f"{type(model).__name__} declares the CAM layer {self.layer!r}, but it has no "
                                 f"{part!r} there: fix its cam_target")
        if not isinstance(found, nn.Module):
            raise ValueError(f"{type(model).__name__}'s CAM layer {self.layer!r} is a {type(found).__name__}, not a module")
        return found

    def reshape(self, activation: Tensor) -> Tensor:
        """The layer's output as channels on a grid [B, C, h, w] (the library's ``reshape_transform``)."""
        if self.prefix_tokens is None:
            if activation.ndim != 4:
                raise ValueError(f"the CAM layer {self.layer!r} gives {tuple(activation.shape)}; a convolutional "
                                 "layer gives [B, C, h, w] (declare prefix_tokens for a ViT's tokens)")
            return activation
        if activation.ndim != 3:
            raise ValueError(f"the CAM layer {self.layer!r} gives {tuple(activation.shape)}, not tokens [B, T, D]")
        patches = activation[:, self.prefix_tokens:]
        side = math.isqrt(patches.shape[1])
        if side * side != patches.shape[1]:
            raise ValueError(f"the CAM layer {self.layer!r} gives {activation.shape[1]} tokens: after "
                             f"{self.prefix_tokens} prefix tokens, {patches.shape[1]} do not fill a square grid")
        return patches.transpose(1, 2).unflatten(-1, (side, side))


def check_explainer(model_class: type, explainer: str) -> None:
    """Refuse an unknown explainer, or a CAM one for a model that declares no layer."""
    if explainer != NATIVE and explainer not in CAM_METHODS:
        raise ValueError(f"--model.explainer must be one of {', '.join((NATIVE, *CAM_METHODS))}; got {explainer!r}")
    if explainer != NATIVE and getattr(model_class, "cam_target", None) is None:
        raise ValueError(f"{model_class.__name__} declares no layer for a CAM explainer (it has no network to "
                         f"explain, or reads saved maps): --model.explainer must be {NATIVE}")


def explainer_label(explainer: str) -> str | None:
    """The label reports give a CAM explainer (``Grad-CAM++``); ``None`` for the model's own maps."""
    return None if explainer == NATIVE else CAM_METHODS[explainer][1]


def explainer_record(model) -> dict:
    """``metrics.json``'s ``explainer`` section: which method made the maps, and where it read the model."""
    if model.explainer == NATIVE:
        return {"name": NATIVE, "label": None}
    target = model.cam_target
    method, label = CAM_METHODS[model.explainer]
    return {"name": model.explainer, "label": label, "library": f"grad-cam {version('grad-cam')}", "method": method,
            "layer": target.layer, "prefix_tokens": target.prefix_tokens, "score": target.score}


class ClassScores(nn.Module):
    """The model as the CAM library sees it: its input -> the class scores [B, K] (its logits)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, model_input: Tensor) -> Tensor:
        return self.model(model_input)[0]


def _library_method(explainer: str, scores: ClassScores, target: CamTarget, layer: nn.Module):
    """The library's method object, its own hooks removed: XBench keeps the layer's output itself."""
    import pytorch_grad_cam  # imported here: it takes seconds (scikit-learn), and native runs never need it

    method = getattr(pytorch_grad_cam, CAM_METHODS[explainer][0])(scores, [layer], reshape_transform=target.reshape)
    method.activations_and_grads.release()
    return method


def _quiet_score_cam():
    """Score-CAM draws a progress bar per image and class (tqdm on stderr, not an option of it):
    silenced while it runs. Only the library's Score-CAM module sees the quiet tqdm."""
    import tqdm
    from pytorch_grad_cam import score_cam

    return mock.patch.object(score_cam, "tqdm", SimpleNamespace(tqdm=partial(tqdm.tqdm, disable=True)))


def _forward_keeping(scores: ClassScores, layer: nn.Module, model_input: Tensor, gradients: bool) -> tuple[Tensor, Tensor]:
    """One forward pass: the class scores [B, K] and the layer's output, kept as a leaf (requiring
    gradients if ``gradients``, under grad mode) so that backward passes of the scores end there."""
    kept: list[Tensor] = []

    def keep(module, inputs, output):
        if not isinstance(output, Tensor):
            raise ValueError(f"the CAM layer {type(module).__name__} returns a {type(output).__name__}, not a tensor")
        kept.append(output.detach().requires_grad_(gradients))
        return kept[-1]

    handle = layer.register_forward_hook(keep)
    try:
        logits = scores(model_input)
    finally:
        handle.remove()
    if len(kept) != 1:
        raise ValueError(f"the CAM layer ran {len(kept)} times in one forward pass; declare a layer that runs once")
    return logits, kept[0]


def cam_maps(model, model_input: Tensor) -> tuple[Tensor, Tensor]:
    """Logits [B, K] and the maps [B, K, h, w] of ``model.explainer`` (a CAM method) for each of the
    K class scores, on the declared layer's grid, ReLU'd as the library does."""
    explainer = model.explainer
    label = CAM_METHODS[explainer][1]
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            f"--model.explainer {explainer} ({label}) needs gradients, which the trainer's inference mode turns off: "
            "run with --trainer.inference_mode false (python -m xbench.test sets it for a CAM explainer), "
            "or Trainer(inference_mode=False) from a script")
    if torch.is_autocast_enabled(model_input.device.type):
        warnings.warn(
            f"{label} runs in float32 under mixed precision: a CAM sums gradient x activation terms that cancel, "
            "and bf16 gradients leave errors larger than the map", stacklevel=2)
    target = model.cam_target
    layer = target.module(model)
    scores = ClassScores(model)
    method = _library_method(explainer, scores, target, layer)
    gradients = explainer in GRADIENT_METHODS
    # grad mode on for the gradient methods: Lightning's test loop runs under no_grad, where even
    # the class score's slice of the logits would leave the graph
    with float32(model_input), torch.set_grad_enabled(gradients):
        model_input = model_input.float()
        logits, kept = _forward_keeping(scores, layer, model_input, gradients)
        activations = _numpy(target.reshape(kept))
        if explainer in CLASS_AGNOSTIC:
            maps = np.repeat(_relu(method.get_cam_image(model_input, layer, None, activations, None, False))[:, None],
                             logits.shape[1], axis=1)
        else:
            maps = np.stack([_class_map(method, explainer, model_input, layer, logits, kept, activations, k, target)
                             for k in range(logits.shape[1])], axis=1)
    return logits.detach(), torch.from_numpy(maps).to(model_input.device)


def _class_map(method, explainer: str, model_input: Tensor, layer: nn.Module, logits: Tensor, kept: Tensor,
               activations: np.ndarray, k: int, target: CamTarget) -> np.ndarray:
    """The map [B, h, w] of class score ``k`` by the library's method."""
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    targets = [ClassifierOutputTarget(k)] * model_input.shape[0]
    if explainer == "scorecam":  # one image at a time: it holds one masked copy of the input per channel
        with _quiet_score_cam():
            return np.concatenate([_relu(method.get_cam_image(model_input[i : i + 1], layer, targets[:1],
                                                              activations[i : i + 1], None, False))
                                   for i in range(model_input.shape[0])])
    (gradient,) = torch.autograd.grad(logits[:, k].sum(), kept, retain_graph=k < logits.shape[1] - 1)
    return _relu(method.get_cam_image(model_input, layer, targets, activations, _numpy(target.reshape(gradient)), False))


def _numpy(tensor: Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _relu(cam: np.ndarray) -> np.ndarray:
    """The library's ReLU of every map (``compute_cam_per_layer``), in float32."""
    return np.maximum(cam, 0).astype(np.float32, copy=False)
