r"""Where did the radiologist look? The saliency field's metrics of a map against eye-tracking gaze.

Each (image, class) pair with a gaze target (``has_gaze``) compares the model's normalised frame map
``s`` (min-max in [0, 1]; a map that points nowhere is all zeros) with the radiologist's gaze tied
to the class: its density ``g`` (sums to 1), the fixation counts ``f`` behind it, the other images'
fixation counts ``h`` (shuffled AUC's negatives) and the centre-bias density ``b`` (the mean gaze
density of the training readings). Per pair, as pysaliency 0.2.22 computes each (``metrics.py``,
``roc_cython.pyx``, ``models.py``) and etsaliencymaps (``compare_heatmaps.py``) its two:

- **NSS**: the mean over fixations of the map standardised by its mean and population standard
  deviation (a constant map: not divided, so 0);
- **CC**: Pearson's correlation of ``s`` and ``g``; 0 for a constant map against a varying density,
  undefined for a constant density (pysaliency's ``CC``);
- **SIM**: ``sum min(s / sum s, g)``, a map of zeros taken as uniform (``SIM``);
- **KL**: ``sum g log(eps + g / (p + eps))`` with ``p = s / sum s`` and ``eps = 2.2204e-16`` (the
  MIT benchmark's ``MIT_KLDiv``, the map as the prediction, the gaze as the empirical map);
- **AUC-Judd**: the ROC of fixated pixels (each fixation once) against unfixated pixels, thresholds
  at the fixated values only, trapezoidal (``AUC_Judd(jitter=False)``: ties are kept, not broken by
  noise);
- **shuffled AUC**: the ROC of the fixations against the other images' fixations on the same map,
  every value a threshold: the Mann--Whitney statistic with ties counting one half (``sAUC``);
- **IG**: information gain over the centre bias, in bits per fixation: the mean over fixations of
  ``log2 p_s - log2 p_b``, each map made a density by `as_density` (pysaliency's
  ``SaliencyMapNormalizingModel`` with ``minimum_value`` = `DENSITY_FLOOR` on the min-max
  normalised map, so the centre bias scores 0 over itself);
- **NCC**: ``mean((g - mean g)(s - mean s)) / (std g std s)`` (etsaliencymaps' ``normalised_corr``;
  undefined for a constant map);
- **sNCC**: ``NCC(g, s) - NCC(b, s)`` (their ``shuffled_normalised_corr``).

A value a pair does not define (no fixation, no other image's fixation, a constant map's NCC) is
NaN in its record, counted and left out of its class's mean. Every sum over the frame is float64.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat

from xbench.metrics.common import MetricValues, RecordsMetric
from xbench.metrics.names import run_keys

#: The per-pair values, in the records' column order (their keys in `xbench.metrics.names`).
VALUES = run_keys("gaze", "per_class")
#: pysaliency's regularisation of the MIT benchmark's KL divergence (MATLAB's ``eps``).
KL_EPS = 2.2204e-16
#: What is added to a min-max normalised map before it is divided by its sum, for information gain:
#: a pixel at the map's minimum is 1,000 times less likely than one at its maximum (a map of zeros:
#: uniform), so a fixation where a map is 0 costs bits instead of an infinite loss.
DENSITY_FLOOR = 1e-3
#: Elements ([pairs, pixels]) per chunk of the sorting kernels: their dozen float64 temporaries stay
#: near half a GiB.
_CHUNK_ELEMENTS = 1 << 22


def _flat(x: Tensor) -> Tensor:
    return x.flatten(1).double()


def _standardised(x: Tensor) -> tuple[Tensor, Tensor]:
    """``x - mean`` and the population standard deviation of each row."""
    centred = x - x.mean(1, keepdim=True)
    return centred, centred.pow(2).mean(1).sqrt()


def _density(x: Tensor) -> Tensor:
    """pysaliency's ``convert_saliency_map_to_density`` of a non-negative row: ``x / sum``, uniform if 0."""
    total = x.sum(1, keepdim=True)
    return torch.where(total > 0, x / total.clamp(min=torch.finfo(x.dtype).tiny), 1.0 / x.shape[1])


def as_density(normalised: Tensor, floor: float = DENSITY_FLOOR) -> Tensor:
    """A min-max normalised map [P, ...] as a density for information gain: ``(s + floor) / sum``."""
    x = _flat(normalised) + floor
    return (x / x.sum(1, keepdim=True)).view(normalised.shape)


