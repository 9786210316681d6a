"""The paper's tables from a `Benchmark` and, with a
`ReportAnalysis` (the tables of `xbench.analysis`), every number's interval and the
calibration, paired-difference, lesion-size and R² tables.

Per ranked column (and row group) the best value is bold and the second best underlined
(`xbench.reporting.table.emphasis`); columns of differences and gaps are not ranked. An
instrument (the Oracle) is a ceiling row: shown for scale, never ranked, and the analysis leaves it
out of R² and paired differences. A human reader set (``--model human``) is a human row in each
grounding table, shown the same way (marked *human*, never ranked), and each model's gap to it gets
its own table per dataset (`human_gap_tables`); on cheXlocalize's human benchmark, also their
percentage decrease beside XBench's paired form (`chexlocalize_decrease_tables`). Every number chosen on the evaluated set itself -- Dice and IoU
at the best threshold tau*, max-F1 and the accuracy at its threshold -- carries a ``*`` in its
header ([`xbench.metrics.names`][xbench.metrics.names]) and the caption says so.
"""

from __future__ import annotations

from typing import Any

from xbench.analysis.tables import ALL, HUMAN_GAP_METRICS, MACRO
from xbench.metrics.human_benchmark import AVERAGE
from xbench.metrics.names import metric as metric_info, short
from xbench.reporting.benchmark import Benchmark
from xbench.reporting.reproduction import MEAN, Reference
from xbench.reporting.table import Cell, Column, Row, Table, missing

CHOSEN_TAU_NOTE = (
    "* Chosen on the evaluated set itself (the paper's protocol), hence optimistic: τ* is, per class, the "
    "threshold among τ = 0, 0.01, ..., 1 that maximises that class's mean Dice (for IoU, its mean IoU)."
)
CHOSEN_F1_NOTE = (
    "* Chosen on the evaluated set itself, hence optimistic: max-F1 is F1 at the probability threshold that "
    "maximises it per class, and Acc@max-F1 the accuracy at that threshold."
)
CEILING_NOTE = (
    "In italics, marked (ceiling): a test instrument that reads the radiologist's regions and the true labels; "
    "shown for scale, never ranked, and left out of R², fits and paired differences."
)


HUMAN_NOTE = (
    "In italics, marked (human): radiologists scored like a model against the same reference (docs: How well do "
    "radiologists agree?), the human scale beside the models, never ranked; a reader's map is binary, so its Dice "
    "and IoU are those of its map at τ = 0.5 in every Dice and IoU column."
)
#: A human row's Dice and IoU in a column of the threshold chosen on the evaluated set: its binary map's.
HUMAN_VALUE = {"dice@best": "dice@0.5", "iou@best": "iou@0.5"}


class ReportAnalysis:
    """The analysis of the report's runs: its settings (``xbench.analysis.settings.Settings``) and
    its tables by name (``xbench.analysis.analysis_tables``: pandas DataFrames of intervals,
    differences, calibration, strata and correlation). Values are fractions, as in ``metrics.json``."""

    def __init__(self, settings: Any, tables: dict[str, Any]) -> None:
        self.settings = settings
        self.tables = tables
        frame = tables["intervals"]
        self._intervals = {
            (dataset, model, key, metric): (lower, upper)
            for dataset, model, key, metric, lower, upper in zip(
                frame["dataset"], frame["model"], frame["class"], frame["metric"], frame["lower"], frame["upper"])
        }

    def interval(self, dataset: str, model: str, key: str, metric: str) -> tuple[float, float] | None:
        """The bootstrap interval of a number (``key``: a class or ``macro``); ``None`` if not analysed."""
        return self._intervals.get((dataset, model, key, metric))

    def rows(self, table: str, **where: str) -> list[dict]:
        """The rows of one analysis table whose columns equal ``where`` (in the table's order)."""
        frame = self.tables[table]
        if frame.empty:
            return []
        keep = True
        for column, value in where.items():
            keep = keep & (frame[column] == value)
        return frame[keep].to_dict("records")

    @property
    def note(self) -> str:
        """What the brackets mean, for captions."""
        s = self.settings
        return (f"Brackets: {100 * s.confidence:g}% bootstrap percentile interval ({s.replicates} replicates, images "
                f"resampled with replacement, seed {s.seed}); τ* and max-F1 are re-chosen inside every replicate.")


