"""Tables a person reads in a terminal, a log file or a pipe: no number is ever cut.

rich shrinks a table that is wider than the console by cutting cells (``Pai…``, ``16…``): at 80
columns, the width of a pipe, a run's ten-column summary did not fit. `print_table` gives
every number column its full width and, when the columns do not fit side by side, prints them in
groups, each beside the label columns (as pandas wraps a wide frame); label columns fold onto
further lines instead of being cut. Where not even one number column fits beside the labels, each
row is printed as lines of ``header: value``. A count is printed with its noun in the number
it takes (`counted`: ``1 image``, ``2 images``).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

#: Characters a column adds to a table's width: one border and a space of padding either side.
COLUMN_FRAME = 3
#: The narrowest a label column is folded to (a finding's name wraps onto further lines).
MIN_LABEL = 6


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """``1 image``, ``2 images``; ``plural`` for a noun that does not take an ``s`` (``copies``)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def _width(console: Console, text: str) -> int:
    return max((console.render_str(line).cell_len for line in text.split("\n")), default=0)


def print_table(console: Console, title: str | None, headers: Sequence[str], rows: Sequence[Sequence[str]],
                labels: int = 1, total_row: bool = False, fold: Sequence[int] = ()) -> None:
    """Print ``rows`` under ``headers``: the first ``labels`` columns are text (left-aligned, folded
    when narrow), the others numbers (right-aligned, never cut). ``total_row``: the last row is a
    total (a line above it, bold); ``fold``: columns of free text, folded to what the console leaves
    them. Cells may hold rich markup (``[green]ok``)."""
    widths = [max([_width(console, str(header)), *(_width(console, str(row[c])) for row in rows)])
              for c, header in enumerate(headers)]
    label_widths = widths[:labels]
    free = [c for c in range(labels) if c in fold]
    fixed = sum(w + COLUMN_FRAME for c, w in enumerate(label_widths) if c not in free) + 1
    room = console.width - fixed - COLUMN_FRAME * len(free)
    if free:  # free text takes what the fixed columns leave, at least MIN_LABEL each
        for c in free:
            label_widths[c] = max(MIN_LABEL, min(widths[c], room // len(free)))
    groups = _groups(widths[labels:], console.width - sum(w + COLUMN_FRAME for w in label_widths) - 1)
    if groups is None:  # the labels leave no room: fold them, or give up the grid
        label_room = console.width - 1 - COLUMN_FRAME * labels - max([0, *(w + COLUMN_FRAME for w in widths[labels:])])
        if label_room < MIN_LABEL * labels:
            _print_lines(console, title, headers, rows, labels)
            return
        label_widths = [min(w, max(MIN_LABEL, label_room // labels)) for w in label_widths]
        groups = _groups(widths[labels:], console.width - sum(w + COLUMN_FRAME for w in label_widths) - 1)
    for part, group in enumerate(groups):
        shown = [*range(labels), *(labels + c for c in group)]
        heading = title if part == 0 else None
        if title is not None and len(groups) > 1:
            heading = f"{title} ({part + 1}/{len(groups)})"
        table = Table(title=heading, title_style="bold")
        for c in shown:
            if c < labels:
                table.add_column(headers[c], width=label_widths[c], overflow="fold")
            else:
                table.add_column(headers[c], justify="right", no_wrap=True, min_width=widths[c])
        for r, row in enumerate(rows):
            last = total_row and r == len(rows) - 1
            table.add_row(*(str(row[c]) for c in shown), end_section=total_row and r == len(rows) - 2,
                          style="bold" if last else None)
        console.print(table)


def _groups(widths: Sequence[int], room: int) -> list[list[int]] | None:
    """The number columns, in order, packed into groups that fit ``room``; ``None`` if one cannot."""
    groups: list[list[int]] = [[]]
    used = 0
    for c, width in enumerate(widths):
        need = width + COLUMN_FRAME
        if need > room:
            return None
        if used + need > room:
            groups.append([])
            used = 0
        groups[-1].append(c)
        used += need
    return groups


def _print_lines(console: Console, title: str | None, headers: Sequence[str], rows: Sequence[Sequence[str]],
                 labels: int) -> None:
    """The plain layout: each row's labels, then one ``header: value`` line per number."""
    if title is not None:
        console.print(title, style="bold")
    for row in rows:
        console.print(" · ".join(str(cell) for cell in row[:labels]))
        for header, cell in zip(headers[labels:], row[labels:]):
            console.print(f"  {header}: {cell}")