def minmax(x: Tensor) -> Tensor:
    """``(x - min) / (max - min)``; a constant map becomes zeros (as the run's `normalise` makes it)."""
    x = x.double()
    low, span = x.min(), x.max() - x.min()
    return torch.where(span > 0, (x - low) / span.clamp(min=torch.finfo(x.dtype).tiny), 0.0)


def nss(saliency: Tensor, fixations: Tensor) -> Tensor:
    """float64 [P]: the map's standardised value, averaged over the fixations (NaN without one)."""
    s, f = _flat(saliency), _flat(fixations)
    centred, std = _standardised(s)
    z = torch.where(std[:, None] > 0, centred / std.clamp(min=1e-300)[:, None], centred)
    return (f * z).sum(1) / f.sum(1)


def cc(saliency: Tensor, gaze: Tensor) -> Tensor:
    """float64 [P]: Pearson's correlation of map and density (pysaliency's ``CC`` edge cases)."""
    (s, s_std), (g, g_std) = _standardised(_flat(saliency)), _standardised(_flat(gaze))
    value = (s * g).mean(1) / (s_std * g_std)
    return torch.where((s_std == 0) & (g_std > 0), 0.0, torch.where(g_std > 0, value, math.nan))


def sim(saliency: Tensor, gaze: Tensor) -> Tensor:
    """float64 [P]: the histogram intersection of the two as densities."""
    return torch.minimum(_density(_flat(saliency)), _density(_flat(gaze))).sum(1)


def kl_divergence(saliency: Tensor, gaze: Tensor) -> Tensor:
    """float64 [P]: the MIT benchmark's KL divergence of the map from the gaze density."""
    p, g = _density(_flat(saliency)), _density(_flat(gaze))
    return (g * torch.log(KL_EPS + g / (p + KL_EPS))).sum(1)


def ncc(reference: Tensor, saliency: Tensor) -> Tensor:
    """float64 [P]: etsaliencymaps' normalised cross-correlation (NaN where either is constant)."""
    (a, a_std), (v, v_std) = _standardised(_flat(reference)), _standardised(_flat(saliency))
    value = (a * v).mean(1) / (v_std * a_std)
    return torch.where((a_std > 0) & (v_std > 0), value, math.nan)


def shuffled_ncc(gaze: Tensor, saliency: Tensor, baseline: Tensor) -> Tensor:
    """float64 [P]: NCC with the gaze less NCC with the centre bias (``baseline`` [S, S])."""
    return ncc(gaze, saliency) - ncc(baseline.expand_as(saliency), saliency)


def information_gain(saliency: Tensor, fixations: Tensor, baseline: Tensor, floor: float = DENSITY_FLOOR) -> Tensor:
    """float64 [P]: bits per fixation of the map's density over the centre bias's (``baseline`` [S, S],
    any non-negative map: min-max normalised and made a density by the same rule as the map)."""
    f = _flat(fixations)
    own = torch.log2(_flat(as_density(saliency, floor)))
    base = torch.log2(_flat(as_density(minmax(baseline)[None], floor)))
    return (f * (own - base)).sum(1) / f.sum(1)


def _tie_bounds(ordered: Tensor) -> tuple[Tensor, Tensor]:
    """For rows sorted along dim 1: each element's first and last index among its equal values."""
    n = ordered.shape[1]
    positions = torch.arange(n, device=ordered.device).expand_as(ordered)
    change = ordered[:, 1:] != ordered[:, :-1]
    starts = torch.cat([torch.ones_like(change[:, :1]), change], 1)
    ends = torch.cat([change, torch.ones_like(change[:, :1])], 1)
    first = torch.where(starts, positions, 0).cummax(1).values
    last = torch.where(ends, positions, n - 1).flip(1).cummin(1).values.flip(1)
    return first, last


