"""The ``metrics.json`` payload of a run: every number, per class and macro, with the schema
version, the chosen thresholds, counts and edge cases, the resolved config and package versions.

A model computes it at the end of its test epoch (``XBenchModel.results``) from its metrics;
`xbench.results.write` writes it into the results folder, and every reader goes through
`xbench.results.folder.read_results`. The keys: ``docs/results.md``.
"""

from __future__ import annotations

import dataclasses
import math
import platform
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from xbench.metrics.faithfulness import class_means, macro_mean
from xbench.metrics.gaze import DENSITY_FLOOR, KL_EPS, VALUES as GAZE_VALUES
from xbench.metrics.grounding import THRESHOLDS
from xbench.metrics.map_quality import DEFINITIONS, SECTIONS, top_k
from xbench.metrics.names import chosen_keys, run_keys
from xbench.metrics.phrases import phrase_intervals, sentence_recognition
from xbench.results.folder import CHECK_TABLES, SCHEMA
from xbench.results.names import NAMES, names_section

GROUNDING_CURVES = ("dice", "iou", "pooled_dice", "pooled_iou")
GROUNDING_PER_CLASS = run_keys("grounding", "per_class")
GROUNDING_MACRO = run_keys("grounding", "macro")
CLASSIFICATION_PER_CLASS = run_keys("classification", "per_class")
CLASSIFICATION_MACRO = run_keys("classification", "macro")
#: The explanation sections (``xbench.checks``' where a run asked for them, and the map-quality families).
CHECK_SECTIONS = tuple(CHECK_TABLES)
CHOSEN_ON_EVALUATED_SET = (
    "grounding: every '@best' value and its '@best_tau' (the threshold maximising that metric per class); "
    f"classification: {', '.join(chosen_keys('classification'))}"
)
#: The console summary's and summary.md's columns.
PACKAGES = ("xbench", "torch", "lightning", "torchmetrics", "transformers", "open_clip_torch", "timm", "pydicom")



def json_number(value) -> float | int | None:
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
        "macro": {name: json_number(grounding[f"macro/{name}"]) for name in GROUNDING_MACRO},
        "classes_with_pairs": json_number(grounding["classes_with_pairs"]),
        "per_class": {
            key: {name: json_number(grounding[name][c]) for name in GROUNDING_PER_CLASS} for c, key in enumerate(classes)
        },
        "curves": {
            key: {name: [json_number(v) for v in grounding[f"{name}_curve"][c]] for name in GROUNDING_CURVES}
            for c, key in enumerate(classes)
        },
    }


def phrase_section(model, datamodule, queries: dict, evaluated, sentences: dict | None = None) -> dict:
    """``phrase_grounding``: a phrase dataset's (image, query) pairs scored per finding as the model
    grounds a query (its ``query_mode``) and, for a phrase-mode model, by the finding's name, with
    intervals and the paired difference (`xbench.metrics.phrases`); where the dataset denies findings
    (``sentences``: every query's score), the AUROC of stated against denied sentences per finding."""
    classes = list(datamodule.classes)
    name = queries.get("finding_name")
    return {
        "query_mode": model.query_mode,
        # where the pairs were scored: "xbench" (the metric frame) or "hi-ml" (native size, hi-ml's placement)
        "protocol": model.phrase_protocol,
        "phrases": len(datamodule.phrases),
        "by_query": grounding_section(queries["query"], classes),
        "by_finding_name": grounding_section(name, classes) if name is not None else None,
        "intervals": phrase_intervals(queries["query"]["records"], name["records"] if name is not None else None,
                                      datamodule.image_ids(), evaluated, classes, datamodule.name),
        "sentence_recognition": sentence_recognition(sentences, datamodule.image_ids(), evaluated, classes,
                                                     datamodule.name) if sentences is not None else None,
    }


