"""R² of a straight-line fit (squared Pearson correlation), per bootstrap replicate."""

from __future__ import annotations

import torch
from torch import Tensor


def r_squared(x: Tensor, y: Tensor) -> Tensor:
    """float64 [R + 1]: R² of the points ``(x[r, m], y[r, m])`` of each row ``r``.

    Points where either value is NaN are left out of their row; a row with fewer than three
    points, or with no spread in x or y, is NaN.
    """
    valid = x.isfinite() & y.isfinite()
    count = valid.sum(1)
    centred = []
    for values in (x.double(), y.double()):
        values = torch.where(valid, values, 0.0)
        mean = values.sum(1, keepdim=True) / count.clamp(min=1).unsqueeze(1)
        centred.append(torch.where(valid, values - mean, 0.0))
    dx, dy = centred
    sxx, syy, sxy = (dx * dx).sum(1), (dy * dy).sum(1), (dx * dy).sum(1)
    defined = (count >= 3) & (sxx > 0) & (syy > 0)
    return torch.where(defined, sxy**2 / (sxx * syy), float("nan"))
