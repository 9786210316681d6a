"""Saliency post-processing shared by every model: upsampling to the mask grid, min-max normalising."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Upsample = Literal["bilinear", "nearest"]


def upsample(maps: Tensor, size: tuple[int, int], mode: Upsample = "bilinear") -> Tensor:
    """Float32 maps [B, C, h, w] -> [B, C, *size] (bilinear with ``align_corners=False``, or nearest)."""
    maps = maps.float()
    if tuple(maps.shape[-2:]) == tuple(size):
        return maps
    if mode == "bilinear":
        return F.interpolate(maps, size=size, mode="bilinear", align_corners=False)
    if mode == "nearest":
        return F.interpolate(maps, size=size, mode="nearest")
    raise ValueError(f"upsample mode must be 'bilinear' or 'nearest'; got {mode!r}")


def normalise(maps: Tensor) -> Tensor:
    """Min-max normalise each (image, class) map of [B, C, H, W] to [0, 1].

    The maximum becomes exactly 1 and the minimum exactly 0 (``(x - lo) / (hi - lo)`` is exact at
    both ends); a constant map becomes all zeros, never NaN.
    """
    flat = maps.flatten(2)
    low, high = torch.aminmax(flat, dim=-1)
    spread = (high - low).unsqueeze(-1)
    scaled = torch.where(spread > 0, (flat - low.unsqueeze(-1)) / spread, torch.zeros_like(flat))
    return scaled.view_as(maps)
