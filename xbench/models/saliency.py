"""Saliency shared by every model: upsampling to the mask grid, placing a map that covers part of
the frame back into it, min-max normalising, and the map methods several models use (patch–text
similarity, Grad-CAM over ViT tokens)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from xbench.models.gpu import float32

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


@dataclass(frozen=True)
class Window:
    """The part of a frame a model saw, in the frame's pixel units (``[top, top + height)`` rows,
    ``[left, left + width)`` columns); it may reach outside the frame where the model saw padding."""

    top: float
    left: float
    height: float
    width: float


def _axis_weights(
    size: int, start: float, extent: float, cells: int, mode: Upsample, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Float64 [size, cells] sampling weights of one frame axis, and which frame pixels the window
    covers; built on ``device`` (no copy from the host, no step that waits for the device)."""
    position = (torch.arange(size, dtype=torch.float64, device=device) + 0.5 - start) * cells / extent  # in cells
    inside = (position >= 0) & (position < cells)
    weights = torch.zeros(size, cells, dtype=torch.float64, device=device)
    rows = torch.arange(size, device=device)
    if mode == "nearest":
        weights[rows, position.floor().clamp(0, cells - 1).long()] = 1.0
    elif mode == "bilinear":  # as F.interpolate(align_corners=False): half-cell offset, edges held
        source = (position - 0.5).clamp(0, cells - 1)
        low = source.floor()
        high = (low + 1).clamp(max=cells - 1)
        weights.index_put_((rows, low.long()), 1 - (source - low), accumulate=True)
        weights.index_put_((rows, high.long()), source - low, accumulate=True)
    else:
        raise ValueError(f"upsample mode must be 'bilinear' or 'nearest'; got {mode!r}")
    return weights.masked_fill_(~inside.unsqueeze(1), 0), inside


def place_in_frame(maps: Tensor, window: Window, frame: tuple[int, int], mode: Upsample = "bilinear") -> Tensor:
    """Maps [B, C, h, w] that cover ``window`` of a frame -> maps [B, C, *frame] on the frame's pixels.

    For models whose preprocessing crops or letterboxes: each frame pixel whose centre lies in the
    window takes the map's value there (``mode`` as in :func:`upsample`); the rest of the frame,
    which the model never saw, takes each map's minimum, so it cannot attract the maximum.
    Computed in float32, also under mixed precision.
    """
    maps = maps.float()
    rows, inside_rows = _axis_weights(frame[0], window.top, window.height, maps.shape[-2], mode, maps.device)
    columns, inside_columns = _axis_weights(frame[1], window.left, window.width, maps.shape[-1], mode, maps.device)
    with float32(maps):
        placed = rows.float() @ maps @ columns.float().T
    covered = inside_rows[:, None] & inside_columns[None, :]
    return torch.where(covered, placed, maps.amin(dim=(-2, -1), keepdim=True))


def normalise(maps: Tensor) -> Tensor:
    """Min-max normalise each (image, class) map of [B, C, H, W] to [0, 1].

    The maximum becomes exactly 1 and the minimum exactly 0 (``(x - lo) / (hi - lo)`` is exact at
    both ends); a constant map becomes all zeros, never NaN.
    """
    flat = maps.flatten(2)
    # amin and amax, not aminmax(dim=...): on CPU the fused one is about 7x slower along a long last dim.
    low, high = flat.amin(dim=-1, keepdim=True), flat.amax(dim=-1, keepdim=True)
    spread = high - low
    # A constant map has x - low == 0 everywhere, and 0 / 1 keeps it 0: no full-size select needed.
    return ((flat - low) / torch.where(spread > 0, spread, 1.0)).view_as(maps)


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
