"""Renderers of a `Table`: Markdown, CSV and LaTeX, and the
project's one Markdown grid writer (`markdown_grid`), which every Markdown table uses."""

from __future__ import annotations

import csv
import io

from xbench.reporting.table import Column, Table, emphasis, missing

def _header(column: Column, separator: str) -> str:
    return column.header if column.group is None else f"{column.group}{separator}{column.header}"


def markdown_grid(headers: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """The project's one Markdown table writer: a header, an alignment line (the first
    ``text_columns`` left, numbers right) and the rows, as lines."""
    align = [":---"] * text_columns + ["---:"] * (len(headers) - text_columns)
    return ["| " + " | ".join(headers) + " |", "|" + "|".join(align) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def to_markdown(table: Table, number: int | None = None) -> str:
    """``**Table n: title**``, the grid (bold best, ``<ins>`` second, ceiling and published rows in
    italics), the caption."""
    heading = f"Table {number}: {table.title}" if number is not None else table.title
    marks = emphasis(table)
    rows, group = [], None
    for row, row_marks in zip(table.rows, marks):
        if row.group is not None and row.group != group:
            group = row.group
            rows.append([f"*{group}*"] + [""] * len(table.columns))
        cells = []
        for cell, column, mark in zip(row.cells, table.columns, row_marks):
            text = column.text(cell)
            cells.append({"best": f"**{text}**", "second": f"<ins>{text}</ins>"}.get(mark, text))
        rows.append([f"*{row.label}*" if row.apart else row.label] + cells)
    grid = markdown_grid([table.stub] + [_header(c, "<br>") for c in table.columns], rows)
    return "\n".join([f"**{heading}**", "", *grid, "", table.caption]) + "\n"


def to_csv(table: Table) -> str:
    """One line per row: the labels, then every value at full precision, in percent where the
    column shows percent (empty: none); a column with intervals gets ``<header> low`` and
    ``<header> high`` columns after it, a column with marks a ``<header> mark`` column."""
    with_interval = [any(row.cells[c].interval is not None for row in table.rows) for c in range(len(table.columns))]
    with_mark = [any(row.cells[c].mark for row in table.rows) for c in range(len(table.columns))]
    has_groups = any(row.group is not None for row in table.rows)
    header = (["group"] if has_groups else []) + [table.stub]
    for column, interval, mark in zip(table.columns, with_interval, with_mark):
        name = _header(column, " ")
        header += [name] + ([f"{name} low", f"{name} high"] if interval else []) + ([f"{name} mark"] if mark else [])
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)

    def number(value: float | None, column: Column) -> str:
        return "" if missing(value) else repr(column.scale[0] * value)

    for row in table.rows:
        line = ([row.group or ""] if has_groups else []) + [row.label]
        for cell, column, interval, mark in zip(row.cells, table.columns, with_interval, with_mark):
            line.append(number(cell.value, column))
            if interval:
                low, high = cell.interval if cell.interval is not None else (None, None)
                line += [number(low, column), number(high, column)]
            if mark:
                line.append(cell.mark)
        writer.writerow(line)
    return buffer.getvalue()


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}
_LATEX_MATH = {"τ": r"\tau", "≥": r"\geq", "Δ": r"\Delta", "×": r"\times", "*": "^*", "−": "-", "<": "<",
               ">": ">", "²": "^2", "†": r"\dagger", "‡": r"\ddagger"}


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
            text = latex_text(column.text(cell))
            cells.append({"best": rf"\textbf{{{text}}}", "second": rf"\underline{{{text}}}"}.get(mark, text))
        label = latex_text(row.label)
        lines.append(" & ".join([rf"\textit{{{label}}}" if row.apart else label] + cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"
