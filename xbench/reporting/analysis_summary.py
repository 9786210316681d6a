"""The Markdown summary of an `Analysis` (``xbench.analyze``'s
``summary.md``): per dataset the macro means with their intervals, paired differences, threshold
calibration and lesion-size strata, each model's gap to the human readers where a human reader set
ran, then the recognition-vs-grounding R²."""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from xbench.analysis.pipeline import Analysis, DatasetAnalysis
from xbench.analysis.tables import ALL, GAZE_GAP_METRICS, HUMAN_GAP_METRICS, MACRO
from xbench.metrics.human_benchmark import AVERAGE
from xbench.metrics.names import short
from xbench.reporting.render import markdown_grid
from xbench.reporting.table import format_interval, missing


def _markdown_table(headers: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    return [*markdown_grid(headers, rows, text_columns), ""]


def _label(run) -> str:
    return f"{run.label} (ceiling)" if run.run.instrument else f"{run.label} (human)" if run.run.human else run.label


#: The metric of the human-scale summary line: IoU at τ = 0.5, cheXlocalize's mIoU.
REACH_METRIC = "iou@0.5"
#: The metric of the gaze's human-scale summary line: NSS, the saliency field's first metric.
GAZE_REACH_METRIC = "nss"
NO_HUMAN_LINE = ("No dataset here has a human reader set's results (`python -m xbench.test --model human`), so no "
                 "human scale is shown: docs/human-agreement.md says which datasets have one.")


def _best_against_each_reader(gaps: pd.DataFrame, metric: str):
    """(dataset, human reader set, the gap row of the model with the highest macro ``metric``) for
    each dataset and reader set of a gap table; none where no model has a value."""
    chosen = gaps[(gaps["class"] == MACRO) & (gaps["metric"] == metric)] if len(gaps) else gaps
    for (dataset, human), frame in chosen.groupby(["dataset", "human"], sort=False):
        defined = frame.dropna(subset=["model_value"])
        if not defined.empty:
            yield dataset, human, defined.loc[defined["model_value"].idxmax()]


def reach_lines(gaps: pd.DataFrame, dataset_label: Callable[[str], str] = str,
                model_label: Callable[[str], str] = str) -> list[str]:
    """Per dataset and human reader set: ``On <dataset>, the best model reaches X % of the human
    readers' IoU@0.5 [a, b]``, X = model / human = 1 − the percentage decrease, its interval the
    decrease's turned round; the best model by its macro `REACH_METRIC`."""
    lines = []
    for dataset, human, best in _best_against_each_reader(gaps, REACH_METRIC):
        percent = lambda value: "–" if missing(value) else f"{100 * value:.1f}"  # noqa: E731
        lines.append(f"On {dataset_label(dataset)}, the best model, {model_label(best['model'])}, reaches "
                     f"{percent(1 - best['decrease'])} % of the human readers' {short(REACH_METRIC)} "
                     f"[{percent(1 - best['decrease_upper'])}, {percent(1 - best['decrease_lower'])}] "
                     f"({model_label(human)}: {percent(best['human_value'])}).")
    return lines


def gaze_reach_lines(gaps: pd.DataFrame, dataset_label: Callable[[str], str] = str,
                     model_label: Callable[[str], str] = str) -> list[str]:
    """Per dataset and human reader set with gaze: ``On <dataset>, the best model reaches X of the
    interobserver NSS [a, b]``, X = model / human (the analysis' ``share``) and its interval; the best
    model by its macro `GAZE_REACH_METRIC` (the centre bias among them)."""
    lines = []
    for dataset, human, best in _best_against_each_reader(gaps, GAZE_REACH_METRIC):
        lines.append(f"On {dataset_label(dataset)}, the best model, {model_label(best['model'])}, reaches "
                     f"{format_interval(best['share'], best['share_lower'], best['share_upper'], scale=1, digits=2)}"
                     f" of the interobserver {short(GAZE_REACH_METRIC)} ({model_label(human)}: "
                     f"{'–' if missing(best['human_value']) else format(best['human_value'], '.2f')}).")
    return lines


def _dataset_markdown(data: DatasetAnalysis, tables: dict[str, pd.DataFrame], confidence: float) -> list[str]:
    level = f"{100 * confidence:g}%"
    pick = lambda frame, **where: frame.loc[(frame[list(where)] == pd.Series(where)).all(1)]  # noqa: E731
    intervals = pick(tables["intervals"], dataset=data.dataset, **{"class": MACRO})
    shown = ("pointing_game", "dice@0.5", "dice@best", "dice@calibrated", "auroc", "auprc")
    images = f"{data.num_images} reads of {data.radiographs} radiographs" if data.radiographs != data.num_images \
        else f"{data.num_images} images"
    resampled = "radiographs resampled, each with all its reads" if data.radiographs != data.num_images \
        else "images resampled"
    lines = [f"## {data.dataset} ({images}, {len(data.runs)} models)", "",
             f"Macro means, percent, with {level} bootstrap intervals ({resampled}). "
             "τ* is chosen on the test set itself, τcal where it is not scored. (ceiling): a test instrument, "
             "never compared; (human): radiologists scored like a model, never ranked.", ""]
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

    gaps = tables["human_gaps"]
    gaps = gaps[gaps["dataset"] == data.dataset] if len(gaps) else gaps
    if len(gaps):
        lines += ["Each model's gap to the human readers, macro means: model − human (percentage points, paired "
                  "interval) and the percentage decrease (human − model) / human (percent), at τ = 0.5.", "",
                  *reach_lines(gaps), ""]
        rows = []
        for (model, human), frame in gaps[gaps["class"] == MACRO].groupby(["model", "human"], sort=False):
            cells = frame.set_index("metric")
            rows.append([f"{model} − {human}", *(
                f"{format_interval(*cells.loc[m, ['difference', 'difference_lower', 'difference_upper']])}; "
                f"{format_interval(*cells.loc[m, ['decrease', 'decrease_lower', 'decrease_upper']])} %"
                for m in HUMAN_GAP_METRICS)])
        lines += _markdown_table(["Model − human", *(f"{short(m)} (M − H; % decrease)" for m in HUMAN_GAP_METRICS)],
                                 rows)

    gaze = tables["gaze_gaps"]
    gaze = gaze[(gaze["dataset"] == data.dataset) & (gaze["class"] == MACRO)] if len(gaze) else gaze
    if len(gaze):
        lines += ["Each model's gap to the radiologists' gaze (the interobserver reader), macro means: model − "
                  "human with its paired interval (KL: lower is better, so a positive gap is the model behind).", "",
                  *gaze_reach_lines(gaze), ""]
        rows = []
        for (model, human), frame in gaze.groupby(["model", "human"], sort=False):
            cells = frame.set_index("metric")
            rows.append([f"{model} − {human}", *(format_interval(
                *cells.loc[m, ["difference", "difference_lower", "difference_upper"]], scale=1, digits=2)
                for m in GAZE_GAP_METRICS)])
        lines += _markdown_table(["Model − human", *map(short, GAZE_GAP_METRICS)], rows)
    lines += _chexlocalize_markdown(data.dataset, tables)
    return lines


def _chexlocalize_markdown(dataset: str, tables: dict[str, pd.DataFrame]) -> list[str]:
    """cheXlocalize's percentage decrease (their Average row, their form and XBench's paired one), and
    the models their protocol cannot compare, by name."""
    lines = []
    decrease, apart = (tables[name][tables[name]["dataset"] == dataset] if len(tables[name]) else tables[name]
                       for name in ("chexlocalize_decrease", "chexlocalize_not_comparable"))
    if len(decrease):
        lines += ["cheXlocalize's percentage decrease from their human benchmark, their Average row (their form, "
                  "percent: chexlocalize_decrease.csv; XBench's paired form beside it):", ""]
        rows = [[r.model, r.metric, format_interval(r.pct_diff, r.pct_diff_lower, r.pct_diff_upper, scale=1, digits=3),
                 format_interval(r.decrease, r.decrease_lower, r.decrease_upper)]
                for r in decrease[decrease["class"] == AVERAGE].itertuples()]
        lines += _markdown_table(["Model", "Metric", "% decrease (theirs)", "% decrease (paired)"], rows, text_columns=2)
    if len(apart):
        lines += [f"Not comparable by cheXlocalize's protocol (no native-size rows; saved maps run with "
                  f"--model.native_protocol true have them): {', '.join(dict.fromkeys(apart['model']))}.", ""]
    return lines


def analysis_markdown(analysis: Analysis, tables: dict[str, pd.DataFrame]) -> str:
    s = analysis.settings
    lines = ["# XBench analysis", "",
             f"{s.replicates} bootstrap replicates (seed {s.seed}), {100 * s.confidence:g}% percentile intervals; "
             f"lesion-size boundaries {', '.join(f'{100 * b:g}%' for b in s.size_bins)} of the image area.", ""]
    if not any(run.run.human for data in analysis.datasets for run in data.runs):
        lines += [NO_HUMAN_LINE, ""]
    for data in analysis.datasets:
        lines += _dataset_markdown(data, tables, s.confidence)
    correlation = tables["correlation"]
    lines += ["## Recognition vs grounding", "",
              "R² of macro AUROC against macro grounding over (model, dataset) points.", ""]
    rows = [[r.scope, r.grounding, str(r.points), format_interval(r.r2, r.lower, r.upper, scale=1, digits=2)]
            for _, r in correlation.iterrows()]
    lines += _markdown_table(["Scope", "Grounding", "Points", "R²"], rows, text_columns=2)
    return "\n".join(lines) + "\n"
