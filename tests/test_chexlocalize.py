"""CheXlocalize: a hand-drawn COCO RLE fixture, and the real sample files of the official repo."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from pycocotools import mask as coco_mask

from conftest import real_file, run_args
from xbench.data.chexlocalize import CheXlocalize
from xbench.data.regions import Polygons
from xbench.data.transforms import resize_mask
from xbench.test import main


#: CSV column -> key, written out here so the test does not read the table it checks.
CSV_COLUMNS = {
    "Enlarged Cardiomediastinum": "enlarged_cardiomediastinum", "Cardiomegaly": "cardiomegaly",
    "Lung Opacity": "lung_opacity", "Lung Lesion": "lung_lesion", "Edema": "edema",
    "Consolidation": "consolidation", "Pneumonia": "pneumonia", "Atelectasis": "atelectasis",
    "Pneumothorax": "pneumothorax", "Pleural Effusion": "pleural_effusion", "Pleural Other": "pleural_other",
    "Fracture": "fracture", "Support Devices": "support_devices",
}
JSON_KEYS = [
    "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Lesion", "Airspace Opacity", "Edema", "Consolidation",
    "Atelectasis", "Pneumothorax", "Pleural Effusion", "Support Devices",
]
HEIGHT, WIDTH = 36, 52  # non-square, like the real 2320 x 2828


def encode(mask: np.ndarray) -> dict:
    """pycocotools' compressed RLE as the official files store it (counts as str)."""
    rle = coco_mask.encode(np.asfortranarray(mask.astype(np.uint8)))
    return {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}


def write_chexlocalize(root, split, images, rows, masks):
    """``images``: relative paths of grey JPGs; ``rows``: CSV rows (dicts); ``masks``: cxr_id ->
    {JSON key -> bool mask}; every listed CXR gets all 10 keys, missing ones all zero."""
    folder = "val" if split == "val" else "test"
    rng = np.random.default_rng(0)
    for relative in images:
        path = root / "CheXpert" / folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH), dtype=np.uint8), mode="L").save(path, quality=95)
    pd.DataFrame(rows).to_csv(root / "CheXpert" / f"{split}_labels.csv", index=False)
    (root / "CheXlocalize").mkdir(exist_ok=True)
    payload = {
        cxr_id: {key: encode(drawn.get(key, np.zeros((HEIGHT, WIDTH), bool))) for key in JSON_KEYS}
        for cxr_id, drawn in masks.items()
    }
    (root / "CheXlocalize" / f"gt_segmentations_{split}.json").write_text(json.dumps(payload))
    return root


def label_row(path, **positive):
    row = {"Path": path, "Sex": "Female", "Age": 60, "AP/PA": "AP", "No Finding": 0.0}
    row.update({column: 0.0 for column in CSV_COLUMNS})
    row.update({column.replace("_", " "): value for column, value in positive.items()})
    return row


def disc(cx, cy, r):
    yy, xx = np.mgrid[:HEIGHT, :WIDTH]
    return (xx - cx) ** 2 + (yy - cy) ** 2 <= r**2


@pytest.fixture(scope="module")
def fixture_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("chexlocalize")
    cardio = np.zeros((HEIGHT, WIDTH), bool)
    cardio[20:30, 15:40] = True
    opacity = disc(10, 12, 6) | disc(45, 8, 3)  # two blobs, one touching the right border region
    devices = np.zeros((HEIGHT, WIDTH), bool)
    devices[2:34, 25] = True  # one pixel wide line
    images = ["patient1/study1/view1_frontal.jpg", "patient2/study1/view1_frontal.jpg",
              "patient2/study1/view2_lateral.jpg"]
    rows = [
        label_row("test/" + images[0], Cardiomegaly=1.0, Lung_Opacity=1.0, Pneumonia=1.0),
        label_row("test/" + images[1], Support_Devices=1.0, Edema=-1.0),
        label_row("test/" + images[2], Support_Devices=1.0),
    ]
    masks = {
        "patient1_study1_view1_frontal": {"Cardiomegaly": cardio, "Airspace Opacity": opacity},
        "patient2_study1_view1_frontal": {"Support Devices": devices},
    }
    write_chexlocalize(root, "test", images, rows, masks)
    return root, {("patient1_study1_view1_frontal", "cardiomegaly"): cardio,
                  ("patient1_study1_view1_frontal", "lung_opacity"): opacity,
                  ("patient2_study1_view1_frontal", "support_devices"): devices}


