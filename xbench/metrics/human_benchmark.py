"""cheXlocalize's human benchmark, scored as their ``eval.py`` scores it, and the percentage decrease
of a model from it, as their ``calculate_percentage_decrease.py`` computes it; beside it XBench's
paired form.

Per (CXR, task), at native size (`hb_iou`, `hb_hit`): the human benchmark's IoU with the ground
truth is NaN unless both its segmentation and the ground truth are non-empty (their
``true_pos_only``, `true_positive_iou`); its hit is 1 when any of its salient points (x, y) lies in
the ground-truth mask (read at ``[int(y), int(x)]``), 0 when the mask is non-empty and no point
does (or it gave none), NaN when the mask is empty.

Their bootstrap (`chexlocalize_resamples`) draws 1,000 resamples of the CXRs (rows sorted by id)
with NumPy's legacy random state seeded once (``np.random.seed(0)``, one ``np.random.choice`` per
replicate), and a task's mean in a replicate skips NaN. Their interval is the 25th and 975th of the
1,000 sorted replicates (NaN sorted last), their "mean" the mean of the replicates, each rounded to
3 decimals (`eval_summary`). The percentage decrease (`percentage_decrease`) is (HB − model) / HB
per replicate, the point estimate from the two replicate means, the "Average" row from the tasks'
means (rounded first, as theirs). Both tables are bootstrapped with the same seed and CXR count,
so replicate r of the model and of the HB resample the same CXRs: their pairing lives in the row
order of two files.

`paired_gap` states that pairing: one resample of the CXRs for model and HB, model − HB and the
percentage decrease per replicate, the estimate from the sample itself (not the replicates' mean)
and XBench's percentile interval (`xbench.metrics.bootstrap`).

A caller (the report) puts each side's per-(image, task) values, a model's and the human
benchmark's, into a [`ScoreTable`][xbench.metrics.human_benchmark.ScoreTable] over the same CXRs
and tasks, then calls [`percentage_decrease`][xbench.metrics.human_benchmark.percentage_decrease]
(their numbers) and [`paired_gap`][xbench.metrics.human_benchmark.paired_gap] (XBench's).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from xbench.metrics.bootstrap import (CONFIDENCE, REPLICATES, SEED, paired_difference, percentile_interval,
                                      random_stream, resample_weights)
from xbench.geometry.maps import normalise
from xbench.metrics.native import true_positive_iou, xbench_iou_and_hit

#: Their bootstrap's replicates and seed (``eval.py``: ``bootstrap_metric(df, 1000)``, ``--seed 0``).
THEIR_REPLICATES, THEIR_SEED = 1000, 0
#: Their interval's tails (``compute_cis(..., confidence_level=0.05)``) and their rounding.
THEIR_ALPHA, THEIR_DECIMALS = 0.05, 3
AVERAGE = "Average"


def hb_iou(hb_mask: np.ndarray | None, gt_mask: np.ndarray | None) -> float:
    """The human benchmark's IoU on one (CXR, task) as their ``calculate_iou`` with
    ``true_pos_only``: NaN unless both masks (bool [H, W], ``None`` for empty) are non-empty."""
    if hb_mask is None or gt_mask is None:
        return float("nan")
    return true_positive_iou(torch.from_numpy(np.asarray(hb_mask, bool)), torch.from_numpy(np.asarray(gt_mask, bool)))


def hb_hit(points: Iterable[tuple[float, float]], gt_mask: np.ndarray | None) -> float:
    """The human benchmark's hit on one (CXR, task) as their ``get_hb_hitrates``: NaN where the
    ground truth (bool [H, W], ``None`` for empty) is empty; else 1 when a point (x, y) lies in it
    (pixel ``[int(y), int(x)]``), 0 when none does or there is none."""
    if gt_mask is None or not np.any(gt_mask):
        return float("nan")
    return float(any(gt_mask[int(y), int(x)] for x, y in points))


def reader_row(native_map: torch.Tensor, region: torch.Tensor | None, points: Iterable[tuple[float, float]],
               mask: torch.Tensor) -> tuple[float, ...]:
    """A human reader's row of `xbench.metrics.native.CHEXLOCALIZE_COLUMNS`
    for one pair at native size (``mask`` bool [H, W], non-empty): XBench's IoU at τ = 0.5 and hit
    of the reader's map (float [H, W], `xbench.data.readers.ReaderSet.native_mark`), min-max
    normalised as a model's; `hb_iou` of its ``region`` (bool [H, W] or ``None``) in both of
    cheXlocalize's IoU columns (a drawn segmentation needs no binarisation); `hb_hit` of its points."""
    truth = mask.bool().numpy()
    iou, hit = xbench_iou_and_hit(normalise(native_map.float()[None, None])[0, 0], mask)
    theirs = hb_iou(None if region is None else region.numpy(), truth)
    return iou, hit, theirs, theirs, hb_hit(points, truth)


