"""The map methods several models use: patch–text similarity and Grad-CAM over ViT tokens.

Deciding that a raw map points nowhere, placing it into the metric frame and normalising it are the
harness's, shared with the data and the metrics: :mod:`xbench.geometry.maps`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from xbench.geometry.precision import float32


def patch_grid(scores: Tensor, grid: tuple[int, int]) -> Tensor:
    """Per-patch scores [B, C, N] (patches in row-major order, N = h * w) -> maps [B, C, h, w]."""
    height, width = grid
    if scores.shape[-1] != height * width:
        raise ValueError(f"{scores.shape[-1]} patch scores do not fill a {height}x{width} grid")
    return scores.unflatten(-1, (height, width))


def patch_text_similarity(patches: Tensor, text: Tensor, grid: tuple[int, int]) -> Tensor:
    """Cosine similarity of every patch embedding with every text embedding, as maps.

    ``patches`` [B, N, D] are patch tokens already mapped into the joint space (the same final
    norm and projection as the image embedding); ``text`` [C, D] one embedding per class.
    Returns [B, C, h, w], raw cosines in [-1, 1], computed in float32 (also under mixed precision).
    """
    with float32(patches):
        cosines = F.normalize(patches.float(), dim=-1) @ F.normalize(text.float(), dim=-1).T
    return patch_grid(cosines.transpose(1, 2), grid)


class ActivationCapture:
    """Forward hook that keeps a module's output as a leaf with gradients, for Grad-CAM.

    The output is detached and marked ``requires_grad``, so gradients of the scores reach this
    activation and nothing before it (the model's weights may stay frozen). Use as a context
    manager around the forward pass; ``activation`` then holds the last output.
    """

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.activation: Tensor | None = None

    def _hook(self, module, inputs, output: Tensor) -> Tensor:
        self.activation = output.detach().requires_grad_(True)
        return self.activation

    def __enter__(self) -> ActivationCapture:
        self._handle = self.module.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def grad_cam(activation: Tensor, scores: Tensor, grid: tuple[int, int], prefix_tokens: int) -> Tensor:
    """Grad-CAM over a ViT's tokens, one map per class score.

    ``activation`` [B, T, D] are the tokens the hook kept (``prefix_tokens`` class/register tokens
    first, then the h*w patches), ``scores`` [B, C] computed from them. For class c the channel
    weights are the patch-averaged gradients of ``scores[:, c]``; the map is
    ``ReLU(sum_d weight_d * activation_d)`` over the patches -> [B, C, h, w].
    """
    patches = activation[:, prefix_tokens:]
    maps = []
    for c in range(scores.shape[1]):
        (gradient,) = torch.autograd.grad(scores[:, c].sum(), activation, retain_graph=True)
        weights = gradient[:, prefix_tokens:].mean(dim=1, keepdim=True)
        maps.append(torch.relu((weights * patches).sum(-1)))
    return patch_grid(torch.stack(maps, dim=1), grid)