def test_fixture_masks_pixel_by_pixel(fixture_root):
    root, drawn = fixture_root
    dm = CheXlocalize(root=str(root), image_size=26, num_workers=0)
    assert dm.classes == list(CheXlocalize.default_classes()) and len(dm.classes) == 13
    samples = dm.samples
    assert [s.image_id for s in samples] == [
        "patient1_study1_view1_frontal", "patient2_study1_view1_frontal", "patient2_study1_view2_lateral",
    ]
    for sample in samples:
        assert sorted(sample.regions) == sorted(key for (cxr, key) in drawn if cxr == sample.image_id)
        for key, region in sample.regions.items():
            mask, clipped = region.to_mask(HEIGHT, WIDTH)
            np.testing.assert_array_equal(mask, drawn[sample.image_id, key])
            assert clipped == 0
    assert samples[0].labels["pneumonia"] == 1 and "pneumonia" not in samples[0].regions
    assert samples[1].labels["edema"] == -1 and samples[1].labels["cardiomegaly"] == 0
    assert samples[2].labels["support_devices"] == 1 and not samples[2].regions  # absent from the JSON
    assert dm.notes["images_entered_grounding"]["support_devices"] == 1
    assert dm.notes["positive_labels_without_mask"]["support_devices"] == 1
    assert dm.notes["positive_labels_without_mask"]["pneumonia"] == 1

    dm.setup()
    for index, sample in enumerate(samples):
        item = dm.test_set[index]
        for c, key in enumerate(dm.classes):
            expected = drawn.get((sample.image_id, key))
            assert bool(item["has_mask"][c]) == (expected is not None), (sample.image_id, key)
            if expected is not None:
                assert item["masks"][c].equal(resize_mask(expected, 26))
            else:
                assert not item["masks"][c].any()
        assert item["labels"].tolist() == [float(sample.labels[key]) for key in dm.classes]


def test_val_split_paths_and_class_subset(tmp_path):
    image = "patient9/study2/view1_frontal.jpg"
    mask = np.zeros((HEIGHT, WIDTH), bool)
    mask[5:9, 7:30] = True
    write_chexlocalize(tmp_path, "val", [image], [label_row("CheXpert-v1.0/valid/" + image, Atelectasis=1.0)],
                       {"patient9_study2_view1_frontal": {"Atelectasis": mask}})
    dm = CheXlocalize(
        root=str(tmp_path), split="val", classes=["atelectasis", "edema"], image_size=HEIGHT, num_workers=0
    )
    dm.setup()
    item = dm.test_set[0]
    assert item["image_id"] == "patient9_study2_view1_frontal"
    assert item["has_mask"].tolist() == [True, False] and item["labels"].tolist() == [1.0, 0.0]
    assert dm.notes["images_entered_grounding"] == {"atelectasis": 1, "edema": 0}


def test_bad_input_errors(fixture_root, tmp_path):
    root, _ = fixture_root
    bad = tmp_path / "bad"
    shutil.copytree(root, bad)
    segmentations = bad / "CheXlocalize" / "gt_segmentations_test.json"
    payload = json.loads(segmentations.read_text())
    payload["patient1_study1_view1_frontal"]["Lung Nodule"] = payload["patient1_study1_view1_frontal"]["Edema"]
    segmentations.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=r"'Lung Nodule' in .*segmentations_test.json, patient1_study1_view1_frontal"):
        _ = CheXlocalize(root=str(bad)).samples
    payload = json.loads((root / "CheXlocalize" / "gt_segmentations_test.json").read_text())
    payload["patient1_study1_view1_frontal"]["Edema"] = {"size": [HEIGHT, WIDTH]}
    segmentations.write_text(json.dumps(payload))
    with pytest.raises(ValueError, match=r"patient1_study1_view1_frontal, 'Edema': expected a COCO RLE"):
        _ = CheXlocalize(root=str(bad)).samples
    shutil.copy(root / "CheXlocalize" / "gt_segmentations_test.json", segmentations)
    (bad / "CheXpert" / "test" / "patient2" / "study1" / "view2_lateral.jpg").unlink()
    with pytest.raises(FileNotFoundError, match=r"test_labels.csv, line 4: image test/patient2/study1/view2_lateral"):
        _ = CheXlocalize(root=str(bad)).samples
    with pytest.raises(FileNotFoundError, match="the label CSV not found"):
        _ = CheXlocalize(root=str(bad), split="val").samples
    shutil.copytree(root / "CheXpert", bad / "CheXpert", dirs_exist_ok=True)
    labels = bad / "CheXpert" / "test_labels.csv"
    pd.read_csv(labels).drop(columns="Fracture").to_csv(labels, index=False)
    with pytest.raises(ValueError, match=r"test_labels.csv: no label column for \['fracture'\]"):
        _ = CheXlocalize(root=str(bad)).samples
    shutil.copy(root / "CheXpert" / "test_labels.csv", labels)
    payload = json.loads(segmentations.read_text())
    payload["patient1_study1_view1_frontal"]["Cardiomegaly"]["size"] = [WIDTH, HEIGHT]  # transposed
    segmentations.write_text(json.dumps(payload))
    dm = CheXlocalize(root=str(bad), num_workers=0)
    dm.setup()
    with pytest.raises(ValueError, match=r"patient1_study1_view1_frontal, 'Cardiomegaly': the mask is 52x36"):
        dm.test_set[0]


