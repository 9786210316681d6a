"""EGD-CXR: release-format fixtures (master_sheet.csv, fixations.csv, transcripts; tiny MIMIC-CXR-JPG
images), the density against a brute-force Gaussian sum, the finding window, the authors' split and
batches identical with the cache on and off."""

import csv
import json
import math
import random

import numpy as np
import pytest
import torch
from PIL import Image

from xbench.data.egd_cxr import EGDCXR

HEIGHT, WIDTH = 48, 40
SIGMA = 150.0
#: (dicom id, patient, Normal, CHF, pneumonia)
IMAGES = [(f"dcm-{i}", f"pat-{i // 2}", *flags) for i, flags in
          enumerate([(0, 1, 0), (0, 0, 1), (1, 0, 0), (0, 1, 1), (0, 1, 0), (0, 0, 1), (1, 0, 0), (0, 1, 0),
                     (0, 0, 1), (0, 1, 0)])]
PHRASES = [("the lungs are clear", 0.5, 2.0), ("there is congestive heart failure", 7.0, 9.0),
           ("findings of pneumonia in the left base", 12.0, 15.0)]


def write_release(root, mimic, *, scale=30.0):
    """``scale``: native pixels per fixture pixel (the density's σ is 150 native pixels)."""
    root.mkdir(parents=True, exist_ok=True)
    header = ["dicom_id", "path", "study_id", "patient_id", "stay_id", "gender", "anchor_age", "image_top_pad",
              "image_bottom_pad", "image_left_pad", "image_right_pad", "Normal", "CHF", "pneumonia"]
    fixations = [["SESSION_ID", "MEDIA_ID", "DICOM_ID", "CNT", "Time (in secs)", "FPOGX", "FPOGY", "FPOGS", "FPOGD",
                  "FPOGID", "FPOGV", "X_ORIGINAL", "Y_ORIGINAL"]]
    with open(root / "master_sheet.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for number, (dicom_id, patient, normal, chf, pneumonia) in enumerate(IMAGES):
            folder = f"files/p1{number}/p1{number}00000/s5{number}000000"
            writer.writerow([dicom_id, f"{folder}/{dicom_id}.dcm", f"5{number}", patient, "", "F", "50 - 60",
                             0, 0, 100, 100, normal, chf, pneumonia])
            size = (int(WIDTH * scale), int(HEIGHT * scale))
            jpg = mimic / folder / f"{dicom_id}.jpg"
            jpg.parent.mkdir(parents=True, exist_ok=True)
            Image.new("L", size, 128).save(jpg)
            rng = np.random.default_rng(number)
            for count in range(15):
                x, y = int(rng.integers(0, size[0])), int(rng.integers(0, size[1]))
                if count == 3:
                    x = y = -1  # the release's mark of a gaze off the image
                fixations.append([1, number, dicom_id, count, round(count * 1.1, 3), 0.5, 0.5, 0, 0.2, count, 1, x, y])
            transcript = root / "audio_segmentation_transcripts" / dicom_id / "transcript.json"
            transcript.parent.mkdir(parents=True, exist_ok=True)
            transcript.write_text(json.dumps({"full_text": " ".join(p for p, _, _ in PHRASES), "time_stamped_text": [
                {"phrase": p, "begin_time": b, "end_time": e} for p, b, e in PHRASES]}))
    with open(root / "fixations.csv", "w", newline="") as handle:
        csv.writer(handle).writerows(fixations)
    with open(root / "bounding_boxes.csv", "w", newline="") as handle:  # anatomy, not read
        csv.writer(handle).writerows([["dicom_id", "bbox_name", "x1", "y1", "x2", "y2"],
                                      *[[dicom_id, "right lung", 100, 100, 500, 900] for dicom_id, *_ in IMAGES]])


@pytest.fixture
def release(tmp_path):
    write_release(tmp_path / "egd", tmp_path / "mimic")
    return tmp_path / "egd", tmp_path / "mimic"


def datamodule(release, **options):
    root, mimic = release
    options = {"image_size": 16, "num_workers": 0, "cache": False, "batch_size": 3, "split": "all", **options}
    data = EGDCXR(str(root), str(mimic), **options)
    data.prepare_data()
    data.setup("test")
    return data


def fixations_of(release, dicom_id):
    with open(release[0] / "fixations.csv") as handle:
        rows = [row for row in csv.DictReader(handle) if row["DICOM_ID"] == dicom_id]
    return [(float(r["Time (in secs)"]), float(r["X_ORIGINAL"]), float(r["Y_ORIGINAL"])) for r in rows]


def brute_density(points, size, height, width, window=None):
    heat = np.zeros((size, size))
    for t, x, y in points:
        if not (0 <= x < width and 0 <= y < height):
            continue
        if window is not None and not any(lo < t <= hi for lo, hi in window):
            continue
        for i in range(size):
            cy = (i + 0.5) * height / size - 0.5
            for k in range(size):
                cx = (k + 0.5) * width / size - 0.5
                heat[i, k] += math.exp(-((cx - x) ** 2 + (cy - y) ** 2) / (2 * SIGMA**2)) / (2 * math.pi * SIGMA**2)
    return heat / heat.sum()


def by_id(data):
    found = {}
    for batch in data.test_dataloader():
        for row, image_id in enumerate(batch["image_id"]):
            found[image_id] = {key: value[row] for key, value in batch.items() if isinstance(value, torch.Tensor)}
    return found


def test_parsing_labels_split_and_notes(release):
    data = datamodule(release)
    assert data.classes == ["congestive_heart_failure", "pneumonia"]
    labels = {s.image_id: s.labels for s in data.samples}
    assert labels["dcm-3"] == {"congestive_heart_failure": 1, "pneumonia": 1}
    assert data.notes["fixations_outside_image"] == len(IMAGES)  # one -1 per image
    # the authors' split_dataset, recomputed with Python's random as they call it
    pid = list(dict.fromkeys(patient for _, patient, *_ in IMAGES))
    random.seed(1)
    random.shuffle(pid)
    train = round(len(pid) * 0.8)
    test_patients = set(pid[train + round((len(pid) - train) * 0.5):])
    test = datamodule(release, split="test")
    assert [s.image_id for s in test.samples] == [d for d, patient, *_ in IMAGES if patient in test_patients]


def test_density_is_the_brute_force_gaussian_sum(release):
    data = datamodule(release)
    found = by_id(data)
    height, width = HEIGHT * 30, WIDTH * 30
    for dicom_id, _, _, chf, pneumonia in IMAGES:
        sample = found[dicom_id]
        assert sample["has_gaze"].tolist() == [bool(chf), bool(pneumonia)]
        expected = brute_density(fixations_of(release, dicom_id), 16, height, width)
        for column in np.flatnonzero(sample["has_gaze"].numpy()):
            np.testing.assert_allclose(sample["gaze"][column].numpy(), expected, rtol=1e-5, atol=1e-9)
            assert sample["gaze"][column].sum().item() == pytest.approx(1.0, abs=1e-5)
            assert sample["fixations"][column].sum().item() == 14


def test_the_finding_window(release):
    data = datamodule(release, gaze="finding")
    found = by_id(data)
    height, width = HEIGHT * 30, WIDTH * 30
    points = fixations_of(release, "dcm-3")
    # the transcript times phrases: a window ends where the phrase that names the finding starts
    # CHF: "there is congestive heart failure" from 7.0, the previous phrase starts at 0.5 -> [5.5, 7.0]
    np.testing.assert_allclose(found["dcm-3"]["gaze"][0].numpy(), brute_density(points, 16, height, width, [(5.5, 7.0)]),
                               rtol=1e-5, atol=1e-9)
    assert found["dcm-3"]["fixations"][0].sum() == sum(5.5 < t <= 7.0 for t, _, _ in points)
    # pneumonia: from 12.0, the previous phrase starts at 7.0 -> [10.5, 12.0]
    np.testing.assert_allclose(found["dcm-3"]["gaze"][1].numpy(), brute_density(points, 16, height, width,
                                                                                [(10.5, 12.0)]), rtol=1e-5, atol=1e-9)


def test_the_centre_bias_is_the_mean_of_the_training_images(release):
    data = datamodule(release, split="test")
    pid = list(dict.fromkeys(patient for _, patient, *_ in IMAGES))
    random.seed(1)
    random.shuffle(pid)
    train = set(pid[:round(len(pid) * 0.8)])
    height, width = HEIGHT * 30, WIDTH * 30
    drawn = [brute_density(fixations_of(release, d), 16, height, width) for d, patient, *_ in IMAGES if patient in train]
    expected = np.mean(drawn, axis=0)
    np.testing.assert_allclose(data.gaze_baseline().numpy(), expected / expected.sum(), rtol=1e-5, atol=1e-9)


def test_batches_are_identical_with_the_cache_on_and_off(release, tmp_path, monkeypatch):
    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    runs = [list(datamodule(release, cache=cache, num_workers=workers).test_dataloader())
            for cache, workers in ((False, 0), (True, 2))]
    for first, second in zip(*runs):
        for key, value in first.items():
            assert torch.equal(value, second[key]) if isinstance(value, torch.Tensor) else value == second[key], key
