"""Golden numbers of cheXlocalize's human benchmark from their own scripts, for tests/test_chexlocalize_hb.py.

    python tools/chexlocalize_hb_golden.py --chexlocalize-repo /path/to/cheXlocalize \\
        --out tests/golden/chexlocalize_hb.json

`write_release` writes a release-format CheXlocalize test split (ten tiny CXRs of different
sizes; the test writes the same files with it): ``CheXpert/test/...jpg`` and
``CheXpert/test_labels.csv``, ``CheXlocalize/gt_segmentations_test.json``,
``hb_segmentations_test.json`` and ``hb_salient_pt_test.json``, and a model's outputs beside them:
``model/segmentations_test.json`` (its segmentations, for their IoU) and ``model/maps/`` (its
heat maps as their pickles, ``<cxr_id>_<task>_map.pkl``, for their hit). The cases: a task whose
ground truth is empty on every CXR (its means NaN), a CXR whose ground truth is empty for every
task, a CXR the human benchmark left out of both files, human-benchmark masks where the ground
truth is empty and empty ones where it is not, tasks with a segmentation but no point (a key
absent, or an empty list), points with fractional coordinates just inside a mask's edge, several
points of which one hits.

Then their scripts run as a user runs them (subprocesses in the clone, ``--seed 0``):
``eval.py`` with ``--metric iou`` and ``--metric hitmiss`` on the human benchmark
(``--if_human_benchmark True``) and on the model, and ``calculate_percentage_decrease.py`` for
``miou`` and ``hitrate``; and the pipeline from the model's heat maps, as a user runs it on saved
maps: ``heatmap_to_segmentation.py`` (their default, Otsu's threshold) on ``model/maps/``,
``eval.py --metric iou`` on its segmentations and ``calculate_percentage_decrease.py --metric miou``
(``maps_iou``, ``maps_miou_pct_decrease``: what XBench's report computes from a saved-map run with
``native_protocol``). The golden file keeps their per-CXR tables and summaries whole, their
percentage-decrease tables whole, and of each 1,000-replicate bootstrap table the first rows, the
per-task sums and NaN counts.

Their code needs pandas, pycocotools, torch, tqdm, scipy and statsmodels (``utils`` imports it):
XBench's environment with ``pip install --no-deps --target /tmp/chexlocalize_deps statsmodels
patsy`` and that folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from pycocotools import mask as coco_mask

#: Their ``LOCALIZATION_TASKS`` (eval_constants.py), in their order; the CSV calls the fourth "Lung Opacity".
TASKS = ("Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity", "Edema", "Consolidation",
         "Atelectasis", "Pneumothorax", "Pleural Effusion", "Support Devices")
CSV_TASKS = ("Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion", "Edema", "Consolidation",
             "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Pleural Other", "Fracture",
             "Support Devices")
#: (height, width) of each CXR, in id order.
SIZES = ((18, 26), (24, 20), (20, 20), (16, 30), (22, 18), (26, 24), (19, 21), (21, 27), (17, 23), (25, 19))
CXR_IDS = tuple(f"patient{64601 + i}_study1_view1_frontal" for i in range(len(SIZES)))
EMPTY_TASK = "Lung Lesion"  # no ground truth on any CXR
EMPTY_CXR = CXR_IDS[9]  # no ground truth for any task
ABSENT_CXR = CXR_IDS[6]  # in neither human-benchmark file
HEAD_ROWS = 5


def encode(mask: np.ndarray) -> dict:
    """pycocotools' compressed RLE as the release stores it (counts as str)."""
    rle = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def blob(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A random rectangle or disc inside the image."""
    mask = np.zeros((height, width), bool)
    top, left = int(rng.integers(0, height - 4)), int(rng.integers(0, width - 4))
    rows, columns = int(rng.integers(3, height - top + 1)), int(rng.integers(3, width - left + 1))
    if rng.random() < 0.5:
        mask[top : top + rows, left : left + columns] = True
    else:
        yy, xx = np.mgrid[:height, :width]
        mask = (yy - top - rows / 2) ** 2 + (xx - left - columns / 2) ** 2 <= (min(rows, columns) / 2) ** 2
    return mask


def shifted(rng: np.random.Generator, mask: np.ndarray) -> np.ndarray:
    """The mask moved by up to three pixels and grown or shrunk by one: another reader's drawing of it."""
    moved = np.roll(mask, (int(rng.integers(-3, 4)), int(rng.integers(-3, 4))), axis=(0, 1))
    if rng.random() < 0.5:
        moved = moved | np.roll(moved, 1, axis=0)
    elif moved.sum() > 6:
        moved = moved & np.roll(moved, 1, axis=1)
    return moved


def edge_point(mask: np.ndarray) -> list[float]:
    """(x, y) 0.9 past the left edge of the mask's last column: inside by their ``int``, outside by rounding."""
    rows, columns = np.nonzero(mask)
    column = int(columns.max())
    row = int(rows[columns == column][0])
    return [column + 0.9, row + 0.25]


def write_release(root: Path) -> dict[tuple[str, str], np.ndarray]:
    """The release-format files under ``root`` (see the module docstring); the model's raw maps by
    (cxr_id, task), as written to its pickles."""
    rng = np.random.default_rng(49)
    gt, hb, points, model, maps = {}, {}, {}, {}, {}
    for cxr_id, (height, width) in zip(CXR_IDS, SIZES):
        gt[cxr_id], hb[cxr_id], points[cxr_id], model[cxr_id] = {}, {}, {}, {}
        for t, task in enumerate(TASKS):
            truth = blob(rng, height, width) if rng.random() < 0.75 else np.zeros((height, width), bool)
            if task == EMPTY_TASK or cxr_id == EMPTY_CXR:
                truth = np.zeros((height, width), bool)
            if truth.any():
                human = shifted(rng, truth) if rng.random() < 0.9 else np.zeros_like(truth)
            else:
                human = blob(rng, height, width) if rng.random() < 0.3 else np.zeros_like(truth)
            gt[cxr_id][task], hb[cxr_id][task] = encode(truth), encode(human)
            marked = rng.random()
            if human.any() and marked < 0.7:
                rows, columns = np.nonzero(human)
                picks = rng.integers(0, len(rows), size=int(rng.integers(1, 3)))
                points[cxr_id][task] = [[float(columns[i]) + 0.5, float(rows[i]) + 0.5] for i in picks]
                if truth.any() and marked < 0.15:
                    points[cxr_id][task].append(edge_point(truth))
            elif human.any() and marked < 0.85:
                points[cxr_id][task] = []  # the key with no point: a miss where the ground truth is drawn
            predicted = shifted(rng, truth) if truth.any() and rng.random() < 0.7 else (
                blob(rng, height, width) if rng.random() < 0.3 else np.zeros((height, width), bool))
            model[cxr_id][task] = encode(predicted)
            maps[cxr_id, task] = rng.random((int(rng.integers(3, 7)), int(rng.integers(3, 7)))).astype(np.float32)
    for cxr_id, task in ((CXR_IDS[0], "Cardiomegaly"), (CXR_IDS[2], "Edema")):  # a drawn ground truth, no HB point
        points[cxr_id].pop(task, None)
    del hb[ABSENT_CXR], points[ABSENT_CXR]
    points = {cxr_id: found for cxr_id, found in points.items() if found}

    images = root / "CheXpert" / "test"
    images.mkdir(parents=True, exist_ok=True)
    with open(root / "CheXpert" / "test_labels.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["Path", *CSV_TASKS])
        for cxr_id, (height, width) in zip(CXR_IDS, SIZES):
            patient, study, view, side = cxr_id.split("_")
            path = images / patient / study / f"{view}_{side}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 256, (height, width), dtype=np.uint8), mode="L").save(path, quality=95)
            drawn = {("Lung Opacity" if task == "Airspace Opacity" else task): coco_mask.area(
                {"size": gt[cxr_id][task]["size"], "counts": gt[cxr_id][task]["counts"].encode()}) > 0
                for task in TASKS}
            writer.writerow([f"test/{patient}/{study}/{view}_{side}.jpg",
                             *(1.0 if drawn.get(task) else 0.0 for task in CSV_TASKS)])
    folder = root / "CheXlocalize"
    folder.mkdir(parents=True, exist_ok=True)
    for name, payload in (("gt_segmentations_test", gt), ("hb_segmentations_test", hb),
                          ("hb_salient_pt_test", points)):
        (folder / f"{name}.json").write_text(json.dumps(payload))
    (root / "model" / "maps").mkdir(parents=True, exist_ok=True)
    (root / "model" / "segmentations_test.json").write_text(json.dumps(model))
    for (cxr_id, task), raw in maps.items():
        height, width = SIZES[CXR_IDS.index(cxr_id)]
        with open(root / "model" / "maps" / f"{cxr_id}_{task}_map.pkl", "wb") as handle:
            pickle.dump({"map": torch.from_numpy(raw)[None, None], "prob": 0.5, "task": task,
                         "cxr_dims": (width, height)}, handle)
    return maps


def _run(repo: Path, script: str, *args: str) -> None:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, script, *args], cwd=repo, env=environment, check=True, capture_output=True)


