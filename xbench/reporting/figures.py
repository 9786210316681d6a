"""The paper's figures from a `Benchmark` (matplotlib, PNG).

- Fig. 2: saliency overlays, the same images for every model (`overlay_grids`);
- Fig. 3: recognition (macro AUROC) against grounding (macro Pointing Game) with a least-squares
  line and its R² (`recognition_vs_grounding`);
- Fig. 4: Dice at the fixed tau = 0.5 against Dice at the best tau*, with the gap (`dice_gap`);
- Dice against tau per model (`dice_curves`);
- with the analysis (``xbench.analysis``): Pointing Game and Dice by lesion size, one line per
  model with bootstrap intervals (`lesion_size`), and the R² of Fig. 3 with its interval;
- with robustness runs: grounding and recognition under each perturbation (`robustness`);
- with a human reader set and the analysis: per dataset, each model's grounding per finding against
  the human readers' band (`human_bands`).

Each function returns `Plot`: the figure and the caption that explains it. Figures use
matplotlib's object API (no pyplot state), so they can be built in any process. A model keeps
one colour in every figure.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from xbench.reporting.benchmark import Benchmark
from xbench.results.folder import read_overlays
from xbench.analysis.tables import ALL, HUMAN_GAP_METRICS, MACRO
from xbench.metrics.names import long
from xbench.metrics.names import metric as metric_info
from xbench.reporting.paper_tables import REFERENCE, ROBUSTNESS_METRICS, STRATA_METRICS, ReportAnalysis, lost_regions
from xbench.reporting.table import format_interval

DPI = 200
FONT_SIZE = 9
#: Saliency colour map: its hue changes from low to high, so it reads on a grey radiograph.
SALIENCY_CMAP = "turbo"
SALIENCY_ALPHA = 0.5
MARKERS = "osD^vP*Xph<>"


@dataclass
class Plot:
    name: str
    figure: Figure
    caption: str


@dataclass(frozen=True)
class LinearFit:
    slope: float
    intercept: float
    r2: float
    n: int


def linear_fit(x: np.ndarray, y: np.ndarray) -> LinearFit | None:
    """Least-squares line y = slope * x + intercept and its R² = 1 - SS_res / SS_tot.

    ``None`` where no line is defined (fewer than two points, or all x or all y equal).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    sxx, syy = float(dx @ dx), float(dy @ dy)
    if sxx == 0 or syy == 0:
        return None
    slope = float(dx @ dy) / sxx
    intercept = float(y.mean() - slope * x.mean())
    residual = y - (slope * x + intercept)
    return LinearFit(slope, intercept, 1 - float(residual @ residual) / syy, len(x))


def _figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _style(ax) -> None:
    ax.tick_params(labelsize=FONT_SIZE)
    ax.grid(alpha=0.3, linewidth=0.5)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def model_colours(bench: Benchmark, extra: list[str] = ()) -> dict[str, tuple]:
    """A colour per model: the benchmark's models first (the same colour in every figure), then
    any model seen only in ``extra`` (one with robustness runs only)."""
    palette = colormaps["tab10"]
    models = list(dict.fromkeys([*bench.models, *extra]))
    return {model: palette(i % 10) for i, model in enumerate(models)}


def _grid_shape(panels: int, max_columns: int = 3) -> tuple[int, int]:
    columns = min(panels, max_columns)
    return math.ceil(panels / columns), columns


def _subplots(figure: Figure, panels: int):
    rows, columns = _grid_shape(panels)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax in axes[panels:]:
        ax.set_visible(False)
    return axes[:panels]


# -- Fig. 3 ------------------------------------------------------------------------------------


def _r2_interval(bench: Benchmark, analysis: ReportAnalysis | None) -> tuple[float, float] | None:
    """The bootstrap interval of Fig. 3's R² (AUROC vs Pointing Game over every point)."""
    if analysis is None:
        return None
    scope = ALL if len(bench.datasets) > 1 else bench.datasets[0]
    (row,) = analysis.rows("correlation", scope=scope, grounding="pointing_game")
    return row["lower"], row["upper"]


