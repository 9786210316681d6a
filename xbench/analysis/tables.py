"""Plain tables (pandas DataFrames) of an :class:`~xbench.analysis.pipeline.Analysis`, its JSON
payload and a Markdown summary. Values are fractions as in ``metrics.json`` (0.616, not 61.6);
:func:`format_interval` writes the ``61.6 [58.9, 64.2]`` cells people read.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from xbench.analysis.bootstrap import paired_difference, percentile_interval
from xbench.analysis.correlation import r_squared
from xbench.analysis.pipeline import Analysis, DatasetAnalysis
from xbench.metrics.names import analysed_keys, short
from xbench.reporting.render import markdown_grid
from xbench.reporting.table import format_interval

#: In the analysis tables: the class of macro-mean rows; the class of the lesion-size rows that
#: pool every class's pairs, and the scope of the correlation over every dataset.
MACRO = "macro"
ALL = "all"
#: Metrics with intervals: per class and, except thresholds, as a macro mean over classes.
METRICS = analysed_keys()
MACRO_METRICS = analysed_keys(macro=True)
STRATA_METRICS = ("pointing_game", "dice@0.5", "dice@best", "dice@calibrated")
#: Grounding metrics set against macro AUROC in the recognition-vs-grounding correlation.
CORRELATED = ("pointing_game", "dice@0.5", "dice@best")


def _scalars(interval: dict[str, torch.Tensor], index: int | tuple = ()) -> dict[str, float]:
    return {key: value[index].item() for key, value in interval.items()}


def interval_table(analysis: Analysis) -> pd.DataFrame:
    """One row per (dataset, model, class or ``macro``, metric): estimate, percentile interval and
    the number of replicates where the metric was defined."""
    rows = []
    confidence = analysis.settings.confidence
    for data in analysis.datasets:
        for run in data.runs:
            for metric in METRICS:
                interval = percentile_interval(run.values[metric], confidence)
                for c, key in enumerate(data.classes):
                    rows.append({"dataset": data.dataset, "model": run.label, "class": key, "metric": metric,
                                 **_scalars(interval, c)})
                if metric in MACRO_METRICS:
                    rows.append({"dataset": data.dataset, "model": run.label, "class": MACRO, "metric": metric,
                                 **_scalars(percentile_interval(run.macro(metric), confidence))})
    return pd.DataFrame(rows)


def difference_table(analysis: Analysis) -> pd.DataFrame:
    """Paired differences ``model_a - model_b`` for every pair of models on a dataset, per class and
    macro: the difference, its interval, and ``a_better``, the fraction of replicates with A > B (a tie ½).
    Instruments (the Oracle) are not compared."""
    rows = []
    confidence = analysis.settings.confidence
    for data in analysis.datasets:
        models = [run for run in data.runs if not run.run.instrument]
        for i, a in enumerate(models):
            for b in models[i + 1:]:
                for metric in MACRO_METRICS:
                    head = {"dataset": data.dataset, "model_a": a.label, "model_b": b.label}
                    difference = paired_difference(a.values[metric], b.values[metric], confidence)
                    for c, key in enumerate(data.classes):
                        rows.append({**head, "class": key, "metric": metric, **_scalars(difference, c)})
                    difference = paired_difference(a.macro(metric), b.macro(metric), confidence)
                    rows.append({**head, "class": MACRO, "metric": metric, **_scalars(difference)})
    columns = ["dataset", "model_a", "model_b", "class", "metric", "estimate", "lower", "upper", "replicates",
               "a_better"]  # named, so that a dataset with one model gives an empty table with its header
    return pd.DataFrame(rows, columns=columns).rename(columns={"estimate": "difference"})


def calibration_table(analysis: Analysis) -> pd.DataFrame:
    """Per (dataset, model, class or ``macro``, curve): the value at tau = 0.5, at the best tau
    chosen on the test set itself (and that tau), at the calibrated tau (with its interval, the
    tau or per-fold taus chosen, and how), and the two gaps over tau = 0.5 (the paper's
    ``best - 0.5`` and its honest twin ``calibrated - 0.5``), each with a paired interval."""
    rows = []
    confidence = analysis.settings.confidence
    for data in analysis.datasets:
        for run in data.runs:
            for curve in ("dice", "iou"):
                taus = run.calibrated_tau[curve][0]
                for c, key in [*enumerate(data.classes), (None, MACRO)]:
                    at = {s: run.series(f"{curve}@{s}", c) for s in ("0.5", "best", "calibrated")}
                    interval = percentile_interval(at["calibrated"], confidence)
                    gap = paired_difference(at["calibrated"], at["0.5"], confidence)
                    gap_best = paired_difference(at["best"], at["0.5"], confidence)
                    rows.append({
                        "dataset": data.dataset, "model": run.label, "class": key, "curve": curve,
                        "method": run.calibration,
                        "at_0.5": at["0.5"][0].item(),
                        "at_best": at["best"][0].item(),
                        "best_tau": math.nan if c is None else run.values[f"{curve}@best_tau"][0, c].item(),
                        "at_calibrated": interval["estimate"].item(),
                        "calibrated_lower": interval["lower"].item(),
                        "calibrated_upper": interval["upper"].item(),
                        "calibrated_tau": "" if c is None else " ".join(f"{t:.2f}" for t in taus[c].tolist()),
                        "gap_best": gap_best["estimate"].item(),
                        "gap_best_lower": gap_best["lower"].item(),
                        "gap_best_upper": gap_best["upper"].item(),
                        "gap_calibrated": gap["estimate"].item(),
                        "gap_calibrated_lower": gap["lower"].item(),
                        "gap_calibrated_upper": gap["upper"].item(),
                    })
    return pd.DataFrame(rows)


def strata_table(analysis: Analysis) -> pd.DataFrame:
    """Per (dataset, model, class or ``all`` pairs pooled, lesion-size stratum, metric): the pair
    count, estimate and interval; ``area_from``/``area_to`` are the stratum's area fractions."""
    rows = []
    confidence = analysis.settings.confidence
    bounds = [0.0, *analysis.settings.size_bins, 1.0]
    for data in analysis.datasets:
        for run in data.runs:
            pairs = run.strata["pairs"][0]
            for metric in STRATA_METRICS:
                if metric not in run.strata:
                    continue
                interval = percentile_interval(run.strata[metric], confidence)
                for c, key in enumerate([*data.classes, ALL]):
                    for s, stratum in enumerate(data.strata):
                        rows.append({
                            "dataset": data.dataset, "model": run.label, "class": key, "stratum": stratum,
                            "area_from": bounds[s], "area_to": bounds[s + 1], "pairs": int(pairs[c, s]),
                            "metric": metric, **_scalars(interval, (c, s)),
                        })
    return pd.DataFrame(rows)