def _interval_cell(value: float | None, row: dict, lower: str = "lower", upper: str = "upper") -> Cell:
    return Cell(None if missing(value) else value, (row[lower], row[upper]))


# -- the paper's tables ------------------------------------------------------------------------

EMPHASIS_NOTE = (
    "Best per column in bold, second underlined; – : no value (no graded pair, or a class with one label value)."
)


def _notes(*notes: str) -> str:
    return " ".join(note for note in notes if note)


def _entries(bench: Benchmark, dataset: str | None = None, humans: bool = True) -> list[tuple[str, str, dict]]:
    """(model, row label, how the row stands apart: `Row`'s ``human`` or ``ceiling``) of the models
    (on ``dataset``, or all), then of the human reader sets (a grounding table's, ``humans``), then
    of the instruments."""
    models = bench.models if dataset is None else bench.models_on(dataset)
    readers = (bench.readers if dataset is None else bench.readers_on(dataset)) if humans else []
    ceilings = bench.instruments if dataset is None else bench.instruments_on(dataset)
    return [(m, bench.model_label(m), {}) for m in models] + \
        [(m, f"{bench.model_label(m)} (human)", {"human": True}) for m in readers] + \
        [(m, f"{bench.model_label(m)} (ceiling)", {"ceiling": True}) for m in ceilings]


def _apart_note(rows: tuple[Row, ...] | list[Row]) -> str:
    """What a human and a ceiling row are, where the table has one."""
    return _notes(HUMAN_NOTE if any(row.human for row in rows) else "",
                  CEILING_NOTE if any(row.ceiling for row in rows) else "")


def _published_rows(published: Reference | None, cells: list[tuple[str, str, str]], group: str | None = None
                    ) -> list[Row]:
    """A row per model of ``published`` (``--published``) with a value among ``cells`` (the table's
    columns as (dataset, finding or ``mean``, metric)): each value as its source prints it, no
    interval. A cell the paper prints twice (a Mean column of its Tables 2-5 reprints Table 1)
    shows its first value, Table 1's."""
    if published is None:
        return []
    rows = []
    for model in dict.fromkeys(model for _, model, _, _ in published.values):
        printed = [published.values.get((dataset, model, finding, metric)) for dataset, finding, metric in cells]
        if any(printed):
            rows.append(Row(f"{published.model_labels.get(model, model)} (published)",
                            tuple(Cell(None) if p is None else Cell(p[0].value, digits=p[0].digits) for p in printed),
                            group=group, published=True))
    return rows


def _published_note(rows: tuple[Row, ...] | list[Row], published: Reference | None) -> str:
    """What a published row is, where the table has one."""
    digits = sorted({cell.digits for row in rows if row.published for cell in row.cells if cell.digits is not None})
    if not digits:
        return ""
    precision = f"to {digits[0]} decimals" if len(digits) == 1 else "each to its stated decimals"
    return (f"In italics, marked (published): the values {published.name} publishes, as printed ({precision}), "
            "beside these results for comparison: no interval, never ranked and not judged (the gate judges a "
            "--reference).")


def _macro(bench: Benchmark, model: str, dataset: str, section: str, name: str,
           analysis: ReportAnalysis | None) -> Cell:
    run = bench.get(model, dataset)
    if run is None:
        return Cell(None)
    value = run.results[section]["macro"][name]
    interval = analysis.interval(dataset, model, MACRO, name) if analysis is not None and value is not None else None
    return Cell(value, interval)