def recognition_vs_grounding(bench: Benchmark, analysis: ReportAnalysis | None = None) -> Plot:
    """One point per (model, dataset): macro AUROC against macro Pointing Game; one fitted line
    (with the analysis: its R² with a bootstrap interval)."""
    colours = model_colours(bench)
    figure = _figure(7.0, 4.2)
    ax = figure.subplots()
    xs, ys, left_out = [], [], []
    markers = {d: MARKERS[i % len(MARKERS)] for i, d in enumerate(bench.datasets)}
    for (model, dataset), run in bench.runs.items():
        auroc = run.results["classification"]["macro"]["auroc"]
        pointing = run.results["grounding"]["macro"]["pointing_game"]
        if auroc is None or pointing is None:
            left_out.append(f"{bench.model_label(model)} on {bench.dataset_label(dataset)}")
            continue
        xs.append(100 * auroc)
        ys.append(100 * pointing)
        ax.scatter(100 * auroc, 100 * pointing, s=36, color=colours[model], marker=markers[dataset],
                   edgecolors="black", linewidths=0.4, zorder=3)
    fit = linear_fit(np.array(xs), np.array(ys))
    interval = _r2_interval(bench, analysis) if fit is not None else None
    r2_text = ""
    if fit is not None:
        r2_text = f"{fit.r2:.2f}"
        if interval is not None:
            level = f"{100 * analysis.settings.confidence:g}%"
            r2_text = format_interval(fit.r2, *interval, scale=1, digits=2).replace(" [", f", {level} CI [", 1)
        line_x = np.array([min(xs), max(xs)])
        ax.plot(line_x, fit.slope * line_x + fit.intercept, color="black", linewidth=1, linestyle="--", zorder=2)
        ax.text(0.03, 0.95, f"R² = {r2_text}  (n = {fit.n})", transform=ax.transAxes, fontsize=FONT_SIZE + 1,
                va="top", bbox={"facecolor": "white", "edgecolor": "0.7", "boxstyle": "round,pad=0.3"})
    ax.set_xlabel("Recognition: macro AUROC (%)", fontsize=FONT_SIZE + 1)
    ax.set_ylabel("Grounding: macro Pointing Game (%)", fontsize=FONT_SIZE + 1)
    _style(ax)
    model_handles = [Line2D([], [], marker="o", linestyle="", color=colours[m], markeredgecolor="black",
                            markeredgewidth=0.4, label=bench.model_label(m)) for m in bench.models]
    dataset_handles = [Line2D([], [], marker=markers[d], linestyle="", color="0.6", markeredgecolor="black",
                              markeredgewidth=0.4, label=bench.dataset_label(d)) for d in bench.datasets]
    figure.legend(handles=model_handles, title="Model", fontsize=FONT_SIZE, title_fontsize=FONT_SIZE,
                  loc="outside right upper", frameon=False, alignment="left")
    figure.legend(handles=dataset_handles, title="Dataset", fontsize=FONT_SIZE, title_fontsize=FONT_SIZE,
                  loc="outside right lower", frameon=False, alignment="left")
    caption = (
        "Recognition against grounding: each point is one model on one dataset (colour: model, shape: dataset), "
        "both macro means over classes. "
        + (f"Dashed: least-squares line, R² = {r2_text} over n = {fit.n} points. " if fit is not None
           else "No line: fewer than two points or no spread. ")
        + ("CI: bootstrap percentile interval of R² (each dataset's images resampled, both macro means and R² "
           "recomputed in every replicate). " if interval is not None else "")
        + (f"Left out (no AUROC or no graded pair): {', '.join(left_out)}." if left_out else "")
    )
    return Plot("fig3_auroc_vs_pointing_game", figure, caption.strip())


# -- Fig. 4 and the Dice curves ----------------------------------------------------------------


