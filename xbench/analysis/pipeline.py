"""From results folders to every analysis: group by dataset, resample once, compute per run.

[`analyze`][xbench.analysis.pipeline.analyze] is the one entry point (the CLI and the report call
it); the tables in [`xbench.analysis.tables`][xbench.analysis.tables] read its `Analysis`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from xbench.analysis.explanations import check_statistics
from xbench.metrics.bootstrap import assign_folds, random_stream, resample_weights
from xbench.analysis.grounding import (
    CrossFitting,
    ValidationChoice,
    grounding_statistics,
    size_strata,
    stratum_means,
)
from xbench.metrics.recognition import recognition_statistics
from xbench.analysis.runs import DatasetRuns, Run, find_run_folders, group_runs, load_run
from xbench.analysis.settings import Settings
from xbench.results.folder import CHECK_TABLES, DAMAGED, GAZE, METRICS, PAIRS, QUERIES

#: How far an estimate re-derived from a folder's records may lie from ``metrics.json``'s own:
#: float noise (the run sums in float64 as the analysis does, in another order), relative to the
#: value or absolute below 1 -- a hand edit or a swapped table moves it by far more.
TOLERANCE = 1e-9
#: The grounding estimates re-derived from ``pairs.csv.gz`` (or a view's ``queries.csv.gz``).
GROUNDING_ESTIMATES = ("pointing_game", "dice@0.5", "iou@0.5")
#: Where ``metrics.json`` keeps the grounding estimates of the pairs analysed, by ``Settings.queries``.
GROUNDING_SECTION = {None: ("grounding",), "query": ("phrase_grounding", "by_query"),
                     "finding_name": ("phrase_grounding", "by_finding_name")}


def stratum_labels(size_bins: Sequence[float]) -> list[str]:
    """``["< 1%", "1–10%", "≥ 10%"]`` for the default boundaries."""
    pct = [f"{100 * b:g}%" for b in size_bins]
    if not pct:
        return ["all sizes"]
    return [f"< {pct[0]}", *(f"{a[:-1]}–{b}" for a, b in zip(pct, pct[1:])), f"≥ {pct[-1]}"]


@dataclass(frozen=True)
class RunAnalysis:
    """One model on one dataset. Tensors: row 0 the estimate, rows 1..R the replicates.

    ``values``: metric -> float64 [R + 1, C] (grounding and recognition, per class; the sanity and
    faithfulness checks' and the gaze metrics' where the run has them);
    ``calibrated_tau``: curve -> float64 [R + 1, C, K] (K folds, or 1 for a validation choice);
    ``strata``: metric -> float64 [R + 1, C + 1, S] (index C pools all classes' pairs).
    """

    label: str
    run: Run
    validation: Run | None
    values: dict[str, Tensor]
    calibrated_tau: dict[str, Tensor]
    strata: dict[str, Tensor]

    @property
    def calibration(self) -> str:
        if self.validation is not None:
            return f"validation ({self.validation.name})"
        return f"cross-fitting ({self.calibrated_tau['dice'].shape[-1]} folds)"

    def macro(self, metric: str) -> Tensor:
        """float64 [R + 1]: mean over the classes where the metric is defined in each row."""
        return torch.nanmean(self.values[metric], dim=1)

    def series(self, metric: str, c: int | None) -> Tensor:
        """float64 [R + 1]: class ``c``'s values, or the macro mean where ``c`` is None."""
        return self.macro(metric) if c is None else self.values[metric][:, c]


@dataclass(frozen=True)
class DatasetAnalysis:
    dataset: str
    classes: tuple[str, ...]
    num_images: int
    strata: list[str]
    runs: list[RunAnalysis]
    #: The radiographs resampled: ``num_images`` unless the samples are reads (several per radiograph).
    radiographs: int


@dataclass(frozen=True)
class Analysis:
    settings: Settings
    datasets: list[DatasetAnalysis]


def check_estimates(run: Run, queries: str | None = None) -> None:
    """The estimates the analysis re-derives from the run's records -- the bootstrap's row 0: per
    class and macro Pointing Game, Dice and IoU at 0.5, each explanation family's and the gaze metrics' means -- against
    ``metrics.json``'s own; a disagreement beyond `TOLERANCE` (a folder edited and resealed, a table
    from another run, a bug) is an error naming the section, the class and both values."""
    ones = torch.ones(1, len(run.image_ids), dtype=torch.float64)
    grounding = grounding_statistics(run.pairs, len(run.classes), ones).per_class
    path = GROUNDING_SECTION[queries]
    body: dict | None = run.results
    for key in path:
        body = (body or {}).get(key)
    if not isinstance(body, dict) or not all(isinstance(body.get(part), dict) for part in ("macro", "per_class")):
        raise ValueError(f"{run.path / METRICS}: {'.'.join(path)} is missing or lacks its macro and per_class "
                         f"means; {DAMAGED}")
    derived = [(".".join(path), body, QUERIES if queries else PAIRS,
                {key: grounding[key][0] for key in GROUNDING_ESTIMATES})]
    derived += [(section, run.results[section], CHECK_TABLES[section],
                 {key: value[0] for key, value in check_statistics(checked, len(run.classes), ones).items()})
                for section, checked in run.checks.items()]
    if run.gaze is not None:
        derived.append(("gaze", run.results["gaze"], GAZE,
                        {key: value[0] for key, value in check_statistics(run.gaze, len(run.classes), ones).items()}))
    for section, body, table, values in derived:
        for key, per_class in values.items():
            for c, name in enumerate(run.classes):
                _compare(run, f"{section}.per_class.{name}.{key}", (body["per_class"].get(name) or {}).get(key),
                         float(per_class[c]), table)
            _compare(run, f"{section}.macro.{key}", body["macro"].get(key), float(torch.nanmean(per_class)), table)


def _compare(run: Run, where: str, reported, derived: float, table: str) -> None:
    """One estimate of ``metrics.json`` (``None``: undefined) against the records' (NaN: undefined)."""
    if reported is None and math.isnan(derived):
        return
    agrees = isinstance(reported, (int, float)) and not isinstance(reported, bool) and not math.isnan(derived) and (
        abs(reported - derived) <= TOLERANCE * max(1.0, abs(derived)))
    if not agrees:
        shown = "undefined" if math.isnan(derived) else f"{derived:.6g}"
        raise ValueError(f"{run.path / METRICS}: {where} is {reported!r}, but the folder's records ({table}) give "
                         f"{shown}; {DAMAGED}")


def analyze_dataset(group: DatasetRuns, settings: Settings) -> DatasetAnalysis:
    """Every run of one dataset, resampled with the same image weights (paired); where the samples are
    reads, radiographs are resampled (and cross-fitted) with all their reads."""
    num_images, num_classes = len(group.image_ids), len(group.classes)
    radiographs = next(iter(group.runs.values())).radiographs if group.reads else None
    weights = resample_weights(num_images, settings.replicates, random_stream(settings.seed, group.dataset, "test"),
                               groups=radiographs)
    if group.validation:
        reference = next(iter(group.validation.values()))
        validation_weights = resample_weights(
            len(reference.image_ids), settings.replicates, random_stream(settings.seed, group.dataset, "validation"),
            groups=reference.radiographs if reference.reads else None)
    if any(label not in group.validation for label in group.runs):  # cross-fitted (a human run has no validation)
        folds = assign_folds(num_images, settings.folds, random_stream(settings.seed, group.dataset, "folds"),
                             groups=radiographs)
    results = []
    for label, run in group.runs.items():
        validation = group.validation.get(label)
        if validation is not None:
            chosen = grounding_statistics(validation.pairs, num_classes, validation_weights)
            calibration = ValidationChoice(chosen.best_index)
        else:
            calibration = CrossFitting(folds, settings.folds)
        strata = size_strata(run.pairs.region, run.image_size, settings.size_bins)
        grounding = grounding_statistics(
            run.pairs, num_classes, weights, calibration, strata, len(settings.size_bins) + 1)
        values = {**grounding.per_class, **recognition_statistics(run.labels, run.logits, weights)}
        for checked in (*run.checks.values(), *([run.gaze] if run.gaze is not None else [])):
            values.update(check_statistics(checked, num_classes, weights))
        results.append(RunAnalysis(label, run, validation, values, grounding.calibrated_tau,
                                   stratum_means(grounding.strata)))
    return DatasetAnalysis(group.dataset, group.classes, num_images, stratum_labels(settings.size_bins), results,
                           int(radiographs.max()) + 1 if radiographs is not None else num_images)


def analyze(
    results: Iterable[str | Path], validation: Iterable[str | Path] = (), settings: Settings | None = None
) -> Analysis:
    """Read results folders (or folders of them), group them by dataset and analyse each dataset.

    Args:
        results: test-split results folders; models on one dataset must cover the same images.
        validation: results folders of the same models on the dataset's validation split; each
            calibrates its model's τ. Without them, τ is cross-fitted over the test images.
    """
    settings = settings or Settings()
    runs = [load_run(folder, settings.queries) for folder in find_run_folders(results)]
    validation = list(validation)
    validation_runs = [load_run(folder, settings.queries) for folder in find_run_folders(validation)] if validation else []
    for run in (*runs, *validation_runs):
        check_estimates(run, settings.queries)
    return Analysis(settings, [analyze_dataset(group, settings) for group in group_runs(runs, validation_runs)])