def test_real_val_sample(real_data, tmp_path):
    """The official sample: two CXRs of the val split, laid out as the AIMI download."""
    source = real_data / "chexlocalize"
    labels = real_file(real_data, "chexlocalize/valid.csv")
    segmentations = json.loads(real_file(real_data, "chexlocalize/gt_segmentations_val.json").read_text())
    polygons = json.loads(real_file(real_data, "chexlocalize/gt_annotations_val.json").read_text())
    (tmp_path / "CheXpert").mkdir()
    (tmp_path / "CheXlocalize").mkdir()
    shutil.copy(labels, tmp_path / "CheXpert" / "val_labels.csv")
    shutil.copy(source / "gt_segmentations_val.json", tmp_path / "CheXlocalize")
    csv_rows = pd.read_csv(labels)
    for path in csv_rows["Path"]:
        relative = path.split("/valid/", 1)[1]
        target = tmp_path / "CheXpert" / "val" / relative
        target.parent.mkdir(parents=True)
        target.symlink_to(real_file(real_data, f"chexlocalize/valid/{relative}"))

    dm = CheXlocalize(root=str(tmp_path), split="val", image_size=224, num_workers=0)
    dm.setup()
    assert len(dm.samples) == 2
    for index, (sample, (_, row)) in enumerate(zip(dm.samples, csv_rows.iterrows())):
        assert sample.labels == {key: int(row[column]) for column, key in CSV_COLUMNS.items()}
        rles = segmentations[sample.image_id]
        item = dm.test_set[index]
        for json_key, rle in rles.items():
            key = "lung_opacity" if json_key == "Airspace Opacity" else CSV_COLUMNS[json_key]
            reference = coco_mask.decode({"size": rle["size"], "counts": rle["counts"].encode()}).astype(bool)
            c = dm.classes.index(key)
            assert bool(item["has_mask"][c]) == bool(reference.any())
            if not reference.any():
                continue
            height, width = rle["size"]
            native = sample.regions[key].to_mask(height, width)[0]
            np.testing.assert_array_equal(native, reference)
            assert item["masks"][c].equal(resize_mask(reference, 224))
            contours = polygons[sample.image_id][json_key]
            outline = Polygons(tuple(tuple(map(tuple, contour)) for contour in contours)).to_mask(height, width)[0]
            iou = (outline & native).sum() / (outline | native).sum()
            assert iou >= 0.95, (sample.image_id, json_key, iou)
    entered = {key: n for key, n in dm.notes["images_entered_grounding"].items() if n}
    assert entered == {"enlarged_cardiomediastinum": 1, "cardiomegaly": 1, "lung_opacity": 1, "support_devices": 1}


def test_cli_baseline_end_to_end(fixture_root, tmp_path):
    root, drawn = fixture_root
    results = main(run_args("centre_prior", "chexlocalize", root, tmp_path, image_size=32))
    assert results["dataset"] and results["data"]["images_evaluated"] == 3
    pairs = {key: v["pairs"] for key, v in results["grounding"]["per_class"].items() if v["pairs"]}
    assert pairs == {"cardiomegaly": 1, "lung_opacity": 1, "support_devices": 1}
    assert results["data"]["notes"]["images_entered_grounding"]["lung_opacity"] == 1