def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return [{key: _cell(value) for key, value in row.items()} for row in csv.DictReader(handle)]


def _cell(value: str):
    """A number, None for NaN (pandas writes it as an empty cell), or the text."""
    if value == "":
        return None
    try:
        number = float(value)
    except ValueError:
        return value
    return None if math.isnan(number) else number


def _bootstrap_digest(path: Path) -> dict:
    """The first rows of a bootstrap table, and per task its sum (NaN skipped) and NaN count."""
    rows = _read_csv(path)
    tasks = list(rows[0])
    return {
        "replicates": len(rows),
        "head": rows[:HEAD_ROWS],
        "sum": {task: math.fsum(row[task] for row in rows if row[task] is not None) for task in tasks},
        "nan": {task: sum(row[task] is None for row in rows) for task in tasks},
    }


def golden(repo: Path, root: Path) -> dict:
    gt = str(root / "CheXlocalize" / "gt_segmentations_test.json")
    runs = {
        "hb": {"iou": root / "CheXlocalize" / "hb_segmentations_test.json",
               "hitmiss": root / "CheXlocalize" / "hb_salient_pt_test.json"},
        "model": {"iou": root / "model" / "segmentations_test.json", "hitmiss": root / "model" / "maps"},
    }
    out = root / "out"
    _run(repo, "heatmap_to_segmentation.py", "--map_dir", str(root / "model" / "maps"),
         "--output_path", str(root / "model" / "otsu_segmentations_test.json"))
    runs["maps"] = {"iou": root / "model" / "otsu_segmentations_test.json"}
    result: dict = {"made_by": "tools/chexlocalize_hb_golden.py", "chexlocalize_commit": _commit(repo)}
    for who, metrics in runs.items():
        hb = who == "hb"
        for metric, prediction in metrics.items():
            _run(repo, "eval.py", "--metric", metric, "--gt_path", gt, "--pred_path", str(prediction),
                 "--save_dir", str(out / who), "--if_human_benchmark", str(hb), "--seed", "0")
            stem = f"{metric}_{'humanbenchmark_' if hb else ''}"  # eval.py's file names
            result[f"{who}_{metric}"] = {
                "per_cxr": _read_csv(out / who / f"{stem}results_per_cxr.csv"),
                "bootstrap": _bootstrap_digest(out / who / f"{stem}bootstrap_results_per_cxr.csv"),
                "summary": _read_csv(out / who / f"{stem}summary_results.csv"),
            }
    for who, metric, stem in (("model", "miou", "iou"), ("model", "hitrate", "hitmiss"), ("maps", "miou", "iou")):
        save_dir = out / f"{who}_pct"
        save_dir.mkdir(parents=True, exist_ok=True)
        _run(repo, "calculate_percentage_decrease.py", "--metric", metric,
             "--hb_bootstrap_results", str(out / "hb" / f"{stem}_humanbenchmark_bootstrap_results_per_cxr.csv"),
             "--pred_bootstrap_results", str(out / who / f"{stem}_bootstrap_results_per_cxr.csv"),
             "--save_dir", str(save_dir))
        prefix = "" if who == "model" else f"{who}_"
        result[f"{prefix}{metric}_pct_decrease"] = _read_csv(save_dir / f"{metric}_pct_decrease.csv")
    return result


def _commit(repo: Path) -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chexlocalize-repo", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--commit", help="their commit, where the clone is no git checkout")
    parser.add_argument("--keep", type=Path, help="keep the release files and their outputs in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as temporary:
        root = args.keep or Path(temporary)
        root.mkdir(parents=True, exist_ok=True)
        write_release(root)
        result = golden(args.chexlocalize_repo.resolve(), root)
    result["chexlocalize_commit"] = result["chexlocalize_commit"] or args.commit
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
