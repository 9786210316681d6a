"""Is the map an explanation? The report's tables and figures of the sanity and faithfulness checks
(``xbench.checks``), for the runs that have them:

- one table with plausibility (Pointing Game, Dice), faithfulness (deletion and insertion AUC,
  ROAD) and sanity (similarity to the original map after every layer group is randomised) side by
  side per model and dataset, with the analysis' bootstrap intervals (`explanation_table`);
- per model and dataset, the cascade as a table (`cascade_tables`) and as the classic figure:
  one pair's map as the layers are randomised from the output down, and the similarities of every
  pair's map to the original at each step (`cascade_figures`);
- plausibility against faithfulness, one point per model and dataset
  (`plausibility_vs_faithfulness`);
- a table per Quantus family -- localisation, complexity, randomisation, robustness -- per model and
  dataset with intervals (`family_tables`).

The definitions: ``docs/explanations.md``.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
from matplotlib.lines import Line2D

from xbench.analysis.tables import MACRO
from xbench.console import counted
from xbench.metrics.names import long, metric, short
from xbench.reporting.benchmark import Benchmark
from xbench.reporting.figures import FONT_SIZE, MARKERS, Plot, _figure, _style, model_colours, overlay_rgb
from xbench.reporting.paper_tables import EMPHASIS_NOTE, ReportAnalysis
from xbench.reporting.table import Cell, Column, Row, Table
from xbench.results.folder import DAMAGED, METRICS, SANITY_MAPS, read_overlays

CHECKS = ("faithfulness", "sanity")
#: The explanation table's columns: (section of metrics.json, key), by column group.
COLUMNS = {
    "Plausibility": (("grounding", "pointing_game"), ("grounding", "dice@0.5")),
    "Faithfulness": (("faithfulness", "deletion_auc"), ("faithfulness", "insertion_auc"), ("faithfulness", "road")),
    "Sanity (all randomised)": (("sanity", "spearman"), ("sanity", "ssim")),
}
#: The report's table of each of Quantus' families: (title, columns as (section, key) by group, what
#: the values are). A run is a row where the family's own section applies.
FAMILIES = {
    "localisation": (
        "Localisation of each model's maps in the radiologist's region (macro mean over classes)",
        {"Grounding": (("grounding", "pointing_game"), ("grounding", "dice@0.5")),
         "Localisation": (("localisation", "relevance_mass"), ("localisation", "relevance_rank"),
                          ("localisation", "top_k_intersection"), ("localisation", "pixel_auc"))},
        "Every graded pair of the split, in percent. Mass: the map's sum inside the region over its sum (Quantus' "
        "relevance mass accuracy and, at its defaults, attribution localisation); Rank: the share of the |R| most "
        "relevant pixels inside the region; Top-k: the share of the k most relevant (Quantus' 1,000 of 224 × 224, "
        "the same share of the frame); Pixel AUC: the AUROC of the map's values for the region's pixels (50: "
        "chance). Higher is better."),
    "complexity": (
        "Complexity of each model's maps (macro mean over classes)",
        {"Complexity": (("complexity", "sparseness"), ("complexity", "complexity"))},
        "Every graded pair's map. Gini: sparseness, 0 (uniform) to 1 (one pixel), higher is sparser; Entropy: "
        "complexity, the entropy in nats of each pixel's share of the map (at most ln n), lower is simpler."),
    "randomisation": (
        "Randomisation: does the map change with the class or the weights? (macro mean over classes)",
        {"Across classes": (("randomisation", "random_logit"),),
         "Cascade (all randomised)": (("sanity", "spearman"), ("sanity", "ssim"))},
        "Random logit: SSIM of each graded pair's map with the same image's map of another class of the run, "
        "drawn per image and class (every graded pair; none in a one-class run). Cascade: the sanity check's "
        "similarity to the original map once every layer group is re-initialised (the images it checked). Lower "
        "is better: a map that explains the class and the model changes with them."),
    "robustness": (
        "Robustness of each model's maps to input noise (macro mean over classes)",
        {"Robustness": (("robustness", "max_sensitivity"), ("robustness", "local_lipschitz"))},
        "The images the robustness check scored. Max-sens: the largest relative change of the map, "
        "‖a − a′‖ / ‖a‖, over noisy copies of the input (uniform noise); Lipschitz: the largest change of the map "
        "per unit of input change, ‖a − a′‖ / ‖x − x′‖ (Gaussian noise). Lower is more robust."),
}
#: An interval over fewer images is marked with their count: resampling so few shows how they vary, not
#: how certain the value is (over one image, every replicate is that image: no spread at all).
FEW_IMAGES = 10
FEW_NOTE = (f"(n images) after an interval: it rests on fewer than {FEW_IMAGES} images, so it shows how those few "
            "vary when resampled, not how certain the value is (over 1 image it has no spread at all).")
ZERO_PAIRS_NOTE = ("– (0 pairs): the check ran but scored no (image, class) pair: none of the images it looked at "
                   "has a graded pair (a positive finding with its region in the frame).")
#: The cascade table's and figure's similarities, and the grounding of the randomised model.
SIMILARITIES = ("spearman", "spearman_abs", "ssim")
STEP_GROUNDING = ("pointing_game", "dice@0.5", "iou@0.5")
#: Maps shown in a cascade figure's strip (the original and the last step always among them).
STRIP_MAPS = 8
#: The cascade figure's curves: the two Spearman curves often coincide (maps without negative
#: values), so the second is dashed with hollow markers around the first's, and both stay visible.
CURVE_STYLES = {
    "spearman": {"linestyle": "-", "marker": "o", "markersize": 3.5},
    "spearman_abs": {"linestyle": "--", "marker": "s", "markersize": 6.5, "markerfacecolor": "none"},
    "ssim": {"linestyle": "-", "marker": "^", "markersize": 3.5},
    "pointing_game": {"linestyle": ":", "marker": "D", "markersize": 3.5},
}
#: The cascade figure's panel titles and step labels.
TITLE_SIZE = FONT_SIZE - 2
#: The faithfulness panels of the scatter.
SCATTER_METRICS = ("deletion_auc", "insertion_auc", "road")

DEFINITIONS = (
    "Faithfulness, on the images the check scored: deletion (insertion) AUC = area under the class's logit as "
    "the most salient input pixels are set to 0 (restored into a blurred input) in K steps; ROAD = (LeRF − MoRF) / "
    "2, the logit change when the least (most) relevant pixels are imputed by noisy linear imputation, averaged "
    "over the percentiles. Sanity: Spearman rank correlation and SSIM of each pair's map with the original map "
    "once every layer group of the model is re-initialised (cascading randomisation); a map that stays alike "
    "does not depend on the weights. Definitions: docs/explanations.md."
)


def _applicable(run, section: str) -> bool:
    return bool((run.results.get(section) or {}).get("applicable"))


def checked_runs(bench: Benchmark) -> list[tuple[str, str]]:
    """(model, dataset) of the runs with a check that applied, in the report's order."""
    return [(model, dataset) for dataset in bench.datasets for model in bench.models_on(dataset)
            if any(_applicable(bench.get(model, dataset), section) for section in CHECKS)]


