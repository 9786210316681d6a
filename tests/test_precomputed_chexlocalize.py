"""cheXlocalize's protocol: XBench's native-size scores of their real Grad-CAM maps equal the numbers
their own code produced (tests/golden/chexlocalize_val.json, made by tools/chexlocalize_golden.py)
wherever the definitions agree; where they differ, by how much."""

import importlib.util
import json
import shutil
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
from xbench.metrics.native import native_pair_scores, native_upsample, otsu_threshold
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
    """The Otsu level equals OpenCV's on every map, and the pixel-wise binary map equals theirs:
    cheXlocalize fills the contours of that map, which changes nothing on maps without holes, as
    all 20 here (a map with a hole inside a blob would differ; README)."""
    for (cxr_id, task), (saved, mask, golden) in real_pairs.items():
        upsampled = native_upsample(saved.map, tuple(mask.shape))
        normalised = ((upsampled - upsampled.min()) / (upsampled.max() - upsampled.min())).numpy()
        levels = np.uint8(255 * normalised)
        level, _ = cv2.threshold(levels, 0, int(levels.max()), cv2.THRESH_OTSU)
        scores = native_pair_scores(saved.map, mask)
        assert scores["otsu_level"] == otsu_threshold(torch.from_numpy(levels)) == int(level), (cxr_id, task)
        assert int((levels > level).sum()) == golden["otsu_pixels"], (cxr_id, task)
        if golden["mask_pixels"]:
            assert scores["iou_otsu"] == pytest.approx(golden["iou_otsu"], abs=1e-12), (cxr_id, task)


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
            "pairs": 1, "xbench_iou@0.5": golden["iou_fixed"], "xbench_pointing_game": golden["hit"],
            "chexlocalize_iou_fixed": golden["iou_fixed"], "chexlocalize_iou_otsu": golden["iou_otsu"],
            "chexlocalize_hit_rate": golden["hit"],
        }
        for golden in GOLDEN["pairs"] if golden["mask_pixels"]
    }
    assert native.keys() == expected.keys()
    for key, values in expected.items():
        assert native[key] == pytest.approx(values, abs=1e-12), key