def _per_model_over_datasets(bench: Benchmark, name: str, title: str, metrics: tuple[str, ...],
                             caption: str, analysis: ReportAnalysis | None, published: Reference | None) -> Table:
    columns = tuple(Column(short(key), bench.dataset_label(d)) for d in bench.datasets for key in metrics)
    rows = tuple(
        Row(label, tuple(_macro(bench, m, d, "grounding", HUMAN_VALUE.get(key, key) if apart.get("human") else key,
                                analysis) for d in bench.datasets for key in metrics), **apart)
        for m, label, apart in _entries(bench)
    ) + tuple(_published_rows(published, [(d, MEAN, key) for d in bench.datasets for key in metrics]))
    return Table(name, title, _notes(caption, _apart_note(rows), _published_note(rows, published)), "Model",
                 columns, rows)


def grounding_table(bench: Benchmark, analysis: ReportAnalysis | None = None,
                    published: Reference | None = None) -> Table:
    """Table 1: Pointing Game, Dice and IoU at the best threshold tau*, per model and dataset."""
    return _per_model_over_datasets(
        bench, "grounding", "Grounding per model and dataset (percent, macro mean over classes)",
        ("pointing_game", "dice@best", "iou@best"),
        "PG = Pointing Game (a hit when a pixel at the map's maximum lies in the region; a constant map is a miss). "
        "Dice@τ*, IoU@τ*: per-image means at each class's best threshold τ*. Macro means over the classes with at "
        "least one graded (image, class) pair. The fixed-threshold twins (τ = 0.5) are in the next table"
        + (", the calibrated threshold in the one after" if analysis is not None else "") + ". "
        + _notes(analysis and analysis.note, EMPHASIS_NOTE, CHOSEN_TAU_NOTE),
        analysis, published,
    )


def grounding_fixed_tau_table(bench: Benchmark, analysis: ReportAnalysis | None = None,
                              published: Reference | None = None) -> Table:
    """Table 1's Dice and IoU at the fixed threshold tau = 0.5 (nothing chosen on the evaluated set)."""
    return _per_model_over_datasets(
        bench, "grounding_fixed_tau", "Grounding at the fixed threshold τ = 0.5 (percent, macro mean over classes)",
        ("dice@0.5", "iou@0.5"),
        "Dice and IoU of the region {s ≥ 0.5} of the min-max normalised map: per-image means, macro over classes "
        "with at least one graded pair. The fixed-rule twins of the previous table's τ* columns. "
        + _notes(analysis and analysis.note, EMPHASIS_NOTE),
        analysis, published,
    )


def _calibration_method(rows: list[dict]) -> str:
    methods = sorted({row["method"] for row in rows})
    if all(m.startswith("validation") for m in methods):
        return "on the model's run on the validation split"
    return " / ".join(m.replace("cross-fitting", "by cross-fitting over the test images") for m in methods)


