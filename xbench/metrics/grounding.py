"""Grounding metrics: Pointing Game, Dice and IoU at all 101 thresholds from one histogram.

A saliency map ``s`` (min-max normalised to [0, 1]) is compared with the radiologist region ``R``.
For the float32 thresholds ``tau_k = k / 100`` (k = 0..100) a pixel belongs to ``B_k`` when
``s >= tau_k``. The bin of a pixel is the largest ``k`` with ``s >= tau_k`` -- exactly what
``torch.bucketize(s, THRESHOLDS, right=True) - 1`` returns. Histograms of all pixels and of the
pixels inside ``R`` give, by suffix sums, ``|B_k|`` and ``|B_k & R|`` for every threshold at once.

Contrast-to-noise ratio (BioViL's grounding metric) of a graded pair: ``|mean_in - mean_out| /
sqrt(var_in + var_out)`` of the normalised map inside and outside ``R`` (population variances),
from float64 sums gathered in the same pass over the pixels as the histograms. Only the pixels
the model saw enter either side: frame pixels outside its window (``seen``) are in neither, as in
hi-ml's phrase grounding, where they are NaN. A map with no contrast and no noise (a constant map)
scores 0; a pair with no seen pixel on a side (a region covering the whole frame, or one the model
never saw) or whose map is exactly constant inside and outside with a contrast (infinite CNR) has
no CNR: counted, left out of its mean.

Everything a result needs is a sum over (image, class) pairs, so the metric's states are sums
(exact under DDP) plus records of the graded pairs only (concatenated) for later analyses. A
phrase dataset's (image, query) pairs enter the same way, summed into the class of each query's
finding (``pair_class``).
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat

from xbench.metrics.common import MetricValues, RecordsMetric
from xbench.metrics.map_quality import VALUES as MAP_QUALITY_VALUES
from xbench.metrics.map_quality import other_class, pair_values, top_k
from xbench.metrics.names import run_keys

NUM_THRESHOLDS = 101
#: The 101 thresholds tau_k = k/100 as float32; bins and reported tau values refer to this tensor.
THRESHOLDS = torch.arange(NUM_THRESHOLDS, dtype=torch.float32) / 100
#: Index of tau = 0.5, the fixed threshold.
FIXED_TAU_INDEX = 50
# A pixel's code within its pair: side * 202 + 2 * r + (s >= tau_r), r = round(100 s) (see _scan);
# its side is inside R (1) or not (0), plus 2 where the model never saw it (when CNR is asked with
# the seen pixels).
_CODES_PER_SIDE = 2 * NUM_THRESHOLDS
# The block pass builds codes in float32 before the integer cast, counted from their block's first
# pair; integers stay exact below 2**24.
_MAX_CODES_PER_BLOCK = 1 << 24
# Elements per block of the block pass: few, large blocks keep kernel launches few.
_BLOCK_ELEMENTS = 1 << 24
# Pixels per chunk of the CPU pass: a native-size map is split over the threads, while a 224 x 224
# map is one chunk (the histograms of the chunks of a pair are summed afterwards).
_CPU_CHUNK_PIXELS = 1 << 16


def threshold_counts(saliency: Tensor, masks: Tensor) -> tuple[Tensor, Tensor]:
    """``|B_k|`` and ``|B_k & R|`` for every (image, class) pair and all 101 thresholds.

    Args:
        saliency: float [B, C, H, W] with values in [0, 1].
        masks: bool [B, C, H, W], the regions ``R``.

    Returns:
        Two int64 tensors [B, C, 101]: predicted-pixel counts and intersection counts.
    """
    hist, _, _ = _scan(saliency, masks, moments=False)
    return _threshold_counts(hist)


def counts_and_moments(saliency: Tensor, masks: Tensor, seen: Tensor | None = None
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """`threshold_counts` and, from the same pass over the pixels, each pair's map mean and
    population variance outside and inside ``R``: float64 [B, C, 2] each (index 0 outside, 1
    inside), NaN where a side has no pixel, and the map's sum (its mass) outside and inside ``R``
    over every pixel, float64 [B, C, 2]. ``seen`` (bool [B, H, W], default all): the pixels the
    moments take; the others (frame pixels outside the model's window) are in neither side, and
    still in the counts and the masses.

    Every pixel is ``s = tau_r + e`` with ``r = round(100 s)`` and ``e`` exact in float32
    (``|e| <= 0.005``). The pass sums ``e`` and ``e^2`` in float64 per histogram code (pair, side,
    ``r``, ``s >= tau_r``), so a side's sum of squared deviations from its mean ``m`` is, code by
    code, ``n (tau_r - m)^2 + 2 (tau_r - m) sum(e) + sum(e^2)``: terms no larger than the
    deviations themselves, without the cancellation of ``sum(s^2) - n m^2`` (a map far from 0 with
    little spread keeps its digits), and exactly 0 for a side at one threshold value (all 0, all 1).
    """
    hist, sum_e, sum_e2 = _scan(saliency, masks, moments=True, seen=seen)
    predicted, inter = _threshold_counts(hist)
    shape = (*hist.shape[:2], hist.shape[-1] // _CODES_PER_SIDE, NUM_THRESHOLDS, 2)  # [B, C, side, r, s >= tau_r]
    tau = THRESHOLDS.to(device=hist.device, dtype=torch.float64).view(NUM_THRESHOLDS, 1)
    every = (hist.double().view(shape) * tau + sum_e.view(shape)).sum((-2, -1))  # [B, C, side]
    mass = every.view(*shape[:2], -1, 2).sum(2)  # seen or not: [B, C, inside]
    count, sum_e, sum_e2 = (part.view(shape)[:, :, :2] for part in (hist.double(), sum_e, sum_e2))  # seen sides
    pixels = count.sum((-2, -1))
    mean = (count * tau + sum_e).sum((-2, -1)) / pixels
    offset = tau - mean[..., None, None]
    squares = (count * offset**2 + 2 * offset * sum_e + sum_e2).sum((-2, -1))
    return predicted, inter, mean, squares.clamp(min=0) / pixels, mass


def _threshold_counts(hist: Tensor) -> tuple[Tensor, Tensor]:
    """``|B_k|`` and ``|B_k & R|`` from the code histogram [B, C, sides * 202]: the bin of code (r,
    above) is ``r - 1 + above``, so bin k collects (k, 1) and (k + 1, 0); seen or not, alike."""
    by_code = hist.view(*hist.shape[:2], hist.shape[-1] // (2 * _CODES_PER_SIDE), 2, NUM_THRESHOLDS, 2).sum(2)  # [B, C, inside, r, above]
    bins = by_code[..., 1].clone()
    bins[..., :-1] += by_code[..., 1:, 0]
    outside, inside = bins.unbind(2)
    return _suffix_sum(outside + inside), _suffix_sum(inside)


def _scan(saliency: Tensor, masks: Tensor, moments: bool, seen: Tensor | None = None
          ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """One pass over the pixels: per pair, a histogram of the pixels' codes and, if asked, the
    float64 sums of ``e`` and ``e^2`` per code.

    The bin of a pixel is ``r - 1 + (s >= r / 100)`` with ``r = round(100 s)``: ``100 s`` is
    within half a bin of the true bin edge, and the comparison against the float32 threshold
    ``THRESHOLDS[r]`` settles the pixels that rounding puts on the wrong side. It is decided on
    ``e = s - THRESHOLDS[r]``, which is exact (``s`` and the threshold are within a factor of 2, or
    ``r = 0``). A pixel's code keeps ``r`` and the comparison (the bin follows from them), so
    ``s = tau_r + e`` holds for all pixels of a code. Returns histograms [B, C, codes] over [side,
    r, comparison]: int64 counts and, with ``moments``, the sums. The side is inside ``R`` or not
    and, with ``seen`` [B, H, W], seen or not: the mask's byte with 2 added where unseen, made
    before the pass (one byte per pixel), so the pass itself is unchanged.

    On a CPU the pass is one compiled loop that reads each pixel once (`_scan_kernel`);
    elsewhere blocks of torch operations (`_scan_blocks`): a dozen elementwise passes and
    three histogram sums, which on a CPU cost about twice the loop.
    """
    if saliency.shape != masks.shape or saliency.ndim != 4:
        raise ValueError(
            f"saliency and masks must both be [B, C, H, W]; got {tuple(saliency.shape)} and {tuple(masks.shape)}"
        )
    batch, classes, height, width = saliency.shape
    pairs, pixels = batch * classes, height * width
    flat_saliency = saliency.reshape(pairs, pixels).float()
    flat_sides = masks.reshape(pairs, pixels).view(torch.uint8)
    sides = 2
    if seen is not None:
        unseen = (~seen.reshape(batch, 1, pixels)).view(torch.uint8)
        flat_sides = torch.add(flat_sides.view(batch, classes, pixels), unseen, alpha=2).view(pairs, pixels)
        sides = 4
    if saliency.device.type == "cpu":
        hist, sums, outside = _scan_cpu(flat_saliency, flat_sides, sides * _CODES_PER_SIDE, moments)
        if outside.any():
            image, slot = divmod(int(outside.nonzero()[0, 0]), classes)
            raise ValueError(f"saliency must lie in [0, 1] (min-max normalised); the map of batch image {image}, "
                             f"slot {slot} holds a value outside it or NaN. Normalise with "
                             "xbench.geometry.maps.normalise first.")
    else:
        hist, sums = _scan_blocks(flat_saliency, flat_sides, sides * _CODES_PER_SIDE, moments)
    shape = (batch, classes, sides * _CODES_PER_SIDE)
    if not moments:
        return hist.view(shape), None, None
    return hist.view(shape), sums[0].view(shape), sums[1].view(shape)


def _scan_cpu(saliency: Tensor, sides: Tensor, codes_per_pair: int, moments: bool
              ) -> tuple[Tensor, Tensor, Tensor]:
    """`_scan_kernel` on torch's CPU threads; a large pair's pixels are split into chunks,
    summed afterwards. Counts [pairs, codes], sums [2, pairs, codes] (e, e^2) and, per pair, whether
    a value lay outside [0, 1] (bool [pairs])."""
    pairs, pixels = saliency.shape
    chunks = max(1, -(-pixels // _CPU_CHUNK_PIXELS))
    threads = torch.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    counts, sums, outside = _scan_kernel(saliency.detach().contiguous().numpy(), sides.contiguous().numpy(),
                                         THRESHOLDS.numpy(), codes_per_pair, _CPU_CHUNK_PIXELS, chunks, moments)
    if torch.get_num_threads() != threads:  # numba's OpenMP pool, started by its first call, resets torch's
        torch.set_num_threads(threads)
    counts, sums, outside = torch.from_numpy(counts), torch.from_numpy(sums), torch.from_numpy(outside)
    if chunks > 1:
        counts = counts.view(pairs, chunks, codes_per_pair).sum(1)
        sums = sums.view(2, pairs, chunks, sums.shape[-1]).sum(2)
        outside = outside.view(pairs, chunks).any(1)
    return counts, sums, outside


def _compiled(function):
    """``function`` compiled by numba for all cores, cached on disk where numba finds a folder to write
    (beside this module, the user's cache folder or ``NUMBA_CACHE_DIR``); where it finds none (a
    read-only install and home), compiled anew in each process rather than failing the import."""
    try:
        return numba.njit(parallel=True, cache=True)(function)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        return numba.njit(parallel=True)(function)


@_compiled
def _scan_kernel(saliency, sides, thresholds, codes_per_pair, chunk, chunks, moments):
    """The pass of `_scan` as one loop over each chunk of a pair's pixels (float32 [pairs,
    pixels] maps, uint8 sides): per chunk, the code counts and, with ``moments``, the float64 sums
    of ``e`` and ``e^2`` per code, and whether a value lay outside [0, 1] or was NaN (skipped, so no
    code ever leaves its chunk's histogram)."""
    pairs, pixels = saliency.shape
    tasks = pairs * chunks
    counts = np.zeros((tasks, codes_per_pair), np.int64)
    sums = np.zeros((2, tasks, codes_per_pair if moments else 0), np.float64)
    outside = np.zeros(tasks, np.bool_)
    hundred = np.float32(100)
    for task in numba.prange(tasks):
        start = (task % chunks) * chunk
        stop = min(start + chunk, pixels)
        values, side = saliency[task // chunks, start:stop], sides[task // chunks, start:stop]
        count, sum_e, sum_e2 = counts[task], sums[0, task], sums[1, task]
        for i in range(values.size):
            s = values[i]
            if not (s >= 0 and s <= 1):
                outside[task] = True
                continue
            r = np.int32(np.rint(s * hundred))
            e = s - thresholds[r]
            code = np.int32(side[i]) * _CODES_PER_SIDE + 2 * r + np.int32(e >= 0)
            count[code] += 1
            if moments:
                wide = np.float64(e)
                sum_e[code] += wide
                sum_e2[code] += wide * wide
    return counts, sums, outside


def _scan_blocks(saliency: Tensor, sides: Tensor, codes_per_pair: int, moments: bool) -> tuple[Tensor, Tensor]:
    """The pass of `_scan` in torch operations, over blocks of pixels (whole pairs, or a part
    of one large pair), few and large so that kernel launches stay few. The histograms are
    ``index_add_``, not ``torch.bincount``, which reads the codes' minimum and maximum back to the
    host and would stall every step on CUDA. Counts [pairs, codes] and sums [2, pairs, codes]."""
    pairs, pixels = saliency.shape
    device = saliency.device
    columns = max(1, min(pixels, _BLOCK_ELEMENTS))
    rows = min(max(1, _BLOCK_ELEMENTS // columns), max(pairs, 1), _MAX_CODES_PER_BLOCK // codes_per_pair)
    size = rows * columns  # one block's elements at most; the buffers are reused by every block
    floats = torch.empty(4, size, device=device)
    codes = torch.empty(size, dtype=torch.int32, device=device)
    wide = torch.empty(2, size if moments else 0, dtype=torch.float64, device=device)
    offsets = (torch.arange(rows, dtype=torch.float32, device=device) * codes_per_pair).unsqueeze(1)
    ones = torch.ones((), dtype=torch.int64, device=device).expand(size)
    # a divisor on the device: CUDA divides by a Python number as a product with its reciprocal,
    # which is not always the correctly rounded r / 100 that THRESHOLDS holds
    hundred = torch.tensor(100.0, device=device)
    hist = torch.zeros(pairs * codes_per_pair, dtype=torch.int64, device=device)
    sums = torch.zeros(2 if moments else 0, pairs * codes_per_pair, dtype=torch.float64, device=device)

    def views(count: int, width: int) -> tuple:
        n = count * width
        return (*(b[:n].view(count, width) for b in floats), codes[:n], *(b[:n] for b in wide))

    full = views(rows, columns)
    for start in range(0, pairs, rows):
        stop = min(start + rows, pairs)
        span = slice(start * codes_per_pair, stop * codes_per_pair)
        for left in range(0, pixels, columns):
            right = min(left + columns, pixels)
            count = stop - start
            r, e, c, side_float, block_codes, e_wide, e_square = (
                full if (count, right - left) == (rows, columns) else views(count, right - left))
            s, side = saliency[start:stop, left:right], sides[start:stop, left:right]
            torch.mul(s, 100, out=r).round_()
            torch.div(r, hundred, out=e)  # bitwise THRESHOLDS[r]
            torch.sub(s, e, out=e)  # exact
            torch.ge(e, 0, out=c)  # 1.0 where s >= THRESHOLDS[r]
            c.add_(r, alpha=2).add_(side_float.copy_(side), alpha=_CODES_PER_SIDE)
            if count > 1:
                c.add_(offsets[:count])
            block_codes.copy_(c.view(-1))
            hist[span].index_add_(0, block_codes, ones[: block_codes.numel()])
            if moments:  # e in float64: index_add_ sums in its source's type
                torch.mul(e_wide.copy_(e.view(-1)), e_wide, out=e_square)
                sums[0, span].index_add_(0, block_codes, e_wide)
                sums[1, span].index_add_(0, block_codes, e_square)
    return hist.view(pairs, codes_per_pair), sums.view(len(sums), pairs, codes_per_pair)


def _suffix_sum(hist: Tensor) -> Tensor:
    return hist.flip(-1).cumsum(-1).flip(-1)


def pair_scores(predicted: Tensor, inter: Tensor) -> tuple[Tensor, Tensor]:
    """Per-pair Dice and IoU curves (float64) from the counts; ``|R|`` is ``inter[..., 0]``."""
    predicted = predicted.double()
    inter = inter.double()
    region = inter[..., :1]
    dice = 2 * inter / (predicted + region)
    iou = inter / (predicted + region - inter)
    return dice, iou


def contrast_to_noise(mean: Tensor, variance: Tensor) -> Tensor:
    """CNR from the map's mean and variance outside and inside ``R`` ([..., 2], as
    `counts_and_moments` gives them); NaN where undefined (a side without pixels, or no noise
    with a contrast)."""
    contrast = (mean[..., 1] - mean[..., 0]).abs()
    noise = variance.sum(-1).sqrt()
    cnr = torch.where(noise > 0, contrast / noise, torch.where(contrast == 0, 0.0, float("nan")))
    return torch.where(contrast.isnan(), float("nan"), cnr)


def grounding_records(saliency: Tensor, masks: Tensor, has_mask: Tensor, seen: Tensor | None = None
                      ) -> dict[str, Tensor]:
    """Functional twin of [`GroundingMetrics`][xbench.metrics.grounding.GroundingMetrics]:
    everything one batch contributes, per pair (``seen``: the pixels CNR takes, see
    `counts_and_moments`).

    Returns a dict of [B, C] tensors (``graded``: the pair enters grounding -- it has a mask and the
    mask is not empty; ``empty_mask``; ``region``; ``hit``; ``constant``; ``tied``; ``cnr``, NaN
    where not graded or undefined), [B, C, 101] tensors (``predicted``, ``inter``, ``dice``,
    ``iou``; zero for pairs that are not graded), ``mass`` [B, C, 2] (the map's sum outside and
    inside ``R``) and ``graded_pairs``, the (image, class) indices of the graded pairs.

    Pointing Game: the map's maximum is 1 after min-max normalisation, so the pixels attaining it
    are exactly the top bin; a hit is any of them inside ``R`` (ties count symmetrically). A
    constant map normalises to all zeros, has an empty top bin, and is a miss.
    """
    predicted, inter, mean, variance, mass = counts_and_moments(saliency, masks, seen)
    region = inter[..., 0]
    has_mask = has_mask.bool()
    graded = has_mask & (region > 0)
    top = predicted[..., -1]
    dice, iou = pair_scores(predicted, inter)
    keep = graded.unsqueeze(-1)
    cnr = torch.where(graded, contrast_to_noise(mean, variance), float("nan"))
    # The records keep the graded pairs only; selecting them costs one device-to-host sync per step
    # (nonzero must learn their number).
    graded_pairs = graded.nonzero(as_tuple=True)
    return {
        "graded": graded,
        "empty_mask": has_mask & (region == 0),
        "region": region,
        "hit": graded & (inter[..., -1] > 0),
        "constant": graded & (top == 0),
        "tied": graded & (top > 1),
        "predicted": predicted * keep,
        "inter": inter * keep,
        "dice": torch.where(keep, dice, 0.0),
        "iou": torch.where(keep, iou, 0.0),
        "cnr": cnr,
        "mass": mass,
        "graded_pairs": graded_pairs,
    }


def summarise_curves(
    pairs: Tensor,
    hits: Tensor,
    dice_sum: Tensor,
    iou_sum: Tensor,
    predicted_sum: Tensor,
    inter_sum: Tensor,
    cnr_pairs: Tensor,
    cnr_sum: Tensor,
) -> dict[str, Tensor]:
    """Per-class results and macro means from summed states."""
    count = pairs.double()
    region_sum = inter_sum[:, :1]  # |B_0 & R| = |R|: tau = 0 takes every pixel
    pooled_total = (predicted_sum + region_sum).double()
    curves = {
        "dice": dice_sum / count.unsqueeze(1),
        "iou": iou_sum / count.unsqueeze(1),
        "pooled_dice": 2 * inter_sum.double() / pooled_total,
        "pooled_iou": inter_sum.double() / (pooled_total - inter_sum.double()),
    }
    has_pairs = pairs > 0
    nan = torch.full_like(count, float("nan"))
    out: dict[str, Tensor] = {
        "pairs": pairs,
        "hits": hits,
        "pointing_game": torch.where(has_pairs, hits.double() / count.clamp(min=1), nan),
        "cnr_pairs": cnr_pairs,
        "cnr": torch.where(cnr_pairs > 0, cnr_sum / cnr_pairs.clamp(min=1), nan),
    }
    thresholds = THRESHOLDS.to(device=count.device, dtype=torch.float64)
    for name, curve in curves.items():
        curve = torch.where(has_pairs.unsqueeze(1), curve, float("nan"))
        out[f"{name}_curve"] = curve
        out[f"{name}@0.5"] = curve[:, FIXED_TAU_INDEX]
        # First maximum -> the smallest tau among equally good ones.
        best, best_index = torch.where(has_pairs.unsqueeze(1), curve, -1.0).max(dim=1)
        out[f"{name}@best"] = torch.where(has_pairs, best, nan)
        out[f"{name}@best_tau"] = torch.where(has_pairs, thresholds[best_index], nan)
    for name in run_keys("grounding", "macro"):
        values = out[name][has_pairs & ~out[name].isnan()]
        out[f"macro/{name}"] = values.mean() if values.numel() else torch.tensor(float("nan"))
    out["classes_with_pairs"] = has_pairs.sum()
    return out


class GroundingMetrics(RecordsMetric):
    """Pointing Game, Dice and IoU (per-image mean and pooled) at τ = 0.5 and at the best τ, and CNR.

    ``update(saliency, masks, has_mask, index, pair_class, seen)``:
        saliency: float [B, K, H, W] in [0, 1], min-max normalised per pair so that a non-constant
            map has maximum exactly 1 and a constant map is all zeros.
        masks: bool [B, K, H, W]; has_mask: bool [B, K]; index: int64 [B] global sample index.
        pair_class: int64 [B, K], the class each pair is scored under (a phrase dataset's queries:
            the query's finding; -1 for an unused slot); ``None``: pair ``k`` is class ``k``.
        seen: bool [B, H, W], the pixels the model saw (``xbench.geometry.maps.seen_pixels``), the
            only ones CNR takes; ``None``: all.

    Only pairs with ``has_mask`` and a non-empty mask are graded; pairs with ``has_mask`` but an
    empty mask are counted as ``empty_masks`` and left out. ``best`` values are chosen on the
    evaluated set itself (the paper's protocol) and must be labelled so wherever shown.

    ``map_quality``: also record, per graded pair, Quantus' localisation, complexity and random-logit
    values (`xbench.metrics.map_quality`; the relevance mass from this pass's sums). Class pairs
    only (no ``pair_class``): a run's own grounding, not a phrase view or a sanity step.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, num_classes: int, validate_args: bool = True, map_quality: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.validate_args = validate_args
        self.map_quality = map_quality
        per_class = lambda dtype: torch.zeros(num_classes, dtype=dtype)  # noqa: E731
        per_curve = lambda dtype: torch.zeros(num_classes, NUM_THRESHOLDS, dtype=dtype)  # noqa: E731
        for name in ("pairs", "hits", "constant_maps", "tied_maxima", "empty_masks", "cnr_pairs"):
            self.add_state(name, per_class(torch.int64), dist_reduce_fx="sum")
        self.add_state("cnr_sum", per_class(torch.float64), dist_reduce_fx="sum")
        for name in ("dice_sum", "iou_sum"):
            self.add_state(name, per_curve(torch.float64), dist_reduce_fx="sum")
        for name in ("predicted_sum", "inter_sum"):
            self.add_state(name, per_curve(torch.int64), dist_reduce_fx="sum")
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {
            "rec_index": ((), torch.int64),
            "rec_slot": ((), torch.int64),
            "rec_class": ((), torch.int64),
            "rec_cnr": ((), torch.float64),
            "rec_predicted": ((NUM_THRESHOLDS,), torch.int32),
            "rec_inter": ((NUM_THRESHOLDS,), torch.int32),
            **({f"rec_{name}": ((), torch.float64) for name in MAP_QUALITY_VALUES} if self.map_quality else {}),
        }

    def update(self, saliency: Tensor, masks: Tensor, has_mask: Tensor, index: Tensor | None = None,
               pair_class: Tensor | None = None, seen: Tensor | None = None) -> None:
        if self.validate_args:
            _check_grounding_inputs(saliency, masks, has_mask, self.num_classes, pair_class, seen)
        r = grounding_records(saliency, masks, has_mask, seen)
        cnr = r["cnr"]
        defined = ~cnr.isnan()
        for state, values in (
            (self.pairs, r["graded"]), (self.hits, r["hit"]), (self.constant_maps, r["constant"]),
            (self.tied_maxima, r["tied"]), (self.empty_masks, r["empty_mask"]), (self.cnr_pairs, defined),
            (self.cnr_sum, torch.where(defined, cnr, 0.0)), (self.dice_sum, r["dice"]), (self.iou_sum, r["iou"]),
            (self.predicted_sum, r["predicted"]), (self.inter_sum, r["inter"]),
        ):
            state += _sum_by_class(values, pair_class, self.num_classes)
        # Records keep only the graded pairs (a few percent of a multi-label dataset's pairs).
        image, slot = r["graded_pairs"]
        self.rec_index.append(torch.full_like(image, -1) if index is None else index[image])
        self.rec_slot.append(slot)
        self.rec_class.append(slot if pair_class is None else pair_class[image, slot])
        self.rec_cnr.append(cnr[image, slot])
        self.rec_predicted.append(r["predicted"][image, slot].int())
        self.rec_inter.append(r["inter"][image, slot].int())
        if self.map_quality:
            if pair_class is not None:
                raise ValueError("map_quality scores class pairs: a run's grounding, without pair_class")
            if index is None:
                raise ValueError("map_quality needs each image's index: the random logit's draw is seeded by it")
            other = None
            if self.num_classes > 1:  # each pair's image's map of the class its random logit draws
                other = saliency[image, other_class(index[image], slot, self.num_classes)]
            values = pair_values(saliency[image, slot], masks[image, slot], r["mass"][image, slot], other,
                                 top_k(saliency.shape[-2] * saliency.shape[-1]))
            for name, value in values.items():
                getattr(self, f"rec_{name}").append(value)

    def compute(self) -> MetricValues:
        out = summarise_curves(
            self.pairs, self.hits, self.dice_sum, self.iou_sum, self.predicted_sum, self.inter_sum,
            self.cnr_pairs, self.cnr_sum,
        )
        out["constant_maps"] = self.constant_maps
        out["tied_maxima"] = self.tied_maxima
        out["empty_masks"] = self.empty_masks
        out["records"] = self.records()
        return MetricValues(out)

    def records(self) -> dict[str, Tensor]:
        """Per graded pair, in (image, slot) order: image index, slot (the class, or a phrase
        dataset's query slot), class, ``|R|``, hit, CNR, the 101-point counts and, with
        ``map_quality``, its values by name."""
        index, slot = dim_zero_cat(self.rec_index), dim_zero_cat(self.rec_slot)
        slots = int(slot.max()) + 1 if slot.numel() else 1
        order = torch.argsort(index * slots + slot, stable=True)
        inter = dim_zero_cat(self.rec_inter)[order].long()
        return {
            "index": index[order],
            "slot": slot[order],
            "class": dim_zero_cat(self.rec_class)[order],
            "region": inter[:, 0],  # |B_0 & R| = |R|
            "hit": inter[:, -1] > 0,  # a top-bin pixel (the map's maximum) inside R
            "cnr": dim_zero_cat(self.rec_cnr)[order],
            "predicted": dim_zero_cat(self.rec_predicted)[order].long(),
            "inter": inter,
            **({name: dim_zero_cat(getattr(self, f"rec_{name}"))[order] for name in MAP_QUALITY_VALUES}
               if self.map_quality else {}),
        }


def _sum_by_class(values: Tensor, pair_class: Tensor | None, num_classes: int) -> Tensor:
    """Per-pair values [B, K, ...] summed over images into their classes: [C, ...]."""
    if pair_class is None:
        return values.sum(0)
    flat = values.flatten(0, 1)
    flat = flat.long() if flat.dtype == torch.bool else flat
    # unused slots (class -1) hold zeros: adding them to class 0 changes nothing
    return flat.new_zeros((num_classes, *flat.shape[1:])).index_add_(0, pair_class.clamp(min=0).flatten(), flat)


def _check_grounding_inputs(saliency: Tensor, masks: Tensor, has_mask: Tensor, num_classes: int,
                            pair_class: Tensor | None, seen: Tensor | None = None) -> None:
    if pair_class is None and (saliency.ndim != 4 or saliency.shape[1] != num_classes):
        raise ValueError(f"saliency must be [B, {num_classes}, H, W]; got {tuple(saliency.shape)}")
    if pair_class is not None:
        if saliency.ndim != 4 or pair_class.shape != saliency.shape[:2]:
            raise ValueError(f"saliency must be [B, K, H, W] and pair_class [B, K]; got {tuple(saliency.shape)} "
                             f"and {tuple(pair_class.shape)}")
        if bool(((pair_class < -1) | (pair_class >= num_classes)).any()) or bool((has_mask & (pair_class < 0)).any()):
            raise ValueError(f"pair_class must hold classes 0..{num_classes - 1} (-1 only for slots without a mask)")
    if masks.shape != saliency.shape or masks.dtype != torch.bool:
        raise ValueError(f"masks must be bool with the saliency's shape {tuple(saliency.shape)}; "
                         f"got {masks.dtype} {tuple(masks.shape)}")
    if seen is not None and (seen.dtype != torch.bool or seen.shape != (saliency.shape[0], *saliency.shape[2:])):
        raise ValueError(f"seen must be bool [B, H, W] = {[saliency.shape[0], *saliency.shape[2:]]}; "
                         f"got {seen.dtype} {tuple(seen.shape)}")
    if has_mask.shape != saliency.shape[:2]:
        raise ValueError(f"has_mask must be [B, C] = {tuple(saliency.shape[:2])}; got {tuple(has_mask.shape)}")
    if not saliency.is_floating_point():
        raise ValueError(f"saliency must be floating point; got {saliency.dtype}")
    if saliency.numel():
        low, high = torch.aminmax(saliency.float())
        if not (0 <= low.item() and high.item() <= 1):
            raise ValueError(
                f"saliency must lie in [0, 1] (min-max normalised); got values in [{low.item()}, {high.item()}]"
                " (NaN appears as nan). Normalise with xbench.geometry.maps.normalise first."
            )
        lows, peaks = torch.aminmax(saliency.flatten(2), dim=-1)
        if not bool(((lows == 0) & ((peaks == 0) | (peaks == 1))).all()):
            raise ValueError(
                "each (image, class) map must be min-max normalised: minimum exactly 0 and maximum "
                "exactly 1, or all zeros for a constant map. Normalise with "
                "xbench.geometry.maps.normalise first."
            )