def _column(group: str, key: str) -> Column:
    return Column(short(key), group, percent=metric(key).unit == "percent", lower_better=metric(key).lower_better)


def _images(results: dict, section: str) -> int:
    """The images a section's values rest on: the whole split for grounding, else those it scored."""
    return results["data"]["images_evaluated"] if section == "grounding" else results[section]["images"]


def _macro_cells(results: dict, keys, dataset: str, model: str, analysis: ReportAnalysis | None) -> list[Cell]:
    """A run's macro means of ``keys`` ((section, key)) with their bootstrap intervals; an interval
    over fewer than `FEW_IMAGES` images is marked with their count, and the empty value of a section
    that scored no pair says so (``– (0 pairs)``)."""
    cells = []
    for section, key in keys:
        found = results.get(section) or {}
        value = found.get("macro", {}).get(key)
        interval = analysis.interval(dataset, model, MACRO, key) if analysis and value is not None else None
        mark = ""
        if interval is not None and _images(results, section) < FEW_IMAGES:
            mark = f"({counted(_images(results, section), 'image')})"
        elif value is None and found.get("applicable") and found.get("pairs") == 0:
            mark = "(0 pairs)"
        cells.append(Cell(value, interval, mark))
    return cells


def _cell_notes(rows) -> str:
    """What the marks of `_macro_cells` mean, for the marks the table holds."""
    marks = {cell.mark for row in rows for cell in row.cells}
    few = any(mark.endswith(("image)", "images)")) for mark in marks)
    return ((FEW_NOTE + " " if few else "") + (ZERO_PAIRS_NOTE + " " if "(0 pairs)" in marks else ""))


