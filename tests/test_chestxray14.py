"""ChestX-ray14 boxes: the odd NIH csv, images found anywhere under root, Data_Entry labels."""

import gzip
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import real_file, run_args
from xbench.data.chestxray14 import ChestXray14Boxes
from xbench.data.io import read_image
from xbench.data.transforms import resize_mask
from xbench.test import main


BOX_HEADER = "Image Index,Finding Label,Bbox [x,y,w,h],,,\n"
ENTRY_HEADER = (
    "Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
    "OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]\n"
)


def write_png(path, size):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows, cols = np.mgrid[:size, :size]
    Image.fromarray(((rows * 3 + cols) % 256).astype(np.uint8)).save(path)


def write_nih(root, box_rows, entries=None, images=()):
    """``images``: (relative path, side) PNGs; ``entries``: (file name, labels) Data_Entry rows."""
    root.mkdir(parents=True, exist_ok=True)
    for relative, size in images:
        write_png(root / relative, size)
    (root / "BBox_List_2017.csv").write_text(BOX_HEADER + "".join(row + "\n" for row in box_rows))
    if entries is not None:
        lines = [f"{name},{labels},0,1,50,M,PA,2500,2048,0.143,0.143\n" for name, labels in entries]
        (root / "Data_Entry_2017_v2020.csv").write_text(ENTRY_HEADER + "".join(lines))
    return root


BOX_ROWS = [
    "00000001_000.png,Cardiomegaly,80.5,160.2,240.0,80.9",
    "00000002_000.png,Infiltrate,8.0,16.0,64.0,40.0,,,",  # a mirror's trailing empty fields
    "00000002_000.png,Atelectasis,400.75,500.0,100.0,300.0",
    "00000003_001.png,Nodule,1000.0,1000.0,40.0,40.0",  # crosses the border of the 1024 grid
]
ENTRIES = [
    ("00000001_000.png", "Cardiomegaly|Emphysema"),
    ("00000002_000.png", "Infiltration|Effusion|Atelectasis"),
    ("00000003_001.png", "No Finding"),
    ("00000004_000.png", "Mass"),
]
IMAGES = [("images_001/images/00000001_000.png", 128), ("images_002/images/00000002_000.png", 1024),
          ("00000003_001.png", 128)]


def box(shape, x1, y1, x2, y2):
    mask = np.zeros(shape, bool)
    mask[y1:y2, x1:x2] = True
    return mask


def test_fixture_masks_labels_and_layout(tmp_path):
    root = write_nih(tmp_path / "nih", BOX_ROWS, ENTRIES, IMAGES)
    dm = ChestXray14Boxes(root=str(root), image_size=128, num_workers=0)
    assert dm.classes == list(ChestXray14Boxes.default_classes()) and len(dm.classes) == 8
    samples = dm.samples
    assert [s.image_id for s in samples] == ["00000001_000.png", "00000002_000.png", "00000003_001.png"]
    assert samples[1].path == root / "images_002" / "images" / "00000002_000.png"
    # native masks: the 128 px images scale the 1024 grid by 1/8, then truncate to pixels
    native = {
        (0, "cardiomegaly"): box((128, 128), 10, 20, 40, 30),  # 80.5/8 .. 320.5/8 -> columns [10, 40)
        (1, "infiltration"): box((1024, 1024), 8, 16, 72, 56),
        (1, "atelectasis"): box((1024, 1024), 400, 500, 500, 800),
        (2, "nodule"): box((128, 128), 125, 125, 128, 128),  # clipped at the border
    }
    for (i, key), expected in native.items():
        mask, clipped = samples[i].regions[key].to_mask(*expected.shape)
        np.testing.assert_array_equal(mask, expected)
        assert clipped == (key == "nodule")
    positives = [sorted(k for k, v in s.labels.items() if v == 1) for s in samples]
    # Data_Entry's Effusion without a box is a positive label; Emphysema is not one of the 8
    assert positives == [["cardiomegaly"], ["atelectasis", "infiltration", "pleural_effusion"], ["nodule"]]
    assert all(v in (0, 1) for s in samples for v in s.labels.values())
    assert dm.notes["boxed_classes_not_in_data_entry"] == 1  # the nodule of a "No Finding" entry
    assert dm.notes["boxes"] == 4 and dm.notes["label_source"] == "Data_Entry_2017_v2020.csv"

    dm.setup()
    for (i, key), expected in native.items():
        item = dm.test_set[i]
        c = dm.classes.index(key)
        assert item["has_mask"][c] and item["masks"][c].equal(resize_mask(expected, 128))
    assert dm.test_set[1]["has_mask"].sum() == 2 and dm.test_set[2]["clipped_shapes"] == 1


