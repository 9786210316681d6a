"""Batch geometry: the whole image resized to ``size x size`` (no crop), masks resized by area.

Masks are resized by exact area coverage -- the fraction of each output pixel that the region
covers -- then binarised at ``threshold`` (gamma, default 0.5). A region never vanishes: if
binarising empties a non-empty region, the output pixel(s) of highest coverage stay set.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


def resize_image(image: np.ndarray, size: int, width: int | None = None) -> torch.Tensor:
    """Grey float image [H, W] in [0, 1] -> float32 tensor [1, size, width or size] (bilinear, antialiased)."""
    shape = (size, size if width is None else width)
    tensor = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32))
    if tensor.shape == shape:
        return tensor.unsqueeze(0)
    resized = F.interpolate(tensor[None, None], size=shape, mode="bilinear", antialias=True, align_corners=False)
    return resized[0].clamp_(0, 1)


def area_coverage(mask: np.ndarray, out_height: int, out_width: int) -> np.ndarray:
    """Exact covered area of each output pixel, as an integer in units of 1 / (H * W).

    Output pixel ``(i, j)`` spans ``[i H/out_h, (i+1) H/out_h) x [j W/out_w, (j+1) W/out_w)`` of
    the source; its coverage fraction is the returned value divided by ``H * W``. Integer
    arithmetic keeps a half-covered pixel at exactly one half.
    """
    rows = _scaled_axis_integral(mask, out_height, axis=0)
    return _scaled_axis_integral(rows, out_width, axis=1)


def _scaled_axis_integral(values: np.ndarray, out: int, axis: int) -> np.ndarray:
    """``out`` times the sum of ``values`` over each of ``out`` equal slices of ``axis`` (integers).

    With ``n`` source cells, slice ``k`` spans ``[k n / out, (k + 1) n / out)``. Scaling positions
    by ``out`` makes every edge an integer ``k n``: cell ``(k n) // out`` is cut at offset
    ``(k n) % out``, so ``out x`` the running integral is an integer at every edge. The running
    integral is only needed at the edge cells: block sums between them (one ``reduceat`` pass)
    replace a full cumulative sum.
    """
    values = np.moveaxis(values, axis, 0)
    n = values.shape[0]
    edges = np.arange(out + 1, dtype=np.int64) * n
    cell = np.minimum(edges // out, n - 1)
    offset = edges - cell * out  # in units of 1/out of a cell; equals ``out`` at the far end
    starts, position = np.unique(cell, return_inverse=True)
    blocks = np.add.reduceat(values, starts, axis=0, dtype=np.int64)
    before = np.concatenate([np.zeros_like(blocks[:1]), np.cumsum(blocks[:-1], axis=0)])
    shape = (-1,) + (1,) * (values.ndim - 1)
    integral = before[position] * out + offset.reshape(shape) * values[cell]
    return np.moveaxis(np.diff(integral, axis=0), 0, axis)


def resize_mask(mask: np.ndarray, size: int, threshold: float = 0.5) -> torch.Tensor:
    """Bool mask [H, W] -> bool tensor [size, size]: area-resize, binarise at ``threshold``, never vanish."""
    height, width = mask.shape
    if not mask.any():
        return torch.zeros(size, size, dtype=torch.bool)
    covered = area_coverage(mask, size, size)
    full = height * width
    out = covered >= threshold * full
    if not out.any():
        out = covered == covered.max()
    return torch.from_numpy(out)
