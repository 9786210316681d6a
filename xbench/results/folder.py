"""The layout of a results folder (file names, schema, its manifest) and reading it back, every
file checked against the manifest first (`verify_folder`, `check_file`).

Kept apart from the writer (`xbench.results.write`) and free of torch, so that the suite
starts quickly.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from xbench.files import read_json_object, regular_file
from xbench.results.names import NAMES, check_names

SCHEMA = "xbench.results/4"
METRICS = "metrics.json"
#: Every file of the folder with its size and SHA-256, written last by the run (`manifest_of`).
MANIFEST = "manifest.json"
OVERLAYS = "overlays.npz"
#: What an error about a damaged results file tells the user to do.
DAMAGED = "the file was edited or damaged: re-run that model on that dataset (or restore the folder)"
PAIRS = "pairs.csv.gz"
QUERIES = "queries.csv.gz"
PER_CLASS = "per_class.csv"
SUMMARY = "summary.md"
CONFIG = "config.yaml"
#: The per-pair tables of the explanation sections, by their section in ``metrics.json``: the run-level
#: checks' (``xbench.checks``: faithfulness, sanity, robustness) and the families every run scores on
#: its graded pairs (``xbench.metrics.map_quality``: localisation, complexity, randomisation).
CHECK_TABLES = {section: f"{section}.csv.gz" for section in (
    "faithfulness", "sanity", "robustness", "localisation", "complexity", "randomisation")}
#: A gaze dataset's run: one row per (image, class) pair with a gaze target and its gaze metrics.
GAZE = "gaze.csv.gz"
#: cheXlocalize's protocol at native size, one row per scored (image, finding) pair
#: (`xbench.metrics.native.CHEXLOCALIZE_COLUMNS`): a saved-map run's with ``native_protocol``, and
#: the human run on cheXlocalize's human benchmark.
CHEXLOCALIZE_PAIRS = "chexlocalize_pairs.csv.gz"
#: The sanity check's saved cascade of one pair: its radiograph, region and map at every step.
SANITY_MAPS = "sanity_maps.npz"
#: Every file a run may write beside the manifest: one present but not listed was added by hand.
WRITTEN = (METRICS, PER_CLASS, SUMMARY, PAIRS, CONFIG, OVERLAYS, QUERIES, *CHECK_TABLES.values(), SANITY_MAPS,
           GAZE, CHEXLOCALIZE_PAIRS)
#: Bytes hashed at a time: a table of any size is streamed, never read whole.
HASH_CHUNK = 1 << 20
#: Where the output went, not which model ran: options that folders written before the output
#: became a callback (``xbench.reporting.writer``) record among the model's ``init_args``.
MODEL_OUTPUT_OPTIONS = ("results_dir", "overlay_pairs")


#: Characters a folder name cannot hold on some systems (Windows refuses ``:``, which a human run's
#: model name ``human:<reader set>`` holds), each spelt ``-`` in the folder's name; ``metrics.json``
#: keeps the name as it is.
UNSAFE_IN_FOLDER_NAMES = '<>:"/\\|?*'


def folder_name(model: str, dataset: str, stamp: str) -> str:
    """A run's folder name, ``<model>__<dataset>__<time>``, legal on every system
    (``human:phantom-second`` becomes ``human-phantom-second``)."""
    safe = "".join("-" if char in UNSAFE_IN_FOLDER_NAMES else char for char in model)
    return f"{safe}__{dataset}__{stamp}"


def count_columns(num_thresholds: int) -> tuple[list[str], list[str]]:
    """The pairs table's 101-point count columns: ``pred_k`` = |B_k| and ``inter_k`` = |B_k & R|."""
    return [f"pred_{k:03d}" for k in range(num_thresholds)], [f"inter_{k:03d}" for k in range(num_thresholds)]


#: The files by which a folder is known as a run's results.
RUN_FILES = (METRICS, MANIFEST, PAIRS)


def find_result_folders(paths: list[Path]) -> list[Path]:
    """Every results folder at or below ``paths`` (a folder holding ``metrics.json``), sorted; a
    folder holding a run's other files but no ``metrics.json`` is an error naming it (`holds_results`).

    Hidden folders (a run still being written is staged under a ``.name``) are not looked into.
    """
    found = set()
    for path in map(Path, paths):
        if not path.is_dir():
            raise FileNotFoundError(f"no results folder at {path}")
        for name in RUN_FILES:
            for file in path.rglob(name):
                if not any(part.startswith(".") for part in file.parent.relative_to(path).parts):
                    found.add(file.parent)
    return sorted(folder for folder in found if holds_results(folder))