def family_tables(bench: Benchmark, analysis: ReportAnalysis | None = None) -> list[Table]:
    """A table per Quantus family (`FAMILIES`) with the runs where it applies, macro means with
    bootstrap intervals."""
    tables = []
    for name, (title, groups, meaning) in FAMILIES.items():
        runs = [(model, dataset) for dataset in bench.datasets for model in bench.models_on(dataset)
                if _applicable(bench.get(model, dataset), name)]
        if not runs:
            continue
        columns = tuple(_column(group, key) for group, keys in groups.items() for _, key in keys)
        rows = tuple(Row(bench.model_label(model), tuple(_macro_cells(bench.get(model, dataset).results,
                                                                      [k for keys in groups.values() for k in keys],
                                                                      dataset, model, analysis)),
                         group=bench.dataset_label(dataset)) for model, dataset in runs)
        caption = (meaning + " – : not scored (a check not asked for, or not applicable). " + _cell_notes(rows)
                   + "Definitions: docs/explanations.md. " + (analysis.note + " " if analysis else "") + EMPHASIS_NOTE)
        tables.append(Table(f"explanations_{name}", title, caption, "Model", columns, rows))
    return tables


def explanation_table(bench: Benchmark, analysis: ReportAnalysis | None = None) -> Table | None:
    """Plausibility, faithfulness and sanity side by side per dataset (row groups) and model, macro
    means with bootstrap intervals (``None`` when no run has a check)."""
    runs = checked_runs(bench)
    if not runs:
        return None
    columns = tuple(_column(group, key) for group, keys in COLUMNS.items() for _, key in keys)
    rows, scopes = [], set()
    for model, dataset in runs:
        results = bench.get(model, dataset).results
        cells = _macro_cells(results, [k for keys in COLUMNS.values() for k in keys], dataset, model, analysis)
        for section in CHECKS:
            if _applicable(bench.get(model, dataset), section):
                scopes.add(f"{section}: {counted(results[section]['images'], 'image')}")
        rows.append(Row(bench.model_label(model), tuple(cells), group=bench.dataset_label(dataset)))
    caption = (
        "Is the map an explanation? Plausibility: Pointing Game and Dice at τ = 0.5 over the whole split, in "
        "percent. " + DEFINITIONS + " AUCs and ROAD in logits (each model's own scale: compare a model's rows, and "
        "rank models with care); Spearman and SSIM from −1 to 1. Lower is better for deletion AUC, Spearman and "
        "SSIM, higher for the rest. – : the check did not run or does not apply (a model without weights has "
        f"no sanity check). Images checked per run: {', '.join(sorted(scopes))}. " + _cell_notes(rows)
        + (analysis.note + " " if analysis else "") + EMPHASIS_NOTE
    )
    return Table("explanations", "Plausibility, faithfulness and sanity of each model's maps (macro mean over classes)",
                 caption, "Model", columns, tuple(rows))