def threshold_table(bench: Benchmark, analysis: ReportAnalysis) -> Table:
    """Macro Dice at tau = 0.5, at the calibrated tau (chosen where it is not scored) and at the
    test-chosen tau*, with both gaps over tau = 0.5, per dataset (row groups) and model."""
    rows, methods = [], []
    for dataset in bench.datasets:
        found = analysis.rows("calibration", dataset=dataset, curve="dice", **{"class": MACRO})
        by_model = {row["model"]: row for row in found}
        for model, label, apart in _entries(bench, dataset, humans=False):  # τ says nothing on a binary map
            row = by_model[model]
            cells = (
                Cell(row["at_0.5"], analysis.interval(dataset, model, MACRO, "dice@0.5")),
                _interval_cell(row["at_calibrated"], row, "calibrated_lower", "calibrated_upper"),
                Cell(row["at_best"], analysis.interval(dataset, model, MACRO, "dice@best")),
                _interval_cell(row["gap_calibrated"], row, "gap_calibrated_lower", "gap_calibrated_upper"),
                _interval_cell(row["gap_best"], row, "gap_best_lower", "gap_best_upper"),
            )
            rows.append(Row(label, cells, group=bench.dataset_label(dataset), **apart))
        if found:
            methods.append(f"{bench.dataset_label(dataset)}: {_calibration_method(found)}")
    columns = (Column(short("dice@0.5")), Column(short("dice@calibrated")), Column(short("dice@best")),
               Column("ΔDice τcal", ranked=False), Column("ΔDice τ*", ranked=False))
    caption = (
        "The calibration gap, honestly: macro Dice at the fixed τ = 0.5, at the calibrated threshold τcal and at "
        "the best threshold τ*. τcal is chosen per class where it is not scored (" + "; ".join(methods) + "; "
        "with K folds, the τ that maximises a class's mean Dice on K − 1 folds scores the held-out fold). "
        "ΔDice = Dice at that threshold − Dice@0.5, in percentage points: ΔDice τ* is the paper's calibration "
        "gap, ΔDice τcal its twin with a threshold chosen elsewhere; both intervals are paired (the two values from "
        "the same replicate, τ* and τcal re-chosen in it). Per-class thresholds: analysis/calibration.csv. "
        + _notes(analysis.note, "Best Dice per column in bold, second underlined; the gaps are not ranked.",
                 CHOSEN_TAU_NOTE, _apart_note(rows))
    )
    return Table("threshold_calibration",
                 "Dice at τ = 0.5, at the calibrated τ and at the test-chosen τ* (percent, macro mean over classes)",
                 caption, "Model", columns, tuple(rows))


def pointing_game_tables(bench: Benchmark, analysis: ReportAnalysis | None = None,
                         published: Reference | None = None) -> list[Table]:
    """Tables 2-5: per-class Pointing Game on each dataset with more than one class."""
    tables = []
    for dataset in bench.datasets:
        classes = bench.classes(dataset)
        if len(classes) < 2:
            continue
        columns = tuple(Column(bench.short_name(key)) for key in classes) + (Column("Mean"),)
        rows = []
        for model, label, apart in _entries(bench, dataset):
            results = bench.get(model, dataset).results
            per_class = results["grounding"]["per_class"]
            cells = []
            for key in [*classes, MACRO]:
                value = (results["grounding"]["macro"] if key == MACRO else per_class.get(key, {})).get("pointing_game")
                interval = None
                if analysis is not None and value is not None:
                    interval = analysis.interval(dataset, model, key, "pointing_game")
                cells.append(Cell(value, interval))
            rows.append(Row(label, tuple(cells), **apart))
        rows += _published_rows(published, [(dataset, key, "pointing_game") for key in classes]
                                + [(dataset, MEAN, "pointing_game")])
        legend = ", ".join(f"{bench.short_name(key)} = {bench.finding_name(key)}" for key in classes)
        label = bench.dataset_label(dataset)
        tables.append(Table(
            f"pointing_game_{dataset}", f"Pointing Game per class on {label} (percent)",
            f"{legend}. Mean: macro mean over the classes with at least one graded pair. "
            + _notes(analysis and analysis.note, EMPHASIS_NOTE, _apart_note(rows), _published_note(rows, published)),
            "Model", columns, tuple(rows),
        ))
    return tables


RECOGNITION_METRICS = ("auroc", "auprc", "f1@0.5", "accuracy@0.5", "max_f1", "accuracy@max_f1")


def recognition_table(bench: Benchmark, analysis: ReportAnalysis | None = None,
                      published: Reference | None = None) -> Table:
    """Recognition per dataset (row groups) and model: AUROC, AUPRC, F1 and accuracy at p >= 0.5, max-F1."""
    rows = tuple(
        row for d in bench.datasets for row in [
            *(Row(label, tuple(_macro(bench, m, d, "classification", key, analysis) for key in RECOGNITION_METRICS),
                  group=bench.dataset_label(d), **apart) for m, label, apart in _entries(bench, d, humans=False)),
            *_published_rows(published, [(d, MEAN, key) for key in RECOGNITION_METRICS], bench.dataset_label(d))]
    )
    return Table(
        "recognition", "Zero-shot recognition per dataset and model (percent, macro mean over classes)",
        "AUROC and AUPRC (average precision) from the logits; F1 and accuracy at probability p ≥ 0.5, the fixed "
        "rule. Unknown labels are left out; a class whose known labels are all one value has no AUROC/AUPRC and "
        "is left out of their macro mean. "
        + _notes(analysis and analysis.note, EMPHASIS_NOTE, CHOSEN_F1_NOTE, _apart_note(rows),
                 _published_note(rows, published)),
        "Model", tuple(Column(short(key)) for key in RECOGNITION_METRICS), rows,
    )