def build_results(*, model, datamodule, grounding, classification, region_counts, config, queries=None,
                  sentences=None) -> dict:
    """The ``metrics.json`` payload of a finished run; ``queries``: a phrase dataset's query metrics
    by view (``query``: as the model grounds a phrase; ``finding_name``: by the finding's name);
    ``sentences``: every query's score where the dataset denies findings (`SentenceScores`)."""
    classes = list(datamodule.classes)
    evaluated = int(classification["records"]["index"].numel())
    return {
        "schema": SCHEMA,
        "model": model.run_name(),
        # which method made the maps: the model's own ("native") or a CAM method on a declared layer
        "explainer": model.explainer_results(),
        "instrument": model.instrument,
        "human": model.human,
        "dataset": datamodule.name,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "classes": classes,
        # how the report, the analysis and W&B show the model, the dataset and each class, whatever
        # module declared them (xbench.results.names)
        NAMES: names_section(model.display(), datamodule.name, classes),
        # how the model saw each image and how its maps reached the frame (the authors' rule, or
        # --model.upsample for a study)
        "preprocess": dataclasses.asdict(model.preprocess) if model.preprocess is not None else None,
        "map_upsample": model.map_upsample,
        "thresholds": [float(t) for t in THRESHOLDS],
        "chosen_on_evaluated_set": CHOSEN_ON_EVALUATED_SET,
        "grounding": grounding_section(grounding, classes),
        "phrase_grounding": phrase_section(model, datamodule, queries, classification["records"]["index"], sentences)
        if queries else None,
        "classification": {
            "calibrated_logits": model.calibrated_logits,
            "macro": {name: json_number(classification[f"macro/{name}"]) for name in CLASSIFICATION_MACRO},
            "hamming_accuracy": json_number(classification["hamming_accuracy"]),
            "single_label_value_classes": json_number(classification["single_label_value_classes"]),
            "per_class": {
                key: {name: json_number(classification[name][c]) for name in CLASSIFICATION_PER_CLASS}
                for c, key in enumerate(classes)
            },
        },
        "data": {
            "images_in_split": len(datamodule.test_set),
            "images_evaluated": evaluated,
            # each sample one radiologist's read (xbench.reads): the analysis resamples radiographs
            "reads": bool(datamodule.reads),
            "image_size": datamodule.image_size,
            "mask_threshold": datamodule.mask_threshold,
            "clipped_shapes": json_number(region_counts["clipped_shapes"]),
            "lost_queries": json_number(region_counts["lost_queries"]),
            "lost_regions": {key: json_number(region_counts["lost_regions"][c]) for c, key in enumerate(classes)},
            "notes": datamodule.notes,
        },
        "config": config if config is not None else _hyperparameters(model, datamodule),
        "versions": _versions(),
    }


#: What the gaze section's values are (docs/gaze.md has the formulas).
GAZE_DEFINITION = (
    "Each (image, class) pair with a gaze target: the normalised frame map against the radiologist's gaze tied "
    "to the class (its density, the fixations behind it), as pysaliency 0.2.22 computes nss, cc, sim, "
    f"kl_divergence (MIT: eps {KL_EPS}), auc_judd (no jitter: ties kept), shuffled_auc (negatives: the split's "
    "other images' fixations) and information_gain (bits per fixation over the centre bias, each map min-max "
    f"normalised plus {DENSITY_FLOOR} and divided by its sum), and etsaliencymaps ncc and shuffled_ncc (ncc with "
    "the gaze less ncc with the centre bias). Per class: the mean over the pairs where a value is defined.")


def gaze_section(gaze, classes: list[str]) -> dict:
    """``metrics.json``'s ``gaze``: the gaze metrics' per-class and macro means, the pairs and the
    values each leaves undefined, and the rule (`GAZE_DEFINITION`)."""
    records = gaze["records"]
    return {
        "applicable": True,
        "baseline": "centre bias: the mean gaze density of the dataset's training readings (gaze_baseline)",
        "density_floor": DENSITY_FLOOR,
        "definition": GAZE_DEFINITION,
        "images": int(torch.unique(records["index"]).numel()),
        "pairs": int(gaze["pairs"].sum()),
        "undefined": {name: int(gaze["pairs"].sum() - gaze["defined"][:, k].sum())
                      for k, name in enumerate(GAZE_VALUES)},
        "macro": {name: json_number(gaze["macro"][name]) for name in GAZE_VALUES},
        "per_class": {key: {"pairs": int(gaze["pairs"][c]),
                            **{name: json_number(gaze["means"][c, k]) for k, name in enumerate(GAZE_VALUES)}}
                      for c, key in enumerate(classes)},
    }


