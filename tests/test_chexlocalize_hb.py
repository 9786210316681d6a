"""cheXlocalize's human benchmark: XBench's values equal what their eval.py and
calculate_percentage_decrease.py computed on the same release-format files
(tests/golden/chexlocalize_hb.json, made by tools/chexlocalize_hb_golden.py, which also writes the files).
"""

import gzip
import importlib.util
import json
import math
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from pycocotools import mask as coco_mask

from conftest import only_folder, run_args
from xbench.data.chexlocalize import CheXlocalize
from xbench.data.transforms import resize_mask
from xbench.findings import finding_key
from xbench.metrics.bootstrap import random_stream, resample_weights
from xbench.metrics.human_benchmark import (AVERAGE, ScoreTable, bootstrap_means, chexlocalize_resamples,
                                            eval_summary, hb_hit, hb_iou, paired_gap, percentage_decrease)
from xbench.metrics.native import native_upsample, true_positive_iou
from xbench.test import main

REPO = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((REPO / "tests" / "golden" / "chexlocalize_hb.json").read_text())


def _tool():
    spec = importlib.util.spec_from_file_location("chexlocalize_hb_golden", REPO / "tools" / "chexlocalize_hb_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TOOL = _tool()
TASKS = TOOL.TASKS  # their LOCALIZATION_TASKS order, the columns of their bootstrap tables
SIZES = dict(zip(TOOL.CXR_IDS, TOOL.SIZES))


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    root = tmp_path_factory.mktemp("chexlocalize_hb")
    maps = TOOL.write_release(root)
    return root, maps


@pytest.fixture(scope="module")
def tables(release):
    """XBench's per-(CXR, task) tables, by task spelled as theirs: the human benchmark from the
    datamodule's reader set, the model from its files, each against the datamodule's ground truth."""
    root, maps = release
    datamodule = CheXlocalize(str(root), split="test", human_benchmark=True, cache=False)
    readers = datamodule.reader_set()
    model_json = json.loads((root / "model" / "segmentations_test.json").read_text())
    scores = {"hb_iou": {}, "hb_hitmiss": {}, "model_iou": {}, "model_hitmiss": {}}
    for sample in datamodule.samples:
        height, width = SIZES[sample.image_id]
        for task in TASKS:
            key = finding_key("chexlocalize", task)
            region = sample.regions.get(key)
            truth = region.to_mask(height, width)[0] if region is not None else None
            mark = readers.marks[sample.image_id].get(key)
            drawn = mark.region.to_mask(height, width)[0] if mark is not None and mark.region is not None else None
            pair = (sample.image_id, task)
            scores["hb_iou"][pair] = hb_iou(drawn, truth)
            scores["hb_hitmiss"][pair] = hb_hit(mark.points if mark is not None else (), truth)
            rle = model_json[sample.image_id][task]
            predicted = coco_mask.decode({"size": rle["size"], "counts": rle["counts"].encode()}).astype(bool)
            empty = np.zeros((height, width), bool)
            scores["model_iou"][pair] = true_positive_iou(torch.from_numpy(predicted),
                                                          torch.from_numpy(truth if truth is not None else empty))
            upsampled = native_upsample(torch.from_numpy(maps[pair]), (height, width))
            row, column = divmod(int(torch.argmax(upsampled)), width)  # their np.argmax: the first maximum
            scores["model_hitmiss"][pair] = float(truth[row, column]) if truth is not None else math.nan
    return {name: ScoreTable.from_pairs(values, SIZES, TASKS) for name, values in scores.items()}


def _same(ours: float, theirs, tolerance: float = 0.0) -> bool:
    """Equal, NaN (theirs: None, an empty CSV cell) where theirs is, within ``tolerance`` relative."""
    if theirs is None:
        return math.isnan(ours)
    if math.isinf(theirs):
        return ours == theirs
    return ours == pytest.approx(theirs, rel=tolerance, abs=tolerance)


@pytest.mark.parametrize("name", ["hb_iou", "hb_hitmiss", "model_iou", "model_hitmiss"])
def test_per_cxr_scores_equal_theirs(tables, name):
    """IoU with ``true_pos_only`` and the hit, per (CXR, task), with their NaN where they have it."""
    table = tables[name]
    rows = {row["img_id"]: row for row in GOLDEN[name]["per_cxr"]}
    assert sorted(rows) == list(table.cxr_ids)
    for i, cxr_id in enumerate(table.cxr_ids):
        for t, task in enumerate(table.tasks):
            assert _same(table.values[i, t], rows[cxr_id][task]), (name, cxr_id, task)
    if name == "hb_iou":  # the fixture's cases are present, so the NaN rules are exercised
        column = table.values[:, TASKS.index(TOOL.EMPTY_TASK)]
        assert np.isnan(column).all() and np.isnan(table.values[table.cxr_ids.index(TOOL.EMPTY_CXR)]).all()
        assert np.isnan(table.values[table.cxr_ids.index(TOOL.ABSENT_CXR)]).all()
    if name == "hb_hitmiss":
        assert (table.values == 0).any() and (table.values == 1).any()
        absent = table.values[table.cxr_ids.index(TOOL.ABSENT_CXR)]
        assert set(absent[~np.isnan(absent)]) == {0.0}  # left out of the HB, drawn in the ground truth: misses


@pytest.mark.parametrize("name", ["hb_iou", "hb_hitmiss", "model_iou", "model_hitmiss"])
def test_bootstrap_replicates_equal_theirs(tables, name):
    """Their resampling by their seed: the same 1,000 replicate means, task by task."""
    golden = GOLDEN[name]["bootstrap"]
    means = bootstrap_means(tables[name], chexlocalize_resamples(len(tables[name].cxr_ids)))
    assert means.shape == (golden["replicates"], len(TASKS))
    for r, row in enumerate(golden["head"]):
        for t, task in enumerate(TASKS):
            assert _same(means[r, t], row[task], 1e-12), (r, task)
    for t, task in enumerate(TASKS):
        assert int(np.isnan(means[:, t]).sum()) == golden["nan"][task]
        assert math.fsum(means[~np.isnan(means[:, t]), t]) == pytest.approx(golden["sum"][task], rel=1e-12)


@pytest.mark.parametrize("name", ["hb_iou", "hb_hitmiss", "model_iou", "model_hitmiss"])
def test_summary_equals_theirs(tables, name):
    """Their mIoU / hit rate per task: the replicates' mean and their order-statistic interval, rounded."""
    summary = eval_summary(tables[name])
    rows = GOLDEN[name]["summary"]
    assert sorted(row["name"] for row in rows) == sorted(summary)
    for row in rows:
        for field in ("lower", "mean", "upper"):
            assert _same(summary[row["name"]][field], row[field]), (row["name"], field)


@pytest.mark.parametrize("metric", ["miou", "hitrate"])
def test_percentage_decrease_equals_theirs(tables, metric):
    """calculate_percentage_decrease.py's table, NaN and infinite bounds and the Average row included."""
    stem = "iou" if metric == "miou" else "hitmiss"
    ours = percentage_decrease(tables[f"model_{stem}"], tables[f"hb_{stem}"])
    theirs = {row[""]: row for row in GOLDEN[f"{metric}_pct_decrease"]}
    assert sorted(theirs) == sorted(ours) and AVERAGE in ours
    for task, row in theirs.items():
        for field in ("hb", "pred", "pct_diff", "pct_diff_lower", "pct_diff_upper"):
            assert _same(ours[task][field], row[field], 1e-12), (task, field)
    flat = [v for row in GOLDEN[f"{metric}_pct_decrease"] for v in row.values() if not isinstance(v, str)]
    assert None in flat  # a task without a defined mean
    if metric == "hitrate":
        assert -math.inf in flat  # a replicate whose HB mean is 0 and the model's is not


def test_paired_gap_equals_a_brute_force_resample(tables):
    """model − human on the same resample of CXRs, each replicate recomputed by drawing the rows."""
    model, human = tables["model_iou"], tables["hb_iou"]
    replicates = 200
    gap = paired_gap(model, human, replicates=replicates, seed=3)
    weights = resample_weights(len(human.cxr_ids), replicates, random_stream(3, "chexlocalize", "human_benchmark"))
    differences, decreases = [], []
    for row in weights.numpy().astype(int):
        drawn = np.repeat(np.arange(len(row)), row)
        with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN means on purpose: a task with no pair drawn
            ours = np.nanmean(model.values[drawn], axis=0)
            theirs = np.nanmean(human.values[drawn], axis=0)
            ours, theirs = np.append(ours, np.nanmean(ours)), np.append(theirs, np.nanmean(theirs))
            differences.append(ours - theirs)
            decreases.append(np.where(theirs != 0, 100 * (theirs - ours) / theirs, np.nan))
    differences, decreases = np.array(differences), np.array(decreases)
    for t, task in enumerate((*TASKS, AVERAGE)):
        entry = gap[task]
        if np.isnan(differences[0, t]):
            assert math.isnan(entry["difference"]["estimate"]) and task == TOOL.EMPTY_TASK
            continue
        assert entry["model"] - entry["human"] == pytest.approx(differences[0, t], abs=1e-12)
        assert entry["difference"]["estimate"] == pytest.approx(differences[0, t], abs=1e-12)
        replicate = differences[1:, t][~np.isnan(differences[1:, t])]
        assert entry["difference"]["replicates"] == len(replicate)
        lower, upper = np.percentile(replicate, [2.5, 97.5])
        assert entry["difference"]["lower"] == pytest.approx(lower, abs=1e-12)
        assert entry["difference"]["upper"] == pytest.approx(upper, abs=1e-12)
        decrease = decreases[1:, t][~np.isnan(decreases[1:, t])]
        assert entry["percentage_decrease"]["estimate"] == pytest.approx(decreases[0, t], abs=1e-9)
        assert entry["percentage_decrease"]["lower"] == pytest.approx(np.percentile(decrease, 2.5), abs=1e-9)


def test_a_model_equal_to_the_human_has_no_gap(tables):
    gap = paired_gap(tables["hb_hitmiss"], tables["hb_hitmiss"], replicates=50)
    defined = [entry for task, entry in gap.items() if not math.isnan(entry["human"]) and entry["human"] > 0]
    assert defined and all(e["difference"]["lower"] == e["difference"]["upper"] == 0 for e in defined)
    assert all(e["difference"]["a_better"] == 0.5 and e["percentage_decrease"]["estimate"] == 0 for e in defined)


def test_tables_of_other_cxrs_are_refused(tables):
    other = ScoreTable.from_pairs({}, list(SIZES)[:-1], TASKS)
    for function in (percentage_decrease, paired_gap):
        with pytest.raises(ValueError, match="must hold the same CXRs and tasks"):
            function(other, tables["hb_iou"])
    with pytest.raises(ValueError, match="outside the table"):
        ScoreTable.from_pairs({("patient1", "Edema"): 1.0}, SIZES, TASKS)


def test_the_human_benchmark_runs_as_a_model(release, tmp_path):
    """``--model human`` on the human benchmark writes ``human:chexlocalize-hb``'s results folder
    through the normal path; its hits read the salient points in the frame."""
    root, _ = release
    size = 32
    main(run_args("human", "chexlocalize", root, tmp_path, "--data.human_benchmark", "true", "--trainer.logger",
                  "false", "--data.cache", "false", image_size=size))
    folder = only_folder(tmp_path)
    assert folder.name.startswith("human-chexlocalize-hb__chexlocalize__")
    payload = json.loads((folder / "metrics.json").read_text())
    assert payload["model"] == "human:chexlocalize-hb" and payload["human"] is True
    notes = payload["data"]["notes"]["human_benchmark"]
    assert notes["images_without_segmentations"] == notes["images_without_salient_points"] == 1  # ABSENT_CXR
    hb = json.loads((root / "CheXlocalize" / "hb_segmentations_test.json").read_text())
    drawn = sum(coco_mask.area({"size": rle["size"], "counts": rle["counts"].encode()}) > 0
                for found in hb.values() for task, rle in found.items() if task == "Edema")
    assert notes["segmentations"]["edema"] == drawn > 0
    with gzip.open(folder / "pairs.csv.gz", "rt") as handle:
        pairs = pd.read_csv(handle)
    graded = pairs[pairs.graded]
    datamodule = CheXlocalize(str(root), split="test", human_benchmark=True, image_size=size, cache=False)
    readers = datamodule.reader_set()
    checked = 0
    for sample in datamodule.samples:
        height, width = SIZES[sample.image_id]
        for key, region in sample.regions.items():
            row = graded[(graded.image_id == sample.image_id) & (graded["class"] == key)]
            mark = readers.marks[sample.image_id].get(key)
            truth = resize_mask(region.to_mask(height, width)[0], size, 0.5)
            if mark is None:  # marked nothing: a constant map, a miss
                hit = False
            elif mark.points:  # the points are the map's maximum
                hit = any(truth[int(y * size // height), int(x * size // width)] for x, y in mark.points)
            else:  # a region without a point: its maximum is tied over its area
                hit = bool((resize_mask(mark.region.to_mask(height, width)[0], size, 0.5) & truth).any())
            assert int(row.hit.iloc[0]) == int(hit), (sample.image_id, key)
            binary = torch.zeros(size, size, dtype=torch.bool)  # the map at tau = 0.5: the region and its points
            if mark is not None and mark.region is not None:
                binary |= resize_mask(mark.region.to_mask(height, width)[0], size, 0.5)
            for x, y in mark.points if mark is not None else ():
                binary[int(y * size // height), int(x * size // width)] = True
            assert (int(row.pred_050.iloc[0]), int(row.inter_050.iloc[0])) == (binary.sum(), (binary & truth).sum())
            checked += 1
    assert checked == len(graded) == sum(len(s.regions) for s in datamodule.samples)