#: The metrics of the paired-difference and lesion-size tables.
DIFFERENCE_METRICS = ("pointing_game", "dice@0.5", "dice@calibrated", "auroc")
STRATA_METRICS = ("pointing_game", "dice@0.5")


def difference_tables(bench: Benchmark, analysis: ReportAnalysis) -> list[Table]:
    """Per dataset with two or more models: every paired difference A - B of macro means."""
    tables = []
    for dataset in bench.datasets:
        found = analysis.rows("differences", dataset=dataset, **{"class": MACRO})
        if not found:
            continue
        pairs: dict[tuple[str, str], dict[str, dict]] = {}
        for row in found:
            pairs.setdefault((row["model_a"], row["model_b"]), {})[row["metric"]] = row
        columns = tuple(column for key in DIFFERENCE_METRICS for column in (
            Column("A − B", short(key), ranked=False), Column("P(A>B)", short(key), ranked=False)))
        rows = []
        for (a, b), metrics in pairs.items():
            cells = []
            for metric in DIFFERENCE_METRICS:
                row = metrics[metric]
                cells += [_interval_cell(row["difference"], row), Cell(None if missing(row["difference"])
                                                                       else row["a_better"])]
            rows.append(Row(f"{bench.model_label(a)} − {bench.model_label(b)}", tuple(cells)))
        label = bench.dataset_label(dataset)
        tables.append(Table(
            f"differences_{dataset}", f"Paired differences between models on {label} (percentage points)",
            "Each row compares two models on the same images: A − B of the macro means, with its paired bootstrap "
            "interval (both models scored on the same resampled images in every replicate, so image difficulty "
            "cancels). An interval that excludes 0 separates the two models at this level. P(A>B): percent of "
            "replicates in which A is ahead, a tie counted as half. Dice@τcal: at the calibrated threshold (previous tables). "
            + _notes(analysis.note, "Instruments (the Oracle) and human readers are not compared here (each "
                     "model's gap to the human readers has its own table)."),
            "A − B", columns, tuple(rows),
        ))
    return tables


def strata_tables(bench: Benchmark, analysis: ReportAnalysis) -> list[Table]:
    """Per dataset: Pointing Game and Dice at tau = 0.5 by lesion size, every class's pairs pooled."""
    tables = []
    for dataset in bench.datasets:
        found = analysis.rows("strata", dataset=dataset, **{"class": ALL})
        if not found:
            continue
        strata = list(dict.fromkeys(row["stratum"] for row in found))
        cell = {(row["model"], row["stratum"], row["metric"]): row for row in found}
        groups = {}
        for stratum in strata:
            counts = sorted({row["pairs"] for row in found if row["stratum"] == stratum})
            groups[stratum] = f"{stratum} (n = {counts[0]})" if len(counts) == 1 else f"{stratum} (n = {counts[0]}–{counts[-1]})"
        columns = tuple(Column(short(key), groups[s]) for s in strata for key in STRATA_METRICS)
        rows = tuple(
            Row(label, tuple(
                _interval_cell(cell[(model, s, metric)]["estimate"], cell[(model, s, metric)])
                for s in strata for metric in STRATA_METRICS), **apart)
            for model, label, apart in _entries(bench, dataset) if any(key[0] == model for key in cell)
        )
        label = bench.dataset_label(dataset)
        tables.append(Table(
            f"lesion_size_{dataset}", f"Grounding by lesion size on {label} (percent)",
            "Lesion size: the region's area |R| as a share of the image (in the batch geometry); every class's "
            "graded pairs pooled, n = pairs per size bin. PG and Dice at the fixed τ = 0.5, means over the bin's "
            "pairs. Per class and at the calibrated τ: analysis/strata.csv. "
            + _notes(analysis.note, EMPHASIS_NOTE, _apart_note(rows)),
            "Model", columns, rows,
        ))
    return tables


