"""The paper's tables from a :class:`~xbench.reporting.benchmark.Benchmark`, as Markdown, CSV and LaTeX.

A :class:`Table` is data: columns (optionally under a group such as a dataset), rows (optionally
in a group, within which emphasis is ranked) and :class:`Cell` values. A cell holds a fraction in
[0, 1], shown in percent, and optionally an interval (e.g. a bootstrap confidence interval) that
every renderer shows next to the value. Per column (and row group) the best value is bold and the
second best underlined, ranked on the values as printed, so equal-looking numbers rank equal.

Every number chosen on the evaluated set itself -- Dice and IoU at the best threshold tau*, max-F1
and the accuracy at its threshold -- carries a ``*`` in its header and the caption says so.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Literal

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


@dataclass(frozen=True)
class Cell:
    """A fraction in [0, 1] (``None``: no value) and an optional interval around it."""

    value: float | None
    interval: tuple[float, float] | None = None


@dataclass(frozen=True)
class Column:
    header: str
    group: str | None = None


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


def percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


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
        for c in range(len(table.columns)):
            printed = {r: round(100 * table.rows[r].cells[c].value, 1) for r in rows
                       if table.rows[r].cells[c].value is not None}
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


def _cell_text(cell: Cell, dash: str = "–") -> str:
    if cell.value is None:
        return dash
    text = percent(cell.value)
    if cell.interval is not None:
        text += f" ({percent(cell.interval[0])}–{percent(cell.interval[1])})"
    return text


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
        for cell, mark in zip(row.cells, row_marks):
            text = _cell_text(cell)
            cells.append({"best": f"**{text}**", "second": f"<ins>{text}</ins>"}.get(mark, text))
        lines.append("| " + " | ".join([row.label] + cells) + " |")
    return "\n".join(lines + ["", table.caption]) + "\n"


def to_csv(table: Table) -> str:
    """One line per row: the labels, then every value in percent at full precision (empty: none);
    a column with intervals gets ``<header> low`` and ``<header> high`` columns after it."""
    with_interval = [any(row.cells[c].interval is not None for row in table.rows) for c in range(len(table.columns))]
    has_groups = any(row.group is not None for row in table.rows)
    header = (["group"] if has_groups else []) + [table.stub]
    for column, interval in zip(table.columns, with_interval):
        name = _header(column, " ")
        header += [name] + ([f"{name} low", f"{name} high"] if interval else [])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)

    def number(value: float | None) -> str:
        return "" if value is None else repr(100 * value)

    for row in table.rows:
        line = ([row.group or ""] if has_groups else []) + [row.label]
        for cell, interval in zip(row.cells, with_interval):
            line.append(number(cell.value))
            if interval:
                low, high = cell.interval if cell.interval is not None else (None, None)
                line += [number(low), number(high)]
        writer.writerow(line)
    return buffer.getvalue()


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_MATH = {"τ": r"\tau", "≥": r"\geq", "Δ": r"\Delta", "×": r"\times", "*": "^*"}


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
        for cell, mark in zip(row.cells, row_marks):
            text = latex_text(_cell_text(cell))
            cells.append({"best": rf"\textbf{{{text}}}", "second": rf"\underline{{{text}}}"}.get(mark, text))
        lines.append(" & ".join([latex_text(row.label)] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


# -- the paper's tables ------------------------------------------------------------------------

EMPHASIS_NOTE = (
    "Best per column in bold, second underlined; – : no value (no graded pair, or a class with one label value)."
)


def _macro(bench: Benchmark, model: str, dataset: str, section: str, name: str) -> Cell:
    run = bench.get(model, dataset)
    return Cell(None if run is None else run.results[section]["macro"][name])


def _per_model_over_datasets(bench: Benchmark, name: str, title: str, metrics: list[tuple[str, str]],
                             caption: str) -> Table:
    columns = tuple(Column(header, bench.dataset_label(d)) for d in bench.datasets for header, _ in metrics)
    rows = tuple(
        Row(bench.model_label(m),
            tuple(_macro(bench, m, d, "grounding", key) for d in bench.datasets for _, key in metrics))
        for m in bench.models
    )
    return Table(name, title, caption, "Model", columns, rows)


def grounding_table(bench: Benchmark) -> Table:
    """Table 1: Pointing Game, Dice and IoU at the best threshold tau*, per model and dataset."""
    return _per_model_over_datasets(
        bench, "grounding", "Grounding per model and dataset (percent, macro mean over classes)",
        [("PG", "pointing_game"), ("Dice@τ*", "dice@best"), ("IoU@τ*", "iou@best")],
        "PG = Pointing Game (a hit when a pixel at the map's maximum lies in the region; a constant map is a miss). "
        "Dice@τ*, IoU@τ*: per-image means at each class's best threshold τ*. Macro means over the classes with at "
        "least one graded (image, class) pair. The fixed-threshold twins (τ = 0.5) are in the next table. "
        f"{EMPHASIS_NOTE} {CHOSEN_TAU_NOTE}",
    )


def grounding_fixed_tau_table(bench: Benchmark) -> Table:
    """Table 1's Dice and IoU at the fixed threshold tau = 0.5 (nothing chosen on the evaluated set)."""
    return _per_model_over_datasets(
        bench, "grounding_fixed_tau", "Grounding at the fixed threshold τ = 0.5 (percent, macro mean over classes)",
        [("Dice@0.5", "dice@0.5"), ("IoU@0.5", "iou@0.5")],
        "Dice and IoU of the region {s ≥ 0.5} of the min-max normalised map: per-image means, macro over classes "
        f"with at least one graded pair. The fixed-rule twins of the previous table's τ* columns. {EMPHASIS_NOTE}",
    )


