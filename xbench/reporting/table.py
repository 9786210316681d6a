"""A table as data: the report's tables are built as `Table` and rendered by
`xbench.reporting.render` (Markdown, CSV, LaTeX).

A table has columns (optionally under a group such as a dataset), rows (optionally in a group,
within which emphasis is ranked) and `Cell` values. A cell holds a fraction, shown in
percent (or, in a column marked so, a plain ratio such as R²), and optionally an interval (a
bootstrap confidence interval) that every renderer shows next to the value: ``61.6 [58.9, 64.2]``.
A ceiling row (an instrument such as the Oracle, which reads the answer) is shown for scale and
never ranked, as are a human row (radiologists scored like a model, `Row.human`) and a published
row (a reference's values beside the runs', `Row.published`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Emphasis = Literal["best", "second"] | None


def missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def format_interval(estimate: float | None, lower: float | None, upper: float | None, scale: float = 100,
                    digits: int = 1) -> str:
    """``61.6 [58.9, 64.2]`` (values scaled by ``scale``); ``–`` for an undefined estimate."""
    if missing(estimate):
        return "–"
    text = lambda v: "–" if missing(v) else f"{scale * v:.{digits}f}"  # noqa: E731
    return f"{text(estimate)} [{text(lower)}, {text(upper)}]"


@dataclass(frozen=True)
class Cell:
    """A value (``None``: no value), an optional interval around it, an optional mark printed
    after it (the reproduction's signs: outside the interval, the reference disagrees with itself)
    and the decimals of a value printed at its source's precision (a published value)."""

    value: float | None
    interval: tuple[float, float] | None = None
    mark: str = ""
    digits: int | None = None


@dataclass(frozen=True)
class Column:
    """``ranked``: bold/underline the best values (not for differences and gaps); ``lower_better``:
    the best is the lowest (a deletion AUC); ``percent``: values are fractions shown in percent, else
    plain numbers with two decimals (R², a logit); ``digits``: other decimals (a reference's values
    as printed)."""

    header: str
    group: str | None = None
    ranked: bool = True
    percent: bool = True
    lower_better: bool = False
    digits: int | None = None

    @property
    def scale(self) -> tuple[float, int]:
        """The factor and decimals a value of this column is printed with."""
        scale, digits = (100, 1) if self.percent else (1, 2)
        return scale, digits if self.digits is None else self.digits

    def text(self, cell: Cell) -> str:
        """The cell as printed: ``61.6``, ``61.6 [58.9, 64.2]`` or ``–``, then its mark."""
        scale, digits = self.scale
        digits = digits if cell.digits is None else cell.digits
        if missing(cell.value):
            text = "–"
        elif cell.interval is None:
            text = f"{scale * cell.value:.{digits}f}"
        else:
            text = format_interval(cell.value, *cell.interval, scale=scale, digits=digits)
        return f"{text} {cell.mark}" if cell.mark else text


@dataclass(frozen=True)
class Row:
    """``ceiling``: an instrument's row (the Oracle), shown for scale and never ranked; ``human``:
    radiologists scored like a model, the human scale, never ranked; ``published``: a reference's
    published values, shown beside the runs', never ranked."""

    label: str
    cells: tuple[Cell, ...]
    group: str | None = None
    ceiling: bool = False
    published: bool = False
    human: bool = False

    @property
    def apart(self) -> bool:
        """Shown in italics for comparison and never ranked: a ceiling, a human or a published row."""
        return self.ceiling or self.published or self.human


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
    """Per row and column: ``best`` (bold) or ``second`` (underlined) within the column and row group
    (the highest values, or the lowest in a ``lower_better`` column).

    Values are ranked as printed, so equal-looking numbers tie, and ties share a rank: a value's
    rank is one plus the number of values above it (75, 50, 50, 25 rank 1, 2, 2, 4). Rank 1 is
    the best and rank 2 the second, but only where some value lies below: a column of equal values
    has no best, and values tied at the bottom are not "second best". Ceiling, human and published
    rows are not ranked.
    """
    marks: list[list[Emphasis]] = [[None] * len(table.columns) for _ in table.rows]
    groups: dict[str | None, list[int]] = {}
    for r, row in enumerate(table.rows):
        if not row.apart:
            groups.setdefault(row.group, []).append(r)
    for rows in groups.values():
        for c, column in enumerate(table.columns):
            if not column.ranked:
                continue
            scale, digits = column.scale
            sign = -1 if column.lower_better else 1
            printed = {r: sign * round(scale * table.rows[r].cells[c].value, digits) for r in rows
                       if not missing(table.rows[r].cells[c].value)}
            for r, value in printed.items():
                above = sum(other > value for other in printed.values())
                below = any(other < value for other in printed.values())
                if below and above < 2:
                    marks[r][c] = "second" if above else "best"
    return marks