def human_gap_tables(bench: Benchmark, analysis: ReportAnalysis) -> list[Table]:
    """Per dataset with a human reader set: each model's gap to the human readers per finding (row
    groups, then the macro mean), for Pointing Game, Dice and IoU at τ = 0.5: model − human with its
    paired interval, and the percentage decrease (human − model) / human with its percentile interval."""
    tables = []
    for dataset in bench.datasets:
        found = analysis.rows("human_gaps", dataset=dataset)
        if not found:
            continue
        cell = {(row["model"], row["human"], row["class"], row["metric"]): row for row in found}
        readers = list(dict.fromkeys(row["human"] for row in found))
        columns = tuple(column for key in HUMAN_GAP_METRICS for column in (
            Column("M − H", short(key), ranked=False), Column("% decrease", short(key), ranked=False)))
        groups = [(key, "Mean" if key == MACRO else bench.finding_name(key)) for key in [*bench.classes(dataset), MACRO]]
        rows = gap_rows(bench, groups, readers, bench.models_on(dataset), cell, HUMAN_GAP_METRICS, lambda gap: (
            (Cell(None), Cell(None)) if gap is None else
            (_interval_cell(gap["difference"], gap, "difference_lower", "difference_upper"),
             _interval_cell(gap["decrease"], gap, "decrease_lower", "decrease_upper"))))
        label = bench.dataset_label(dataset)
        means = {(row["human"], row["metric"]): row["human_value"] for row in found if row["class"] == MACRO}
        human_values = "; ".join(f"{bench.model_label(human)}: " + ", ".join(
            f"{short(metric)} {Column('').text(Cell(means.get((human, metric))))}" for metric in HUMAN_GAP_METRICS)
            for human in readers)
        tables.append(Table(
            f"human_gap_{dataset}", f"Each model's gap to the human readers on {label} (percentage points, percent)",
            "Per finding and for the macro mean (Mean): M − H = the model's value − the human readers' (percentage "
            "points), with its paired bootstrap interval (model and readers scored on the same resampled "
            "radiographs in every replicate); % decrease = (human − model) / human, cheXlocalize's percentage "
            "decrease, its estimate from the means and its percentile interval over the same replicates (100: the "
            "model scores 0; below 0: the model is ahead). Pointing Game, Dice and IoU at τ = 0.5, the human "
            f"readers' binary map (their macro means: {human_values}). Not ranked. " + analysis.note,
            "Model", columns, tuple(rows),
        ))
    return tables


def gap_rows(bench: Benchmark, groups, readers: list[str], models: list[str], cell: dict, metrics,
             cells_of) -> list[Row]:
    """The rows of a gap table: per (finding key, row group) of ``groups``, per human reader set and
    model, ``cells_of`` each metric's gap row (``cell[(model, human, key, metric)]``, ``None`` where
    absent); a model with none of them on a finding has no row; the reader set is named in the label
    where there are several."""
    rows = []
    for key, group in groups:
        for human in readers:
            for model in models:
                entries = [cell.get((model, human, key, metric)) for metric in metrics]
                if not any(entries):
                    continue
                label = bench.model_label(model) + (f" − {bench.model_label(human)}" if len(readers) > 1 else "")
                rows.append(Row(label, tuple(c for entry in entries for c in cells_of(entry)), group=group))
    return rows


#: cheXlocalize's two percentage decreases (`xbench.analysis.tables.chexlocalize_decrease_table`), as they name them.
CHEXLOCALIZE_METRICS = {"miou": "mIoU", "hitrate": "hit rate"}