@dataclass(frozen=True)
class ScoreTable:
    """One reader's or model's per-CXR scores: ``values`` float64 [N, T], NaN where a (CXR, task)
    has no score; rows the split's CXRs sorted by id (their ``eval.py``'s order, which their
    resampling indexes), columns ``tasks``."""

    cxr_ids: tuple[str, ...]
    tasks: tuple[str, ...]
    values: np.ndarray

    @classmethod
    def from_pairs(cls, scores: Mapping[tuple[str, str], float], cxr_ids: Iterable[str], tasks: Sequence[str]
                   ) -> ScoreTable:
        """From ``(cxr_id, task) -> value``. ``cxr_ids``: every CXR of the split, with or without a
        score (each is a row of the resample, as every CXR of their ground-truth file is); a pair
        absent from ``scores`` is NaN. A score for a CXR or task not listed is an error."""
        rows, columns = sorted(set(cxr_ids)), tuple(tasks)
        row_of = {cxr_id: i for i, cxr_id in enumerate(rows)}
        column_of = {task: j for j, task in enumerate(columns)}
        unknown = sorted(pair for pair in scores if pair[0] not in row_of or pair[1] not in column_of)
        if unknown:
            raise ValueError(f"{len(unknown)} scores name a CXR or task outside the table (e.g. {unknown[0]}); "
                             f"the table has {len(rows)} CXRs and the tasks {list(columns)}")
        values = np.full((len(rows), len(columns)), np.nan)
        for (cxr_id, task), value in scores.items():
            values[row_of[cxr_id], column_of[task]] = value
        return cls(tuple(rows), columns, values)


def _same_rows(model: ScoreTable, human: ScoreTable) -> None:
    if model.cxr_ids != human.cxr_ids or model.tasks != human.tasks:
        raise ValueError(
            f"the model's table ({len(model.cxr_ids)} CXRs, tasks {list(model.tasks)}) and the human benchmark's "
            f"({len(human.cxr_ids)} CXRs, tasks {list(human.tasks)}) must hold the same CXRs and tasks: a "
            "percentage decrease compares the two on the same images"
        )


def chexlocalize_resamples(num_cxrs: int, replicates: int = THEIR_REPLICATES, seed: int = THEIR_SEED) -> np.ndarray:
    """int64 [R, N]: the rows their ``bootstrap_metric`` draws, replicate by replicate, after
    ``np.random.seed(seed)`` (NumPy's legacy stream, whose values NumPy keeps across versions)."""
    state = np.random.RandomState(seed)
    return np.stack([state.choice(num_cxrs, size=num_cxrs, replace=True) for _ in range(replicates)])


