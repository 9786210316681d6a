"""The paper's tables from a :class:`~xbench.reporting.benchmark.Benchmark`, as Markdown, CSV and LaTeX.

A :class:`Table` is data: columns (optionally under a group such as a dataset), rows (optionally
in a group, within which emphasis is ranked) and :class:`Cell` values. A cell holds a fraction,
shown in percent (or, in a column marked so, a plain ratio such as R²), and optionally an
interval (a bootstrap confidence interval) that every renderer shows next to the value:
``61.6 [58.9, 64.2]``. Per ranked column (and row group) the best value is bold and the second
best underlined, ranked on the values as printed, so equal-looking numbers rank equal; columns of
differences and gaps are not ranked.

With a :class:`ReportAnalysis` (the tables of :mod:`xbench.analysis`), every number gets its
interval, and the calibration, paired-difference, lesion-size and R² tables are added.

Every number chosen on the evaluated set itself -- Dice and IoU at the best threshold tau*, max-F1
and the accuracy at its threshold -- carries a ``*`` in its header and the caption says so.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any, Literal

from xbench.findings import display_name, short_name
from xbench.reporting.benchmark import Benchmark

Emphasis = Literal["best", "second"] | None

CHOSEN_TAU_NOTE = (
    "* Chosen on the evaluated set itself (the paper's protocol), hence optimistic: τ* is, per class, the "
    "threshold among τ = 0, 0.01, ..., 1 that maximises that class's mean Dice (for IoU, its mean IoU)."
)
CHOSEN_F1_NOTE = (
    "* Chosen on the evaluated set itself, hence optimistic: max-F1 is F1 at the probability threshold that "
    "maximises it per class, and Acc@max-F1 the accuracy at that threshold."
)


def format_interval(estimate: float | None, lower: float | None, upper: float | None, scale: float = 100,
                    digits: int = 1) -> str:
    """``61.6 [58.9, 64.2]`` (values scaled by ``scale``); ``–`` for an undefined estimate."""
    if _missing(estimate):
        return "–"
    text = lambda v: "–" if _missing(v) else f"{scale * v:.{digits}f}"  # noqa: E731
    return f"{text(estimate)} [{text(lower)}, {text(upper)}]"


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


@dataclass(frozen=True)
class Cell:
    """A value (``None``: no value) and an optional interval around it."""

    value: float | None
    interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class Column:
    """``ranked``: bold/underline the best values (not for differences and gaps); ``percent``:
    values are fractions shown in percent, else plain ratios with two decimals (R²)."""

    header: str
    group: str | None = None
    ranked: bool = True
    percent: bool = True

    @property
    def scale(self) -> tuple[float, int]:
        """The factor and decimals a value of this column is printed with."""
        return (100, 1) if self.percent else (1, 2)


@dataclass(frozen=True)
class Row:
    label: str
    cells: tuple[Cell, ...]
    group: str | None = None


@dataclass(frozen=True)
class Table:
    """A titled grid; ``stub`` heads the row-label column; ``caption`` explains every header."""

    name: str
    title: str
    caption: str
    stub: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]


def emphasis(table: Table) -> list[list[Emphasis]]:
    """Per row and column: ``best`` (bold) or ``second`` (underlined) within the column and row group.

    The best needs at least two values in the column to compare, the second at least three.
    Values that print the same rank the same.
    """
    marks: list[list[Emphasis]] = [[None] * len(table.columns) for _ in table.rows]
    groups: dict[str | None, list[int]] = {}
    for r, row in enumerate(table.rows):
        groups.setdefault(row.group, []).append(r)
    for rows in groups.values():
        for c, column in enumerate(table.columns):
            if not column.ranked:
                continue
            scale, digits = column.scale
            printed = {r: round(scale * table.rows[r].cells[c].value, digits) for r in rows
                       if not _missing(table.rows[r].cells[c].value)}
            if len(printed) < 2:
                continue
            ranked = sorted(set(printed.values()), reverse=True)
            for r, value in printed.items():
                if value == ranked[0]:
                    marks[r][c] = "best"
                elif len(printed) >= 3 and len(ranked) > 1 and value == ranked[1]:
                    marks[r][c] = "second"
    return marks


# -- renderers ---------------------------------------------------------------------------------


def _cell_text(cell: Cell, column: Column) -> str:
    scale, digits = column.scale
    if _missing(cell.value):
        return "–"
    if cell.interval is None:
        return f"{scale * cell.value:.{digits}f}"
    return format_interval(cell.value, *cell.interval, scale=scale, digits=digits)


def _header(column: Column, separator: str) -> str:
    return column.header if column.group is None else f"{column.group}{separator}{column.header}"


def to_markdown(table: Table, number: int | None = None) -> str:
    """``**Table n: title**``, the grid (bold best, ``<ins>`` second), the caption."""
    heading = f"Table {number}: {table.title}" if number is not None else table.title
    marks = emphasis(table)
    lines = [f"**{heading}**", "",
             "| " + " | ".join([table.stub] + [_header(c, "<br>") for c in table.columns]) + " |",
             "|" + "|".join([":---"] + ["---:"] * len(table.columns)) + "|"]
    group = None
    for row, row_marks in zip(table.rows, marks):
        if row.group is not None and row.group != group:
            group = row.group
            lines.append("| " + " | ".join([f"*{group}*"] + [""] * len(table.columns)) + " |")
        cells = []
        for cell, column, mark in zip(row.cells, table.columns, row_marks):
            text = _cell_text(cell, column)
            cells.append({"best": f"**{text}**", "second": f"<ins>{text}</ins>"}.get(mark, text))
        lines.append("| " + " | ".join([row.label] + cells) + " |")
    return "\n".join(lines + ["", table.caption]) + "\n"


def to_csv(table: Table) -> str:
    """One line per row: the labels, then every value at full precision, in percent where the
    column shows percent (empty: none); a column with intervals gets ``<header> low`` and
    ``<header> high`` columns after it."""
    with_interval = [any(row.cells[c].interval is not None for row in table.rows) for c in range(len(table.columns))]
    has_groups = any(row.group is not None for row in table.rows)
    header = (["group"] if has_groups else []) + [table.stub]
    for column, interval in zip(table.columns, with_interval):
        name = _header(column, " ")
        header += [name] + ([f"{name} low", f"{name} high"] if interval else [])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)

    def number(value: float | None, column: Column) -> str:
        return "" if _missing(value) else repr(column.scale[0] * value)

    for row in table.rows:
        line = ([row.group or ""] if has_groups else []) + [row.label]
        for cell, column, interval in zip(row.cells, table.columns, with_interval):
            line.append(number(cell.value, column))
            if interval:
                low, high = cell.interval if cell.interval is not None else (None, None)
                line += [number(low, column), number(high, column)]
        writer.writerow(line)
    return buffer.getvalue()


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_MATH = {"τ": r"\tau", "≥": r"\geq", "Δ": r"\Delta", "×": r"\times", "*": "^*", "−": "-", "<": "<",
               ">": ">", "²": "^2"}


def latex_text(text: str) -> str:
    """Plain text (with τ, ≥, Δ, ×, –, and ``*`` for "chosen on the evaluated set") as LaTeX;
    neighbouring symbols share one math span (``τ*`` -> ``$\\tau^*$``)."""
    parts: list[tuple[bool, str]] = []
    for ch in text:
        math = ch in _LATEX_MATH
        piece = _LATEX_MATH[ch] if math else _LATEX_SPECIAL.get(ch, "--" if ch == "–" else ch)
        if parts and parts[-1][0] == math:
            parts[-1] = (math, parts[-1][1] + piece)
        else:
            parts.append((math, piece))
    return "".join(f"${piece}$" if math else piece for math, piece in parts)


def to_latex(table: Table) -> str:
    """A booktabs ``table`` (needs ``\\usepackage{booktabs}``): grouped headers, ``\\textbf`` best,
    ``\\underline`` second."""
    marks = emphasis(table)
    width = len(table.columns)
    lines = [r"\begin{table}[t]", r"\centering", r"\small",
             rf"\caption{{{latex_text(table.title)}. {latex_text(table.caption)}}}",
             rf"\label{{tab:{table.name}}}",
             r"\begin{tabular}{l" + "r" * width + "}", r"\toprule"]
    spans: list[tuple[str | None, int, int]] = []
    for c, column in enumerate(table.columns, start=2):
        if spans and spans[-1][0] == column.group:
            spans[-1] = (column.group, spans[-1][1], c)
        else:
            spans.append((column.group, c, c))
    if any(group is not None for group, _, _ in spans):
        lines.append(" & ".join([""] + [
            rf"\multicolumn{{{stop - start + 1}}}{{c}}{{{latex_text(group or '')}}}" for group, start, stop in spans
        ]) + r" \\")
        lines.append(" ".join(rf"\cmidrule(lr){{{start}-{stop}}}" for group, start, stop in spans if group))
    lines.append(" & ".join([latex_text(table.stub)] + [latex_text(c.header) for c in table.columns]) + r" \\")
    lines.append(r"\midrule")
    group = None
    for row, row_marks in zip(table.rows, marks):
        if row.group is not None and row.group != group:
            if group is not None:
                lines.append(r"\midrule")
            group = row.group
            lines.append(rf"\multicolumn{{{width + 1}}}{{l}}{{\textit{{{latex_text(group)}}}}} \\")
        cells = []
        for cell, column, mark in zip(row.cells, table.columns, row_marks):
            text = latex_text(_cell_text(cell, column))
            cells.append({"best": rf"\textbf{{{text}}}", "second": rf"\underline{{{text}}}"}.get(mark, text))
        lines.append(" & ".join([latex_text(row.label)] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


# -- the analysis, as the report reads it ------------------------------------------------------

#: In the analysis tables: the class of macro-mean rows; the class of the lesion-size rows that
#: pool every class's pairs, and the scope of the correlation over every dataset.
MACRO = "macro"
ALL = "all"


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
    return Cell(None if _missing(value) else value, (row[lower], row[upper]))


# -- the paper's tables ------------------------------------------------------------------------

EMPHASIS_NOTE = (
    "Best per column in bold, second underlined; – : no value (no graded pair, or a class with one label value)."
)


def _notes(*notes: str) -> str:
    return " ".join(note for note in notes if note)


def _macro(bench: Benchmark, model: str, dataset: str, section: str, name: str,
           analysis: ReportAnalysis | None) -> Cell:
    run = bench.get(model, dataset)
    if run is None:
        return Cell(None)
    value = run.results[section]["macro"][name]
    interval = analysis.interval(dataset, model, MACRO, name) if analysis is not None and value is not None else None
    return Cell(value, interval)


def _per_model_over_datasets(bench: Benchmark, name: str, title: str, metrics: list[tuple[str, str]],
                             caption: str, analysis: ReportAnalysis | None) -> Table:
    columns = tuple(Column(header, bench.dataset_label(d)) for d in bench.datasets for header, _ in metrics)
    rows = tuple(
        Row(bench.model_label(m),
            tuple(_macro(bench, m, d, "grounding", key, analysis) for d in bench.datasets for _, key in metrics))
        for m in bench.models
    )
    return Table(name, title, caption, "Model", columns, rows)


def grounding_table(bench: Benchmark, analysis: ReportAnalysis | None = None) -> Table:
    """Table 1: Pointing Game, Dice and IoU at the best threshold tau*, per model and dataset."""
    return _per_model_over_datasets(
        bench, "grounding", "Grounding per model and dataset (percent, macro mean over classes)",
        [("PG", "pointing_game"), ("Dice@τ*", "dice@best"), ("IoU@τ*", "iou@best")],
        "PG = Pointing Game (a hit when a pixel at the map's maximum lies in the region; a constant map is a miss). "
        "Dice@τ*, IoU@τ*: per-image means at each class's best threshold τ*. Macro means over the classes with at "
        "least one graded (image, class) pair. The fixed-threshold twins (τ = 0.5) are in the next table"
        + (", the calibrated threshold in the one after" if analysis is not None else "") + ". "
        + _notes(analysis and analysis.note, EMPHASIS_NOTE, CHOSEN_TAU_NOTE),
        analysis,
    )


def grounding_fixed_tau_table(bench: Benchmark, analysis: ReportAnalysis | None = None) -> Table:
    """Table 1's Dice and IoU at the fixed threshold tau = 0.5 (nothing chosen on the evaluated set)."""
    return _per_model_over_datasets(
        bench, "grounding_fixed_tau", "Grounding at the fixed threshold τ = 0.5 (percent, macro mean over classes)",
        [("Dice@0.5", "dice@0.5"), ("IoU@0.5", "iou@0.5")],
        "Dice and IoU of the region {s ≥ 0.5} of the min-max normalised map: per-image means, macro over classes "
        "with at least one graded pair. The fixed-rule twins of the previous table's τ* columns. "
        + _notes(analysis and analysis.note, EMPHASIS_NOTE),
        analysis,
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
        for model in bench.models_on(dataset):
            row = by_model[model]
            cells = (
                Cell(row["at_0.5"], analysis.interval(dataset, model, MACRO, "dice@0.5")),
                _interval_cell(row["at_calibrated"], row, "calibrated_lower", "calibrated_upper"),
                Cell(row["at_best"], analysis.interval(dataset, model, MACRO, "dice@best")),
                _interval_cell(row["gap_calibrated"], row, "gap_calibrated_lower", "gap_calibrated_upper"),
                Cell(row["gap_best"]),
            )
            rows.append(Row(bench.model_label(model), cells, group=bench.dataset_label(dataset)))
        if found:
            methods.append(f"{bench.dataset_label(dataset)}: {_calibration_method(found)}")
    columns = (Column("Dice@0.5"), Column("Dice@τcal"), Column("Dice@τ*"),
               Column("ΔDice τcal", ranked=False), Column("ΔDice τ*", ranked=False))
    caption = (
        "The calibration gap, honestly: macro Dice at the fixed τ = 0.5, at the calibrated threshold τcal and at "
        "the best threshold τ*. τcal is chosen per class where it is not scored (" + "; ".join(methods) + "; "
        f"with K folds, the τ that maximises a class's mean Dice on K − 1 folds scores the held-out fold). "
        "ΔDice = Dice at that threshold − Dice@0.5, in percentage points: ΔDice τ* is the paper's calibration "
        "gap, ΔDice τcal its twin with a threshold chosen elsewhere. Per-class thresholds: analysis/calibration.csv. "
        + _notes(analysis.note, "Best Dice per column in bold, second underlined; the gaps are not ranked.",
                 CHOSEN_TAU_NOTE)
    )
    return Table("threshold_calibration",
                 "Dice at τ = 0.5, at the calibrated τ and at the test-chosen τ* (percent, macro mean over classes)",
                 caption, "Model", columns, tuple(rows))


def pointing_game_tables(bench: Benchmark, analysis: ReportAnalysis | None = None) -> list[Table]:
    """Tables 2-5: per-class Pointing Game on each dataset with more than one class."""
    tables = []
    for dataset in bench.datasets:
        classes = bench.classes(dataset)
        if len(classes) < 2:
            continue
        columns = tuple(Column(short_name(key)) for key in classes) + (Column("Mean"),)
        rows = []
        for model in bench.models_on(dataset):
            results = bench.get(model, dataset).results
            per_class = results["grounding"]["per_class"]
            cells = []
            for key in [*classes, MACRO]:
                value = (results["grounding"]["macro"] if key == MACRO else per_class.get(key, {})).get("pointing_game")
                interval = None
                if analysis is not None and value is not None:
                    interval = analysis.interval(dataset, model, key, "pointing_game")
                cells.append(Cell(value, interval))
            rows.append(Row(bench.model_label(model), tuple(cells)))
        legend = ", ".join(f"{short_name(key)} = {display_name(key)}" for key in classes)
        label = bench.dataset_label(dataset)
        tables.append(Table(
            f"pointing_game_{dataset}", f"Pointing Game per class on {label} (percent)",
            f"{legend}. Mean: macro mean over the classes with at least one graded pair. "
            + _notes(analysis and analysis.note, EMPHASIS_NOTE),
            "Model", columns, tuple(rows),
        ))
    return tables


RECOGNITION_METRICS = (
    ("AUROC", "auroc"), ("AUPRC", "auprc"), ("F1@p≥0.5", "f1@0.5"), ("Acc@p≥0.5", "accuracy@0.5"),
    ("max-F1*", "max_f1"), ("Acc@max-F1*", "accuracy@max_f1"),
)


def recognition_table(bench: Benchmark, analysis: ReportAnalysis | None = None) -> Table:
    """Recognition per dataset (row groups) and model: AUROC, AUPRC, F1 and accuracy at p >= 0.5, max-F1."""
    rows = tuple(
        Row(bench.model_label(m),
            tuple(_macro(bench, m, d, "classification", key, analysis) for _, key in RECOGNITION_METRICS),
            group=bench.dataset_label(d))
        for d in bench.datasets for m in bench.models_on(d)
    )
    return Table(
        "recognition", "Zero-shot recognition per dataset and model (percent, macro mean over classes)",
        "AUROC and AUPRC (average precision) from the logits; F1 and accuracy at probability p ≥ 0.5, the fixed "
        "rule. Unknown labels are left out; a class whose known labels are all one value has no AUROC/AUPRC and "
        "is left out of their macro mean. "
        + _notes(analysis and analysis.note + " Acc@max-F1* has no interval.", EMPHASIS_NOTE, CHOSEN_F1_NOTE),
        "Model", tuple(Column(header) for header, _ in RECOGNITION_METRICS), rows,
    )


#: (header, analysis metric) of the paired-difference and lesion-size tables
DIFFERENCE_METRICS = (("PG", "pointing_game"), ("Dice@0.5", "dice@0.5"), ("Dice@τcal", "dice@calibrated"),
                      ("AUROC", "auroc"))
STRATA_METRICS = (("PG", "pointing_game"), ("Dice@0.5", "dice@0.5"))


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
        columns = tuple(column for header, _ in DIFFERENCE_METRICS for column in (
            Column("A − B", header, ranked=False), Column("P(A>B)", header, ranked=False)))
        rows = []
        for (a, b), metrics in pairs.items():
            cells = []
            for _, metric in DIFFERENCE_METRICS:
                row = metrics[metric]
                cells += [_interval_cell(row["difference"], row), Cell(None if _missing(row["difference"])
                                                                       else row["a_better"])]
            rows.append(Row(f"{bench.model_label(a)} − {bench.model_label(b)}", tuple(cells)))
        label = bench.dataset_label(dataset)
        tables.append(Table(
            f"differences_{dataset}", f"Paired differences between models on {label} (percentage points)",
            "Each row compares two models on the same images: A − B of the macro means, with its paired bootstrap "
            "interval (both models scored on the same resampled images in every replicate, so image difficulty "
            "cancels). An interval that excludes 0 separates the two models at this level. P(A>B): percent of "
            "replicates in which A is ahead, a tie counted as half. Dice@τcal: at the calibrated threshold (previous tables). "
            + analysis.note,
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
        columns = tuple(Column(header, groups[s]) for s in strata for header, _ in STRATA_METRICS)
        rows = tuple(
            Row(bench.model_label(model), tuple(
                _interval_cell(cell[(model, s, metric)]["estimate"], cell[(model, s, metric)])
                for s in strata for _, metric in STRATA_METRICS))
            for model in bench.models_on(dataset) if any(key[0] == model for key in cell)
        )
        label = bench.dataset_label(dataset)
        tables.append(Table(
            f"lesion_size_{dataset}", f"Grounding by lesion size on {label} (percent)",
            "Lesion size: the region's area |R| as a share of the image (in the batch geometry); every class's "
            "graded pairs pooled, n = pairs per size bin. PG and Dice at the fixed τ = 0.5, means over the bin's "
            "pairs. Per class and at the calibrated τ: analysis/strata.csv. "
            + _notes(analysis.note, EMPHASIS_NOTE),
            "Model", columns, rows,
        ))
    return tables


CORRELATION_METRICS = (("PG", "pointing_game"), ("Dice@0.5", "dice@0.5"), ("Dice@τ*", "dice@best"))


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
                        tuple(_interval_cell(metrics[m]["r2"], metrics[m]) for _, m in CORRELATION_METRICS)))
    return Table(
        "recognition_vs_grounding",
        "Does recognition predict grounding? R² of macro AUROC against macro grounding",
        "R² (squared Pearson correlation) over the (model, dataset) points of a dataset, or of all datasets; "
        "n = points. Undefined (–) with fewer than three points or no spread. Intervals: the same bootstrap "
        "replicates, each dataset's images resampled, R² recomputed in every replicate. "
        + _notes(analysis.note, CHOSEN_TAU_NOTE),
        "Scope", tuple(Column(header, "R² with AUROC", ranked=False, percent=False)
                       for header, _ in CORRELATION_METRICS), tuple(rows),
    )


#: (header, metrics.json section, metric) of the robustness table and figure
ROBUSTNESS_METRICS = (("PG", "grounding", "pointing_game"), ("Dice@0.5", "grounding", "dice@0.5"),
                      ("Dice@τ*", "grounding", "dice@best"), ("AUROC", "classification", "auroc"),
                      ("AUPRC", "classification", "auprc"))
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
            cells = tuple(Cell(run.results[section]["macro"][metric]) for _, section, metric in ROBUSTNESS_METRICS)
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
        "Perturbation", tuple(Column(header, ranked=False) for header, _, _ in ROBUSTNESS_METRICS), tuple(rows),
    )


def paper_tables(bench: Benchmark, analysis: ReportAnalysis | None = None) -> list[Table]:
    """Every table of the report, in order: Table 1, its fixed-τ twin, [the calibrated τ], per-class PG,
    recognition, [paired differences, lesion-size strata, R²] (bracketed: with the analysis)."""
    tables = [grounding_table(bench, analysis), grounding_fixed_tau_table(bench, analysis)]
    if analysis is not None:
        tables.append(threshold_table(bench, analysis))
    tables += [*pointing_game_tables(bench, analysis), recognition_table(bench, analysis)]
    if analysis is not None:
        tables += [*difference_tables(bench, analysis), *strata_tables(bench, analysis),
                   correlation_table(bench, analysis)]
    return tables
