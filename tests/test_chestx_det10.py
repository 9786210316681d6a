"""ChestX-Det10: the real test.json, and a hand-made fixture checked pixel by pixel."""

import shutil

import numpy as np
import pytest

from conftest import real_file, write_chestx_det10
from xbench.data.chestx_det10 import ChestXDet10

SPEC_IMAGES_PER_CLASS = {
    "consolidation": 289, "pleural_effusion": 252, "fibrosis": 82, "nodule": 77, "fracture": 76,
    "atelectasis": 48, "emphysema": 39, "calcification": 38, "pneumothorax": 35, "mass": 30,
}


def test_real_test_json(real_data, tmp_path):
    annotations = real_file(real_data, "chestx_det10/test.json")
    shutil.copy(annotations, tmp_path / "test.json")
    (tmp_path / "test_data").mkdir()
    import json

    for entry in json.loads(annotations.read_text()):
        (tmp_path / "test_data" / entry["file_name"]).touch()  # never decoded by the index
    dm = ChestXDet10(root=str(tmp_path))
    samples = dm.samples
    assert len(samples) == 542
    assert sum(any(s.labels.values()) for s in samples) == 459
    assert sum(len(region.xyxy) for s in samples for region in s.regions.values()) == 1476
    per_class = {key: sum(s.labels[key] for s in samples) for key in SPEC_IMAGES_PER_CLASS}
    assert per_class == SPEC_IMAGES_PER_CLASS
    assert dm.classes == list(ChestXDet10.default_classes())


def test_fixture_masks_pixel_by_pixel(tmp_path):
    entries = [
        {"file_name": "1.png", "syms": ["Effusion", "Nodule", "Effusion"],
         "boxes": [[2, 3, 10, 12], [40, 41, 44, 47], [8, 20, 30, 25]]},
        {"file_name": "2.png", "syms": [], "boxes": []},
    ]
    write_chestx_det10(tmp_path, entries, size=64)
    dm = ChestXDet10(root=str(tmp_path), classes=["pleural_effusion", "nodule", "mass"], image_size=64, num_workers=0)
    dm.setup()
    first, second = dm.test_set[0], dm.test_set[1]
    effusion = np.zeros((64, 64), bool)
    effusion[3:12, 2:10] = True  # rows y1:y2, columns x1:x2, half-open
    effusion[20:25, 8:30] = True  # union of the class's boxes
    nodule = np.zeros((64, 64), bool)
    nodule[41:47, 40:44] = True
    np.testing.assert_array_equal(first["masks"][0].numpy(), effusion)
    np.testing.assert_array_equal(first["masks"][1].numpy(), nodule)
    assert not first["masks"][2].any()
    assert first["has_mask"].tolist() == [True, True, False]
    assert first["labels"].tolist() == [1.0, 1.0, 0.0]
    assert second["labels"].tolist() == [0.0, 0.0, 0.0] and not second["has_mask"].any()
    assert first["image"].shape == (1, 64, 64)
    assert first["image_id"] == "1.png"


def test_fixture_masks_after_resize(tmp_path):
    write_chestx_det10(tmp_path, [{"file_name": "1.png", "syms": ["Mass"], "boxes": [[8, 16, 24, 40]]}], size=64)
    dm = ChestXDet10(root=str(tmp_path), image_size=32, num_workers=0)
    dm.setup()
    mask = dm.test_set[0]["masks"][dm.classes.index("mass")].numpy()
    expected = np.zeros((32, 32), bool)
    expected[8:20, 4:12] = True  # exact halving
    np.testing.assert_array_equal(mask, expected)


def test_bad_input_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset folder not found"):
        _ = ChestXDet10(root=str(tmp_path / "nowhere")).samples
    write_chestx_det10(tmp_path, [{"file_name": "1.png", "syms": ["Efusion"], "boxes": [[1, 1, 3, 3]]}])
    with pytest.raises(ValueError, match=r"'Efusion' in .*test.json, entry 0"):
        _ = ChestXDet10(root=str(tmp_path)).samples
    write_chestx_det10(tmp_path, [{"file_name": "1.png", "syms": [], "boxes": []}])
    (tmp_path / "test.json").write_text('[{"file_name": "9.png", "syms": [], "boxes": []}]')
    with pytest.raises(FileNotFoundError, match=r"entry 0: image 9.png not found"):
        _ = ChestXDet10(root=str(tmp_path)).samples
    (tmp_path / "test.json").write_text('[{"file_name": "1.png", "syms": ["Mass"], "boxes": [[5, 5, 3, 9]]}]')
    with pytest.raises(ValueError, match="x2 > x1"):
        _ = ChestXDet10(root=str(tmp_path)).samples
    with pytest.raises(ValueError, match="not annotated in this dataset"):
        ChestXDet10(root=str(tmp_path), classes=["cardiomegaly"])


def test_box_outside_image_is_clipped_and_counted(tmp_path):
    write_chestx_det10(tmp_path, [{"file_name": "1.png", "syms": ["Mass", "Nodule"],
                                   "boxes": [[50, 50, 80, 70], [70, 70, 90, 90]]}], size=64)
    dm = ChestXDet10(root=str(tmp_path), classes=["mass", "nodule"], image_size=64, num_workers=0)
    dm.setup()
    item = dm.test_set[0]
    assert item["clipped_shapes"] == 2
    assert item["masks"][0].sum() == 14 * 14
    assert item["lost_regions"].tolist() == [False, True]
    assert item["has_mask"].tolist() == [True, False]
