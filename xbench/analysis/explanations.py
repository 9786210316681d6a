"""The checks' per-pair tables read back, and their per-class means in every bootstrap replicate.

A run with the sanity or faithfulness check (``xbench.checks``) keeps one row per scored (image,
class) pair in ``faithfulness.csv.gz`` and one per pair and cascade step in ``sanity.csv.gz``. The
analysis resamples them with the dataset's image weights, the same draws as every other metric of
the run and of every other model on the dataset, so their intervals are paired with plausibility's.
A pair whose value is undefined (a map that points nowhere; a constant map's Spearman correlation)
is left out of its class's mean, as in ``metrics.json``; a class with no defined pair in a replicate
is NaN there and left out of that replicate's macro mean. A gaze dataset's run keeps its gaze
metrics' pairs in ``gaze.csv.gz`` (`load_gaze`), resampled the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from xbench.metrics.map_quality import SECTIONS as ALWAYS_ON
from xbench.metrics.names import analysed_keys, metric, run_keys
from xbench.results.folder import CHECK_TABLES, DAMAGED, GAZE, PAIRS, read_table

#: The analysed values of each check, by its section in ``metrics.json``.
CHECK_METRICS = {section: analysed_keys(section) for section in CHECK_TABLES}
#: The sections whose tables flag each pair's constant map (those `xbench.results.payload.pair_section`
#: builds, with its counts): all but sanity, which scores a map against itself randomised.
FLAGGED = tuple(section for section in CHECK_TABLES if section != "sanity")
#: How far past its metric's range (`xbench.metrics.names.Metric.bounds`) a value may lie: float noise.
RANGE_SLACK = 1e-9


@dataclass(frozen=True)
class CheckedPairs:
    """The (image, class) pairs one check scored: ``image`` int64 [P] (row in the run's sorted image
    ids), ``cls`` int64 [P], and per metric float64 [P] (NaN: undefined for that pair)."""

    image: Tensor
    cls: Tensor
    values: dict[str, Tensor]


def load_checks(folder: Path, metrics: dict, classes: tuple[str, ...], image_ids: np.ndarray, graded: np.ndarray
                ) -> dict[str, CheckedPairs]:
    """The pairs of each check that ran on the folder's run (``metrics.json``'s section applicable):
    faithfulness's pairs, and sanity's pairs after its last cascade step (every group randomised).
    ``graded``: the run's graded pairs as ``image * C + class`` (`pair_cells`), sorted, which every
    table's pairs are checked against; a table without its section is an error naming both."""
    found = {}
    for section, file in CHECK_TABLES.items():
        body = metrics.get(section)  # a dict where present (read_results checks it)
        path = Path(folder) / file
        if not (body or {}).get("applicable"):
            if os.path.lexists(path):
                raise ValueError(f"{path} is present, but metrics.json has no applicable {section} section; {DAMAGED}")
            continue
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing, but metrics.json holds a {section} section; {DAMAGED}")
        table = read_table(path, dtype={"image_id": str, "class": str}, keep_default_na=False,
                           na_values={name: ["", "nan", "NaN"] for name in CHECK_METRICS[section]})
        if section == "sanity":
            last = metrics[section]["steps"][-1]["step"]
            table = table[table["step"] == last]
        if len(table) != body.get("pairs"):
            raise ValueError(f"{path} holds {len(table)} pairs, but metrics.json's {section} section counts "
                             f"{body.get('pairs')!r}; {DAMAGED}")
        checked = _checked_pairs(path, table, CHECK_METRICS[section], classes, image_ids)
        _check_graded(path, section, table, pair_cells(checked.image, checked.cls, len(classes)), graded)
        if section in FLAGGED:
            _check_constant_maps(path, section, table, body, classes)
        found[section] = checked
    return found


#: The gaze metrics' per-pair values (``gaze.csv.gz``'s columns beside the pair's).
GAZE_METRICS = run_keys("gaze", "per_class")


def load_gaze(folder: Path, metrics: dict, classes: tuple[str, ...], image_ids: np.ndarray) -> CheckedPairs | None:
    """The (image, class) pairs a gaze run scored (``gaze.csv.gz``), every value in its metric's range
    and the pairs of each class as ``metrics.json``'s gaze section counts them; ``None`` for a run
    without gaze. A table without its section, or a section without its table, is an error naming both."""
    body, path = metrics.get("gaze"), Path(folder) / GAZE
    if not (body or {}).get("applicable"):
        if os.path.lexists(path):
            raise ValueError(f"{path} is present, but metrics.json has no gaze section; {DAMAGED}")
        return None
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing, but metrics.json holds a gaze section; {DAMAGED}")
    table = read_table(path, dtype={"image_id": str, "class": str}, keep_default_na=False,
                       na_values={name: ["", "nan", "NaN"] for name in GAZE_METRICS})
    checked = _checked_pairs(path, table, GAZE_METRICS, classes, image_ids)
    counted = torch.bincount(checked.cls, minlength=len(classes)).tolist()
    listed = [(body["per_class"].get(key) or {}).get("pairs") for key in classes]
    if counted != listed:
        raise ValueError(f"{path} holds {dict(zip(classes, counted))} pairs per class, but metrics.json's gaze section "
                         f"counts {dict(zip(classes, listed))}; {DAMAGED}")
    return checked


