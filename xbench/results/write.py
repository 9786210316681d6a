"""Writing a run's results folder: ``<model>__<dataset>__<time>/`` (`folder_name`).

- ``metrics.json``: the payload (`xbench.results.payload`);
- ``per_class.csv``: one row per class, every per-class number;
- ``summary.md``: the tables a person reads (rendered by the caller, `xbench.reporting.summary`);
- ``pairs.csv.gz``: one row per (image, class): label and logit; for graded pairs also ``|R|``,
  the Pointing Game hit, the CNR and the 101-point counts ``pred_k = |B_k|``, ``inter_k = |B_k & R|``;
- ``queries.csv.gz`` (a phrase dataset's run): one row per graded (image, query) and view (``query``:
  as the model grounds the phrase; ``finding_name``: by its finding's name), with the phrase and
  the same columns as a graded pair;
- ``faithfulness.csv.gz``, ``sanity.csv.gz`` (runs with those checks, ``xbench.checks``): one row
  per scored (image, class) pair -- and cascade step -- with its values; a curve's points as
  ``<name>_000``, ``<name>_001``, ...; ``sanity_maps.npz``: one pair's radiograph, region and map
  at every cascade step (the report's strip of maps);
- ``gaze.csv.gz`` (a gaze dataset's run): one row per (image, class) pair with a gaze target: its
  fixations and every gaze metric (``xbench.metrics.gaze``), empty where undefined;
- ``chexlocalize_pairs.csv.gz`` (runs scored by cheXlocalize's protocol at native size: saved maps
  with ``native_protocol``, the human run on its human benchmark): one row per scored (image,
  class) pair with ``xbench.metrics.native.CHEXLOCALIZE_COLUMNS``;
- ``config.yaml``: the resolved configuration;
- ``overlays.npz``: for a fixed subset of positive pairs (the same images for every model, see
  ``xbench.reporting.overlays``) the image, the normalised map and the region in the batch geometry;
- ``manifest.json``, written last: every other file with its byte size and SHA-256, which every
  reader checks the folder against (`xbench.results.folder.verify_folder`).

Every file is written to a temporary name and renamed, inside a folder that is itself renamed
into place at the end: an interrupted run leaves no half file and no half folder.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from xbench.files import WriteFailed, atomic_write, check_writable_folder, staging_folder
from xbench.results.folder import (
    CHECK_TABLES, CHEXLOCALIZE_PAIRS, CONFIG, GAZE, MANIFEST, METRICS, OVERLAYS, PAIRS, PER_CLASS, QUERIES,
    SANITY_MAPS, SUMMARY, count_columns, folder_name, manifest_of,
)
from xbench.results.names import finding_display


#: Images per chunk of ``pairs.csv.gz``: the table is built and written this many images at a time,
#: so its memory stays bounded (about 1000 x C rows) whatever the dataset's size.
PAIR_CHUNK_IMAGES = 1000


def pair_table(results: dict, grounding_records: dict, classification_records: dict, image_ids: list[str],
               images: slice = slice(None)) -> pd.DataFrame:
    """One row per (image, class) evaluated, for the ``images`` rows of the classification records;
    grounding columns empty for pairs not graded."""
    classes = results["classes"]
    index = classification_records["index"][images].cpu().numpy()
    num_classes = len(classes)
    rows = pd.DataFrame({
        "image_index": np.repeat(index, num_classes),
        "image_id": np.repeat(np.asarray(image_ids, dtype=object)[index], num_classes),
        "class": np.tile(np.asarray(classes, dtype=object), len(index)),
        "label": classification_records["labels"][images].cpu().numpy().reshape(-1),
        "logit": classification_records["logits"][images].cpu().numpy().reshape(-1),
    })
    graded_index = grounding_records["index"].cpu().numpy()
    chosen = np.flatnonzero(np.isin(graded_index, index))
    pick = lambda name: grounding_records[name].cpu().numpy()[chosen]  # noqa: E731
    counts = {
        "image_index": graded_index[chosen],
        "class": np.asarray(classes, dtype=object)[pick("class")],
        "graded": True,
        "region_px": pick("region"),
        "hit": pick("hit"),
        "cnr": pick("cnr"),
    }
    predicted, inter = pick("predicted"), pick("inter")
    predicted_names, inter_names = count_columns(predicted.shape[1])
    counts.update(zip(predicted_names, predicted.T))
    counts.update(zip(inter_names, inter.T))
    graded = pd.DataFrame(counts)
    table = rows.merge(graded, on=["image_index", "class"], how="left", validate="one_to_one")
    table["graded"] = table["graded"].eq(True)
    integers = ["region_px", "hit", *predicted_names, *inter_names]
    table[integers] = table[integers].astype("Int64")
    return table


def write_pairs(path: Path, results: dict, grounding_records: dict, classification_records: dict,
                image_ids: list[str], chunk_images: int = PAIR_CHUNK_IMAGES) -> None:
    """``pairs.csv.gz``: the pair table written ``chunk_images`` images at a time into one gzip stream."""
    grounding_records = {name: values.cpu() for name, values in grounding_records.items()}
    classification_records = {name: values.cpu() for name, values in classification_records.items()}
    num_images = len(classification_records["index"])
    with gzip.open(path, "wt", encoding="utf-8", newline="") as handle:
        for start in range(0, max(num_images, 1), chunk_images):
            images = slice(start, start + chunk_images)
            table = pair_table(results, grounding_records, classification_records, image_ids, images)
            table.to_csv(handle, index=False, header=start == 0)


def query_table(results: dict, query_records: dict[str, dict], datamodule) -> pd.DataFrame:
    """One row per graded (image, query) and view: the phrase, its finding and the pair's columns."""
    classes, samples = results["classes"], datamodule.samples
    tables = []
    for view, records in query_records.items():
        records = {name: value.cpu().numpy() for name, value in records.items()}
        index, slot = records["index"], records["slot"]
        phrases = [[q.text for q in samples[i].queries if q.finding in classes][k] for i, k in zip(index, slot)]
        predicted_names, inter_names = count_columns(records["predicted"].shape[1])
        tables.append(pd.DataFrame({
            "image_index": index,
            "image_id": np.asarray(datamodule.image_ids(), dtype=object)[index],
            "query": slot,
            "finding": np.asarray(classes, dtype=object)[records["class"]],
            "phrase": phrases,
            "view": view,
            "region_px": records["region"],
            "hit": records["hit"],
            "cnr": records["cnr"],
            **dict(zip(predicted_names, records["predicted"].T)),
            **dict(zip(inter_names, records["inter"].T)),
        }))
    return pd.concat(tables, ignore_index=True)


