"""Reading the CSV and JSON files that datasets ship (and results folders hold), with errors that
name the file and the line.

Files are read as downloaded: a UTF-8 byte-order mark is tolerated, header names and values are
compared with surrounding spaces stripped (SIIM's header is ``ImageId, EncodedPixels``, with a
space, and its values carry a leading space in some copies but not in others).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import yaml


@contextmanager
def open_text(path: Path) -> Iterator[IO[str]]:
    """``path`` opened as UTF-8 text (a byte-order mark tolerated); bytes that are not UTF-8, or a
    line the csv module cannot read, are an error naming the file."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            yield handle
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {error.object[error.start:error.start + 1]!r} at offset {error.start} of "
            "the part read): is it the file as downloaded? Save it as UTF-8."
        ) from None
    except csv.Error as error:
        raise ValueError(f"{path}: not a readable CSV file ({error})") from None


def read_json(path: Path):
    """The JSON in ``path``; an empty, truncated or non-UTF-8 file is an error naming it and the place."""
    try:
        with open_text(path) as handle:
            return json.load(handle)
    except json.JSONDecodeError as error:
        state = "is empty" if not Path(path).stat().st_size else f"is not valid JSON ({error})"
        raise ValueError(f"{path} {state}: was it truncated? Download or write it again.") from None


def read_yaml(path: Path):
    """The YAML in ``path``; a file that is not valid YAML is an error naming it and the line."""
    try:
        with open_text(path) as handle:
            return yaml.safe_load(handle)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        place = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise ValueError(f"{path}{place}: not valid YAML ({problem}); fix the file") from None


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
