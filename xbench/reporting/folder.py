"""The layout of a results folder (file names, schema), reading it back, and the atomic write
every output file of XBench goes through.

Kept apart from the writer (``results.py``) and free of torch, so that the report and the suite
start quickly.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from xbench.data.annotation_files import read_json

SCHEMA = "xbench.results/2"
METRICS = "metrics.json"
OVERLAYS = "overlays.npz"
PAIRS = "pairs.csv.gz"
QUERIES = "queries.csv.gz"


def count_columns(num_thresholds: int) -> tuple[list[str], list[str]]:
    """The pairs table's 101-point count columns: ``pred_k`` = |B_k| and ``inter_k`` = |B_k & R|."""
    return [f"pred_{k:03d}" for k in range(num_thresholds)], [f"inter_{k:03d}" for k in range(num_thresholds)]


def find_result_folders(paths: list[Path]) -> list[Path]:
    """Every results folder at or below ``paths`` (a folder holding ``metrics.json``), sorted.

    Hidden folders (a run still being written is staged under a ``.name``) are not looked into.
    """
    found = set()
    for path in map(Path, paths):
        if not path.is_dir():
            raise FileNotFoundError(f"no results folder at {path}")
        for metrics in path.rglob(METRICS):
            relative = metrics.parent.relative_to(path).parts
            if not any(part.startswith(".") for part in relative):
                found.add(metrics.parent)
    return sorted(found)


def read_results(folder: Path) -> dict:
    """The ``metrics.json`` payload of a results folder, checked for its schema."""
    path = Path(folder) / METRICS
    payload = read_json(path)
    if payload.get("schema") != SCHEMA:
        raise ValueError(
            f"{path}: schema {payload.get('schema')!r}, expected {SCHEMA!r}; it was written by another "
            "XBench version -- re-run that model or read it with the version that wrote it"
        )
    return payload


def read_overlays(folder: Path) -> dict[str, np.ndarray] | None:
    """The saved overlay pairs of a results folder (``None`` if it has none)."""
    path = Path(folder) / OVERLAYS
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it to ``path``.

    A reader never sees a half-written file: an interrupted write leaves the old file (or none).
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(descriptor)
    try:
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