def sanity_steps(run) -> list[dict]:
    """The run's cascade steps (``metrics.json``'s ``sanity.steps``), each with its layers and every
    similarity and grounding value a finite number or null (undefined); anything else is an error
    naming the file, the step and the value."""
    path = run.folder / METRICS
    steps = run.results["sanity"].get("steps")
    if not isinstance(steps, list) or not steps:
        raise ValueError(f"{path}: sanity.steps is missing or not a list of steps; {DAMAGED}")
    for i, step in enumerate(steps):
        if not (isinstance(step, dict) and isinstance(step.get("layers"), str) and isinstance(step.get("grounding"), dict)):
            raise ValueError(f"{path}: sanity.steps[{i}] lacks its layers or grounding; {DAMAGED}")
        values = [(key, step) for key in SIMILARITIES] + [(key, step["grounding"]) for key in STEP_GROUNDING]
        for key, holder in values:
            where = f"sanity.steps[{i}].{'' if holder is step else 'grounding.'}{key}"
            if key not in holder:
                raise ValueError(f"{path}: {where} is missing; {DAMAGED}")
            value = holder[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value)):
                raise ValueError(f"{path}: {where} is {value!r}, not a finite number or null; {DAMAGED}")
    return steps


def sanity_strip(run, steps: list[dict]) -> dict | None:
    """The run's saved cascade of one pair (`SANITY_MAPS`: its radiograph, region and a map per
    step, all [H, W]), or ``None`` where it saved none; arrays that do not fit the steps are an error
    naming the file."""
    saved = read_overlays(run.folder, SANITY_MAPS)
    if saved is None:
        return None
    path = run.folder / SANITY_MAPS
    missing = sorted({"image_id", "finding", "image", "mask", "maps"} - saved.keys())
    if missing:
        raise ValueError(f"{path} lacks the arrays {missing}; {DAMAGED}")
    maps, image, mask = saved["maps"], saved["image"], saved["mask"]
    if maps.shape[:1] != (len(steps),) or not maps.shape[1:] == image.shape == mask.shape or image.ndim != 2:
        raise ValueError(f"{path}: maps {maps.shape}, image {image.shape} and mask {mask.shape} are not one [H, W] "
                         f"map for each of the {len(steps)} steps with its image and region; {DAMAGED}")
    return saved


def cascade_tables(bench: Benchmark) -> list[Table]:
    """Per run with the sanity check: each cascade step's similarity to the original map and the
    randomised model's grounding on the checked images."""
    tables = []
    for model, dataset in checked_runs(bench):
        run = bench.get(model, dataset)
        if not _applicable(run, "sanity"):
            continue
        section, steps = run.results["sanity"], sanity_steps(run)
        columns = (*(Column(short(key), "Similarity to the original", ranked=False, percent=False)
                     for key in SIMILARITIES),
                   *(Column(short(key), "Grounding of the randomised model", ranked=False) for key in STEP_GROUNDING))
        rows = tuple(Row(f"{k}. {step['layers']}",
                         (*(Cell(step[key]) for key in SIMILARITIES),
                          *(Cell(step["grounding"][key]) for key in STEP_GROUNDING)))
                     for k, step in enumerate(steps))
        label = f"{bench.model_label(model)} on {bench.dataset_label(dataset)}"
        tables.append(Table(
            f"sanity_{model}_{dataset}", f"Cascading randomisation of {label}",
            f"Step k re-initialises the layers named and every layer above it (from the output down; seed "
            f"{section['seed']}), step 0 is the model as loaded. Similarities: mean over the "
            f"{counted(section['pairs'], 'graded pair')} of {counted(section['images'], 'image')} of Spearman's rank "
            "correlation (plain and of absolute values) and "
            "SSIM between the pair's map and its original map (macro over classes); a map that explains the model "
            "falls towards 0. Grounding (percent): the randomised model's maps graded on the same images. "
            "Meaningful with the authors' weights only: random weights have nothing to destroy.",
            "Randomised up to", columns, rows))
    return tables


