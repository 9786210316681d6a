"""The results folder of one run: ``<model>__<dataset>__<time>/``.

- ``metrics.json``: every number, per class and macro, with the schema version, the chosen
  thresholds, counts and edge cases, the resolved config and package versions;
- ``per_class.csv``: one row per class, every per-class number;
- ``summary.md``: the table a person reads;
- ``pairs.csv.gz``: one row per (image, class): label and logit; for graded pairs also ``|R|``,
  the Pointing Game hit, the CNR and the 101-point counts ``pred_k = |B_k|``, ``inter_k = |B_k & R|``;
- ``queries.csv.gz`` (a phrase dataset's run): one row per graded (image, query) and view (``query``:
  as the model grounds the phrase; ``finding_name``: by its finding's name), with the phrase and
  the same columns as a graded pair;
- ``config.yaml``: the resolved configuration;
- ``overlays.npz``: for a fixed subset of positive pairs (the same images for every model, see
  ``xbench.reporting.overlays``) the image, the normalised map and the region in the batch geometry.

Every file is written to a temporary name and renamed, inside a folder that is itself renamed
into place at the end: an interrupted run leaves no half file and no half folder.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import math
import os
import platform
import shutil
import tempfile
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml

from xbench.findings import display_name
from xbench.metrics.grounding import THRESHOLDS
from xbench.metrics.names import chosen_keys, metric, run_keys
from xbench.reporting.render import markdown_grid
from xbench.reporting.folder import METRICS, OVERLAYS, PAIRS, QUERIES, SCHEMA, atomic_write, count_columns, follow_umask

GROUNDING_CURVES = ("dice", "iou", "pooled_dice", "pooled_iou")
GROUNDING_PER_CLASS = run_keys("grounding", "per_class")
GROUNDING_MACRO = run_keys("grounding", "macro")
CLASSIFICATION_PER_CLASS = run_keys("classification", "per_class")
CLASSIFICATION_MACRO = run_keys("classification", "macro")
CHOSEN_ON_EVALUATED_SET = (
    "grounding: every '@best' value and its '@best_tau' (the threshold maximising that metric per class); "
    f"classification: {', '.join(chosen_keys('classification'))}"
)
#: The console summary's and summary.md's columns.
SUMMARY_GROUNDING = ("pointing_game", "dice@0.5", "dice@best", "dice@best_tau", "iou@0.5", "iou@best", "iou@best_tau",
                     "cnr")
SUMMARY_RECOGNITION = ("auroc", "auprc", "f1@0.5", "accuracy@0.5", "max_f1")
PACKAGES = ("xbench", "torch", "lightning", "torchmetrics", "transformers", "open_clip_torch", "timm", "pydicom")


def _number(value) -> float | int | None:
    """A JSON-safe scalar: ints stay ints, NaN becomes null."""
    value = value.item() if isinstance(value, torch.Tensor) else value
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    value = float(value)
    return None if math.isnan(value) else value


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def grounding_section(grounding, classes: list[str]) -> dict:
    """A grounding section of ``metrics.json``: macro means, per-class values and curves."""
    return {
        "macro": {name: _number(grounding[f"macro/{name}"]) for name in GROUNDING_MACRO},
        "classes_with_pairs": _number(grounding["classes_with_pairs"]),
        "per_class": {
            key: {name: _number(grounding[name][c]) for name in GROUNDING_PER_CLASS} for c, key in enumerate(classes)
        },
        "curves": {
            key: {name: [_number(v) for v in grounding[f"{name}_curve"][c]] for name in GROUNDING_CURVES}
            for c, key in enumerate(classes)
        },
    }


def phrase_section(model, datamodule, queries: dict, evaluated) -> dict:
    """``phrase_grounding``: a phrase dataset's (image, query) pairs scored per finding as the model
    grounds a query (its ``query_mode``) and, for a phrase-mode model, by the finding's name, with
    intervals and the paired difference (:mod:`xbench.analysis.phrases`)."""
    from xbench.analysis.phrases import phrase_intervals  # the analysis stack loads only for phrase runs

    classes = list(datamodule.classes)
    name = queries.get("finding_name")
    return {
        "query_mode": model.query_mode,
        "phrases": len(datamodule.phrases),
        "by_query": grounding_section(queries["query"], classes),
        "by_finding_name": grounding_section(name, classes) if name is not None else None,
        "intervals": phrase_intervals(queries["query"]["records"], name["records"] if name is not None else None,
                                      datamodule.image_ids(), evaluated, classes, datamodule.name),
    }


def build_results(*, model, datamodule, grounding, classification, region_counts, config, queries=None) -> dict:
    """The ``metrics.json`` payload of a finished run; ``queries``: a phrase dataset's query metrics
    by view (``query``: as the model grounds a phrase; ``finding_name``: by the finding's name)."""
    classes = list(datamodule.classes)
    evaluated = int(classification["records"]["index"].numel())
    return {
        "schema": SCHEMA,
        "model": model.model_name(),
        "instrument": model.instrument,
        "dataset": datamodule.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "classes": classes,
        # how the model saw each image and how its maps reached the frame (the authors' rule, or
        # --model.upsample for a study)
        "preprocess": dataclasses.asdict(model.preprocess) if model.preprocess is not None else None,
        "map_upsample": model.map_upsample,
        "thresholds": [float(t) for t in THRESHOLDS],
        "chosen_on_evaluated_set": CHOSEN_ON_EVALUATED_SET,
        "grounding": grounding_section(grounding, classes),
        "phrase_grounding": phrase_section(model, datamodule, queries, classification["records"]["index"])
        if queries else None,
        "classification": {
            "calibrated_logits": model.calibrated_logits,
            "macro": {name: _number(classification[f"macro/{name}"]) for name in CLASSIFICATION_MACRO},
            "hamming_accuracy": _number(classification["hamming_accuracy"]),
            "single_label_value_classes": _number(classification["single_label_value_classes"]),
            "per_class": {
                key: {name: _number(classification[name][c]) for name in CLASSIFICATION_PER_CLASS}
                for c, key in enumerate(classes)
            },
        },
        "data": {
            "images_in_split": len(datamodule.test_set),
            "images_evaluated": evaluated,
            "image_size": datamodule.image_size,
            "mask_threshold": datamodule.mask_threshold,
            "clipped_shapes": _number(region_counts["clipped_shapes"]),
            "lost_queries": _number(region_counts["lost_queries"]),
            "lost_regions": {key: _number(region_counts["lost_regions"][c]) for c, key in enumerate(classes)},
            "notes": datamodule.notes,
        },
        "config": config if config is not None else _hyperparameters(model, datamodule),
        "versions": _versions(),
    }


def _hyperparameters(model, datamodule) -> dict:
    """Without the CLI: each module's class path and constructor arguments (``hparams``)."""

    def describe(module) -> dict:
        kind = type(module)
        args = {key: str(value) if isinstance(value, Path) else value for key, value in module.hparams.items()}
        return {"class_path": f"{kind.__module__}.{kind.__qualname__}", "init_args": args}

    return {"model": describe(model), "data": describe(datamodule)}


def log_keys(results: dict) -> dict[str, float]:
    """Flat scalar keys for loggers: ``grounding/pointing_game/macro``, ``.../<class>``, ...; a
    phrase run's views as ``phrase_grounding/by_query/...`` and ``phrase_grounding/by_finding_name/...``."""
    sections = [("grounding", results["grounding"], GROUNDING_PER_CLASS),
                ("classification", results["classification"], CLASSIFICATION_PER_CLASS)]
    phrases = results.get("phrase_grounding") or {}
    sections += [(f"phrase_grounding/{view}", phrases[view], GROUNDING_PER_CLASS)
                 for view in ("by_query", "by_finding_name") if phrases.get(view) is not None]
    flat: dict[str, float] = {}
    for prefix, section, per_class_names in sections:
        for name, value in section["macro"].items():
            flat[f"{prefix}/{name}/macro"] = math.nan if value is None else float(value)
        for key, values in section["per_class"].items():
            for name in per_class_names:
                value = values[name]
                flat[f"{prefix}/{name}/{key}"] = math.nan if value is None else float(value)
    return flat


# -- tables -----------------------------------------------------------------------------------

def _text(key: str, value) -> str:
    """A value as the summary prints it: percent with one decimal, a threshold with two, a count."""
    if value is None:
        return "–"
    unit = metric(key).unit
    return f"{100 * value:.1f}" if unit == "percent" else f"{value:.2f}" if unit in ("threshold", "ratio") else str(value)


def _summary_table(results: dict, section: dict, counts: tuple[str, ...], shown: tuple[str, ...],
                   summed: bool) -> list[list[str]]:
    """One row per class (display name, counts, values), then the macro mean (counts summed or blank)."""
    per_class, macro = section["per_class"], section["macro"]
    rows = [[display_name(key), *(_text(n, per_class[key][n]) for n in counts + shown)] for key in results["classes"]]
    totals = [_text(n, sum(v[n] for v in per_class.values())) if summed else "" for n in counts]
    return rows + [["Macro mean", *totals, *(_text(n, macro[n]) if n in macro else "" for n in shown)]]


def summary_tables(results: dict) -> list[tuple[str, tuple[str, ...], list[list[str]]]]:
    """The run's tables (grounding, recognition; a phrase dataset's query grounding) as (title,
    headers, rows); last row = macro mean."""
    shown = [("Grounding (percent; CNR a ratio)", results["grounding"], ("pairs",), SUMMARY_GROUNDING, True),
             ("Recognition (percent)", results["classification"], ("positives", "negatives"), SUMMARY_RECOGNITION,
              False)]
    phrases = results.get("phrase_grounding")
    if phrases:
        how = "the report phrase" if phrases["query_mode"] == "phrase" else "the finding's map (fixed vocabulary)"
        shown.append((f"Phrase grounding, each query grounded by {how} (percent; CNR a ratio)",
                      phrases["by_query"], ("pairs",), SUMMARY_GROUNDING, True))
        if phrases["by_finding_name"] is not None:
            shown.append(("Phrase grounding, the same queries grounded by the finding's name (percent; CNR a ratio)",
                          phrases["by_finding_name"], ("pairs",), SUMMARY_GROUNDING, True))
    tables = []
    for title, section, counts, columns, summed in shown:
        headers = ("Finding", *(metric(n).short for n in counts + columns))
        tables.append((title, headers, _summary_table(results, section, counts, columns, summed)))
    return tables


def summary_footnotes(results: dict) -> list[str]:
    g, d = results["grounding"], results["data"]
    calibration = (
        []
        if results["classification"]["calibrated_logits"]
        else [
            f"{results['model']}'s scores are not calibrated probabilities: F1 and accuracy at p ≥ 0.5 apply an "
            "arbitrary cut for it; AUROC, AUPRC and max-F1 depend only on the ranking."
        ]
    )
    edge = {name: sum(v[name] for v in g["per_class"].values()) for name in ("constant_maps", "tied_maxima", "empty_masks")}
    notes = [
        "PG = Pointing Game: a hit when a pixel at the map's maximum lies in the region (ties count if any tied "
        "pixel is inside; a constant map is a miss). Dice/IoU: per-image means over graded (image, class) pairs.",
        "* chosen on the evaluated set itself (the paper's protocol): 'best' is the threshold τ that maximises "
        "the metric for that class, max-F1 the best probability threshold. Compare with τ = 0.5 and p ≥ 0.5.",
        f"Images evaluated: {d['images_evaluated']} of {d['images_in_split']}. Edge cases: "
        f"{edge['constant_maps']} constant maps, {edge['tied_maxima']} maps with tied maxima, "
        f"{edge['empty_masks']} pairs with an empty mask (left out); {d['clipped_shapes']} shapes clipped at the "
        f"image border; {sum(d['lost_regions'].values())} annotated regions empty in the frame (left out).",
        "CNR: contrast-to-noise ratio, |mean inside − mean outside| / √(var inside + var outside) of the normalised "
        "map, averaged over the pairs where it is defined (a constant map scores 0; a region covering the frame, or a "
        "map exactly constant inside and outside, has none).",
        *calibration,
        *_phrase_notes(results.get("phrase_grounding")),
    ]
    return notes


def _phrase_notes(phrases: dict | None) -> list[str]:
    """The phrase-vs-name paired differences (macro means with their intervals), when there are any."""
    if not phrases:
        return []
    intervals = phrases["intervals"]
    if "phrase_minus_name" not in intervals:
        return [f"Queries are grounded by their finding's map (query_mode {phrases['query_mode']}): the model has "
                "a fixed vocabulary or no text side, so its phrase and finding-name results are one and the same."]
    level = round(100 * intervals["confidence"])

    def difference(key: str) -> str:
        value = intervals["phrase_minus_name"][key]["macro"]
        if value["estimate"] is None:
            return f"{metric(key).short} –"
        scale = 100 if metric(key).unit == "percent" else 1
        return (f"{metric(key).short} {scale * value['estimate']:+.2f} "
                f"[{scale * value['lower']:+.2f}, {scale * value['upper']:+.2f}]")

    shown = ", ".join(difference(key) for key in intervals["phrase_minus_name"])
    return [f"Report phrase minus finding name, macro mean over findings, paired over the same queries "
            f"({level} % bootstrap interval over images, {intervals['replicates']} replicates): {shown}."]


def summary_markdown(results: dict) -> str:
    lines = [
        f"# {results['model']} on {results['dataset']}",
        "",
        f"Run {results['created']}, XBench {results['versions']['xbench']}, schema `{results['schema']}`.",
    ]
    for title, headers, rows in summary_tables(results):
        lines += ["", f"## {title}", "", *markdown_grid(list(headers), rows)]
    lines += [""] + [f"{note}  " for note in summary_footnotes(results)]
    return "\n".join(lines) + "\n"


# -- writing ----------------------------------------------------------------------------------


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


def check_writable(results_dir: Path) -> None:
    """Fail before a run, not after it: ``results_dir`` must be a folder XBench can write in."""
    try:
        Path(results_dir).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=results_dir).close()
    except OSError as error:
        raise ValueError(
            f"--model.results_dir {results_dir} is not a folder XBench can write in ({error.strerror or error}); "
            "choose another one"
        ) from None