def dice_gap(bench: Benchmark) -> Plot:
    """Per dataset, per model: Dice at tau = 0.5 and at the best tau*, and their difference."""
    figure = _figure(*_panel_size(bench, per_model=0.5, base=1.3, height=3.2))
    fixed_colour, chosen_colour = "#4c72b0", "#dd8452"
    for ax, dataset in zip(_subplots(figure, len(bench.datasets)), bench.datasets):
        models = bench.models_on(dataset)
        positions = np.arange(len(models))
        fixed = [_macro_percent(bench, m, dataset, "dice@0.5") for m in models]
        chosen = [_macro_percent(bench, m, dataset, "dice@best") for m in models]
        ax.bar(positions - 0.2, np.nan_to_num(fixed), width=0.4, color=fixed_colour, label="τ = 0.5 (fixed)")
        ax.bar(positions + 0.2, np.nan_to_num(chosen), width=0.4, color=chosen_colour,
               label="best τ* (chosen on the evaluated set)")
        top = max([v for v in fixed + chosen if not math.isnan(v)] + [1.0])
        for x, low, high in zip(positions, fixed, chosen):
            if not (math.isnan(low) or math.isnan(high)):
                ax.text(x, max(low, high) + 0.03 * top, f"Δ {high - low:+.1f}", ha="center", va="bottom",
                        fontsize=FONT_SIZE - 1)
        ax.set_ylim(0, top * 1.18)
        ax.set_xticks(positions, [bench.model_label(m) for m in models], rotation=30, ha="right")
        ax.set_title(bench.dataset_label(dataset), fontsize=FONT_SIZE + 1)
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("Dice (%), macro over classes", fontsize=FONT_SIZE)
        _style(ax)
        ax.grid(axis="x", visible=False)
    figure.legend(*figure.axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=2,
                  fontsize=FONT_SIZE, frameon=False)
    caption = (
        "Dice at the fixed threshold τ = 0.5 (blue) and at the best threshold τ* (orange), macro means over "
        "classes; Δ = Dice@τ* − Dice@0.5 in percentage points. τ* is chosen on the evaluated set itself (per "
        "class), so the orange bars and Δ are optimistic: they show how much a model's maps depend on the "
        "threshold."
    )
    return Plot("fig4_dice_fixed_vs_best_tau", figure, caption)


def _macro_percent(bench: Benchmark, model: str, dataset: str, name: str) -> float:
    value = bench.get(model, dataset).results["grounding"]["macro"][name]
    return math.nan if value is None else 100 * value


def _panel_size(bench: Benchmark, per_model: float, base: float, height: float) -> tuple[float, float]:
    rows, columns = _grid_shape(len(bench.datasets))
    width = columns * (base + per_model * max(len(bench.models_on(d)) for d in bench.datasets))
    return max(width, 5.0), rows * height + 0.5


def mean_curve(results: dict, name: str = "dice") -> np.ndarray | None:
    """The mean over classes with graded pairs of a per-class curve (``None`` if no class has one)."""
    curves = [c[name] for key, c in results["grounding"]["curves"].items()
              if results["grounding"]["per_class"][key]["pairs"] > 0]
    return np.mean(np.array(curves, dtype=float), axis=0) if curves else None


