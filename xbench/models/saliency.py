"""The map method several models use: patch–text similarity (CAM explainers:
[`xbench.models.explainers`][xbench.models.explainers]).

Deciding that a raw map points nowhere, placing it into the metric frame and normalising it are the
harness's, shared with the data and the metrics: [`xbench.geometry.maps`][xbench.geometry.maps]."""

from __future__ import annotations

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