def _chunks(pairs: int, pixels: int):
    step = max(1, _CHUNK_ELEMENTS // max(pixels, 1))
    return [slice(start, start + step) for start in range(0, pairs, step)]


def auc_judd(saliency: Tensor, fixations: Tensor) -> Tensor:
    """float64 [P]: AUC-Judd, thresholds at the fixated values (NaN without a fixation or an unfixated pixel)."""
    return _aucs(saliency, fixations, None)[0]


def shuffled_auc(saliency: Tensor, fixations: Tensor, shuffled: Tensor) -> Tensor:
    """float64 [P]: the AUC of the fixations against the other images' fixations ``shuffled`` (NaN
    without either)."""
    return _aucs(saliency, fixations, shuffled)[1]


def _aucs(saliency: Tensor, fixations: Tensor, shuffled: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """AUC-Judd and (with ``shuffled``) the shuffled AUC from one sort of each pair's map, in chunks of pairs."""
    s, f = saliency.flatten(1), fixations.flatten(1)
    h = shuffled.flatten(1) if shuffled is not None else None
    parts = [_sorted_aucs(s[part], f[part], None if h is None else h[part]) for part in _chunks(*s.shape)]
    empty = s.new_zeros(0, dtype=torch.float64)
    judd = torch.cat([p[0] for p in parts]) if parts else empty
    return judd, (torch.cat([p[1] for p in parts]) if parts else empty) if h is not None else None


def _sorted_aucs(s: Tensor, f: Tensor, h: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """The two AUCs of pairs [P, N] from the map's values in ascending order (the map's own dtype:
    the sort needs no float64), every sum float64."""
    ordered, order = s.sort(1)
    f = f.gather(1, order).double()
    n = s.shape[1]
    positions = torch.arange(n, device=s.device)
    first, last = _tie_bounds(ordered)
    # AUC-Judd: a threshold at each fixated value v; the pixels at or above v start at v's first tie
    hits, false = f.cumsum(1), (f == 0).double().cumsum(1)
    total_hits, total_false = hits[:, -1:], false[:, -1:]
    hits_below, false_below = (hits - f).gather(1, first), (false - (f == 0).double()).gather(1, first)
    kept = (first == positions) & (hits.gather(1, last) - hits_below > 0)
    x, y = (total_false - false_below) / total_false, (total_hits - hits_below) / total_hits
    # the curve runs from the highest threshold down: each kept point's predecessor is the next kept one above it
    above = torch.where(kept, positions, n).flip(1).cummin(1).values.flip(1)
    above = torch.cat([above[:, 1:], torch.full_like(above[:, :1], n)], 1)
    x_above = torch.where(above < n, x.gather(1, above.clamp(max=n - 1)), 0.0)
    y_above = torch.where(above < n, y.gather(1, above.clamp(max=n - 1)), 0.0)
    area = torch.where(kept, (x - x_above) * (y + y_above) / 2, 0.0).sum(1)
    lowest = torch.where(kept, positions, n).amin(1, keepdim=True).clamp(max=n - 1)  # the last point before (1, 1)
    area += ((1 - x.gather(1, lowest)) * (1 + y.gather(1, lowest)) / 2).squeeze(1)
    judd = torch.where((total_hits > 0).squeeze(1) & (total_false > 0).squeeze(1), area, math.nan)
    if h is None:
        return judd, None
    # shuffled AUC: P(fixation > other fixation) + P(equal) / 2, over the map's values
    h = h.gather(1, order).double()
    below = h.cumsum(1) - h  # the other fixations strictly before each position
    less = below.gather(1, first)
    equal = (below + h).gather(1, last) - less
    pos_total, neg_total = f.sum(1), h.sum(1)
    value = (f * (less + equal / 2)).sum(1) / (pos_total * neg_total)
    return judd, torch.where((pos_total > 0) & (neg_total > 0), value, math.nan)


def gaze_values(saliency: Tensor, gaze: Tensor, fixations: Tensor, shuffled: Tensor, baseline: Tensor,
                floor: float = DENSITY_FLOOR) -> Tensor:
    """Every metric of `VALUES` for P pairs ([P, S, S] each; ``baseline`` [S, S]): float64 [P, K]."""
    aucs = _aucs(saliency, fixations, shuffled)
    kernels = {
        "nss": lambda: nss(saliency, fixations),
        "cc": lambda: cc(saliency, gaze),
        "sim": lambda: sim(saliency, gaze),
        "kl_divergence": lambda: kl_divergence(saliency, gaze),
        "auc_judd": lambda: aucs[0],
        "shuffled_auc": lambda: aucs[1],
        "information_gain": lambda: information_gain(saliency, fixations, baseline, floor),
        "ncc": lambda: ncc(gaze, saliency),
        "shuffled_ncc": lambda: shuffled_ncc(gaze, saliency, baseline),
    }
    return torch.stack([kernels[name]() for name in VALUES], 1)


class GazeMetrics(RecordsMetric):
    """The gaze metrics of every (image, class) pair with a gaze target, summed per class.

    Args:
        num_classes: C.
        baseline: the centre-bias density [S, S] (the datamodule's ``gaze_baseline()``).

    States: per class ``pairs`` (int64 [C]), ``defined`` (int64 [C, K]: pairs where each value is
    defined) and ``sums`` (float64 [C, K]); records per pair ``rec_index``, ``rec_class`` (int64),
    ``rec_fixations`` (float64: the fixations behind its gaze) and ``rec_values`` (float64 [K], NaN
    where undefined), K = `VALUES`.
    """

    full_state_update = False

    def __init__(self, num_classes: int, baseline: Tensor, **kwargs) -> None:
        super().__init__(**kwargs)
        if baseline.ndim != 2 or not bool(torch.isfinite(baseline).all()) or bool((baseline < 0).any()):
            raise ValueError(f"the centre-bias baseline must be a finite, non-negative [S, S] map; got shape "
                             f"{tuple(baseline.shape)}")
        self.num_classes = num_classes
        self.register_buffer("baseline", baseline.double(), persistent=False)
        self.add_state("pairs", torch.zeros(num_classes, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("defined", torch.zeros(num_classes, len(VALUES), dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("sums", torch.zeros(num_classes, len(VALUES), dtype=torch.float64), dist_reduce_fx="sum")
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"rec_index": ((), torch.int64), "rec_class": ((), torch.int64), "rec_fixations": ((), torch.float64),
                "rec_values": ((len(VALUES),), torch.float64)}

    def update(self, saliency: Tensor, gaze: Tensor, fixations: Tensor, has_gaze: Tensor, shuffled: Tensor,
               index: Tensor) -> None:
        """``saliency``, ``gaze``, ``fixations`` [B, C, S, S], ``has_gaze`` bool [B, C], ``shuffled``
        [B, S, S] (the other images' fixations), ``index`` int64 [B]."""
        if saliency.shape != gaze.shape or saliency.shape != fixations.shape or saliency.shape[:2] != has_gaze.shape:
            raise ValueError(f"saliency, gaze and fixations must be [B, C, S, S] and has_gaze [B, C]; got "
                             f"{tuple(saliency.shape)}, {tuple(gaze.shape)}, {tuple(fixations.shape)}, "
                             f"{tuple(has_gaze.shape)}")
        if saliency.shape[-2:] != self.baseline.shape or shuffled.shape != (saliency.shape[0], *saliency.shape[-2:]):
            raise ValueError(f"the frame of the maps {tuple(saliency.shape[-2:])} must be the centre bias's "
                             f"{tuple(self.baseline.shape)} and shuffled_fixations [B, S, S]; got "
                             f"{tuple(shuffled.shape)}")
        image, cls = has_gaze.nonzero(as_tuple=True)
        values = gaze_values(saliency[image, cls], gaze[image, cls], fixations[image, cls], shuffled[image],
                             self.baseline)
        defined = ~values.isnan()
        self.pairs += torch.bincount(cls, minlength=self.num_classes)
        self.defined.index_add_(0, cls, defined.long())
        self.sums.index_add_(0, cls, values.nan_to_num(0.0))
        self.rec_index.append(index[image])
        self.rec_class.append(cls)
        self.rec_fixations.append(fixations[image, cls].double().flatten(1).sum(1))
        self.rec_values.append(values)

    def compute(self) -> MetricValues:
        means = self.sums / self.defined  # 0 / 0: no defined pair of the class -> NaN
        macro = {name: torch.nanmean(means[:, k]) for k, name in enumerate(VALUES)}
        return MetricValues({"pairs": self.pairs.clone(), "defined": self.defined.clone(), "means": means,
                             "macro": macro, "records": self.records()})

    def records(self) -> dict[str, Tensor]:
        """One row per pair: ``index``, ``class``, ``fixations`` and each value by its key."""
        values = dim_zero_cat(self.rec_values)
        return {"index": dim_zero_cat(self.rec_index), "class": dim_zero_cat(self.rec_class),
                "fixations": dim_zero_cat(self.rec_fixations),
                **{name: values[:, k] for k, name in enumerate(VALUES)}}