def pair_section(index: Tensor, cls: Tensor, constant: Tensor, values: dict[str, Tensor], classes: list[str]
                 ) -> dict:
    """What every per-pair explanation section holds (the checks', Quantus' families'): the images and
    pairs scored, the constant maps among them, and each value's macro and per-class means over the
    pairs where it is defined."""
    means = {name: class_means(value, cls, len(classes))[0] for name, value in values.items()}
    pairs = torch.bincount(cls, minlength=len(classes))
    return {
        "images": int(torch.unique(index).numel()),
        "pairs": int(cls.numel()),
        "constant_maps": int(constant.sum()),
        "macro": {name: json_number(macro_mean(mean)) for name, mean in means.items()},
        "per_class": {key: {"pairs": int(pairs[c]), "constant_maps": int(constant[cls == c].sum()),
                            **{name: json_number(mean[c]) for name, mean in means.items()}}
                      for c, key in enumerate(classes)},
    }


def map_quality_sections(records: dict[str, Tensor], classes: list[str], frame_pixels: int
                         ) -> dict[str, tuple[dict, dict]]:
    """The families' ``metrics.json`` sections and per-pair records (``<section>.csv.gz``) from the
    grounding metric's records (`GroundingMetrics` with ``map_quality``)."""
    cls, index = records["class"], records["index"]
    constant = records["predicted"][:, -1] == 0  # no top-bin pixel: a constant map
    out = {}
    for section, names in SECTIONS.items():
        if section == "randomisation" and len(classes) < 2:
            out[section] = ({"applicable": False, "reason": "the run has one class: there is no other class's map"},
                            {})
            continue
        values = {name: records[name] for name in names}
        body = {
            "applicable": True,
            **({"top_k": top_k(frame_pixels), "frame_pixels": frame_pixels} if section == "localisation" else {}),
            "undefined": {name: int(value.isnan().sum()) for name, value in values.items()},
            "definition": DEFINITIONS[section],
            **pair_section(index, cls, constant, values, classes),
        }
        out[section] = (body, {"index": index, "class": cls, "constant_map": constant, **values})
    return out


def _hyperparameters(model, datamodule) -> dict:
    """Without the CLI: each module's class path and constructor arguments (``hparams``)."""

    def describe(module) -> dict:
        kind = type(module)
        args = {key: str(value) if isinstance(value, Path) else value for key, value in module.hparams.items()}
        return {"class_path": f"{kind.__module__}.{kind.__qualname__}", "init_args": args}

    return {"model": describe(model), "data": describe(datamodule)}


def log_keys(results: dict) -> dict[str, float]:
    """Flat scalar keys for loggers: ``grounding/pointing_game/macro``, ``.../<class>``, ...; a
    phrase run's views as ``phrase_grounding/by_query/...`` and ``phrase_grounding/by_finding_name/...``;
    the checks' and a gaze run's as ``faithfulness/deletion_auc/macro``, ``sanity/ssim/<class>``,
    ``gaze/nss/macro``, ... and each cascade
    step's as ``sanity/step_<k>/<metric>`` (``pointing_game``, ... of the randomised model)."""
    sections = [("grounding", results["grounding"], GROUNDING_PER_CLASS),
                ("classification", results["classification"], CLASSIFICATION_PER_CLASS)]
    phrases = results.get("phrase_grounding") or {}
    sections += [(f"phrase_grounding/{view}", phrases[view], GROUNDING_PER_CLASS)
                 for view in ("by_query", "by_finding_name") if phrases.get(view) is not None]
    checks = {name: results[name] for name in (*CHECK_SECTIONS, "gaze") if (results.get(name) or {}).get("applicable")}
    sections += [(name, section, run_keys(name, "per_class")) for name, section in checks.items()]
    as_float = lambda value: math.nan if value is None else float(value)  # noqa: E731
    flat: dict[str, float] = {}
    for prefix, section, per_class_names in sections:
        for name, value in section["macro"].items():
            flat[f"{prefix}/{name}/macro"] = as_float(value)
        for key, values in section["per_class"].items():
            for name in per_class_names:
                flat[f"{prefix}/{name}/{key}"] = as_float(values[name])
    for step in checks.get("sanity", {}).get("steps", []):
        for name, value in {**{k: step[k] for k in run_keys("sanity", "macro")}, **step["grounding"]}.items():
            flat[f"sanity/step_{step['step']}/{name}"] = as_float(value)
    return flat