def _strip_steps(count: int) -> list[int]:
    """Up to `STRIP_MAPS` steps of ``count``, evenly spaced, the first and last among them."""
    return sorted({int(round(v)) for v in np.linspace(0, count - 1, min(count, STRIP_MAPS))})


def spearman_curves_coincide(steps: list[dict]) -> bool:
    """Whether every step's Spearman of absolute values equals its plain Spearman (to 1e-9, or
    both undefined): then the figure's two curves are one line, and its legend and caption say so."""
    pairs = [(step["spearman"], step["spearman_abs"]) for step in steps]
    return all(plain == absolute if None in (plain, absolute) else math.isclose(plain, absolute, abs_tol=1e-9)
               for plain, absolute in pairs)


def cascade_figures(bench: Benchmark) -> list[Plot]:
    """Per run with the sanity check, the classic cascade figure: one pair's map at steps of the
    cascade (when the run saved them) above the similarity of every pair's map to the original."""
    plots = []
    for model, dataset in checked_runs(bench):
        run = bench.get(model, dataset)
        if not _applicable(run, "sanity"):
            continue
        steps = sanity_steps(run)
        saved = sanity_strip(run, steps)
        shown = _strip_steps(len(steps)) if saved is not None else []
        width = max(7.0, 1.15 * len(shown))
        figure = _figure(width, 6.6 if shown else 4.6)
        if shown:
            top, bottom = figure.subfigures(2, 1, height_ratios=(1, 1.6))
            # Each title wrapped to its panel's width (about 0.6 em a character), so neighbours never meet.
            characters = int(0.9 * width / len(shown) * 72 / (0.6 * TITLE_SIZE))
            for ax, k in zip(top.subplots(1, len(shown), squeeze=False)[0], shown):
                ax.imshow(overlay_rgb(saved["image"], saved["maps"][k], saved["mask"].astype(bool)))
                ax.set_title(textwrap.fill(f"{k}. {steps[k]['layers']}", characters), fontsize=TITLE_SIZE)
                ax.set_axis_off()
        else:
            bottom = figure
        ax = bottom.subplots()
        x = np.arange(len(steps))
        same = spearman_curves_coincide(steps)
        for key in (*SIMILARITIES, "pointing_game"):
            values = [step["grounding"][key] if key == "pointing_game" else step[key] for step in steps]
            label = long(key) if key == "pointing_game" else short(key)
            ax.plot(x, [math.nan if v is None else v for v in values], linewidth=1.3, **CURVE_STYLES[key],
                    label=f"{label}: same as {short('spearman')}" if same and key == "spearman_abs" else label)
        ax.axhline(0, color="0.4", linewidth=0.8)
        # Vertical labels: their boxes are their glyphs, one per step, side by side.
        ax.set_xticks(x, [f"{k}. {step['layers']}" for k, step in enumerate(steps)], rotation=90,
                      fontsize=TITLE_SIZE)
        ax.set_ylim(-1.05, 1.05)
        ax.set_ylabel("similarity to the original map", fontsize=FONT_SIZE)
        ax.set_xlabel("randomised up to (cumulative, from the output down)", fontsize=FONT_SIZE)
        _style(ax)
        ax.legend(fontsize=FONT_SIZE - 1, frameon=False, ncols=4, loc="lower left")
        label = f"{bench.model_label(model)} on {bench.dataset_label(dataset)}"
        section = run.results["sanity"]
        caption = (
            f"Cascading randomisation of {label}: "
            + (f"top, the map of {bench.finding_name(str(saved['finding'].item()))} on image {saved['image_id'].item()} (white: the region) "
               "as the model is randomised step by step; bottom, " if shown else "")
            + f"the mean similarity of the maps of {counted(section['pairs'], 'graded pair')} to their original "
            "maps (Spearman, "
            "plain and of absolute values, and SSIM) and the Pointing Game of the randomised model (a fraction). "
            + ("The two Spearman curves coincide here (the dashed one lies on the solid one): taking absolute "
               "values changed no correlation, as for maps without negative values. " if same else "")
            + "A map that explains the model changes as its weights are destroyed; one that stays alike explains "
            "the image. Meaningful with the authors' weights only."
        )
        plots.append(Plot(f"sanity_{model}_{dataset}", figure, caption))
    return plots


