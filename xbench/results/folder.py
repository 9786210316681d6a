"""The layout of a results folder (file names, schema) and reading it back.

Kept apart from the writer (`xbench.results.write`) and free of torch, so that the suite
starts quickly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xbench.files import read_json_object

SCHEMA = "xbench.results/2"
METRICS = "metrics.json"
OVERLAYS = "overlays.npz"
#: What an error about a damaged results file tells the user to do.
DAMAGED = "the file was edited or damaged: re-run that model on that dataset (or restore the folder)"
PAIRS = "pairs.csv.gz"
QUERIES = "queries.csv.gz"
#: The per-pair tables of the explanation sections, by their section in ``metrics.json``: the run-level
#: checks' (``xbench.checks``: faithfulness, sanity, robustness) and the families every run scores on
#: its graded pairs (``xbench.metrics.map_quality``: localisation, complexity, randomisation).
CHECK_TABLES = {section: f"{section}.csv.gz" for section in (
    "faithfulness", "sanity", "robustness", "localisation", "complexity", "randomisation")}
#: The sanity check's saved cascade of one pair: its radiograph, region and map at every step.
SANITY_MAPS = "sanity_maps.npz"
#: Where the output went, not which model ran: options that folders written before the output
#: became a callback (``xbench.reporting.writer``) record among the model's ``init_args``.
MODEL_OUTPUT_OPTIONS = ("results_dir", "overlay_pairs")


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
    payload = read_json_object(path, "a run's results", DAMAGED)
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
    for key in CHECK_TABLES:  # optional: where present, what the analysis, the report and W&B read
        value = payload.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not isinstance(value.get("applicable"), bool) or (
                value["applicable"] and not all(isinstance(value.get(part), dict) for part in ("macro", "per_class"))):
            raise ValueError(f"{path}: {key!r} is not an explanation section (a dict with 'applicable' and, where it "
                             f"applies, 'macro' and 'per_class'); {DAMAGED}")
    return payload


def read_overlays(folder: Path, file: str = OVERLAYS) -> dict[str, np.ndarray] | None:
    """The saved overlay pairs of a results folder, or another of its arrays files (``file``:
    `SANITY_MAPS`); ``None`` if it has none."""
    path = Path(folder) / file
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except Exception as error:  # noqa: BLE001 -- numpy and zipfile raise several types for a damaged archive
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error}); {DAMAGED}") from None


def read_table(path: Path, **options):
    """``pandas.read_csv`` of a results table (``pairs.csv.gz``, ``queries.csv.gz``); a truncated,
    damaged or foreign file is an error naming it."""
    import pandas as pd  # noqa: PLC0415 -- the report's and the suite's start stay free of pandas

    try:
        return pd.read_csv(path, **options)
    except Exception as error:  # noqa: BLE001 -- gzip, zlib, pandas' parser and codecs each raise their own
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error}); {DAMAGED}") from None