def not_comparable_line(bench: Benchmark, analysis: ReportAnalysis, dataset: str) -> str | None:
    """The models on ``dataset`` that cheXlocalize's protocol cannot compare with its human benchmark,
    named in one sentence (``None``: none)."""
    found = analysis.rows("chexlocalize_not_comparable", dataset=dataset)
    if not found:
        return None
    models = ", ".join(dict.fromkeys(bench.model_label(row["model"]) for row in found))
    return (f"Not comparable by cheXlocalize's protocol on {bench.dataset_label(dataset)} (no native-size rows; "
            f"saved maps run with --model.native_protocol true have them): {models}.")


def chexlocalize_decrease_tables(bench: Benchmark, analysis: ReportAnalysis) -> list[Table]:
    """Per dataset with cheXlocalize's human benchmark scored at native size: per finding and their
    Average, for mIoU and hit rate, their percentage decrease as their script prints it beside
    XBench's paired form (model − human and the percentage decrease, one resample for both)."""
    tables = []
    for dataset in bench.datasets:
        found = analysis.rows("chexlocalize_decrease", dataset=dataset)
        if not found:
            continue
        cell = {(row["model"], row["human"], row["class"], row["metric"]): row for row in found}
        readers = list(dict.fromkeys(row["human"] for row in found))
        plain = dict(ranked=False, percent=False, digits=3)
        columns = tuple(column for metric, name in CHEXLOCALIZE_METRICS.items() for column in (
            Column("HB", name, **plain), Column("model", name, **plain), Column("% decrease (theirs)", name, **plain),
            Column("M − H (paired)", name, ranked=False), Column("% decrease (paired)", name, ranked=False)))
        groups = [(key, "Average" if key == AVERAGE else bench.finding_name(key))
                  for key in dict.fromkeys(row["class"] for row in found)]
        rows = gap_rows(bench, groups, readers, bench.models_on(dataset), cell, CHEXLOCALIZE_METRICS, lambda e: (
            Cell(e["hb"]), Cell(e["pred"]),
            _interval_cell(e["pct_diff"], e, "pct_diff_lower", "pct_diff_upper"),
            _interval_cell(e["difference"], e, "difference_lower", "difference_upper"),
            _interval_cell(e["decrease"], e, "decrease_lower", "decrease_upper")))
        label = bench.dataset_label(dataset)
        tables.append(Table(
            f"chexlocalize_decrease_{dataset}", f"cheXlocalize's percentage decrease on {label}",
            "Their form exactly, as their calculate_percentage_decrease.py prints it: HB and model = the means of "
            "1,000 bootstrap replicates (seed 0, NumPy's legacy stream) of the per-CXR IoU of their default Otsu "
            "segmentation (mIoU; NaN pairs left out, their true_pos_only) and of their hit (hit rate), scored at "
            "each CXR's native size; % decrease (theirs) = (HB − model) / HB in percent from those means, its "
            "bounds the 25th and 975th of the sorted replicates (-inf: a replicate's HB mean was 0); Average: "
            "their row (the tasks' means rounded to 3). Beside it XBench's paired form on the same per-CXR "
            "values: model and human on the same resampled CXRs in every replicate, M − H (percentage points) "
            "and (human − model) / human (percent), each estimated on the CXRs themselves with its percentile "
            f"interval ({analysis.settings.replicates} replicates, seed {analysis.settings.seed}). Not ranked. "
            + (not_comparable_line(bench, analysis, dataset) or ""),
            "Model", columns, tuple(rows),
        ))
    return tables


CORRELATION_METRICS = ("pointing_game", "dice@0.5", "dice@best")


