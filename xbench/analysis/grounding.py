"""Grounding statistics of every bootstrap replicate at once, from the 101-point pair counts.

Each graded pair contributes a feature row: its Dice curve (101 values), its IoU curve, its
Pointing Game hit, a 1 (to count pairs), per lesion-size stratum the same count, hit and Dice at
0.5 when the pair is in that stratum, and last its CNR and a 1 where the CNR is defined (0 and 0
where not: a class's CNR is the mean over its pairs with one). A class's replicate sums are
``weights[:, images] @ features`` -- one matrix product for all replicates -- taken per
cross-fitting fold, so the fold sums, their complements and the totals all come from it. From the
sums, per replicate:

- Pointing Game, Dice and IoU at tau = 0.5, CNR;
- Dice and IoU at the best tau, the tau re-chosen inside every replicate (so the interval
  includes the selection); the smallest tau among equal maxima, as in ``xbench.metrics``;
- Dice and IoU at a calibrated tau, chosen where it is not scored: by cross-fitting (for each
  fold, the tau that maximises the mean over the other folds' pairs -- total minus fold sums --
  scores the fold's own pairs) or on the validation run (the tau chosen on the validation
  replicate scores the test replicate);
- per lesion-size stratum: pair counts, hits, and Dice numerators at 0.5, best and calibrated tau
  (the last two pick each pair's Dice at its replicate's tau, then sum with the weights).

Means are over the class's pairs in the replicate (a pair drawn twice counts twice); a class with
no pair in a replicate is NaN there and left out of that replicate's macro mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from xbench.analysis.runs import GradedPairs
from xbench.metrics.grounding import FIXED_TAU_INDEX, NUM_THRESHOLDS, THRESHOLDS, pair_scores

CURVES = ("dice", "iou")
_SLICES = {"dice": slice(0, NUM_THRESHOLDS), "iou": slice(NUM_THRESHOLDS, 2 * NUM_THRESHOLDS)}
_HIT, _COUNT = 2 * NUM_THRESHOLDS, 2 * NUM_THRESHOLDS + 1
_STRATA = _COUNT + 1  # first of the per-stratum columns: count, hit, Dice at 0.5 (S each)
_TAUS = THRESHOLDS.double()
#: Per-stratum sums kept for every class: counts, then numerators of the stratum means.
#: ``calibrated_pairs`` counts the pairs of classes whose calibrated tau is defined in the replicate.
STRATUM_SUMS = ("pairs", "hits", "dice@0.5", "dice@best", "calibrated_pairs", "dice@calibrated")


@dataclass(frozen=True)
class CrossFitting:
    """Calibrate tau by K-fold cross-fitting over images (``folds``: int64 [N], values 0..K-1)."""

    folds: Tensor
    num_folds: int


@dataclass(frozen=True)
class ValidationChoice:
    """Calibrate tau on a validation run: per curve, int64 [R + 1, C] indices of the tau chosen
    there in each replicate (-1 where the validation replicate has no pair of the class)."""

    best_index: dict[str, Tensor]


@dataclass(frozen=True)
class GroundingStatistics:
    """Row 0 the estimate, rows 1..R the replicates.

    ``per_class``: name -> float64 [R + 1, C]; ``best_index``: curve -> int64 [R + 1, C] (-1: none);
    ``calibrated_tau``: curve -> float64 [R + 1, C, K] (per fold; K = 1 for a validation choice);
    ``strata``: name (`STRATUM_SUMS`; the calibrated ones only with a calibration) ->
    float64 [R + 1, C, S] sums.
    """

    per_class: dict[str, Tensor]
    best_index: dict[str, Tensor]
    calibrated_tau: dict[str, Tensor]
    strata: dict[str, Tensor]


def pair_features(pairs: GradedPairs) -> Tensor:
    """float64 [P, 2 * 101 + 2]: Dice curve, IoU curve, hit, 1."""
    dice, iou = pair_scores(pairs.predicted, pairs.inter)
    ones = torch.ones(len(pairs.hit), 1, dtype=torch.float64)
    return torch.cat([dice, iou, pairs.hit.double().unsqueeze(1), ones], 1)


def size_strata(region: Tensor, image_size: int, boundaries: Sequence[float]) -> Tensor:
    """int64 [P]: the stratum of each pair by area fraction ``|R| / image_size**2``.

    Stratum ``i`` holds ``boundaries[i - 1] <= fraction < boundaries[i]`` (a pair exactly on a
    boundary goes to the larger stratum).
    """
    fraction = region.double() / float(image_size) ** 2
    return torch.bucketize(fraction, torch.tensor(list(boundaries), dtype=torch.float64), right=True)


def _best(curve: Tensor, defined: Tensor) -> Tensor:
    """Index of the first maximum along the last dim; -1 where not ``defined`` (where a curve
    without pairs is 0/0 = NaN, whatever argmax makes of it is masked)."""
    return torch.where(defined, curve.argmax(-1), -1)


def _at(values: Tensor, index: Tensor) -> Tensor:
    """``values[..., index]`` per leading position (index -1 reads 0; callers mask)."""
    return values.gather(-1, index.clamp(min=0).unsqueeze(-1)).squeeze(-1)


def grounding_statistics(
    pairs: GradedPairs,
    num_classes: int,
    weights: Tensor,
    calibration: CrossFitting | ValidationChoice | None = None,
    strata: Tensor | None = None,
    num_strata: int = 1,
) -> GroundingStatistics:
    """All grounding statistics of one run for the sample (row 0) and every replicate.

    Args:
        pairs: the run's graded pairs (``pairs.image`` indexes the columns of ``weights``).
        weights: float64 [R + 1, N] image multiplicities (`resample_weights`).
        calibration: how the calibrated tau is chosen; ``None`` skips it.
        strata: int64 [P] stratum of each pair (`size_strata`); ``None``: one stratum.
    """
    rows = weights.shape[0]
    image_weights = weights.T.contiguous()  # [N, R + 1]: an image's multiplicities side by side
    curves = pair_features(pairs)
    if strata is None:
        strata = torch.zeros(len(pairs.cls), dtype=torch.int64)
    in_stratum = torch.nn.functional.one_hot(strata, num_strata).double()
    cnr_defined = ~pairs.cnr.isnan()
    features = torch.cat([curves, in_stratum, in_stratum * curves[:, _HIT, None],
                          in_stratum * curves[:, FIXED_TAU_INDEX, None],
                          pairs.cnr.nan_to_num(0.0).unsqueeze(1), cnr_defined.double().unsqueeze(1)], 1)
    if isinstance(calibration, CrossFitting):
        num_folds, fold = calibration.num_folds, calibration.folds[pairs.image]
    else:
        num_folds, fold = 1, torch.zeros(len(pairs.cls), dtype=torch.int64)

    nan = torch.full((rows, num_classes), float("nan"), dtype=torch.float64)
    per_class = {name: nan.clone() for name in (
        "pairs", "pointing_game", "cnr", *(f"{c}@{s}" for c in CURVES for s in ("0.5", "best", "best_tau")))}
    best_index = {c: torch.full((rows, num_classes), -1, dtype=torch.int64) for c in CURVES}
    calibrated_tau: dict[str, Tensor] = {}
    if calibration is not None:
        per_class.update({f"{c}@calibrated": nan.clone() for c in CURVES})
        calibrated_tau = {c: torch.full((rows, num_classes, num_folds), float("nan"), dtype=torch.float64)
                          for c in CURVES}
    kept = STRATUM_SUMS if calibration is not None else STRATUM_SUMS[:4]
    stratum_sums = {name: weights.new_zeros(rows, num_classes, num_strata) for name in kept}

    # Pairs sorted by class, then fold: each (class, fold) is one contiguous slice.
    block = pairs.cls * num_folds + fold
    order = torch.argsort(block, stable=True)
    bounds = [0, *torch.bincount(block, minlength=num_classes * num_folds).cumsum(0).tolist()]
    stratum_columns = {name: slice(_STRATA + i * num_strata, _STRATA + (i + 1) * num_strata)
                       for i, name in enumerate(("pairs", "hits", "dice@0.5"))}
    for c in range(num_classes):
        lo, hi = bounds[c * num_folds], bounds[(c + 1) * num_folds]
        members = order[lo:hi]
        drawn = image_weights[pairs.image[members]]  # [n, R + 1]
        x = features[members]
        by_fold = weights.new_empty(num_folds, rows, features.shape[1])
        for f in range(num_folds):
            a, b = bounds[c * num_folds + f] - lo, bounds[c * num_folds + f + 1] - lo
            by_fold[f] = (x[a:b].T @ drawn[a:b]).T  # [R + 1, F]; this operand order copies least
        total = by_fold.sum(0)
        count = total[:, _COUNT]
        present = count > 0
        per_class["pairs"][:, c] = count
        per_class["pointing_game"][:, c] = torch.where(present, total[:, _HIT] / count, float("nan"))
        cnr_sum, cnr_count = total[:, -2], total[:, -1]
        per_class["cnr"][:, c] = torch.where(cnr_count > 0, cnr_sum / cnr_count, float("nan"))
        for curve_name, where in _SLICES.items():
            means = total[:, where] / count.unsqueeze(1)  # [R + 1, 101]
            best = _best(means, present)
            best_index[curve_name][:, c] = best
            per_class[f"{curve_name}@0.5"][:, c] = means[:, FIXED_TAU_INDEX]
            per_class[f"{curve_name}@best"][:, c] = torch.where(present, _at(means, best), float("nan"))
            per_class[f"{curve_name}@best_tau"][:, c] = torch.where(present, _TAUS[best.clamp(min=0)], float("nan"))
        for name, columns in stratum_columns.items():
            stratum_sums[name][:, c] = total[:, columns]
        pair_dice = x[:, _SLICES["dice"]]  # [n, 101]
        member_strata = in_stratum[members].T  # [S, n]

        def stratum_sum_at(tau_of_pair: Tensor) -> Tensor:
            """[R + 1, S]: per stratum, the weighted sum of each pair's Dice at its tau index [n, R + 1]."""
            return (member_strata @ pair_dice.gather(1, tau_of_pair).mul_(drawn)).T

        best_dice = best_index["dice"][:, c].clamp(min=0)
        stratum_sums["dice@best"][:, c] = stratum_sum_at(best_dice.expand(len(members), -1))
        if calibration is None:
            continue
        held_count = by_fold[:, :, _COUNT]  # [K, R + 1]
        if isinstance(calibration, CrossFitting):
            # Each fold's complement: its sums rank the taus as its means do (one positive count).
            others = total[:, :_HIT] - by_fold[:, :, :_HIT]  # [K, R + 1, 202]
            others_count = count - held_count
        for curve_name, where in _SLICES.items():
            if isinstance(calibration, CrossFitting):
                chosen = _best(others[:, :, where], others_count > 0)  # [K, R + 1]
            else:
                chosen = calibration.best_index[curve_name][:, c].unsqueeze(0)  # [1, R + 1]
            undefined = ((held_count > 0) & (chosen < 0)).any(0) | ~present
            held = _at(by_fold[:, :, where], chosen).sum(0)
            per_class[f"{curve_name}@calibrated"][:, c] = torch.where(undefined, float("nan"), held / count)
            calibrated_tau[curve_name][:, c] = torch.where(chosen >= 0, _TAUS[chosen.clamp(min=0)], float("nan")).T
            if curve_name == "dice":
                defined = ~undefined.unsqueeze(1)
                held_strata = stratum_sum_at(chosen.clamp(min=0)[fold[members]])
                stratum_sums["dice@calibrated"][:, c] = torch.where(defined, held_strata, 0.0)
                stratum_sums["calibrated_pairs"][:, c] = torch.where(defined, stratum_sums["pairs"][:, c], 0.0)
    return GroundingStatistics(per_class, best_index, calibrated_tau, stratum_sums)


def stratum_means(strata: dict[str, Tensor]) -> dict[str, Tensor]:
    """Per-stratum values [R + 1, C + 1, S] from the sums; index C pools every class's pairs.

    ``pairs`` is the pair count; ``pointing_game`` and the Dice values are means over the
    stratum's pairs (NaN where it has none). The pooled calibrated Dice leaves out the classes
    whose calibrated tau is undefined in the replicate.
    """
    pooled = {name: torch.cat([sums, sums.sum(1, keepdim=True)], 1) for name, sums in strata.items()}

    def mean(name: str, count: Tensor) -> Tensor:
        return torch.where(count > 0, pooled[name] / count, float("nan"))

    count = pooled["pairs"]
    out = {"pairs": count, "pointing_game": mean("hits", count), "dice@0.5": mean("dice@0.5", count),
           "dice@best": mean("dice@best", count)}
    if "dice@calibrated" in pooled:
        out["dice@calibrated"] = mean("dice@calibrated", pooled["calibrated_pairs"])
    return out
