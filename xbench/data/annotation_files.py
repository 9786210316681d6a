"""Reading the CSV files that datasets ship, with errors that name the file and the line.

Files are read as downloaded (`xbench.files.open_text`): a UTF-8 byte-order mark is
tolerated, header names and values are compared with surrounding spaces stripped (SIIM's header is
``ImageId, EncodedPixels``, with a space, and its values carry a leading space in some copies but
not in others).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from pathlib import Path

from xbench.files import open_text


def read_csv_rows(path: Path, columns: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(line number, {column: stripped value})`` for each data row of ``path``.

    ``columns`` must all be in the header (other columns are ignored); a row with fewer fields
    than the header is an error naming its line.
    """
    with open_text(path) as handle:
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        missing = [name for name in columns if name not in header]
        if missing:
            raise ValueError(
                f"{path}: the header {header} lacks the column(s) {missing}; expected a header with "
                f"{list(columns)}. Is this the right file?"
            )
        positions = {name: header.index(name) for name in columns}
        for fields in reader:
            if not fields:
                continue
            if len(fields) < len(header):
                raise ValueError(f"{path}, line {reader.line_num}: {len(fields)} fields, the header has {len(header)}")
            yield reader.line_num, {name: fields[i].strip() for name, i in positions.items()}


def split_file_path(root: Path, split_file: str) -> Path:
    """A split file named relative to the dataset folder ``root``, or by an absolute path."""
    path = Path(split_file).expanduser()
    return path if path.is_absolute() else root / path