def _nanmean(values: np.ndarray, axis: int) -> np.ndarray:
    """pandas' ``mean``: NaN skipped, NaN where nothing is left (without NumPy's warning)."""
    defined = ~np.isnan(values)
    count = defined.sum(axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(defined, values, 0).sum(axis) / np.where(count, count, np.nan)


def bootstrap_means(table: ScoreTable, resamples: np.ndarray) -> np.ndarray:
    """float64 [R, T]: each task's mean over the resampled rows (NaN skipped), as their
    ``{iou,hitmiss}_bootstrap_results_per_cxr.csv``."""
    return _nanmean(table.values[resamples], axis=1)


def _their_interval(replicates: np.ndarray) -> tuple[float, float, float]:
    """Their ``compute_cis`` unrounded: the ``int(0.025 R) - 1``-th and ``int(0.975 R) - 1``-th of the
    sorted replicates (NaN last) and the replicates' mean (NaN skipped)."""
    ordered = np.sort(replicates)
    count = len(ordered)
    lower = ordered[int(THEIR_ALPHA / 2 * count) - 1]
    upper = ordered[int((1 - THEIR_ALPHA / 2) * count) - 1]
    return float(lower), float(_nanmean(replicates, axis=0)), float(upper)


def _round(value: float) -> float:
    return float(np.round(value, THEIR_DECIMALS))


def eval_summary(table: ScoreTable, replicates: int = THEIR_REPLICATES, seed: int = THEIR_SEED
                 ) -> dict[str, dict[str, float]]:
    """Their ``{miou,hitrate}_summary_results.csv``: per task ``lower``, ``mean`` (of the
    replicates) and ``upper``, rounded to 3 decimals as they print them."""
    means = bootstrap_means(table, chexlocalize_resamples(len(table.cxr_ids), replicates, seed))
    out = {}
    for t, task in enumerate(table.tasks):
        lower, mean, upper = _their_interval(means[:, t])
        out[task] = {"lower": _round(lower), "mean": _round(mean), "upper": _round(upper)}
    return out


def percentage_decrease(model: ScoreTable, human: ScoreTable, replicates: int = THEIR_REPLICATES,
                        seed: int = THEIR_SEED) -> dict[str, dict[str, float]]:
    """Their ``{miou,hitrate}_pct_decrease.csv``, per task and ``"Average"``: ``hb`` and ``pred``
    (the replicates' means), ``pct_diff`` (100 (hb − pred) / hb, rounded to 3), ``pct_diff_lower``
    and ``pct_diff_upper`` (their interval of (HB − model) / HB over the replicates, rounded to 3,
    times 100, rounded again). ``"Average"``: ``hb`` and ``pred`` the tasks' means rounded to 3,
    ``pct_diff`` from those rounded values, its interval that of 100 (HB − model) / HB on the
    replicates' means over tasks. Both tables are resampled by their rule with the same seed, so
    replicate r draws the same CXRs for both, as their two ``eval.py`` runs do."""
    _same_rows(model, human)
    resamples = chexlocalize_resamples(len(human.cxr_ids), replicates, seed)
    hb, pred = bootstrap_means(human, resamples), bootstrap_means(model, resamples)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = (hb - pred) / hb
    out = {}
    hb_means, pred_means = _nanmean(hb, axis=0), _nanmean(pred, axis=0)
    for t, task in enumerate(human.tasks):
        lower, _, upper = _their_interval(ratio[:, t])
        with np.errstate(invalid="ignore", divide="ignore"):
            pct = (hb_means[t] - pred_means[t]) / hb_means[t] * 100
        out[task] = {"hb": float(hb_means[t]), "pred": float(pred_means[t]), "pct_diff": _round(pct),
                     "pct_diff_lower": _round(_round(lower) * 100), "pct_diff_upper": _round(_round(upper) * 100)}
    average_hb, average_pred = _round(_nanmean(hb_means, axis=0)), _round(_nanmean(pred_means, axis=0))
    hb_average, pred_average = _nanmean(hb, axis=1), _nanmean(pred, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        average_pct = (average_hb - average_pred) / average_hb * 100
        lower, _, upper = _their_interval(100 * (hb_average - pred_average) / hb_average)
    out[AVERAGE] = {"hb": average_hb, "pred": average_pred, "pct_diff": _round(average_pct),
                    "pct_diff_lower": _round(_round(lower)), "pct_diff_upper": _round(_round(upper))}
    return out


def _weighted_means(table: ScoreTable, weights: torch.Tensor) -> torch.Tensor:
    """float64 [R + 1, T]: each task's mean over the weighted CXRs where it is defined (NaN where none is)."""
    values = torch.from_numpy(table.values)
    defined = ~values.isnan()
    total = weights @ torch.where(defined, values, 0.0)
    count = weights @ defined.double()
    return total / count.where(count > 0, torch.nan)


def paired_gap(model: ScoreTable, human: ScoreTable, replicates: int = REPLICATES, seed: int = SEED,
               confidence: float = CONFIDENCE) -> dict[str, dict[str, dict[str, float]]]:
    """XBench's paired form, per task and ``"Average"`` (the tasks' mean): ``model``, ``human``
    (each the mean over its defined pairs), ``difference`` (model − human: ``estimate``, ``lower``,
    ``upper``, ``replicates`` used, ``a_better`` = P(model > human)) and ``percentage_decrease``
    (100 (human − model) / human), each an estimate on the CXRs themselves with the percentile
    interval of ``replicates`` resamples of the CXRs, the same resample for model and human
    (stream ``(seed, "chexlocalize", "human_benchmark")``). A replicate where a value is undefined
    (no pair drawn, or a human mean of 0 under the percentage) is left out and counted."""
    _same_rows(model, human)
    weights = resample_weights(len(human.cxr_ids), replicates, random_stream(seed, "chexlocalize", "human_benchmark"))
    ours, theirs = _weighted_means(model, weights), _weighted_means(human, weights)
    ours = torch.cat([ours, ours.nanmean(dim=1, keepdim=True)], dim=1)
    theirs = torch.cat([theirs, theirs.nanmean(dim=1, keepdim=True)], dim=1)
    difference = paired_difference(ours, theirs, confidence)
    decrease = percentile_interval(100 * (theirs - ours) / theirs.where(theirs != 0, torch.nan), confidence)
    out = {}
    for t, task in enumerate((*human.tasks, AVERAGE)):
        out[task] = {
            "model": float(ours[0, t]), "human": float(theirs[0, t]),
            "difference": {name: float(value[t]) for name, value in difference.items()},
            "percentage_decrease": {name: float(value[t]) for name, value in decrease.items()},
        }
    return out
