"""Plain tables (pandas DataFrames) of an `Analysis` and its JSON
payload. Values are fractions as in ``metrics.json`` (0.616, not 61.6); the Markdown a person reads
is `xbench.reporting.analysis_summary`'s.
"""

from __future__ import annotations

import math

import pandas as pd
import torch

from xbench.analysis.correlation import r_squared
from xbench.analysis.explanations import CHECK_METRICS, same_images
from xbench.analysis.pipeline import Analysis, RunAnalysis
from xbench.metrics.bootstrap import paired_difference, percentile_interval
from xbench.metrics.human_benchmark import AVERAGE, ScoreTable, paired_gap
from xbench.metrics.human_benchmark import percentage_decrease as their_percentage_decrease
from xbench.metrics.native import PERCENTAGE_DECREASE_COLUMNS
from xbench.metrics.names import analysed_keys
from xbench.metrics.names import metric as metric_info

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
#: The metrics of a model's gap to the human readers: at τ = 0.5, a human reader's binary map.
HUMAN_GAP_METRICS = ("pointing_game", "dice@0.5", "iou@0.5")
#: The metrics of a model's gap to a radiologist's gaze (the interobserver reader): every gaze metric.
GAZE_GAP_METRICS = analysed_keys("gaze", macro=True)


def _scalars(interval: dict[str, torch.Tensor], index: int | tuple = ()) -> dict[str, float]:
    return {key: value[index].item() for key, value in interval.items()}


def interval_table(analysis: Analysis) -> pd.DataFrame:
    """One row per (dataset, model, class or ``macro``, metric): estimate, percentile interval and
    the number of replicates where the metric was defined."""
    rows = []
    confidence = analysis.settings.confidence
    for data in analysis.datasets:
        for run in data.runs:
            for metric in (m for m in METRICS if m in run.values):  # a check's only where the run has it
                interval = percentile_interval(run.values[metric], confidence)
                for c, key in enumerate(data.classes):
                    rows.append({"dataset": data.dataset, "model": run.label, "class": key, "metric": metric,
                                 **_scalars(interval, c)})
                if metric in MACRO_METRICS:
                    rows.append({"dataset": data.dataset, "model": run.label, "class": MACRO, "metric": metric,
                                 **_scalars(percentile_interval(run.macro(metric), confidence))})
    return pd.DataFrame(rows)


def ranked(run: RunAnalysis) -> bool:
    """A model's run: compared with the other models and a point in fits; not an instrument (the
    Oracle) nor a human reader, which are shown for scale."""
    return not (run.run.instrument or run.run.human)


def comparable(a: RunAnalysis, b: RunAnalysis, metric: str) -> bool:
    """Whether both runs have ``metric`` on the same images: a check's metric (sanity, faithfulness)
    only where both ran it on the same image subset."""
    if metric not in a.values or metric not in b.values:
        return False
    section = metric_info(metric).section
    if section not in CHECK_METRICS:
        return True
    return same_images(a.run.checks[section], b.run.checks[section])


def difference_table(analysis: Analysis) -> pd.DataFrame:
    """Paired differences ``model_a - model_b`` for every pair of models on a dataset, per class and
    macro: the difference, its interval, and ``a_better``, the fraction of replicates with A > B (a tie ½).
    Instruments (the Oracle) and human readers are not compared (a model's gap to the human readers
    is `human_gap_table`'s); a check's metrics only between runs that checked the same images."""
    rows = []
    confidence = analysis.settings.confidence
    for data in analysis.datasets:
        models = [run for run in data.runs if ranked(run)]
        for i, a in enumerate(models):
            for b in models[i + 1:]:
                for metric in (m for m in MACRO_METRICS if comparable(a, b, m)):
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
    """Per (dataset, model, class or ``macro``, curve): the value at τ = 0.5, at the best τ
    chosen on the test set itself (and that τ), at the calibrated τ (with its interval, the
    τ or per-fold τs chosen, and how), and the two gaps over τ = 0.5 (the paper's
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
    (the Oracle) and human readers are not points."""
    confidence = analysis.settings.confidence
    points: dict[str, list[tuple[torch.Tensor, dict[str, torch.Tensor]]]] = {}
    for data in analysis.datasets:
        points[data.dataset] = [(run.macro("auroc"), {m: run.macro(m) for m in CORRELATED})
                                for run in data.runs if ranked(run)]
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


def percentage_decrease(model: torch.Tensor, human: torch.Tensor, confidence: float) -> dict[str, torch.Tensor]:
    """``(human - model) / human`` per row (cheXlocalize's percentage decrease, as a fraction): the
    estimate from row 0's means, the percentile interval over the replicates where it is defined
    (NaN where the human's value is 0 or either is undefined)."""
    human = human.double()
    decrease = torch.where(human != 0, (human - model.double()) / human, float("nan"))
    return percentile_interval(decrease, confidence)