def correlation_table(analysis: Analysis) -> pd.DataFrame:
    """R² between macro AUROC and a macro grounding metric over (model, dataset) points: per
    dataset (one point per model) and, with several datasets, over ``all`` of them. Instruments
    (the Oracle) are not points."""
    confidence = analysis.settings.confidence
    points: dict[str, list[tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {}
    for data in analysis.datasets:
        points[data.dataset] = [(run.macro("auroc"), {m: run.macro(m) for m in CORRELATED})
                                for run in data.runs if not run.run.instrument]
    if len(analysis.datasets) > 1:
        points[ALL] = [p for scope in list(points.values()) for p in scope]
    rows = []
    for scope, members in points.items():
        if not members:  # a dataset with only instruments
            continue
        x = torch.stack([auroc for auroc, _ in members], 1)
        for metric in CORRELATED:
            y = torch.stack([grounding[metric] for _, grounding in members], 1)
            interval = percentile_interval(r_squared(x, y), confidence)
            rows.append({"scope": scope, "recognition": "auroc", "grounding": metric, "points": len(members),
                         **_scalars(interval)})
    columns = ["scope", "recognition", "grounding", "points", "estimate", "lower", "upper", "replicates"]
    return pd.DataFrame(rows, columns=columns).rename(columns={"estimate": "r2"})


def analysis_tables(analysis: Analysis) -> dict[str, pd.DataFrame]:
    """Every table by the file stem the CLI writes it under."""
    return {
        "intervals": interval_table(analysis),
        "differences": difference_table(analysis),
        "calibration": calibration_table(analysis),
        "strata": strata_table(analysis),
        "correlation": correlation_table(analysis),
    }


def _json_value(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def analysis_json(analysis: Analysis, tables: dict[str, pd.DataFrame]) -> dict:
    """The JSON payload: settings, the runs analysed, and every table as a list of records."""
    s = analysis.settings
    return {
        "schema": "xbench.analysis/1",
        "settings": {"replicates": s.replicates, "seed": s.seed, "confidence": s.confidence, "folds": s.folds,
                     "size_bins": list(s.size_bins)},
        "datasets": [
            {"dataset": data.dataset, "classes": list(data.classes), "images": data.num_images,
             "strata": data.strata,
             "runs": [{"label": run.label, "model": run.run.model, "folder": str(run.run.path),
                       "validation": str(run.validation.path) if run.validation else None,
                       "calibration": run.calibration} for run in data.runs]}
            for data in analysis.datasets
        ],
        "tables": {name: [{k: _json_value(v) for k, v in row.items()} for row in frame.to_dict("records")]
                   for name, frame in tables.items()},
    }


def _markdown_table(headers: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    return [*markdown_grid(headers, rows, text_columns), ""]


def _label(run) -> str:
    return f"{run.label} (ceiling)" if run.run.instrument else run.label


def _dataset_markdown(data: DatasetAnalysis, tables: dict[str, pd.DataFrame], confidence: float) -> list[str]:
    level = f"{100 * confidence:g}%"
    pick = lambda frame, **where: frame.loc[(frame[list(where)] == pd.Series(where)).all(1)]  # noqa: E731
    intervals = pick(tables["intervals"], dataset=data.dataset, **{"class": MACRO})
    shown = ("pointing_game", "dice@0.5", "dice@best", "dice@calibrated", "auroc", "auprc")
    lines = [f"## {data.dataset} ({data.num_images} images, {len(data.runs)} models)", "",
             f"Macro means, percent, with {level} bootstrap intervals (images resampled). "
             "τ* is chosen on the test set itself, τcal where it is not scored. (ceiling): a test instrument, "
             "never compared.", ""]
    rows = []
    for run in data.runs:
        cells = pick(intervals, model=run.label).set_index("metric")
        rows.append([_label(run), *(format_interval(*cells.loc[m, ["estimate", "lower", "upper"]]) for m in shown)])
    lines += _markdown_table(["Model", *map(short, shown)], rows)

    differences = tables["differences"]  # without rows (one model per dataset) it has no columns either
    if len(differences):
        differences = pick(differences, dataset=data.dataset, **{"class": MACRO})
    if len(differences):
        compared = ("pointing_game", "dice@calibrated", "auroc")
        lines += ["Paired differences A − B (same resampled images), percentage points; "
                  "P(A>B) = share of replicates where A is ahead, a tie counted as ½.", ""]
        rows = []
        for (a, b), frame in differences.groupby(["model_a", "model_b"], sort=False):
            cells = frame.set_index("metric")
            rows.append([f"{a} − {b}", *(
                f"{format_interval(*cells.loc[m, ['difference', 'lower', 'upper']])} ({cells.loc[m, 'a_better']:.2f})"
                for m in compared)])
        lines += _markdown_table(["A − B", *(f"{short(m)} (P(A>B))" for m in compared)], rows)

    calibration = pick(tables["calibration"], dataset=data.dataset, curve="dice", **{"class": MACRO})
    lines += ["Threshold calibration, macro Dice (percent): gap = value − Dice at τ = 0.5.", ""]
    rows = [[r.model, r.method, f"{100 * r['at_0.5']:.1f}", f"{100 * r.at_best:.1f}",
             format_interval(r.gap_best, r.gap_best_lower, r.gap_best_upper),
             format_interval(r.at_calibrated, r.calibrated_lower, r.calibrated_upper),
             format_interval(r.gap_calibrated, r.gap_calibrated_lower, r.gap_calibrated_upper)]
            for _, r in calibration.iterrows()]
    headers = ["Model", "τ chosen by", *map(short, ("dice@0.5", "dice@best")), "gap τ*", short("dice@calibrated"),
               "gap τcal"]
    lines += _markdown_table(headers, rows, text_columns=2)

    strata = pick(tables["strata"], dataset=data.dataset, **{"class": ALL})
    lines += ["Lesion-size strata, all pairs pooled (percent; lesion area as a share of the image).", ""]
    rows = []
    for run in data.runs:
        for metric in ("pointing_game", "dice@0.5"):
            cells = pick(strata, model=run.label, metric=metric).set_index("stratum")
            rows.append([_label(run), short(metric), *(
                f"{format_interval(*cells.loc[s, ['estimate', 'lower', 'upper']])} (n={cells.loc[s, 'pairs']})"
                for s in data.strata)])
    lines += _markdown_table(["Model", "Metric", *data.strata], rows, text_columns=2)
    return lines


def summary_markdown(analysis: Analysis, tables: dict[str, pd.DataFrame]) -> str:
    s = analysis.settings
    lines = ["# XBench analysis", "",
             f"{s.replicates} bootstrap replicates (seed {s.seed}), {100 * s.confidence:g}% percentile intervals; "
             f"lesion-size boundaries {', '.join(f'{100 * b:g}%' for b in s.size_bins)} of the image area.", ""]
    for data in analysis.datasets:
        lines += _dataset_markdown(data, tables, s.confidence)
    correlation = tables["correlation"]
    lines += ["## Recognition vs grounding", "",
              "R² of macro AUROC against macro grounding over (model, dataset) points.", ""]
    rows = [[r.scope, r.grounding, str(r.points), format_interval(r.r2, r.lower, r.upper, scale=1, digits=2)]
            for _, r in correlation.iterrows()]
    lines += _markdown_table(["Scope", "Grounding", "Points", "R²"], rows, text_columns=2)
    return "\n".join(lines) + "\n"
