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
#: What an error about a damaged results file tells the user to do.
DAMAGED = "the file was edited or damaged: re-run that model on that dataset (or restore the folder)"
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


#: What every reader of ``metrics.json`` relies on: key -> (type, the keys it must hold).
CORE_SECTIONS = {"model": (str, ()), "dataset": (str, ()), "classes": (list, ()), "data": (dict, ()),
                 "config": (dict, ("model",))}


def read_results(folder: Path, sections: dict | None = None) -> dict:
    """The ``metrics.json`` payload of a results folder, checked for its schema, the core sections
    and the reader's own ``sections`` (key -> (type, keys it must hold)); a file that is not a
    run's results is an error naming it."""
    path = Path(folder) / METRICS
    payload = read_json(path)
    if not isinstance(payload, dict):
        raise ValueError(f"{path} holds a JSON {type(payload).__name__}, not a run's results; {DAMAGED}")
    if payload.get("schema") != SCHEMA:
        raise ValueError(
            f"{path}: schema {payload.get('schema')!r}, expected {SCHEMA!r}; it was written by another "
            "XBench version -- re-run that model or read it with the version that wrote it"
        )
    for key, (kind, inner) in {**CORE_SECTIONS, **(sections or {})}.items():
        value = payload.get(key)
        if not isinstance(value, kind) or any(name not in value for name in inner):
            held = f" holding {', '.join(inner)}" if inner else ""
            raise ValueError(f"{path}: {key!r} is missing or not a {kind.__name__}{held}; {DAMAGED}")
        if "per_class" in inner and any(not isinstance(value["per_class"].get(c), dict) for c in payload["classes"]):
            raise ValueError(f"{path}: {key}.per_class lacks some of the classes {payload['classes']}; {DAMAGED}")
    return payload


def read_overlays(folder: Path) -> dict[str, np.ndarray] | None:
    """The saved overlay pairs of a results folder (``None`` if it has none)."""
    path = Path(folder) / OVERLAYS
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except Exception as error:  # noqa: BLE001 -- numpy and zipfile raise several types for a damaged archive
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error}); {DAMAGED}") from None


def current_umask() -> int:
    """The process's file-mode creation mask, read without changing it (``os.umask`` can only read
    it by setting it, a moment in which another thread's new file would get the wrong mode)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):  # not Linux, or a kernel before 4.7
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def follow_umask(path: Path, folder: bool = False) -> None:
    """Give ``path`` the mode a plain ``open`` or ``mkdir`` would have: ``tempfile`` makes files
    0600 and folders 0700, unreadable to the group a user shares results with."""
    os.chmod(path, (0o777 if folder else 0o666) & ~current_umask())


def read_table(path: Path, **options):
    """``pandas.read_csv`` of a results table (``pairs.csv.gz``, ``queries.csv.gz``); a truncated,
    damaged or foreign file is an error naming it."""
    import pandas as pd  # noqa: PLC0415 -- the report's and the suite's start stay free of pandas

    try:
        return pd.read_csv(path, **options)
    except Exception as error:  # noqa: BLE001 -- gzip, zlib, pandas' parser and codecs each raise their own
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error}); {DAMAGED}") from None


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write`` on a temporary file beside ``path``, then rename it to ``path`` (with the mode
    the user's umask gives a new file).

    A reader never sees a half-written file: an interrupted write leaves the old file (or none). A
    failed write (a full disk, a file-size limit) is an error naming ``path``.
    """
    path = Path(path)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(descriptor)
    try:
        write(Path(temporary))
        follow_umask(Path(temporary))
        os.replace(temporary, path)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        if error.filename is not None or str(path) in str(error):
            raise
        raise OSError(error.errno, f"{error.strerror or error}: writing {path} failed (a full disk, a quota or a "
                                   "file-size limit such as `ulimit -f`?); free space or lift the limit and "
                                   "run again") from error
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
