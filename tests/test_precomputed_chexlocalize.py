"""cheXlocalize's protocol: XBench's native-size scores of their real Grad-CAM maps equal the numbers
their own code produced (tests/golden/chexlocalize_val.json, made by tools/chexlocalize_golden.py)
wherever the definitions agree; where they differ, by how much."""

import importlib.util
import json
import pickle
import shutil
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import torch

from conftest import real_file, run_args
from xbench.data.regions import CocoRLE
from xbench.findings import finding_key
from xbench.metrics.grounding import FIXED_TAU_INDEX
from xbench.metrics.native import chexlocalize_segmentations, native_pair_scores
from xbench.models.precomputed import PrecomputedSaliency, probability_logit
from xbench.test import main

REPO = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((REPO / "tests" / "golden" / "chexlocalize_val.json").read_text())


def load_tool():
    spec = importlib.util.spec_from_file_location("chexlocalize_golden", REPO / "tools" / "chexlocalize_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def real_pairs(real_data, tmp_path_factory):
    """Their pickles written from the real maps, read back by PrecomputedSaliency; native masks."""
    folder = tmp_path_factory.mktemp("gradcam_pickles")
    load_tool().write_pickles(real_file(real_data, "chexlocalize/gradcam_maps_val.npz"), folder)
    reader = PrecomputedSaliency(str(folder), layout="chexlocalize")
    segmentations = json.loads(real_file(real_data, "chexlocalize/gt_segmentations_val.json").read_text())
    pairs = {}
    for row in GOLDEN["pairs"]:
        saved = reader.read_pair(row["cxr_id"], finding_key("chexlocalize", row["task"]))
        height, width = saved.image_size
        mask, _ = CocoRLE.from_json(segmentations[row["cxr_id"]][row["task"]], "gt").to_mask(height, width)
        pairs[row["cxr_id"], row["task"]] = (saved, torch.from_numpy(mask), row)
    return pairs


def test_pickles_read_as_written(real_data, real_pairs):
    data = np.load(real_file(real_data, "chexlocalize/gradcam_maps_val.npz"))
    ids, tasks = list(data["cxr_ids"]), list(data["tasks"])
    for (cxr_id, task), (saved, _, _) in real_pairs.items():
        i, t = ids.index(cxr_id), tasks.index(task)
        assert saved.map.equal(torch.from_numpy(data["maps"][i, t]))
        assert saved.logit == probability_logit(data["probs"][i, t])
        assert saved.image_size == tuple(int(v) for v in data["cxr_dims_wh"][i][::-1])


def test_native_scores_agree_with_their_code(real_pairs):
    """Fixed-threshold IoU and the argmax hit equal theirs on every pair with a mask; XBench's own
    tau = 0.5 (>=) and symmetric-tie hit equal them too, as no pixel sits exactly at 0.5 and no
    maximum is tied on these maps. Empty masks: theirs score IoU 0, XBench leaves the pair out."""
    graded = 0
    for (cxr_id, task), (saved, mask, golden) in real_pairs.items():
        scores = native_pair_scores(saved.map, mask, GOLDEN["fixed_threshold"])
        if golden["mask_pixels"] == 0:
            assert golden["iou_fixed"] == 0.0 and golden["hit"] is None
            assert scores["iou"][0].isnan() or float(scores["iou"][0]) == 0.0
            continue
        graded += 1
        assert scores["iou_fixed"] == pytest.approx(golden["iou_fixed"], abs=1e-12), (cxr_id, task)
        assert float(scores["iou"][FIXED_TAU_INDEX]) == pytest.approx(golden["iou_fixed"], abs=1e-12), (cxr_id, task)
        assert scores["argmax_hit"] == bool(golden["hit"]) == scores["hit"], (cxr_id, task)
    assert graded == 4


def test_otsu_agrees_with_their_code(real_pairs):
    """The Otsu level equals OpenCV's on every map, and the Otsu segmentation -- contours of the
    pixels above it filled, single pixels dropped -- is theirs pixel for pixel (by digest), as is
    the fixed-threshold one; so are the IoUs."""
    tool = load_tool()
    for (cxr_id, task), (saved, mask, golden) in real_pairs.items():
        theirs = chexlocalize_segmentations(saved.map, tuple(mask.shape), GOLDEN["fixed_threshold"])
        levels = np.uint8(255 * theirs["normalised"].numpy())
        assert theirs["otsu_level"] == int(cv2.threshold(levels, 0, 255, cv2.THRESH_OTSU)[0]), (cxr_id, task)
        for name in ("otsu", "fixed"):
            segmentation = theirs[name].numpy()
            assert int(segmentation.sum()) == golden[f"{name}_pixels"], (cxr_id, task, name)
            assert tool.segmentation_digest(segmentation) == golden[f"{name}_digest"], (cxr_id, task, name)
        if golden["mask_pixels"]:
            scores = native_pair_scores(saved.map, mask)
            assert scores["iou_otsu"] == pytest.approx(golden["iou_otsu"], abs=1e-12), (cxr_id, task)


def test_crafted_maps_segment_as_their_code(tmp_path):
    """Maps with holes, islands in holes, isolated pixels, two-pixel and diagonal components, thin
    lines, border blobs and upsampled noise, written as their pickles and read back as a run reads
    them: both segmentations equal theirs pixel for pixel. A float64 map is binarised in float64,
    as by their code; the same map rounded to float32 would not be (so this test sees the precision)."""
    crafted = GOLDEN["crafted"]
    reader = PrecomputedSaliency(str(tmp_path), layout="chexlocalize")
    for row in crafted:
        raw = torch.tensor(row["map"], dtype=getattr(torch, row["dtype"]))
        with open(tmp_path / f"{row['name']}_Cardiomegaly_map.pkl", "wb") as handle:
            pickle.dump({"map": raw[None, None], "prob": 0.5, "task": "Cardiomegaly", "cxr_dims": row["cxr_dims"]},
                        handle)
    for row in crafted:
        saved = reader.read_pair(row["name"], "cardiomegaly")
        assert saved.map.dtype == getattr(torch, row["dtype"]), row["name"]
        theirs = chexlocalize_segmentations(saved.map, saved.image_size, GOLDEN["fixed_threshold"])
        for name in ("otsu", "fixed"):
            expected = np.array([[c == "1" for c in line] for line in row[name]])
            assert np.array_equal(theirs[name].numpy(), expected), (row["name"], name)
    holes = np.array([[c == "1" for c in line] for line in crafted[0]["otsu"]])
    assert holes[6, 6] and holes[5, 5] and not holes[2, 20]  # a filled hole, its island; a dropped pixel
    rounded = chexlocalize_segmentations(saved.map.float(), saved.image_size, GOLDEN["fixed_threshold"])
    assert saved.map.dtype == torch.float64 and not torch.equal(rounded["fixed"], theirs["fixed"])


def test_chexlocalize_pickles_end_to_end(real_data, real_pairs, tmp_path):
    """The pickles as a model in ``python -m xbench.test`` on the real val sample; the three classes
    without a pickle (pneumonia, pleural other, fracture) are skipped and counted; the native-size
    rows in metrics.json are their code's numbers."""
    folder = tmp_path / "pickles"
    load_tool().write_pickles(real_file(real_data, "chexlocalize/gradcam_maps_val.npz"), folder.mkdir() or folder)
    root = tmp_path / "root"
    labels = real_file(real_data, "chexlocalize/valid.csv")
    (root / "CheXpert").mkdir(parents=True)
    (root / "CheXlocalize").mkdir()
    shutil.copy(labels, root / "CheXpert" / "val_labels.csv")
    shutil.copy(real_file(real_data, "chexlocalize/gt_segmentations_val.json"), root / "CheXlocalize")
    for path in pd.read_csv(labels)["Path"]:
        relative = path.split("/valid/", 1)[1]
        target = root / "CheXpert" / "val" / relative
        target.parent.mkdir(parents=True)
        target.symlink_to(real_file(real_data, f"chexlocalize/valid/{relative}"))
    args = run_args("precomputed_chexlocalize", "chexlocalize", root, tmp_path / "results", "--data.split", "val",
                    "--model.path", str(folder), image_size=224)
    with pytest.raises(FileNotFoundError, match=r"6 of 26 .* first: \(patient64541_study1_view1_frontal, fracture\)"):
        main([*args, "--trainer.logger", "false"])  # no W&B run left open by the error
    with pytest.warns(UserWarning, match="6 pairs have no saved output and are skipped"):
        results = main([*args, "--model.missing", "skip", "--model.native_protocol", "true"])
    assert results["precomputed"]["missing_pairs"] == 6
    pairs = {key: v["pairs"] for key, v in results["grounding"]["per_class"].items() if v["pairs"]}
    assert pairs == {"enlarged_cardiomediastinum": 1, "cardiomegaly": 1, "lung_opacity": 1, "support_devices": 1}
    hits = {key: v["hits"] for key, v in results["grounding"]["per_class"].items() if v["pairs"]}
    native_hits = {finding_key("chexlocalize", task): int(golden["hit"])
                   for (_, task), (_, _, golden) in real_pairs.items() if golden["mask_pixels"]}
    assert hits == native_hits
    native = results["precomputed"]["chexlocalize_protocol"]["per_class"]
    expected = {
        finding_key("chexlocalize", golden["task"]): {
            "pairs": 1, "empty_masks": 0, "xbench_iou@0.5": golden["iou_fixed"],
            "xbench_pointing_game": golden["hit"], "chexlocalize_iou_fixed": golden["iou_fixed"],
            "chexlocalize_iou_fixed_left_out": 0, "chexlocalize_iou_otsu": golden["iou_otsu"],
            "chexlocalize_iou_otsu_left_out": 0, "chexlocalize_hit_rate": golden["hit"],
        }
        for golden in GOLDEN["pairs"] if golden["mask_pixels"]
    }
    assert native.keys() == expected.keys()
    for key, values in expected.items():
        assert native[key] == pytest.approx(values, abs=1e-12), key


def their_eval_means(pairs: list[tuple[torch.Tensor, torch.Tensor]], fixed_threshold: float) -> pd.Series:
    """cheXlocalize's eval.py, written out plainly: per pair, ``calculate_iou`` with its default
    ``true_pos_only=True`` on the fixed-threshold and the Otsu segmentation (NaN where either mask is
    empty), ``get_hitrates``' hit at the first maximum (NaN where the mask is empty); per column,
    pandas' mean, which skips NaN, as their bootstrap does."""
    rows = []
    for raw, mask in pairs:
        gt = mask.numpy()
        segmentations = chexlocalize_segmentations(raw, gt.shape, fixed_threshold)
        row = {}
        for name in ("fixed", "otsu"):
            predicted = segmentations[name].numpy()
            row[name] = (np.nan if np.sum(predicted) == 0 or np.sum(gt) == 0
                         else np.sum(np.logical_and(predicted, gt)) / np.sum(np.logical_or(predicted, gt)))
        x, y = np.unravel_index(np.argmax(segmentations["upsampled"].numpy(), axis=None), gt.shape)
        row["hit"] = 1 if gt[x][y] == 1 else np.nan if np.sum(gt) == 0 else 0
        rows.append(row)
    return pd.DataFrame(rows, columns=["fixed", "otsu", "hit"]).mean()


def test_true_pos_only_leaves_out_the_pairs_their_eval_leaves_out():
    """Their default rule, against a plain re-implementation of eval.py: an empty Otsu
    segmentation (one bright pixel: a single-point contour, dropped), an empty fixed one (a constant
    map), an empty mask, both empty, and a finding with no pair left: each mean over the pairs their
    code keeps, the left-out pairs counted, empty masks counted apart."""
    from xbench.metrics.native import ChexlocalizeRecords, chexlocalize_means, model_row

    rng = np.random.default_rng(0)
    box = torch.zeros(24, 32, dtype=torch.bool)
    box[4:14, 6:20] = True
    spike = torch.zeros(24, 32)
    spike[8, 10] = 1.0
    smooth = torch.from_numpy(rng.random((3, 4), dtype=np.float32))
    constant, empty = torch.full((6, 8), 0.3), torch.zeros(24, 32, dtype=torch.bool)
    pairs = {"a": [(smooth, box), (spike, box), (constant, box), (smooth, empty), (smooth.double() * 1e300, box)],
             "b": [(smooth, empty), (constant, empty), (constant, box)]}
    assert not chexlocalize_segmentations(spike, (24, 32))["otsu"].any()  # the edge this test is about
    records = ChexlocalizeRecords(2)
    for c, key in enumerate(pairs):
        for raw, mask in pairs[key]:
            records.update(mask, c, 0, partial(model_row, raw, mask, 0.5))
    means = chexlocalize_means(records.compute(), list(pairs))
    for key, rows in pairs.items():
        theirs = their_eval_means(rows, 0.5)
        graded = [(raw, mask) for raw, mask in rows if mask.any()]
        ours = means[key]
        assert ours["pairs"] == len(graded) and ours["empty_masks"] == len(rows) - len(graded), key
        for column, name in (("fixed", "chexlocalize_iou_fixed"), ("otsu", "chexlocalize_iou_otsu"),
                             ("hit", "chexlocalize_hit_rate")):
            expected = None if np.isnan(theirs[column]) else pytest.approx(theirs[column], abs=1e-12)
            assert ours[name] == expected, (key, name)
        for column, name in (("fixed", "chexlocalize_iou_fixed"), ("otsu", "chexlocalize_iou_otsu")):
            left_out = sum(np.isnan(their_eval_means([pair], 0.5)[column]) for pair in graded)  # pair by pair
            assert ours[f"{name}_left_out"] == left_out, (key, name)
    assert means["a"]["chexlocalize_iou_otsu_left_out"] == 2 and means["a"]["chexlocalize_iou_fixed_left_out"] == 1
    assert means["b"]["chexlocalize_iou_otsu"] is None and means["b"]["xbench_pointing_game"] == 0.0
