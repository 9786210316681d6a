"""RSNA Pneumonia: Kaggle and MD.ai layouts, the MAVL split, the real stage_2_train_labels.csv."""

import csv
import zipfile
from collections import defaultdict

import numpy as np
import pytest

from conftest import real_file, run_oracle, write_dicom
from xbench.data.io import ImageReadError
from xbench.data.rsna import RSNAPneumonia

SIZE = 48
LABELS = [  # patientId, x, y, width, height, Target
    ("p-one", "4.0", "6.0", "10.0", "20.0", "1"),
    ("p-neg", "", "", "", "", "0"),
    ("p-two", "20.0", "2.0", "8.0", "6.0", "1"),
    ("p-two", "24.0", "30.0", "22.0", "16.0", "1"),
    ("p-one", "30.0", "30.0", "4.0", "4.0", "1"),
]


def write_labels(root, rows):
    with open(root / "stage_2_train_labels.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["patientId", "x", "y", "width", "height", "Target"])
        writer.writerows(rows)


def expected_mask(patient: str) -> np.ndarray:
    mask = np.zeros((SIZE, SIZE), bool)
    for pid, x, y, w, h, _ in LABELS:
        if pid == patient and x:
            x, y, w, h = (int(float(v)) for v in (x, y, w, h))
            mask[y : y + h, x : x + w] = True
    return mask


@pytest.fixture
def kaggle_root(tmp_path):
    write_labels(tmp_path, LABELS)
    pixels = np.random.default_rng(0).integers(0, 256, size=(SIZE, SIZE), dtype=np.uint8)
    write_dicom(tmp_path / "stage_2_train_images" / "p-one.dcm", pixels)
    write_dicom(tmp_path / "stage_2_train_images" / "p-neg.dcm", pixels, compression="jpeg")
    write_dicom(tmp_path / "stage_2_train_images" / "p-two.dcm", pixels, compression="j2k")
    write_dicom(tmp_path / "stage_2_test_images" / "p-unlabelled.dcm", pixels)
    return tmp_path


def test_kaggle_layout_masks_native_and_resized(kaggle_root):
    dm = RSNAPneumonia(root=str(kaggle_root), image_size=SIZE, num_workers=0)
    dm.setup()
    assert dm.image_ids() == ["p-one", "p-neg", "p-two"]
    items = [dm.test_set[i] for i in range(3)]
    for item in items:
        np.testing.assert_array_equal(item["masks"][0].numpy(), expected_mask(item["image_id"]))
        assert item["image"].shape == (1, SIZE, SIZE)
    assert [item["labels"].item() for item in items] == [1, 0, 1]
    assert [item["has_mask"].item() for item in items] == [True, False, True]
    assert dm.notes == {"label_rows": 5, "images_in_label_file": 3, "images": 3, "positive_images": 2, "boxes": 4}

    resized = RSNAPneumonia(root=str(kaggle_root), image_size=SIZE // 2, num_workers=0)
    resized.setup()
    for i, patient in enumerate(("p-one", "p-two")):
        # even box corners: each output pixel's 2x2 block is wholly in or out
        expected = expected_mask(patient)[::2, ::2]
        np.testing.assert_array_equal(resized.test_set[2 * i]["masks"][0].numpy(), expected)


def write_split(path, rows):
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["ID", "img_path", "boxes", "classes"])
        writer.writerows(rows)


def test_mdai_tree_with_split_file(tmp_path):
    write_labels(tmp_path, LABELS)
    pixels = np.full((SIZE, SIZE), 100, np.uint8)
    tree = "mdai_rsna_project_x9N20BZa_images_2018-07-20-153330"
    write_dicom(tmp_path / tree / "1.2.1" / "1.2.2" / "1.2.3.dcm", pixels)
    write_dicom(tmp_path / tree / "1.3.1" / "1.3.2" / "1.3.3.dcm", pixels)
    split = [
        ("p-two", f"{tree}/1.2.1/1.2.2/1.2.3.dcm", "24.0;30.0;22.0;16.0|20.0;2.0;8.0;6.0", "1"),
        ("p-neg", f"{tree}/1.3.1/1.3.2/1.3.3.dcm", "", "0"),
    ]
    write_split(tmp_path / "mavl_test_split.csv", split)
    dm = RSNAPneumonia(root=str(tmp_path), split_file="mavl_test_split.csv", image_size=SIZE, num_workers=0)
    dm.setup()
    assert dm.image_ids() == ["p-two", "p-neg"]
    assert dm.samples[0].path.name == "1.2.3.dcm"
    np.testing.assert_array_equal(dm.test_set[0]["masks"][0].numpy(), expected_mask("p-two"))
    assert dm.notes["images"] == 2 and dm.notes["positive_images"] == 1 and dm.notes["boxes"] == 2


def test_bad_input(kaggle_root):
    root = kaggle_root
    write_split(root / "split.csv", [("p-nobody", "", "", "0")])
    with pytest.raises(ValueError, match=r"split.csv, line 2: patientId p-nobody is not in stage_2_train_labels.csv"):
        _ = RSNAPneumonia(root=str(root), split_file="split.csv").samples
    write_split(root / "split.csv", [("p-one", "", "", "0")])
    with pytest.raises(ValueError, match=r"line 2: classes='0' but .* Target=1"):
        _ = RSNAPneumonia(root=str(root), split_file="split.csv").samples
    write_split(root / "split.csv", [("p-two", "", "20.0;2.0;8.0;6.0", "1")])
    with pytest.raises(ValueError, match=r"line 2: boxes .* differ"):
        _ = RSNAPneumonia(root=str(root), split_file="split.csv").samples
    with pytest.raises(FileNotFoundError, match=r"split file .* not found at .*absent.csv"):
        _ = RSNAPneumonia(root=str(root), split_file="absent.csv").samples

    write_labels(root, LABELS + [("p-gone", "", "", "", "", "0")])
    with pytest.raises(FileNotFoundError, match=r"no DICOM for patientId p-gone .*p-gone.dcm"):
        _ = RSNAPneumonia(root=str(root)).samples
    write_labels(root, [("p-neg", "1.0", "", "", "", "0")])
    with pytest.raises(ValueError, match=r"line 2: a negative row"):
        _ = RSNAPneumonia(root=str(root)).samples
    write_labels(root, [("p-one", "1.0", "1.0", "0.0", "3.0", "1")])
    with pytest.raises(ValueError, match=r"line 2: box .* positive width and height"):
        _ = RSNAPneumonia(root=str(root)).samples
    write_labels(root, [("p-one", "1.0", "1.0", "2.0", "3.0", "1"), ("p-one", "", "", "", "", "0")])
    with pytest.raises(ValueError, match=r"line 3: patientId p-one has rows with Target 0 and rows with Target 1"):
        _ = RSNAPneumonia(root=str(root)).samples

    write_labels(root, [("p-one", "1.0", "1.0", "2.0", "3.0", "1")])
    path = root / "stage_2_train_images" / "p-one.dcm"
    path.write_bytes(path.read_bytes()[:-50])
    dm = RSNAPneumonia(root=str(root), num_workers=0)
    dm.setup()
    with pytest.raises(ImageReadError, match=r"p-one.dcm.*truncated"):
        dm.test_set[0]


@pytest.fixture(scope="module")
def real_rsna(real_data, tmp_path_factory):
    """The real label file unzipped and the MAVL split, with an empty placeholder per image."""
    root = tmp_path_factory.mktemp("rsna")
    with zipfile.ZipFile(real_file(real_data, "rsna/stage_2_train_labels.csv.zip")) as archive:
        archive.extract("stage_2_train_labels.csv", root)
    (root / "mavl_test_split.csv").write_bytes(real_file(real_data, "rsna/mavl_test_split.csv").read_bytes())
    boxes = defaultdict(list)
    with open(root / "stage_2_train_labels.csv") as handle:
        for row in csv.DictReader(handle):
            boxes[row["patientId"]]  # every patient gets an entry
            if row["Target"] == "1":
                boxes[row["patientId"]].append(tuple(float(row[k]) for k in ("x", "y", "width", "height")))
    (root / "stage_2_train_images").mkdir()
    for patient in boxes:
        (root / "stage_2_train_images" / f"{patient}.dcm").touch()
    return root, boxes


def region_boxes(sample) -> list[tuple[float, ...]]:
    region = sample.regions.get("pneumonia")
    return sorted((x1, y1, x2 - x1, y2 - y1) for x1, y1, x2, y2 in region.xyxy) if region else []


def test_real_label_file(real_rsna):
    root, boxes = real_rsna
    samples = RSNAPneumonia(root=str(root)).samples
    assert len(samples) == 26684
    assert sum(s.labels["pneumonia"] for s in samples) == 6012
    assert sum(len(region_boxes(s)) for s in samples) == 9555
    assert all(region_boxes(s) == sorted(boxes[s.image_id]) for s in samples)


def test_real_mavl_split(real_rsna):
    root, boxes = real_rsna
    samples = RSNAPneumonia(root=str(root), split_file="mavl_test_split.csv").samples
    assert len(samples) == 5337
    assert sum(s.labels["pneumonia"] for s in samples) == 1218
    with open(root / "mavl_test_split.csv") as handle:
        split = {row["ID"]: row["boxes"] for row in csv.DictReader(handle)}
    assert [s.image_id for s in samples] == list(split)
    for s in samples:
        from_split = [tuple(map(float, b.split(";"))) for b in split[s.image_id].split("|")] if split[s.image_id] else []
        assert region_boxes(s) == sorted(from_split) == sorted(boxes[s.image_id])


def test_cli_end_to_end_with_the_benchmark_config(kaggle_root, tmp_path):
    write_split(
        kaggle_root / "mavl_test_split.csv",
        [("p-neg", "", "", "0"), ("p-two", "", "20.0;2.0;8.0;6.0|24.0;30.0;22.0;16.0", "1")],
    )
    payload = run_oracle("rsna", kaggle_root, tmp_path / "results", image_size=SIZE)
    assert payload["data"]["images_evaluated"] == 2 and payload["data"]["notes"]["positive_images"] == 1
    graded = payload["grounding"]["per_class"]["pneumonia"]
    assert graded["pairs"] == 1 and graded["pointing_game"] == 1.0 and graded["dice@best"] == 1.0