def pair_cells(image: Tensor | np.ndarray, cls: Tensor | np.ndarray, num_classes: int) -> np.ndarray:
    """Each (image row, class) pair as one number, ``image * C + class``."""
    return np.asarray(image, dtype=np.int64) * num_classes + np.asarray(cls, dtype=np.int64)


def _check_graded(path: Path, section: str, table: pd.DataFrame, cells: np.ndarray, graded: np.ndarray) -> None:
    """The families score exactly the graded pairs of ``pairs.csv.gz``; a run-level check a subset."""
    foreign = ~np.isin(cells, graded)
    if foreign.any():
        first = np.flatnonzero(foreign)[0]
        raise ValueError(f"{path}, data row {table.index[first] + 2}: ({table['image_id'].iloc[first]}, "
                         f"{table['class'].iloc[first]}) is not a graded pair of {PAIRS}; {DAMAGED}")
    if section in ALWAYS_ON and len(cells) != len(graded):
        raise ValueError(f"{path} holds {len(cells)} pairs, but {PAIRS} grades {len(graded)}: {section} scores "
                         f"every graded pair; {DAMAGED}")


def _check_constant_maps(path: Path, section: str, table: pd.DataFrame, body: dict, classes: tuple[str, ...]) -> None:
    """The table's ``constant_map`` flags, counted per class, against the section's own counts."""
    flags = table["constant_map"] if "constant_map" in table.columns else None
    if flags is None or (len(flags) and flags.dtype != bool):  # a table of no pairs reads as no type
        raise ValueError(f"{path}: the constant_map column is missing or holds more than True and False; {DAMAGED}")
    counted = flags.groupby(table["class"]).sum()
    for key in classes:
        listed = body["per_class"][key].get("constant_maps")
        if int(counted.get(key, 0)) != listed:
            raise ValueError(f"{path}: {int(counted.get(key, 0))} constant maps of {key} flagged, but metrics.json's "
                             f"{section}.per_class.{key}.constant_maps counts {listed!r}; {DAMAGED}")


def _checked_pairs(path: Path, table: pd.DataFrame, names: tuple[str, ...], classes: tuple[str, ...],
                   image_ids: np.ndarray) -> CheckedPairs:
    missing = [name for name in ("image_id", "class", *names) if name not in table.columns]
    if missing:
        raise ValueError(f"{path}: columns missing: {', '.join(missing)}; {DAMAGED}")
    cls = pd.Categorical(table["class"], categories=classes).codes.astype(np.int64)
    ids = table["image_id"].to_numpy(dtype=str)
    image = np.searchsorted(image_ids, ids)
    known = (image < len(image_ids)) & (image_ids[np.minimum(image, len(image_ids) - 1)] == ids)
    if (cls < 0).any() or not known.all():
        rows = np.flatnonzero((cls < 0) | ~known)[:5] + 2
        raise ValueError(f"{path}, data row(s) {', '.join(map(str, rows))}: image_id or class not among the run's "
                         f"images and classes; {DAMAGED}")
    if len(np.unique(image * len(classes) + cls)) != len(table):
        raise ValueError(f"{path}: an (image, class) pair appears twice; {DAMAGED}")
    values = {}
    for name in names:
        column = pd.to_numeric(table[name], errors="coerce").to_numpy(dtype=np.float64)
        text = np.isnan(column) & table[name].notna().to_numpy()  # read as NaN only where the file is blank or nan
        if text.any():
            first = np.flatnonzero(text)[0]
            raise ValueError(f"{path}, data row {table.index[first] + 2}: {name} is {table[name].iloc[first]!r}, "
                             f"not a number; {DAMAGED}")
        if np.isinf(column).any():
            raise ValueError(f"{path}: {name} holds an infinite value; {DAMAGED}")
        low, high = metric(name).bounds
        outside = (column < low - RANGE_SLACK) | (column > high + RANGE_SLACK)
        if outside.any():
            first = np.flatnonzero(outside)[0]
            raise ValueError(f"{path}, data row {table.index[first] + 2}, column {name}: {float(column[first])!r} lies "
                             f"outside its range [{low:g}, {high:g}]; {DAMAGED}")
        values[name] = torch.tensor(column)
    return CheckedPairs(torch.from_numpy(image), torch.from_numpy(cls), values)


def check_statistics(pairs: CheckedPairs, num_classes: int, weights: Tensor) -> dict[str, Tensor]:
    """Per metric, float64 [R + 1, C]: each class's mean over its defined pairs, every pair weighted
    by its image's multiplicity in the replicate (row 0: all ones, the estimate of ``metrics.json``)."""
    drawn = weights[:, pairs.image]  # [R + 1, P]
    out = {}
    for name, value in pairs.values.items():
        defined = ~value.isnan()
        sums = drawn.new_zeros(len(weights), num_classes).index_add_(1, pairs.cls, drawn * value.nan_to_num(0.0))
        counts = drawn.new_zeros(len(weights), num_classes).index_add_(1, pairs.cls, drawn * defined)
        out[name] = sums / counts  # 0 / 0: no defined pair of the class in the replicate -> NaN
    return out


def same_images(a: CheckedPairs, b: CheckedPairs) -> bool:
    """Whether two runs' checks scored the same images (so that a paired difference means one thing)."""
    return torch.equal(torch.unique(a.image), torch.unique(b.image))