#: The columns of `human_gap_table`, named so that a dataset without a human run gives an empty table with them.
HUMAN_GAP_COLUMNS = ["dataset", "model", "human", "class", "metric", "model_value", "human_value", "difference",
                     "difference_lower", "difference_upper", "decrease", "decrease_lower", "decrease_upper",
                     "replicates"]


def human_gap_table(analysis: Analysis) -> pd.DataFrame:
    """Per dataset with a human reader's run, each model's gap to it, per class and ``macro``, for
    Pointing Game, Dice and IoU at τ = 0.5 (`HUMAN_GAP_METRICS`): ``difference`` = model − human
    with its paired bootstrap interval (both from the same resampled radiographs in every replicate),
    and ``decrease`` = (human − model) / human with its percentile interval; ``replicates``: those
    where the decrease is defined. The macro rows take each replicate's macro means."""
    rows = []
    confidence = analysis.settings.confidence
    for data in analysis.datasets:
        humans = [run for run in data.runs if run.run.human]
        models = [run for run in data.runs if ranked(run)]
        for human in humans:
            for model in models:
                for metric in HUMAN_GAP_METRICS:
                    for c, key in [*enumerate(data.classes), (None, MACRO)]:
                        a, b = model.series(metric, c), human.series(metric, c)
                        difference = paired_difference(a, b, confidence)
                        decrease = percentage_decrease(a, b, confidence)
                        rows.append({
                            "dataset": data.dataset, "model": model.label, "human": human.label, "class": key,
                            "metric": metric, "model_value": a[0].item(), "human_value": b[0].item(),
                            "difference": difference["estimate"].item(),
                            "difference_lower": difference["lower"].item(),
                            "difference_upper": difference["upper"].item(),
                            "decrease": decrease["estimate"].item(), "decrease_lower": decrease["lower"].item(),
                            "decrease_upper": decrease["upper"].item(), "replicates": decrease["replicates"].item(),
                        })
    return pd.DataFrame(rows, columns=HUMAN_GAP_COLUMNS)


#: The columns of `gaze_gap_table`.
GAZE_GAP_COLUMNS = ["dataset", "model", "human", "class", "metric", "lower_better", "model_value", "human_value",
                    "difference", "difference_lower", "difference_upper", "model_better", "share", "share_lower",
                    "share_upper", "replicates"]


def gaze_gap_table(analysis: Analysis) -> pd.DataFrame:
    """Per dataset with a human reader's run that has gaze metrics (REFLACX's interobserver reader),
    each model's gap to it -- the centre bias's too, the floor -- per class and ``macro``, for every
    gaze metric (`GAZE_GAP_METRICS`): ``difference`` = model − human, whatever the metric's direction
    (``lower_better``: for KL a positive difference is the model behind), with its paired bootstrap
    interval (both from the same resampled radiographs in every replicate); ``model_better``: the share
    of replicates where the model is ahead by the metric's direction (a tie ½); ``share`` = model /
    human with its percentile interval (NaN where the human's value is 0), ``replicates``: those where
    the share is defined. The macro rows take each replicate's macro means."""
    rows = []
    confidence = analysis.settings.confidence
    for data in analysis.datasets:
        humans = [run for run in data.runs if run.run.human and run.run.gaze is not None]
        models = [run for run in data.runs if ranked(run) and run.run.gaze is not None]
        for human in humans:
            for model in models:
                for metric in GAZE_GAP_METRICS:
                    lower_better = metric_info(metric).lower_better
                    for c, key in [*enumerate(data.classes), (None, MACRO)]:
                        a, b = model.series(metric, c), human.series(metric, c)
                        difference = paired_difference(a, b, confidence)
                        ahead = difference["a_better"].item()
                        share = percentile_interval(torch.where(b != 0, a / b, float("nan")), confidence)
                        rows.append({
                            "dataset": data.dataset, "model": model.label, "human": human.label, "class": key,
                            "metric": metric, "lower_better": lower_better, "model_value": a[0].item(),
                            "human_value": b[0].item(), "difference": difference["estimate"].item(),
                            "difference_lower": difference["lower"].item(),
                            "difference_upper": difference["upper"].item(),
                            "model_better": 1 - ahead if lower_better else ahead,
                            "share": share["estimate"].item(), "share_lower": share["lower"].item(),
                            "share_upper": share["upper"].item(), "replicates": share["replicates"].item(),
                        })
    return pd.DataFrame(rows, columns=GAZE_GAP_COLUMNS)


#: The columns of `chexlocalize_decrease_table`: theirs (``hb``, ``pred``, ``pct_diff`` and its bounds, as
#: their ``{miou,hitrate}_pct_decrease.csv``, in percent and rounded as they print them), then XBench's
#: paired form (fractions, as every analysis table).
CHEXLOCALIZE_DECREASE_COLUMNS = [
    "dataset", "model", "human", "metric", "class", "hb", "pred", "pct_diff", "pct_diff_lower", "pct_diff_upper",
    "model_value", "human_value", "difference", "difference_lower", "difference_upper", "model_better",
    "decrease", "decrease_lower", "decrease_upper", "replicates"]