def write_results(
    results_dir: Path, results: dict, grounding_records: dict, classification_records: dict, datamodule,
    overlays: dict[str, np.ndarray] | None = None, query_records: dict[str, dict] | None = None,
) -> Path:
    """Write the run's folder under ``results_dir`` and return its path."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    results_dir.mkdir(parents=True, exist_ok=True)
    name = f"{results['model']}__{results['dataset']}__{stamp}"
    staging = Path(tempfile.mkdtemp(dir=results_dir, prefix=f".{name}."))
    try:
        follow_umask(staging, folder=True)
        atomic_write(staging / METRICS, lambda p: p.write_text(json.dumps(results, indent=1, allow_nan=False)))
        per_class = pd.DataFrame([
            {"class": key, "display": display_name(key),
             **{f"grounding/{k}": v for k, v in results["grounding"]["per_class"][key].items()},
             **{f"classification/{k}": v for k, v in results["classification"]["per_class"][key].items()}}
            for key in results["classes"]
        ])
        atomic_write(staging / "per_class.csv", lambda p: per_class.to_csv(p, index=False))
        atomic_write(staging / "summary.md", lambda p: p.write_text(summary_markdown(results)))
        image_ids = datamodule.image_ids()
        atomic_write(staging / PAIRS,
                     lambda p: write_pairs(p, results, grounding_records, classification_records, image_ids))
        atomic_write(staging / "config.yaml", lambda p: p.write_text(yaml.safe_dump(results["config"], sort_keys=False)))
        if overlays is not None:
            atomic_write(staging / OVERLAYS, lambda p: _write_overlays(p, overlays))
        if query_records:
            table = query_table(results, query_records, datamodule)
            atomic_write(staging / QUERIES, lambda p: table.to_csv(p, index=False, compression="gzip"))
        final = claim_folder(staging, results_dir, name)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return final
