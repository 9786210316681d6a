"""Where did the radiologist look? The report's gaze table and overlays, for the datasets with gaze.

- one table per dataset (`gaze_tables`): every model's gaze metrics (macro mean over classes, with
  the analysis' bootstrap intervals), the centre bias (``gaze_centre_bias``, the floor) among them
  and a radiologist's run (a results folder marked ``human``, such as REFLACX's interobserver
  reader) as a row apart, shown for scale and never ranked; beside it, where such a run is there and
  the analysis ran, each model's gap to it (`gaze_gap_table`);
- one figure per dataset (`gaze_overlays`): for the saved overlay pairs with gaze, the radiograph
  with its region, the radiologist's gaze density and each model's map.

The definitions: ``docs/gaze.md``.
"""

from __future__ import annotations

import textwrap

import numpy as np

from xbench.analysis.tables import GAZE_GAP_METRICS, MACRO
from xbench.metrics.names import metric, run_keys, short
from xbench.reporting.benchmark import Benchmark
from xbench.reporting.explanations import _cell_notes, _macro_cells
from xbench.reporting.figures import FONT_SIZE, SALIENCY_CMAP, Plot, _figure, overlay_rgb
from xbench.reporting.paper_tables import EMPHASIS_NOTE, ReportAnalysis, _interval_cell, gap_rows
from xbench.reporting.table import Cell, Column, Row, Table, missing
from xbench.results.folder import read_overlays

GAZE_METRICS = run_keys("gaze", "per_class")
#: The table's column groups: the map against the gaze itself, and against it beyond the centre bias.
GROUPS = {"Against the gaze": ("nss", "cc", "sim", "kl_divergence", "auc_judd", "ncc"),
          "Beyond the centre bias": ("shuffled_auc", "information_gain", "shuffled_ncc")}
#: Pairs (columns) per overlay figure.
OVERLAY_COLUMNS = 4
MEANING = (
    "Each model's map for a finding against the radiologist's eye-tracking gaze tied to that finding, macro mean "
    "over classes of the per-pair values. NSS: the map's z-score at the fixations; CC and NCC: correlation of map and "
    "gaze density (a constant map: CC 0, NCC undefined); SIM: histogram intersection (0 to 1); KL: KL divergence of "
    "the map from the gaze density (lower is better); AUC-J: AUC-Judd, fixated against unfixated pixels (0.5: "
    "chance); sAUC: the fixations against the other images' fixations, which discounts the centre bias (0.5: "
    "chance); IG: information gain over the centre bias in bits per fixation (0: the centre bias); sNCC: NCC with the "
    "gaze less NCC with the centre bias. Higher is better but for KL. The centre bias (gaze_centre_bias: the mean "
    "gaze density of the training readings as the map) is the floor; a radiologist's row (human) is shown for scale "
    "and never ranked.")


def _has_gaze(run) -> bool:
    return bool((run.results.get("gaze") or {}).get("applicable"))


def gaze_runs(bench: Benchmark, dataset: str) -> list[str]:
    """The models, then the human reader sets, with gaze metrics on ``dataset``, in the report's order."""
    return [model for model in bench.models_on(dataset) + bench.readers_on(dataset)
            if _has_gaze(bench.get(model, dataset))]


def gaze_tables(bench: Benchmark, analysis: ReportAnalysis | None = None) -> list[Table]:
    """One table per dataset with gaze: the models' gaze metrics with intervals, a human row apart."""
    tables = []
    columns = tuple(Column(short(key), group, percent=False, lower_better=metric(key).lower_better)
                    for group, keys in GROUPS.items() for key in keys)
    keys = [("gaze", key) for keys in GROUPS.values() for key in keys]
    for dataset in bench.datasets:
        models = gaze_runs(bench, dataset)
        if not models:
            continue
        rows = []
        for model in models:
            results = bench.get(model, dataset).results
            human = bool(results.get("human"))
            label = bench.model_label(model) + (" (human)" if human else "")
            rows.append(Row(label, tuple(_macro_cells(results, keys, dataset, model, analysis)), ceiling=human))
        pairs = {bench.get(m, dataset).results["gaze"]["pairs"] for m in models}
        without = [bench.model_label(m) for m in bench.models_on(dataset) + bench.readers_on(dataset)
                   if m not in models]
        unscored = f"Run without gaze on these images, so not in this table: {', '.join(without)}. " if without else ""
        caption = (MEANING + f" Pairs scored: {', '.join(map(str, sorted(pairs)))}. " + unscored + _cell_notes(rows)
                   + "Definitions: docs/gaze.md. " + (analysis.note + " " if analysis else "") + EMPHASIS_NOTE)
        tables.append(Table(f"gaze_{dataset}", f"Where did the radiologist look? Gaze metrics on "
                            f"{bench.dataset_label(dataset)} (macro mean over classes)", caption, "Model", columns,
                            tuple(rows)))
        if analysis is not None:
            tables += gaze_gap_table(bench, analysis, dataset)
    return tables