def dice_curves(bench: Benchmark) -> Plot:
    """Per dataset: each model's Dice (mean over classes) at every threshold tau."""
    colours = model_colours(bench)
    rows, columns = _grid_shape(len(bench.datasets))
    figure = _figure(max(4.2 * columns, 5.0), 3.2 * rows + 0.6)
    handles = {}
    for ax, dataset in zip(_subplots(figure, len(bench.datasets)), bench.datasets):
        for model in bench.models_on(dataset):
            results = bench.get(model, dataset).results
            curve = mean_curve(results)
            if curve is None:
                continue
            (line,) = ax.plot(results["thresholds"], 100 * curve, color=colours[model], linewidth=1.4)
            handles[model] = line
        ax.axvline(0.5, color="0.4", linestyle=":", linewidth=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(bottom=0)
        ax.set_title(bench.dataset_label(dataset), fontsize=FONT_SIZE + 1)
        ax.set_xlabel("threshold τ on the normalised map", fontsize=FONT_SIZE)
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("Dice (%), mean over classes", fontsize=FONT_SIZE)
        _style(ax)
    ordered = [m for m in bench.models if m in handles]
    figure.legend([handles[m] for m in ordered], [bench.model_label(m) for m in ordered], loc="outside lower center",
                  ncols=min(len(ordered), 4) or 1, fontsize=FONT_SIZE, frameon=False)
    caption = (
        "Dice against the threshold τ (the predicted region is {s ≥ τ} of the min-max normalised map): per-image "
        "means, averaged over the classes with graded pairs. Dotted: the fixed τ = 0.5. The best τ* of the tables "
        "is chosen per class on that class's own curve, so the peak of this mean curve need not equal the macro "
        "Dice@τ*."
    )
    return Plot("dice_vs_tau", figure, caption)


# -- lesion size -------------------------------------------------------------------------------

#: The y axis of each lesion-size panel.
STRATA_UNITS = {"pointing_game": "hits (% of pairs)", "dice@0.5": "mean Dice (%)"}


def lesion_size(bench: Benchmark, analysis: ReportAnalysis) -> Plot | None:
    """Per dataset (rows), Pointing Game and Dice at tau = 0.5 (columns) per lesion-size bin, every
    class's pairs pooled: one line per model, bootstrap intervals as error bars."""
    datasets = [d for d in bench.datasets if analysis.rows("strata", dataset=d, **{"class": ALL})]
    if not datasets:
        return None
    colours = model_colours(bench)
    figure = _figure(7.0, 2.9 * len(datasets) + 0.6)
    axes = figure.subplots(len(datasets), len(STRATA_METRICS), squeeze=False)
    handles = {}
    for row_axes, dataset in zip(axes, datasets):
        found = analysis.rows("strata", dataset=dataset, **{"class": ALL})
        strata = list(dict.fromkeys(row["stratum"] for row in found))
        counts = {s: max(row["pairs"] for row in found if row["stratum"] == s) for s in strata}
        models = [m for m in bench.models_on(dataset) if any(row["model"] == m for row in found)]
        positions = np.arange(len(strata), dtype=float)
        for ax, metric in zip(row_axes, STRATA_METRICS):
            for i, model in enumerate(models):
                rows = {row["stratum"]: row for row in found if row["model"] == model and row["metric"] == metric}
                values = np.array([rows[s]["estimate"] for s in strata], dtype=float) * 100
                lower = np.array([rows[s]["lower"] for s in strata], dtype=float) * 100
                upper = np.array([rows[s]["upper"] for s in strata], dtype=float) * 100
                offset = (i - (len(models) - 1) / 2) * min(0.08, 0.4 / max(len(models), 1))
                # a stratum's estimate can lie outside its replicates' interval (few replicates): no arm below 0
                arms = np.clip(np.nan_to_num(np.stack([values - lower, upper - values])), 0, None)
                handles[model] = ax.errorbar(
                    positions + offset, values, yerr=arms,
                    color=colours[model], marker=MARKERS[i % len(MARKERS)], markersize=4, linewidth=1.4,
                    capsize=2.5, elinewidth=0.9, label=bench.model_label(model))
            ax.set_xticks(positions, [f"{s}\n(n = {counts[s]})" for s in strata])
            ax.set_xlim(-0.5, len(strata) - 0.5)
            ax.set_ylim(bottom=-3)  # a point at 0 stays whole
            ax.set_ylabel(STRATA_UNITS[metric], fontsize=FONT_SIZE)
            ax.set_title(f"{bench.dataset_label(dataset)}: {long(metric)}", fontsize=FONT_SIZE + 1)
            _style(ax)
            ax.grid(axis="x", visible=False)
        for ax in row_axes:
            ax.set_xlabel("lesion area as a share of the image", fontsize=FONT_SIZE)
    ordered = [m for m in bench.models if m in handles]
    figure.legend([handles[m] for m in ordered], [bench.model_label(m) for m in ordered], loc="outside lower center",
                  ncols=min(len(ordered), 4) or 1, fontsize=FONT_SIZE, frameon=False)
    level = f"{100 * analysis.settings.confidence:g}%"
    caption = (
        "Grounding by lesion size: Pointing Game (left) and Dice at the fixed τ = 0.5 (right) per size bin of the "
        "region's area as a share of the image (in the batch geometry), the pairs of every class pooled; n = graded "
        f"(image, class) pairs in the bin. One line per model; error bars: {level} bootstrap intervals "
        f"({analysis.settings.replicates} replicates, images resampled). Models are drawn slightly apart along x "
        "so that their bars do not overlap. A bin without pairs has no point."
    )
    return Plot("lesion_size", figure, caption)


# -- the human scale ---------------------------------------------------------------------------

#: The human readers' bands: a grey per reader set on a dataset.
HUMAN_BAND_COLOURS = ("0.55", "0.3", "0.75")


def human_band(bench: Benchmark, analysis: ReportAnalysis, dataset: str) -> Plot:
    """Pointing Game, Dice and IoU at τ = 0.5 (panels) per finding and for the macro mean (x): each
    model's estimate with its interval, over the human readers' estimate (a line) and interval (a
    shaded band) on the same images."""
    colours = model_colours(bench)
    keys = [*bench.classes(dataset), MACRO]
    models, readers = bench.models_on(dataset), bench.readers_on(dataset)
    figure = _figure(max(6.0, 1.2 * len(keys) * len(HUMAN_GAP_METRICS) / 2 + 2), 3.0)
    axes = figure.subplots(1, len(HUMAN_GAP_METRICS), squeeze=False)[0]
    positions = np.arange(len(keys), dtype=float)
    handles = {}

    def interval(model: str, key: str, metric: str) -> tuple[float, float, float]:
        grounding = bench.get(model, dataset).results["grounding"]
        value = (grounding["macro"] if key == MACRO else grounding["per_class"].get(key, {})).get(metric)
        lower, upper = analysis.interval(dataset, model, key, metric) or (math.nan, math.nan)
        return tuple(100 * (math.nan if v is None else v) for v in (value, lower, upper))

    for ax, metric in zip(axes, HUMAN_GAP_METRICS):
        for h, human in enumerate(readers):
            colour = HUMAN_BAND_COLOURS[h % len(HUMAN_BAND_COLOURS)]
            for x, key in zip(positions, keys):
                value, lower, upper = interval(human, key, metric)
                if math.isnan(value):
                    continue
                band = ax.fill_between([x - 0.42, x + 0.42], lower, upper, color=colour, alpha=0.3, linewidth=0)
                ax.hlines(value, x - 0.42, x + 0.42, color=colour, linewidth=1.6)
                handles[human] = band
        for i, model in enumerate(models):
            found = np.array([interval(model, key, metric) for key in keys])
            offset = (i - (len(models) - 1) / 2) * min(0.12, 0.6 / max(len(models), 1))
            arms = np.clip(np.nan_to_num(np.stack([found[:, 0] - found[:, 1], found[:, 2] - found[:, 0]])), 0, None)
            handles[model] = ax.errorbar(
                positions + offset, found[:, 0], yerr=arms,
                color=colours[model], marker=MARKERS[i % len(MARKERS)], markersize=4, linestyle="none", capsize=2.5,
                elinewidth=0.9)
        ax.set_xticks(positions, [("Mean" if key == MACRO else bench.short_name(key)) for key in keys])
        ax.set_xlim(-0.5, len(keys) - 0.5)
        ax.set_ylim(-3, 103)
        ax.set_ylabel("percent", fontsize=FONT_SIZE)
        ax.set_title(long(metric), fontsize=FONT_SIZE + 1)
        _style(ax)
        ax.grid(axis="x", visible=False)
    shown = [*models, *readers]
    figure.legend([handles[m] for m in shown if m in handles],
                  [bench.model_label(m) + (" (human)" if m in readers else "") for m in shown if m in handles],
                  loc="outside lower center", ncols=min(len(handles), 4) or 1, fontsize=FONT_SIZE, frameon=False)
    level = f"{100 * analysis.settings.confidence:g}%"
    caption = (
        f"Grounding against the human readers on {bench.dataset_label(dataset)}: Pointing Game, Dice and IoU at "
        "τ = 0.5 per finding and for the macro mean (Mean). Grey band: the human readers' value (line) and its "
        f"{level} bootstrap interval (shaded), scored like a model against the same reference on the same images; "
        "points: each model's value, error bars its interval (models drawn slightly apart along x). The gaps with "
        "their paired intervals are in the table of each model's gap to the human readers."
    )
    return Plot(f"human_band_{dataset}", figure, caption)


def human_bands(bench: Benchmark, analysis: ReportAnalysis) -> list[Plot]:
    """`human_band` of every dataset with a human reader set and a model."""
    return [human_band(bench, analysis, d) for d in bench.datasets if bench.readers_on(d) and bench.models_on(d)]


# -- robustness --------------------------------------------------------------------------------

#: The robustness figure's panels: Pointing Game, Dice at tau = 0.5, AUROC
ROBUSTNESS_PANELS = tuple(m for m in ROBUSTNESS_METRICS if m in ("pointing_game", "dice@0.5", "auroc"))


def perturbation_tick(label: str, width: int = 26) -> str:
    """A perturbation label over several lines: each transform's name, then its arguments."""
    lines = []
    for part in label.split(" + "):
        name, _, rest = part.partition("(")
        arguments, _, tail = rest.rpartition(")")
        lines.append(name if not lines else f"+ {name}")
        lines += textwrap.wrap(arguments, width, break_long_words=False)
        lines += [tail.strip(", ")] if tail.strip(", ") else []  # the seed
    return "\n".join(lines)


def robustness(bench: Benchmark) -> Plot | None:
    """Per dataset (rows) and metric (columns): each model's value under every perturbation (one
    row of the panel each, the unperturbed reference on top), its reference value as a dotted line."""
    pairs = bench.robustness_pairs()
    if not pairs:
        return None
    datasets = list(dict.fromkeys(d for _, d in pairs))
    colours = model_colours(bench, sorted({m for m, _ in pairs}))
    labels = {d: [REFERENCE] + sorted({p for m, e in pairs if e == d for p, _ in bench.robustness_runs(m, d) if p})
              for d in datasets}
    wrapped = {label: label if label == REFERENCE else perturbation_tick(label) for d in datasets for label in labels[d]}
    height = sum(0.3 * sum(wrapped[label].count("\n") + 1 for label in labels[d]) + 1.0 for d in datasets) + 0.7
    figure = _figure(9.0, height)
    axes = figure.subplots(len(datasets), len(ROBUSTNESS_PANELS), squeeze=False, sharey="row",
                           gridspec_kw={"height_ratios": [len(labels[d]) for d in datasets]})
    handles = {}
    for row_axes, dataset in zip(axes, datasets):
        models = [m for m, d in pairs if d == dataset]
        positions = {label: i for i, label in enumerate(labels[dataset])}
        for ax, metric in zip(row_axes, ROBUSTNESS_PANELS):
            section = metric_info(metric).section
            largest = 0.0
            for i, model in enumerate(models):
                offset = (i - (len(models) - 1) / 2) * min(0.15, 0.6 / len(models))
                points = [(positions[p or REFERENCE] + offset, run.results[section]["macro"][metric])
                          for p, run in bench.robustness_runs(model, dataset)]
                ys = [y for y, v in points if v is not None]
                xs = [100 * v for _, v in points if v is not None]
                largest = max([largest, *xs])
                handles[model] = ax.scatter(xs, ys, s=30, color=colours[model], marker=MARKERS[i % len(MARKERS)],
                                            edgecolors="black", linewidths=0.4, zorder=3)
                reference = bench.get(model, dataset)
                if reference is not None and reference.results[section]["macro"][metric] is not None:
                    ax.axvline(100 * reference.results[section]["macro"][metric], color=colours[model],
                               linestyle=":", linewidth=1, zorder=2)
            ax.set_yticks(range(len(labels[dataset])), [wrapped[label] for label in labels[dataset]])
            ax.set_ylim(len(labels[dataset]) - 0.5, -0.5)  # the reference on top
            ax.axhline(0.5, color="0.6", linewidth=0.6)
            # from 0, so that small changes look small; AUROC on its whole range (chance: 50)
            right = 100 if metric == "auroc" else min(100, max(10.0, 1.15 * largest))
            ax.set_xlim(-0.03 * right, right)
            ax.set_xlabel(f"{long(metric)} (%)", fontsize=FONT_SIZE)
            ax.set_title(f"{bench.dataset_label(dataset)}: {long(metric)}", fontsize=FONT_SIZE + 1)
            _style(ax)
            ax.grid(axis="y", visible=False)
    ordered = sorted(handles)
    reference_line = Line2D([], [], color="0.3", linestyle=":", linewidth=1)
    figure.legend([*(handles[m] for m in ordered), reference_line],
                  [*(bench.model_label(m) for m in ordered), "its unperturbed value"], loc="outside lower center",
                  ncols=min(len(ordered) + 1, 5), fontsize=FONT_SIZE, frameon=False)
    lost = [f"{lost_regions(run)} under {p}" for m, d in pairs for p, run in bench.robustness_runs(m, d)
            if p and lost_regions(run)]
    caption = (
        "Grounding and recognition under perturbation: each row one augment pipeline (applied to image and masks "
        "together, the same perturbed images for every model), the unperturbed run on top; one marker per model "
        "(models drawn slightly apart vertically), its unperturbed value as a dotted line of its colour. "
        "Pointing Game, Dice at the fixed τ = 0.5 and AUROC are macro means over classes."
        + (f" Regions pushed out of the frame (left out of grounding): {'; '.join(lost)}." if lost else "")
    )
    return Plot("robustness", figure, caption)


# -- Fig. 2 ------------------------------------------------------------------------------------


def region_outline(mask: np.ndarray) -> np.ndarray:
    """The region's border pixels (inside pixels with a 4-neighbour outside), two pixels wide."""
    padded = np.pad(mask, 1)
    interior = padded[1:-1, 1:-1] & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & padded[1:-1, 2:]
    border = mask & ~interior
    thick = np.pad(border, 1)
    return border | thick[:-2, 1:-1] | thick[2:, 1:-1] | thick[1:-1, :-2] | thick[1:-1, 2:]


def overlay_rgb(image: np.ndarray, saliency: np.ndarray | None, mask: np.ndarray) -> np.ndarray:
    """uint8 RGB [S,S,3]: the grey radiograph, the map in the saliency colour map blended over it
    (if given), and the region's outline in white. ``image``/``saliency`` uint8 [S,S], ``mask`` bool."""
    grey = np.repeat(image[..., None].astype(float) / 255, 3, axis=-1)
    if saliency is not None:
        heat = colormaps[SALIENCY_CMAP](saliency.astype(float) / 255)[..., :3]
        grey = (1 - SALIENCY_ALPHA) * grey + SALIENCY_ALPHA * heat
    rgb = (grey * 255).round().astype(np.uint8)
    rgb[region_outline(mask.astype(bool))] = 255
    return rgb


def overlay_grids(bench: Benchmark, max_columns: int = 6) -> list[Plot]:
    """Per dataset, the saved pairs every model has (the same images), as columns: the first image
    of each class, or more per class while they fit in ``max_columns``; rows: the radiograph with
    its region, then one per model. A dataset with more columns is split over several figures."""
    plots = []
    for dataset in bench.datasets:
        saved = {}
        for model in bench.models_on(dataset):
            overlays = read_overlays(bench.get(model, dataset).folder)
            if overlays is not None and len(overlays["image_id"]):
                saved[model] = overlays
        if not saved:
            continue
        common = set.intersection(*({(f, i) for f, i in zip(o["finding"], o["image_id"])} for o in saved.values()))
        classes = [key for key in bench.classes(dataset) if any(f == key for f, _ in common)]
        per_class = max(1, max_columns // max(len(classes), 1))
        pairs = [(key, image_id) for key in classes
                 for image_id in sorted(i for f, i in common if f == key)[:per_class]]
        for part, start in enumerate(range(0, len(pairs), max_columns), start=1):
            chunk = pairs[start:start + max_columns]
            name = f"fig2_overlays_{dataset}" + (f"_{part}" if len(pairs) > max_columns else "")
            plots.append(_overlay_grid(bench, dataset, saved, chunk, name))
    return plots


def _overlay_grid(bench: Benchmark, dataset: str, saved: dict, pairs: list[tuple[str, str]], name: str) -> Plot:
    models = list(saved)
    panel = 1.55
    figure = _figure(panel * len(pairs) + 1.4, panel * (len(models) + 1) + 0.55)
    axes = figure.subplots(len(models) + 1, len(pairs), squeeze=False)
    for c, (key, image_id) in enumerate(pairs):
        for r, model in enumerate([None, *models]):
            overlays = saved[model or models[0]]
            (i,) = np.flatnonzero((overlays["finding"] == key) & (overlays["image_id"] == image_id))[:1]
            saliency = None if model is None else overlays["saliency"][i]
            ax = axes[r, c]
            ax.imshow(overlay_rgb(overlays["image"][i], saliency, overlays["mask"][i]), interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                title = textwrap.fill(bench.finding_name(key), 18, break_long_words=False)
                ax.set_title(f"{title}\n({c + 1})", fontsize=FONT_SIZE)
            if c == 0:
                label = "Radiograph + region" if model is None else bench.model_label(model)
                ax.set_ylabel(textwrap.fill(label, 18, break_long_words=False), fontsize=FONT_SIZE)
    colourbar = figure.colorbar(ScalarMappable(Normalize(0, 1), colormaps[SALIENCY_CMAP]), ax=axes,
                                shrink=min(0.8, 3.5 / figure.get_figheight()), aspect=20)
    colourbar.set_label("saliency (min–max normalised)", fontsize=FONT_SIZE)
    colourbar.ax.tick_params(labelsize=FONT_SIZE - 1)
    images = "; ".join(f"({c + 1}) {bench.short_name(key)}: {image_id}" for c, (key, image_id) in enumerate(pairs))
    missing = [bench.model_label(m) for m in bench.models_on(dataset) if m not in saved]
    caption = (
        f"Saliency overlays on {bench.dataset_label(dataset)}: each column one image positive for the finding "
        "above it (the first ones by sorted image id, the same image for every model); top row the radiograph with the "
        f"radiologist region outlined in white, then each model's map for that finding in the {SALIENCY_CMAP} "
        f"colour map blended at {int(100 * SALIENCY_ALPHA)}% over the radiograph. Images: {images}."
        + (f" No overlays saved by: {', '.join(missing)}." if missing else "")
    )
    return Plot(name, figure, caption)


def paper_figures(bench: Benchmark, analysis: ReportAnalysis | None = None) -> list[Plot]:
    """Every figure of the report, in order (the lesion-size figure and the human readers' bands with
    the analysis)."""
    plots = [recognition_vs_grounding(bench, analysis), dice_gap(bench), dice_curves(bench)]
    strata = lesion_size(bench, analysis) if analysis is not None else None
    humans = human_bands(bench, analysis) if analysis is not None else []
    return plots + ([strata] if strata is not None else []) + humans + overlay_grids(bench)