def pointing_game_tables(bench: Benchmark) -> list[Table]:
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
            cells = tuple(Cell(per_class[key]["pointing_game"] if key in per_class else None) for key in classes)
            rows.append(Row(bench.model_label(model), cells + (Cell(results["grounding"]["macro"]["pointing_game"]),)))
        legend = ", ".join(f"{short_name(key)} = {display_name(key)}" for key in classes)
        label = bench.dataset_label(dataset)
        tables.append(Table(
            f"pointing_game_{dataset}", f"Pointing Game per class on {label} (percent)",
            f"{legend}. Mean: macro mean over the classes with at least one graded pair. {EMPHASIS_NOTE}",
            "Model", columns, tuple(rows),
        ))
    return tables


RECOGNITION_METRICS = (
    ("AUROC", "auroc"), ("AUPRC", "auprc"), ("F1@p≥0.5", "f1@0.5"), ("Acc@p≥0.5", "accuracy@0.5"),
    ("max-F1*", "max_f1"), ("Acc@max-F1*", "accuracy@max_f1"),
)


def recognition_table(bench: Benchmark) -> Table:
    """Recognition per dataset (row groups) and model: AUROC, AUPRC, F1 and accuracy at p >= 0.5, max-F1."""
    rows = tuple(
        Row(bench.model_label(m), tuple(_macro(bench, m, d, "classification", key) for _, key in RECOGNITION_METRICS),
            group=bench.dataset_label(d))
        for d in bench.datasets for m in bench.models_on(d)
    )
    return Table(
        "recognition", "Zero-shot recognition per dataset and model (percent, macro mean over classes)",
        "AUROC and AUPRC (average precision) from the logits; F1 and accuracy at probability p ≥ 0.5, the fixed "
        "rule. Unknown labels are left out; a class whose known labels are all one value has no AUROC/AUPRC and "
        f"is left out of their macro mean. {EMPHASIS_NOTE} {CHOSEN_F1_NOTE}",
        "Model", tuple(Column(header) for header, _ in RECOGNITION_METRICS), rows,
    )


def paper_tables(bench: Benchmark) -> list[Table]:
    """Every table of the report, in order: Table 1, its fixed-τ twin, per-class PG, recognition."""
    return [grounding_table(bench), grounding_fixed_tau_table(bench), *pointing_game_tables(bench),
            recognition_table(bench)]