def check_table(records: dict, classes: list[str], image_ids: list[str]) -> pd.DataFrame:
    """A check's per-pair records (``index``, ``class``, then values [P] or curves [P, K]) as a table:
    ``image_index``, ``image_id``, ``class``, each value as a column, a curve as ``<name>_000``, ...
    (its ``arrays``, if any, go to their own file)."""
    index = records["index"].cpu().numpy()
    columns = {"image_index": index, "image_id": np.asarray(image_ids, dtype=object)[index],
               "class": np.asarray(classes, dtype=object)[records["class"].cpu().numpy()]}
    for name, values in records.items():
        if name in ("index", "class", "arrays"):
            continue
        values = values.cpu().numpy()
        if values.ndim == 1:
            columns[name] = values
        else:
            columns.update({f"{name}_{k:03d}": values[:, k] for k in range(values.shape[1])})
    return pd.DataFrame(columns)


def _write_overlays(path: Path, overlays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as handle:
        np.savez_compressed(handle, **overlays)


def claim_folder(staging: Path, results_dir: Path, name: str) -> Path:
    """Rename the finished ``staging`` folder to ``name`` or, when a run that finished in the same
    second holds it, ``name-1``, ``name-2``, ...: the rename itself is the claim (it fails on a
    folder with contents), so two runs never share a name and no run replaces another's folder."""
    for suffix in range(1000):
        final = results_dir / (name if suffix == 0 else f"{name}-{suffix}")
        if final.exists():
            continue
        try:
            os.rename(staging, final)
            return final
        except OSError:
            if not final.exists():
                raise
    raise RuntimeError(f"{results_dir}: 1000 results folders named {name}[-N]; clear some out")


def check_writable(results_dir: Path, option: str) -> None:
    """Fail before a run, not after it: ``results_dir`` (given as ``option``) must be a folder XBench
    can write in (`check_writable_folder`)."""
    check_writable_folder(results_dir, option, f"give {option} a folder you can write in")


def write_results(results_dir: Path, results: dict, records: dict, datamodule, summary: str,
                  overlays: dict[str, np.ndarray] | None = None) -> Path:
    """Write the run's folder under ``results_dir`` and return its path. ``records``: the metrics'
    per-pair records (``grounding``, ``classification``, a phrase run's ``queries`` by view and a gaze
    run's ``gaze``, as ``XBenchModel.records`` holds them); ``summary``: the text of ``summary.md``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    name = folder_name(results["model"], results["dataset"], stamp)
    staging = staging_folder(results_dir, name)
    try:
        atomic_write(staging / METRICS, lambda p: p.write_text(json.dumps(results, indent=1, allow_nan=False)))
        per_class = pd.DataFrame([
            {"class": key, "display": finding_display(results, key),
             **{f"grounding/{k}": v for k, v in results["grounding"]["per_class"][key].items()},
             **{f"classification/{k}": v for k, v in results["classification"]["per_class"][key].items()}}
            for key in results["classes"]
        ])
        atomic_write(staging / PER_CLASS, lambda p: per_class.to_csv(p, index=False))
        atomic_write(staging / SUMMARY, lambda p: p.write_text(summary))
        image_ids = datamodule.image_ids()
        atomic_write(staging / PAIRS, lambda p: write_pairs(p, results, records["grounding"], records["classification"],
                                                            image_ids))
        atomic_write(staging / CONFIG, lambda p: p.write_text(yaml.safe_dump(results["config"], sort_keys=False)))
        if overlays is not None:
            atomic_write(staging / OVERLAYS, lambda p: _write_overlays(p, overlays))
        if records.get("queries"):
            table = query_table(results, records["queries"], datamodule)
            atomic_write(staging / QUERIES, lambda p: table.to_csv(p, index=False, compression="gzip"))
        for section, file in CHECK_TABLES.items():
            if records.get(section):
                checked = check_table(records[section], results["classes"], image_ids)
                atomic_write(staging / file, lambda p, t=checked: t.to_csv(p, index=False, compression="gzip"))
        if records.get("gaze") is not None:
            gaze = check_table(records["gaze"], results["classes"], image_ids)
            atomic_write(staging / GAZE, lambda p: gaze.to_csv(p, index=False, compression="gzip"))
        if records.get("chexlocalize") is not None:
            native = check_table(records["chexlocalize"], results["classes"], image_ids)
            atomic_write(staging / CHEXLOCALIZE_PAIRS, lambda p: native.to_csv(p, index=False, compression="gzip"))
        if (records.get("sanity") or {}).get("arrays"):
            atomic_write(staging / SANITY_MAPS, lambda p: _write_overlays(p, records["sanity"]["arrays"]))
        manifest = manifest_of(staging)  # last: it lists every file above, as written
        atomic_write(staging / MANIFEST, lambda p: p.write_text(json.dumps(manifest, indent=1)))
        final = claim_folder(staging, results_dir, name)
    except WriteFailed as error:  # named as the user will look for it, not by the staging folder's name
        shutil.rmtree(staging, ignore_errors=True)
        raise WriteFailed(error, f"{Path(error.target).name} into the results folder {results_dir / name}",
                          "free space or lift the limit and run again (no part of the folder was kept)") from error
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final
