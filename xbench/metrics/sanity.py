"""How alike two maps of the same (image, class) are, for the sanity check's cascading
randomisation (Adebayo et al., NeurIPS 2018): the map of the model as trained against the map after
some of its layers were re-initialised.

- `spearman`: Spearman's rank correlation of the two maps placed in the frame, before min-max
  normalisation (which keeps ranks but would make every value non-negative): the Pearson correlation
  of the ranks, equal values sharing their mean rank; undefined (NaN) where either map is constant.
  Taken plain and of the absolute values, as Adebayo et al. report both (a signed map may flip).
- `ssim`: the structural similarity of the two min-max normalised frame maps (data range 1,
  torchmetrics' definition: a Gaussian window of 11 pixels, sigma 1.5, the border mirrored, the mean
  over every pixel), what the metrics see. The window is applied as two matrix products (one per
  axis, the mirrored border folded into the matrix): on a CPU about ten times torchmetrics' float64
  convolution, which every run's random logit would otherwise pay (`xbench.metrics.map_quality`).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat

from xbench.metrics.common import MetricValues, RecordsMetric
from xbench.metrics.faithfulness import pair_order

#: The per-pair similarities a sanity record holds, in the tables' order.
SIMILARITIES = ("spearman", "spearman_abs", "ssim")


def average_ranks(values: Tensor) -> Tensor:
    """float64 [N, n]: the ranks (1..n) of each row of ``values`` [N, n], equal values sharing the
    mean of their ranks (``scipy.stats.rankdata``'s ``average``)."""
    ordered, order = torch.sort(values, dim=-1, stable=True)
    mean_rank = sorted_mean_ranks(ordered)
    return torch.empty_like(mean_rank).scatter_(-1, order, mean_rank)


def sorted_mean_ranks(ordered: Tensor) -> Tensor:
    """float64 [N, n]: the rank of each place of rows sorted ascending [N, n], equal values sharing
    the mean of their ranks."""
    starts = torch.ones_like(ordered, dtype=torch.bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    group = starts.cumsum(-1) - 1  # the tie group of each sorted position
    position = torch.arange(1, ordered.shape[-1] + 1, dtype=torch.float64, device=ordered.device).expand_as(ordered)
    sums = torch.zeros_like(position).scatter_add_(-1, group, position)
    counts = torch.zeros_like(position).scatter_add_(-1, group, torch.ones_like(position))
    return sums.gather(-1, group) / counts.gather(-1, group)


def spearman(a: Tensor, b: Tensor) -> Tensor:
    """float64 [N]: Spearman's rank correlation of each row of ``a`` and ``b`` [N, n] (maps flattened);
    NaN where either row is constant."""
    ranks_a, ranks_b = average_ranks(a.flatten(1)), average_ranks(b.flatten(1))
    ranks_a = ranks_a - ranks_a.mean(-1, keepdim=True)
    ranks_b = ranks_b - ranks_b.mean(-1, keepdim=True)
    spread = (ranks_a.square().sum(-1) * ranks_b.square().sum(-1)).sqrt()
    return torch.where(spread > 0, (ranks_a * ranks_b).sum(-1) / spread, torch.nan)


#: SSIM's Gaussian window (taps, sigma) and its constants for data range 1: (0.01, 0.03) squared.
SSIM_TAPS, SSIM_SIGMA = 11, 1.5
_C1, _C2 = 0.01**2, 0.03**2


@functools.lru_cache(maxsize=8)
def _window_matrix(size: int) -> Tensor:
    """float64 [size, size]: the Gaussian window along one axis of ``size`` pixels as a matrix, the
    border mirrored (torch's reflect padding: pixel -k is pixel k)."""
    half = SSIM_TAPS // 2
    if size <= half:
        raise ValueError(f"SSIM needs maps of at least {half + 1} pixels a side (its window mirrors {half}); "
                         f"got {size}")
    offsets = torch.arange(-half, half + 1, dtype=torch.float64)
    taps = torch.exp(-0.5 * (offsets / SSIM_SIGMA) ** 2)
    rows = torch.arange(size).unsqueeze(1).expand(size, SSIM_TAPS)
    columns = (rows + offsets.long()).abs()
    columns = torch.where(columns > size - 1, 2 * (size - 1) - columns, columns)
    weights = (taps / taps.sum()).expand(size, -1)
    return torch.zeros(size, size, dtype=torch.float64).index_put_((rows, columns), weights, accumulate=True)


def windowed(maps: Tensor) -> Tensor:
    """float64 [..., H, W]: each map's local means under SSIM's Gaussian window."""
    maps = maps.double()
    height, width = maps.shape[-2:]
    return _window_matrix(height).to(maps.device) @ maps @ _window_matrix(width).to(maps.device).T


def ssim(a: Tensor, b: Tensor) -> Tensor:
    """float64 [N]: the structural similarity of normalised maps ``a`` and ``b`` [N, H, W] in [0, 1]."""
    a, b = a.double(), b.double()
    mean_a, mean_b = windowed(a), windowed(b)
    variance_a, variance_b = windowed(a * a) - mean_a**2, windowed(b * b) - mean_b**2
    covariance = windowed(a * b) - mean_a * mean_b
    index = ((2 * mean_a * mean_b + _C1) * (2 * covariance + _C2)
             / ((mean_a**2 + mean_b**2 + _C1) * (variance_a + variance_b + _C2)))
    return index.flatten(-2).mean(-1)


def similarities(original: Tensor, randomised: Tensor, original_saliency: Tensor,
                 randomised_saliency: Tensor) -> dict[str, Tensor]:
    """The `SIMILARITIES` [N] of N map pairs: frame maps before normalisation [N, H, W] (the
    rank correlations) and the normalised ones (SSIM)."""
    return {"spearman": spearman(original, randomised),
            "spearman_abs": spearman(original.abs(), randomised.abs()),
            "ssim": ssim(original_saliency, randomised_saliency)}


class SanityRecords(RecordsMetric):
    """One row per (image, class, cascade step): the similarities of the map at that step to the
    original, gathered across processes like every record state."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"sa_index": ((), torch.int64), "sa_class": ((), torch.int64), "sa_step": ((), torch.int64),
                **{f"sa_{name}": ((), torch.float64) for name in SIMILARITIES}}

    def update(self, index: Tensor, classes: Tensor, step: int, values: dict[str, Tensor]) -> None:
        self.sa_index.append(index)
        self.sa_class.append(classes)
        self.sa_step.append(torch.full_like(index, step))
        for name in SIMILARITIES:
            getattr(self, f"sa_{name}").append(values[name].double())

    def compute(self) -> MetricValues:
        """Every process's rows, ordered by (step, image index, class)."""
        index, cls, step = dim_zero_cat(self.sa_index), dim_zero_cat(self.sa_class), dim_zero_cat(self.sa_step)
        within = pair_order(index, cls)
        order = within[torch.argsort(step[within], stable=True)]
        return MetricValues({"index": index[order], "class": cls[order], "step": step[order],
                             **{name: dim_zero_cat(getattr(self, f"sa_{name}"))[order] for name in SIMILARITIES}})