def correlation_table(bench: Benchmark, analysis: ReportAnalysis) -> Table:
    """R² between macro AUROC and macro grounding over (model, dataset) points, with intervals."""
    scopes: dict[str, dict[str, dict]] = {}
    for row in analysis.tables["correlation"].to_dict("records"):
        scopes.setdefault(row["scope"], {})[row["grounding"]] = row
    rows = []
    for scope, metrics in scopes.items():
        points = next(iter(metrics.values()))["points"]
        label = "All datasets" if scope == ALL else bench.dataset_label(scope)
        rows.append(Row(f"{label} (n = {points})",
                        tuple(_interval_cell(metrics[m]["r2"], metrics[m]) for m in CORRELATION_METRICS)))
    return Table(
        "recognition_vs_grounding",
        "Does recognition predict grounding? R² of macro AUROC against macro grounding",
        "R² (squared Pearson correlation) over the (model, dataset) points of a dataset, or of all datasets; "
        "n = points. Undefined (–) with fewer than three points or no spread. Intervals: the same bootstrap "
        "replicates, each dataset's images resampled, R² recomputed in every replicate. Instruments (the "
        "Oracle) and human readers are not points. "
        + _notes(analysis.note, CHOSEN_TAU_NOTE),
        "Scope", tuple(Column(short(key), "R² with AUROC", ranked=False, percent=False)
                       for key in CORRELATION_METRICS), tuple(rows),
    )


#: The metrics of the robustness table and figure.
ROBUSTNESS_METRICS = ("pointing_game", "dice@0.5", "dice@best", "auroc", "auprc")
REFERENCE = "unperturbed (reference)"


def lost_regions(run) -> int:
    """Regions the loader left out of grounding because they ended up empty in the frame
    (pushed out by a perturbation, or clipped away)."""
    return sum((run.results["data"].get("lost_regions") or {}).values())


def robustness_table(bench: Benchmark) -> Table | None:
    """Grounding and recognition of each model on each dataset under every perturbation it was run
    with, the unperturbed run first (``None`` when there are no robustness runs)."""
    rows, lost = [], []
    for model, dataset in bench.robustness_pairs():
        group = f"{bench.model_label(model)} on {bench.dataset_label(dataset)}"
        for perturbation, run in bench.robustness_runs(model, dataset):
            cells = tuple(Cell(run.results[metric_info(key).section]["macro"][key]) for key in ROBUSTNESS_METRICS)
            rows.append(Row(perturbation or REFERENCE, cells, group=group))
            if lost_regions(run):
                lost.append(f"{lost_regions(run)} under {perturbation or REFERENCE} ({group})")
    if not rows:
        return None
    return Table(
        "robustness", "Grounding and recognition under perturbation (percent, macro mean over classes)",
        "Each group is one model on one dataset: first the unperturbed run (the paper's protocol), then one row per "
        "augment pipeline, applied to image and masks together at native size before the batch geometry, seeded "
        "per image, so every model sees the same perturbed images. Photometric pipelines leave masks bit-identical, "
        "geometric ones move them with the image. "
        + ("Regions pushed entirely out of the frame (left out of grounding): " + "; ".join(lost) + ". " if lost
           else "No region was pushed out of the frame. ")
        + "Values are not ranked. " + CHOSEN_TAU_NOTE,
        "Perturbation", tuple(Column(short(key), ranked=False) for key in ROBUSTNESS_METRICS), tuple(rows),
    )


def paper_tables(bench: Benchmark, analysis: ReportAnalysis | None = None,
                 published: Reference | None = None) -> list[Table]:
    """Every table of the report, in order: Table 1, its fixed-τ twin, [the calibrated τ], per-class PG,
    recognition, [each model's gap to the human readers, paired differences, lesion-size strata, R²]
    (bracketed: with the analysis);
    ``published``: a reference's values as rows beside the runs' (``--published``)."""
    tables = [grounding_table(bench, analysis, published), grounding_fixed_tau_table(bench, analysis, published)]
    if analysis is not None:
        tables.append(threshold_table(bench, analysis))
    tables += [*pointing_game_tables(bench, analysis, published), recognition_table(bench, analysis, published)]
    if analysis is not None:
        tables += [*human_gap_tables(bench, analysis), *chexlocalize_decrease_tables(bench, analysis),
                   *difference_tables(bench, analysis),
                   *strata_tables(bench, analysis), correlation_table(bench, analysis)]
    return tables