NOT_COMPARABLE_COLUMNS = ["dataset", "model", "human", "reason"]
NOT_COMPARABLE_REASON = ("no native-size rows of cheXlocalize's protocol (chexlocalize_pairs.csv.gz): only saved maps "
                         "run with --model.native_protocol true have them")


def _chexlocalize_humans(data) -> list:
    """The human runs of a dataset scored by cheXlocalize's human-benchmark protocol at native size."""
    return [run for run in data.runs if run.run.human and run.run.chexlocalize is not None
            and "chexlocalize_protocol" in run.run.results.get("reader_set", {})]


def _score_table(run, column: str, tasks: tuple[str, ...]) -> ScoreTable:
    rows = run.run.chexlocalize
    rows = rows[rows["class"].isin(tasks)]
    scores = dict(zip(zip(rows["image_id"], rows["class"]), rows[column]))
    return ScoreTable.from_pairs(scores, run.run.image_ids, tasks)


def chexlocalize_decrease_table(analysis: Analysis) -> pd.DataFrame:
    """Per dataset with cheXlocalize's human benchmark at native size, each model with native-size
    rows of their protocol: their percentage decrease exactly (`xbench.metrics.human_benchmark.
    percentage_decrease`: mIoU of their default Otsu segmentation, hit rate, per finding and their
    ``Average``; 1,000 replicates, their seed) beside XBench's paired form (`paired_gap`: the
    analysis' replicates and seed, one resample for model and human). Findings: those the human
    benchmark's run scored by their protocol (``reader_set.chexlocalize_protocol.findings``)."""
    rows = []
    settings = analysis.settings
    for data in analysis.datasets:
        for human in _chexlocalize_humans(data):
            tasks = tuple(k for k in human.run.results["reader_set"]["chexlocalize_protocol"]["findings"]
                          if k in data.classes)
            for model in (run for run in data.runs if ranked(run) and run.run.chexlocalize is not None):
                for metric, column in PERCENTAGE_DECREASE_COLUMNS.items():
                    ours, theirs = _score_table(model, column, tasks), _score_table(human, column, tasks)
                    published = their_percentage_decrease(ours, theirs)
                    paired = paired_gap(ours, theirs, settings.replicates, settings.seed, settings.confidence)
                    for key in (*tasks, AVERAGE):
                        gap, decrease = paired[key]["difference"], paired[key]["percentage_decrease"]
                        rows.append({
                            "dataset": data.dataset, "model": model.label, "human": human.label, "metric": metric,
                            "class": key, **published[key],
                            "model_value": paired[key]["model"], "human_value": paired[key]["human"],
                            "difference": gap["estimate"], "difference_lower": gap["lower"],
                            "difference_upper": gap["upper"], "model_better": gap["a_better"],
                            "decrease": decrease["estimate"] / 100, "decrease_lower": decrease["lower"] / 100,
                            "decrease_upper": decrease["upper"] / 100, "replicates": decrease["replicates"],
                        })
    return pd.DataFrame(rows, columns=CHEXLOCALIZE_DECREASE_COLUMNS)


def chexlocalize_not_comparable(analysis: Analysis) -> pd.DataFrame:
    """The models on a dataset with cheXlocalize's human benchmark at native size that cannot be
    compared with it by their protocol (no native-size rows), each named with the reason."""
    rows = [{"dataset": data.dataset, "model": run.label, "human": human.label, "reason": NOT_COMPARABLE_REASON}
            for data in analysis.datasets for human in _chexlocalize_humans(data)
            for run in data.runs if ranked(run) and run.run.chexlocalize is None]
    return pd.DataFrame(rows, columns=NOT_COMPARABLE_COLUMNS)


def analysis_tables(analysis: Analysis) -> dict[str, pd.DataFrame]:
    """Every table by the file stem the CLI writes it under."""
    return {
        "intervals": interval_table(analysis),
        "differences": difference_table(analysis),
        "calibration": calibration_table(analysis),
        "strata": strata_table(analysis),
        "correlation": correlation_table(analysis),
        "human_gaps": human_gap_table(analysis),
        "gaze_gaps": gaze_gap_table(analysis),
        "chexlocalize_decrease": chexlocalize_decrease_table(analysis),
        "chexlocalize_not_comparable": chexlocalize_not_comparable(analysis),
    }


def _json_value(value):
    """JSON has no NaN or infinity: ``None`` (the CSV keeps an unbounded interval's ±inf)."""
    if isinstance(value, float) and not math.isfinite(value):
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
             "radiographs": data.radiographs, "strata": data.strata,
             "runs": [{"label": run.label, "model": run.run.model, "human": run.run.human,
                       "folder": str(run.run.path),
                       "validation": str(run.validation.path) if run.validation else None,
                       "calibration": run.calibration} for run in data.runs]}
            for data in analysis.datasets
        ],
        "tables": {name: [{k: _json_value(v) for k, v in row.items()} for row in frame.to_dict("records")]
                   for name, frame in tables.items()},
    }
