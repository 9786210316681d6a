"""Augmentations move masks with the image, leave them alone when photometric, and repeat exactly."""

import json

import albumentations as A
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from conftest import CONFIGS, run_args, write_chestx_det10
from xbench.data.augment import build_pipeline
from xbench.data.chestx_det10 import ChestXDet10
from xbench.test import main

ROTATE_90 = [{"class_path": "albumentations.Rotate", "init_args": {"limit": [90, 90], "p": 1.0, "border_mode": 0}}]
PHOTOMETRIC = [
    {"class_path": "albumentations.RandomBrightnessContrast", "init_args": {"p": 1.0}},
    {"class_path": "GaussNoise", "init_args": {"std_range": [0.05, 0.1], "p": 1.0}},
]


@pytest.fixture
def fixture_root(tmp_path):
    entries = [{"file_name": f"{i}.png", "syms": ["Mass"], "boxes": [[8, 4, 20, 12]]} for i in range(5)]
    return write_chestx_det10(tmp_path, entries, size=64)


def dataset(root, **kwargs):
    dm = ChestXDet10(root=str(root), classes=["mass"], image_size=64, num_workers=0, **kwargs)
    dm.setup()
    return dm.test_set


def test_rotation_by_90_moves_the_mask_where_the_box_corners_go(fixture_root):
    item = dataset(fixture_root, augment=ROTATE_90)[0]
    # The box covers columns [8, 20) and rows [4, 12) of a 64x64 image. A counter-clockwise quarter turn
    # sends pixel (row r, column c) to (63 - c, r): rows [64 - 20, 64 - 8) = [44, 56), columns [4, 12).
    expected = np.zeros((64, 64), bool)
    expected[44:56, 4:12] = True
    np.testing.assert_array_equal(item["masks"][0].numpy(), expected)
    plain = dataset(fixture_root)[0]
    torch.testing.assert_close(item["image"][0], torch.rot90(plain["image"][0], 1), rtol=0, atol=1e-6)


def test_photometric_transforms_leave_masks_bit_identical(fixture_root):
    plain, changed = dataset(fixture_root)[1], dataset(fixture_root, augment=PHOTOMETRIC)[1]
    assert torch.equal(plain["masks"], changed["masks"])
    assert not torch.equal(plain["image"], changed["image"])
    assert 0 <= changed["image"].min() and changed["image"].max() <= 1


def test_same_seed_same_batches_in_any_worker_layout(fixture_root):
    def batches(seed, workers):
        data = dataset(fixture_root, augment=PHOTOMETRIC + ROTATE_90, augment_seed=seed)
        return [b["image"] for b in DataLoader(data, batch_size=2, num_workers=workers)]

    first, again, workers = batches(7, 0), batches(7, 0), batches(7, 2)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(torch.equal(a, b) for a, b in zip(first, workers))
    assert not all(torch.equal(a, b) for a, b in zip(first, batches(8, 0)))
    data = dataset(fixture_root, augment=PHOTOMETRIC, augment_seed=7)
    assert not torch.equal(data[0]["image"], data[2]["image"]), "each sample gets its own draw"


def test_region_pushed_out_of_frame_is_counted(fixture_root, tmp_path):
    shift = [{"class_path": "albumentations.Affine", "init_args": {"translate_px": {"x": 60, "y": 0}, "p": 1.0}}]
    item = dataset(fixture_root, augment=shift)[0]
    assert not item["has_mask"][0] and item["lost_regions"][0] and item["labels"][0] == 1
    config = tmp_path / "shift.yaml"
    config.write_text(json.dumps({"data": {"init_args": {"augment": shift}}}))
    results = main(run_args("oracle", "chestx_det10", fixture_root, tmp_path / "results",
                            "--data.classes", "[mass]", "--config", str(config)))
    assert results["data"]["lost_regions"] == {"mass": 5}
    assert results["grounding"]["per_class"]["mass"]["pairs"] == 0
    assert results["classification"]["per_class"]["mass"]["positives"] == 5


def test_serialised_albumentations_form_is_accepted():
    serialised = A.to_dict(A.Compose([A.HorizontalFlip(p=1.0)]))
    image = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    out = build_pipeline(serialised)(image=image)["image"]
    np.testing.assert_array_equal(out, image[:, ::-1])


@pytest.mark.parametrize(
    "config, pattern",
    [
        ([{"class_path": "albumentations.Rotate", "init_args": {"limit": 5}},
          {"class_path": "albumentations.Rotat"}], r"augment entry 1: 'albumentations.Rotat' is not an albumentations transform"),
        ([{"class_path": "albumentations.Rotate", "init_args": {"limitt": 5}}], r"augment entry 0 \(albumentations.Rotate\): invalid arguments"),
        ([{"class_path": "os.system"}], r"augment entry 0: 'os.system' is not an albumentations transform"),
        ([{"init_args": {}}], r"augment entry 0: expected a mapping with 'class_path'"),
        ({"Rotate": {}}, r"serialised form"),
    ],
)
def test_invalid_pipeline_names_the_entry(fixture_root, config, pattern):
    with pytest.raises(ValueError, match=pattern):
        ChestXDet10(root=str(fixture_root), augment=config)


def test_invalid_pipeline_in_yaml_fails_at_configuration(fixture_root, tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(json.dumps({"data": {"init_args": {"augment": [{"class_path": "albumentations.Blurr"}]}}}))
    with pytest.raises(ValueError, match=r"augment entry 0: 'albumentations.Blurr'"):
        main(["--config", str(CONFIGS / "models" / "oracle.yaml"), "--config", str(CONFIGS / "data" / "chestx_det10.yaml"),
              "--data.root", str(fixture_root), "--config", str(config)])