def holds_results(folder: Path) -> bool:
    """Whether ``folder`` holds a run's files; one that holds some but no ``metrics.json`` is an
    error naming it, never skipped (the run would drop out of every table unnamed)."""
    if not any(os.path.lexists(Path(folder) / name) for name in RUN_FILES):
        return False
    if not os.path.lexists(Path(folder) / METRICS):
        raise ValueError(f"{folder} holds a run's files but no {METRICS}; {DAMAGED}")
    return True


def file_digest(path: Path) -> dict:
    """``{"bytes", "sha256"}`` of a file, hashed in chunks; anything but a regular file (a named pipe
    would block the read for ever) is refused before it is opened."""
    digest = hashlib.sha256()
    with open(regular_file(path), "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return {"bytes": os.stat(path).st_size, "sha256": digest.hexdigest()}


def manifest_of(folder: Path) -> dict:
    """The manifest of a finished folder: every file in it but the manifest, with its digest."""
    files = sorted(p for p in Path(folder).iterdir() if p.name != MANIFEST)
    return {"files": {path.name: file_digest(path) for path in files}}


def read_manifest(folder: Path) -> dict[str, dict]:
    """The manifest's files (name -> ``{"bytes", "sha256"}``), checked for its shape."""
    path = Path(folder) / MANIFEST
    if not os.path.lexists(path):
        raise ValueError(f"{path} is missing (every folder this XBench version writes has one); {DAMAGED}")
    try:
        manifest = read_json_object(path, "a results folder's manifest", DAMAGED)
    except ValueError as error:
        raise _damage(error) from None
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ValueError(f"{path}: 'files' is missing or not a dict of file name -> bytes and sha256; {DAMAGED}")
    for name, entry in files.items():
        bytes_, sha = (entry.get("bytes"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        if (name in ("", ".", "..", MANIFEST) or Path(name).name != name or not isinstance(bytes_, int)
                or isinstance(bytes_, bool) or not isinstance(sha, str)):
            raise ValueError(f"{path}: files[{name!r}] is not a file of the folder with its 'bytes' (an integer) "
                             f"and 'sha256' (a string); {DAMAGED}")
    return files


def check_file(folder: Path, name: str, files: dict[str, dict]) -> None:
    """One file of ``folder`` against the manifest's ``files``: listed, present, a regular file of
    the listed size and SHA-256."""
    path = Path(folder) / name
    if name not in files:
        raise ValueError(f"{path} is not listed in {Path(folder) / MANIFEST} (added to the folder by hand?); {DAMAGED}")
    try:
        found = file_digest(path)
    except FileNotFoundError:
        raise ValueError(f"{path} is missing, but {MANIFEST} lists it; {DAMAGED}") from None
    except ValueError as error:  # not a regular file (xbench.files.regular_file)
        raise _damage(error) from None
    listed = files[name]
    if found["bytes"] != listed["bytes"] or found["sha256"] != listed["sha256"]:
        raise ValueError(f"{path} is not the file the run wrote ({found['bytes']} bytes, SHA-256 "
                         f"{found['sha256'][:16]}...; {MANIFEST} lists {listed['bytes']} bytes, "
                         f"{listed['sha256'][:16]}...); {DAMAGED}")


#: The fixes `xbench.files` gives a file the user supplies, which a results folder's file replaces by `DAMAGED`.
GENERIC_FIXES = (": was it truncated?", ": name the file itself")


def _damage(error: ValueError) -> ValueError:
    """A file error of `xbench.files` (not JSON, not a regular file) with a results folder's fix."""
    what = str(error)
    for fix in GENERIC_FIXES:
        what = what.split(fix)[0]
    return ValueError(what if DAMAGED in what else f"{what}; {DAMAGED}")


def verify_folder(folder: Path) -> None:
    """Every file the manifest lists, and every file XBench writes that is present, checked against
    the manifest (`check_file`): what a reader uses is what the run wrote."""
    files = read_manifest(folder)
    present = {name for name in WRITTEN if os.path.lexists(Path(folder) / name)}
    for name in sorted(set(files) | present):
        check_file(folder, name, files)


#: What every reader of ``metrics.json`` relies on: key -> (type, the keys it must hold).
CORE_SECTIONS = {"model": (str, ()), "dataset": (str, ()), "classes": (list, ()), "data": (dict, ()),
                 "config": (dict, ("model",)), NAMES: (dict, ("model", "dataset", "findings"))}


def read_results(folder: Path, sections: dict | None = None) -> dict:
    """The ``metrics.json`` payload of a results folder, checked for its schema, the core sections,
    the names it shows its model, dataset and findings by (`check_names`) and the reader's own
    ``sections`` (key -> (type, keys it must hold)); a file that is not a run's results is an error
    naming it."""
    folder = Path(folder)
    path = folder / METRICS
    if not os.path.lexists(folder / MANIFEST):  # an older version's folder has none: say so first
        _check_schema(path, read_json_object(path, "a run's results", DAMAGED))
    verify_folder(folder)
    payload = read_json_object(path, "a run's results", DAMAGED)
    _check_schema(path, payload)
    for key, (kind, inner) in {**CORE_SECTIONS, **(sections or {})}.items():
        value = payload.get(key)
        if not isinstance(value, kind) or any(name not in value for name in inner):
            held = f" holding {', '.join(inner)}" if inner else ""
            raise ValueError(f"{path}: {key!r} is missing or not a {kind.__name__}{held}; {DAMAGED}")
        if "per_class" in inner and any(not isinstance(value["per_class"].get(c), dict) for c in payload["classes"]):
            raise ValueError(f"{path}: {key}.per_class lacks some of the classes {payload['classes']}; {DAMAGED}")
    check_names(path, payload, DAMAGED)
    _check_kind(path, payload)
    for key in (*CHECK_TABLES, "gaze"):  # optional: where present, what the analysis, the report and W&B read
        value = payload.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not isinstance(value.get("applicable"), bool) or (
                value["applicable"] and not all(isinstance(value.get(part), dict) for part in ("macro", "per_class"))):
            raise ValueError(f"{path}: {key!r} is not an explanation section (a dict with 'applicable' and, where it "
                             f"applies, 'macro' and 'per_class'); {DAMAGED}")
    return payload


def _check_kind(path: Path, payload: dict) -> None:
    """What kind of run it is, as every reader sorts it: a model, a test instrument (the Oracle:
    ``instrument``) or a radiologist scored like a model (``human``, with its ``reader_set``), never
    two at once; and whether its samples are reads (``data.reads``)."""
    flags = {key: payload.get(key, False) for key in ("instrument", "human")}
    flags["data.reads"] = payload["data"].get("reads", False)
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{path}: {key!r} is {value!r}, not true or false; {DAMAGED}")
    if flags["instrument"] and flags["human"]:
        raise ValueError(f"{path}: the run claims to be both a test instrument ('instrument': true, a ceiling that "
                         "reads the answer) and a human reader ('human': true); no run is both; " + DAMAGED)
    readers = payload.get("reader_set")
    if flags["human"] and not (isinstance(readers, dict) and all(isinstance(readers.get(k), str) for k in ("name", "rule"))):
        raise ValueError(f"{path}: 'human' is true but 'reader_set' (the reader set's name and rule, which "
                         f"--model human writes) is missing or not a dict of strings; {DAMAGED}")


def _check_schema(path: Path, payload: dict) -> None:
    if payload.get("schema") != SCHEMA:
        raise ValueError(
            f"{path}: schema {payload.get('schema')!r}, expected {SCHEMA!r}; it was written by another "
            "XBench version -- re-run that model or read it with the version that wrote it"
        )


def read_overlays(folder: Path, file: str = OVERLAYS) -> dict[str, np.ndarray] | None:
    """The saved overlay pairs of a results folder, or another of its arrays files (``file``:
    `SANITY_MAPS`); ``None`` if it has none (and its manifest lists none)."""
    path, files = Path(folder) / file, read_manifest(folder)
    if file not in files and not os.path.lexists(path):
        return None
    check_file(folder, file, files)
    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {name: arrays[name] for name in arrays.files}
    except Exception as error:  # noqa: BLE001 -- numpy and zipfile raise several types for a damaged archive
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error}); {DAMAGED}") from None


def read_table(path: Path, **options):
    """``pandas.read_csv`` of a results table (``pairs.csv.gz``, ``queries.csv.gz``); a truncated,
    damaged or foreign file, or one its folder's manifest does not list as it is, is an error naming it."""
    import pandas as pd  # noqa: PLC0415 -- the report's and the suite's start stay free of pandas

    path = Path(path)
    check_file(path.parent, path.name, read_manifest(path.parent))
    try:
        return pd.read_csv(path, **options)
    except Exception as error:  # noqa: BLE001 -- gzip, zlib, pandas' parser and codecs each raise their own
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error}); {DAMAGED}") from None