def test_without_data_entry_unboxed_classes_are_unknown(tmp_path):
    root = write_nih(tmp_path / "nih", BOX_ROWS[:1], None, IMAGES[:1])
    with pytest.warns(UserWarning, match="recognition metrics are undefined"):
        (sample,) = ChestXray14Boxes(root=str(root)).samples
    assert sample.labels["cardiomegaly"] == 1
    assert {v for k, v in sample.labels.items() if k != "cardiomegaly"} == {-1}


def test_bad_input_errors(tmp_path):
    root = write_nih(tmp_path / "a", BOX_ROWS[:1] + ["00000002_000.png,Infiltrates,1,1,5,5"], ENTRIES, IMAGES)
    with pytest.raises(ValueError, match=r"'Infiltrates' in .*BBox_List_2017.csv, line 3"):
        _ = ChestXray14Boxes(root=str(root)).samples
    root = write_nih(tmp_path / "b", BOX_ROWS[:1] + ["00000009_000.png,Mass,1,1,5,5"], ENTRIES, IMAGES)
    with pytest.raises(FileNotFoundError, match=r"BBox_List_2017.csv, line 3: image 00000009_000.png not found"):
        _ = ChestXray14Boxes(root=str(root)).samples
    root = write_nih(tmp_path / "c", BOX_ROWS[:1] + ["00000001_000.png,Edema,1,1,5,5"], ENTRIES, IMAGES)
    with pytest.raises(ValueError, match="line 3: 'Edema' is not one of the 8 box findings"):
        _ = ChestXray14Boxes(root=str(root)).samples
    root = write_nih(tmp_path / "d", BOX_ROWS[:1], ENTRIES, IMAGES + [("images/00000001_000.png", 128)])
    with pytest.raises(ValueError, match="two files named 00000001_000.png"):
        _ = ChestXray14Boxes(root=str(root)).samples
    root = write_nih(tmp_path / "e", BOX_ROWS[:1], ENTRIES[1:], IMAGES)
    with pytest.raises(ValueError, match="no row for 1 images"):
        _ = ChestXray14Boxes(root=str(root)).samples
    with pytest.raises(ValueError, match="not annotated in this dataset"):
        ChestXray14Boxes(root=str(root), classes=["emphysema"])


SPEC_IMAGES_PER_CLASS = {
    "atelectasis": 180, "pleural_effusion": 153, "cardiomegaly": 146, "infiltration": 123, "pneumonia": 120,
    "pneumothorax": 98, "mass": 85, "nodule": 79,
}


def test_real_box_file_and_pngs(real_data, tmp_path):
    for name in ("BBox_List_2017.csv", "Data_Entry_2017_v2020.csv"):
        with gzip.open(real_file(real_data, f"nih/{name}.gz"), "rb") as source, open(tmp_path / name, "wb") as out:
            shutil.copyfileobj(source, out)
    folder = tmp_path / "images_001" / "images"
    folder.mkdir(parents=True)
    for line in (tmp_path / "BBox_List_2017.csv").read_text().splitlines()[1:]:
        (folder / line.split(",")[0]).touch()  # never decoded by the index
    dm = ChestXray14Boxes(root=str(tmp_path))
    samples = dm.samples
    assert len(samples) == 880 and dm.notes["images"] == 880
    assert sum(len(region.boxes.xyxy) for s in samples for region in s.regions.values()) == 984 == dm.notes["boxes"]
    assert {key: sum(key in s.regions for s in samples) for key in SPEC_IMAGES_PER_CLASS} == SPEC_IMAGES_PER_CLASS
    assert dm.notes["images_entered_grounding"] == SPEC_IMAGES_PER_CLASS
    assert dm.notes["boxed_classes_not_in_data_entry"] == 0  # every box label is in Data_Entry
    for name in ("00000001_000.png", "00027426_000.png"):
        path = real_file(real_data, f"nih/{name}")
        image = read_image(path)
        reference = np.asarray(Image.open(path).convert("L"), dtype=np.float32) / 255
        assert image.ndim == 2 and image.shape == reference.shape and image.shape[0] == image.shape[1]
        np.testing.assert_array_equal(image, reference)


def test_cli_baseline_end_to_end(tmp_path):
    root = write_nih(tmp_path / "nih", BOX_ROWS, ENTRIES, IMAGES)
    with pytest.warns(UserWarning, match="1 annotated shapes reached outside their image"):
        results = main(run_args("centre_prior", "chestxray14", root, tmp_path / "results", image_size=32))
    assert results["data"]["images_evaluated"] == 3 and len(results["classes"]) == 8
    pairs = {key: v["pairs"] for key, v in results["grounding"]["per_class"].items() if v["pairs"]}
    assert pairs == {"cardiomegaly": 1, "infiltration": 1, "atelectasis": 1, "nodule": 1}
    assert results["data"]["clipped_shapes"] == 1
    assert results["classification"]["per_class"]["pleural_effusion"]["positives"] == 1