def gaze_gap_table(bench: Benchmark, analysis: ReportAnalysis, dataset: str) -> list[Table]:
    """Each model's gap to the radiologists' gaze on ``dataset`` (the analysis' ``gaze_gaps``), per
    finding (row groups) and for the macro mean: model − human per gaze metric with its paired
    interval (a finding no pair scored has no rows); none where no human reader set has gaze there."""
    found = analysis.rows("gaze_gaps", dataset=dataset)
    if not found:
        return []
    cell = {(row["model"], row["human"], row["class"], row["metric"]): row for row in found}
    readers = list(dict.fromkeys(row["human"] for row in found))
    models = list(dict.fromkeys(row["model"] for row in found))
    columns = tuple(Column(short(key), "M − H", ranked=False, percent=False) for key in GAZE_GAP_METRICS)
    scored = {row["class"] for row in found if not missing(row["difference"])}
    groups = [(key, "Mean" if key == MACRO else bench.finding_name(key))
              for key in (*bench.classes(dataset), MACRO) if key in scored]  # a finding without gaze pairs: no rows
    rows = gap_rows(bench, groups, readers, models, cell, GAZE_GAP_METRICS, lambda gap: (
        Cell(None) if gap is None else _interval_cell(gap["difference"], gap, "difference_lower", "difference_upper"),))
    means = {(row["human"], row["metric"]): row["human_value"] for row in found if row["class"] == MACRO}
    human_values = "; ".join(f"{bench.model_label(human)}: " + ", ".join(
        f"{short(m)} {Column('', percent=False).text(Cell(means.get((human, m))))}" for m in GAZE_GAP_METRICS)
        for human in readers)
    lower = ", ".join(short(m) for m in GAZE_GAP_METRICS if metric(m).lower_better)
    return [Table(
        f"gaze_gap_{dataset}", f"Each model's gap to the radiologists' gaze on {bench.dataset_label(dataset)}",
        "Per finding and for the macro mean (Mean): M − H = the model's gaze metric − the human reader set's (on "
        "REFLACX the interobserver reader: each held-out radiologist's own gaze against the others'), with its paired bootstrap "
        "interval (model and reader scored on the same reads, the same radiographs resampled in every replicate, "
        f"each with all its reads). Below 0 the model is behind, but for {lower} (lower is better: above 0 the model "
        f"is behind). The centre bias (gaze_centre_bias) is the floor. The reader's macro means: {human_values}. "
        "Not ranked. " + analysis.note,
        "Model", columns, tuple(rows),
    )]


def gaze_overlays(bench: Benchmark) -> list[Plot]:
    """Per dataset with gaze, the saved overlay pairs with gaze that every gaze run saved: the
    radiograph with its region, the gaze density, then each model's map (one row each)."""
    plots = []
    for dataset in bench.datasets:
        saved = {}
        for model in gaze_runs(bench, dataset):
            overlays = read_overlays(bench.get(model, dataset).folder)
            if overlays is not None and "gaze" in overlays and overlays["has_gaze"].any():
                saved[model] = overlays
        if not saved:
            continue
        common = set.intersection(*({(f, i) for f, i, g in zip(o["finding"], o["image_id"], o["has_gaze"]) if g}
                                    for o in saved.values()))
        pairs = sorted(common, key=lambda pair: (bench.classes(dataset).index(pair[0]), pair[1]))[:OVERLAY_COLUMNS]
        if pairs:
            plots.append(_gaze_grid(bench, dataset, saved, pairs))
    return plots


def _gaze_grid(bench: Benchmark, dataset: str, saved: dict, pairs: list[tuple[str, str]]) -> Plot:
    models = list(saved)
    panel = 1.55
    figure = _figure(panel * len(pairs) + 1.2, panel * (len(models) + 2) + 0.5)
    axes = figure.subplots(len(models) + 2, len(pairs), squeeze=False)
    first = saved[models[0]]
    for c, (key, image_id) in enumerate(pairs):
        (i,) = np.flatnonzero((first["finding"] == key) & (first["image_id"] == image_id))[:1]
        panels = [("Radiograph + region", overlay_rgb(first["image"][i], None, first["mask"][i])),
                  ("Radiologist's gaze", overlay_rgb(first["image"][i], first["gaze"][i], first["mask"][i]))]
        for model in models:
            overlays = saved[model]
            (j,) = np.flatnonzero((overlays["finding"] == key) & (overlays["image_id"] == image_id))[:1]
            panels.append((bench.model_label(model), overlay_rgb(overlays["image"][j], overlays["saliency"][j],
                                                                  overlays["mask"][j])))
        for r, (label, rgb) in enumerate(panels):
            ax = axes[r, c]
            ax.imshow(rgb, interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"{textwrap.fill(bench.finding_name(key), 18, break_long_words=False)}\n({c + 1})",
                             fontsize=FONT_SIZE)
            if c == 0:
                ax.set_ylabel(textwrap.fill(label, 18, break_long_words=False), fontsize=FONT_SIZE)
    images = "; ".join(f"({c + 1}) {bench.short_name(key)}: {image_id}" for c, (key, image_id) in enumerate(pairs))
    caption = (f"Where the radiologist looked on {bench.dataset_label(dataset)}: each column one saved overlay pair "
               "with gaze; top row the radiograph with the region outlined in white, then the radiologist's gaze "
               f"density for that finding (scaled to its maximum) and each model's map, in the {SALIENCY_CMAP} colour "
               f"map over the radiograph. Images: {images}.")
    return Plot(f"gaze_overlays_{dataset}", figure, caption)