def plausibility_vs_faithfulness(bench: Benchmark, analysis: ReportAnalysis | None = None) -> Plot | None:
    """One point per (model, dataset) with the faithfulness check: macro Pointing Game against each
    faithfulness measure, with bootstrap intervals as error bars where the analysis gives them."""
    runs = [(m, d) for m, d in checked_runs(bench) if _applicable(bench.get(m, d), "faithfulness")]
    if not runs:
        return None
    colours = model_colours(bench)
    markers = {d: MARKERS[i % len(MARKERS)] for i, d in enumerate(bench.datasets)}
    figure = _figure(10.0, 3.6)
    axes = figure.subplots(1, len(SCATTER_METRICS))
    for ax, key in zip(axes, SCATTER_METRICS):
        for model, dataset in runs:
            results = bench.get(model, dataset).results
            x, y = results["grounding"]["macro"]["pointing_game"], results["faithfulness"]["macro"][key]
            if x is None or y is None:
                continue
            errors = {}
            for axis, (metric, value, scale) in {"xerr": ("pointing_game", x, 100), "yerr": (key, y, 1)}.items():
                interval = analysis.interval(dataset, model, MACRO, metric) if analysis else None
                if interval is not None and not any(v is None or math.isnan(v) for v in interval):
                    errors[axis] = [[scale * (value - interval[0])], [scale * (interval[1] - value)]]
            ax.errorbar(100 * x, y, **errors, fmt=markers[dataset], color=colours[model], markersize=6,
                        markeredgecolor="black", markeredgewidth=0.4, elinewidth=0.8, capsize=2)
        ax.set_xlabel("Plausibility: macro Pointing Game (%)", fontsize=FONT_SIZE)
        ax.set_ylabel(f"{long(key)}", fontsize=FONT_SIZE - 1)
        _style(ax)
    shown = list(dict.fromkeys(m for m, _ in runs))
    figure.legend(handles=[Line2D([], [], marker="o", linestyle="", color=colours[m], markeredgecolor="black",
                                  markeredgewidth=0.4, label=bench.model_label(m)) for m in shown]
                  + [Line2D([], [], marker=markers[d], linestyle="", color="0.6", markeredgecolor="black",
                            markeredgewidth=0.4, label=bench.dataset_label(d))
                     for d in dict.fromkeys(d for _, d in runs)],
                  fontsize=FONT_SIZE, loc="outside right upper", frameon=False)
    caption = (
        "Plausibility against faithfulness: each point is one model on one dataset (colour: model, shape: dataset); "
        "x, the macro Pointing Game over the whole split; y, the macro deletion AUC (lower is more faithful), "
        "insertion AUC and ROAD (higher is more faithful) on the images the check scored, in the model's logits. A "
        "map can point where the radiologist looked without driving the model's score, and the reverse. "
        + ("Error bars: bootstrap percentile intervals (images resampled, paired with the Pointing Game's)."
           if analysis else "")
    )
    return Plot("plausibility_vs_faithfulness", figure, caption.strip())


def explanation_tables(bench: Benchmark, analysis: ReportAnalysis | None = None) -> list[Table]:
    table = explanation_table(bench, analysis)
    return ([table] if table is not None else []) + family_tables(bench, analysis) + cascade_tables(bench)


def explanation_figures(bench: Benchmark, analysis: ReportAnalysis | None = None) -> list[Plot]:
    scatter = plausibility_vs_faithfulness(bench, analysis)
    return ([scatter] if scatter is not None else []) + cascade_figures(bench)
