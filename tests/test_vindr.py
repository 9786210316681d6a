"""VinDr-CXR: DICOM fixtures (MONOCHROME1, 12-bit, JPEG 2000), both layouts, several readers."""

import csv
import gzip

import numpy as np
import pandas as pd
import pydicom
import pytest
import torch
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, JPEG2000Lossless, SecondaryCaptureImageStorage, generate_uid

from conftest import real_file, run_args
from xbench.data.io import ImageReadError, read_image
from xbench.data.transforms import resize_image, resize_mask
from xbench.data.vindr import VinDrCXR
from xbench.findings import SPELLINGS
from xbench.test import main


LOCAL_LABELS = list(SPELLINGS["vindr"])
GLOBAL_TRAIN = ["COPD", "Lung tumor", "Pneumonia", "Tuberculosis", "Other diseases", "No finding"]
GLOBAL_TEST = ["COPD", "Lung tumor", "Pneumonia", "Tuberculosis", "Other disease", "No finding"]
HEIGHT, WIDTH = 40, 56  # non-square; JPEG 2000 needs at least 32 pixels a side


def write_dicom(path, pixels, *, bits_stored, monochrome1=False, jpeg2000=False, window=None, pixel_data=True):
    """A minimal CR DICOM as clinical systems write it: ``bits_stored`` of 16 allocated bits."""
    meta = FileMetaDataset()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = SecondaryCaptureImageStorage, meta.MediaStorageSOPInstanceUID
    ds.Modality = "CR"
    ds.Rows, ds.Columns = pixels.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME1" if monochrome1 else "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, bits_stored, bits_stored - 1, 0
    if window is not None:
        ds.WindowCenter, ds.WindowWidth = window
    if pixel_data:
        ds.PixelData = pixels.astype(np.uint16).tobytes()
        if jpeg2000:
            ds.compress(JPEG2000Lossless, pixels.astype(np.uint16))
    ds.save_as(path, enforce_file_format=True)
    return path


def linear_window(values, centre, width, low, high):
    """DICOM PS3.3 C.11.2.1.2.1, the 'LINEAR' VOI function, written out."""
    values = values.astype(np.float64)
    out = ((values - (centre - 0.5)) / (width - 1) + 0.5) * (high - low) + low
    out[values <= centre - 0.5 - (width - 1) / 2] = low
    out[values > centre - 0.5 + (width - 1) / 2] = high
    return out


def ramp(bits, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2**bits, size=(HEIGHT, WIDTH), dtype=np.uint16)


def test_read_dicom_monochrome1_12_bit_and_jpeg2000(tmp_path):
    twelve = ramp(12, 0)
    plain = write_dicom(tmp_path / "a.dicom", twelve, bits_stored=12)
    np.testing.assert_allclose(read_image(plain), twelve / 4095, rtol=1e-6)
    inverted = write_dicom(tmp_path / "b.dicom", twelve, bits_stored=12, monochrome1=True)
    np.testing.assert_allclose(read_image(inverted), (4095 - twelve) / 4095, rtol=1e-6, atol=1e-7)
    compressed = write_dicom(tmp_path / "c.dicom", twelve, bits_stored=12, jpeg2000=True, monochrome1=True)
    assert pydicom.dcmread(compressed).file_meta.TransferSyntaxUID == JPEG2000Lossless
    np.testing.assert_allclose(read_image(compressed), (4095 - twelve) / 4095, rtol=1e-6, atol=1e-7)
    # a window maps onto the stored range, then MONOCHROME1 inverts it
    windowed = write_dicom(tmp_path / "d.dicom", twelve, bits_stored=12, monochrome1=True, window=(2000, 1001))
    expected = 1 - linear_window(twelve, 2000, 1001, 0, 4095) / 4095
    np.testing.assert_allclose(read_image(windowed), expected, rtol=1e-6, atol=1e-6)
    sixteen = ramp(16, 1)
    deep = write_dicom(tmp_path / "e.dicom", sixteen, bits_stored=16, jpeg2000=True)
    np.testing.assert_allclose(read_image(deep), sixteen / 65535, rtol=1e-6)


# --- the PhysioNet layout, written by hand --------------------------------------------------------

def write_physionet(root, split, images, boxes, labels):
    """``images``: id -> pixel writer kwargs; ``boxes``: rows (id, reader, class, xyxy or None);
    ``labels``: rows (id, reader, {label: 1}) -- reader None for the test split's consensus."""
    (root / split).mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    for image_id, kwargs in images.items():
        write_dicom(root / split / f"{image_id}.dicom", **kwargs)
    per_reader = split == "train"
    with open(root / "annotations" / f"annotations_{split}.csv", "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["image_id", "rad_id", "class_name", "x_min", "y_min", "x_max", "y_max"])
        for image_id, reader, name, box in boxes:
            out.writerow([image_id, reader, name, *(box if box else ["", "", "", ""])])
    with open(root / "annotations" / f"image_labels_{split}.csv", "w", newline="") as handle:
        out = csv.writer(handle)
        columns = LOCAL_LABELS + (GLOBAL_TRAIN if per_reader else GLOBAL_TEST)
        out.writerow(["image_id"] + (["rad_id"] if per_reader else []) + columns)
        for image_id, reader, positive in labels:
            out.writerow([image_id] + ([reader] if per_reader else []) + [positive.get(c, 0) for c in columns])
    return root


def filled(*boxes, shape=(HEIGHT, WIDTH)):
    mask = np.zeros(shape, bool)
    for x1, y1, x2, y2 in boxes:
        mask[y1:y2, x1:x2] = True
    return mask


@pytest.fixture(scope="module")
def physionet_test(tmp_path_factory):
    root = tmp_path_factory.mktemp("vindr")
    images = {
        "aa01": dict(pixels=ramp(12, 2), bits_stored=12, monochrome1=True),
        "bb02": dict(pixels=ramp(12, 3), bits_stored=12, jpeg2000=True),
        "cc03": dict(pixels=ramp(14, 4), bits_stored=14),
    }
    boxes = [
        ("aa01", "R8", "Cardiomegaly", (10.0, 20.0, 40.0, 30.0)),
        ("aa01", "R8", "Nodule/Mass", (2.0, 3.0, 6.0, 8.0)),
        ("aa01", "R9", "Nodule/Mass", (50.0, 30.0, 54.0, 36.0)),  # consensus: any rad_id is the consensus
        ("bb02", "R8", "No finding", None),
        ("cc03", "R10", "Pleural effusion", (0.0, 25.0, 20.0, 40.0)),
        ("cc03", "R10", "Edema", (30.0, 5.0, 40.0, 15.0)),
    ]
    labels = [
        ("aa01", None, {"Cardiomegaly": 1, "Nodule/Mass": 1, "Other disease": 1}),
        ("bb02", None, {"No finding": 1}),
        ("cc03", None, {"Pleural effusion": 1, "Edema": 1, "Rib fracture": 1}),
    ]
    return write_physionet(root, "test", images, boxes, labels), images


def test_physionet_test_split_masks_labels_images(physionet_test):
    root, images = physionet_test
    dm = VinDrCXR(root=str(root), image_size=32, num_workers=0)
    assert dm.classes == list(VinDrCXR.default_classes()) and "edema" not in dm.classes
    samples = {s.image_id: s for s in dm.samples}
    assert list(samples) == ["aa01", "bb02", "cc03"]
    native = {
        ("aa01", "cardiomegaly"): filled((10, 20, 40, 30)),
        ("aa01", "nodule_mass"): filled((2, 3, 6, 8), (50, 30, 54, 36)),
        ("cc03", "pleural_effusion"): filled((0, 25, 20, 40)),
    }
    for (image_id, key), expected in native.items():
        mask, clipped = samples[image_id].regions[key].to_mask(HEIGHT, WIDTH)
        np.testing.assert_array_equal(mask, expected)
        assert clipped == 0
    assert {i: sorted(s.regions) for i, s in samples.items()} == {
        "aa01": ["cardiomegaly", "nodule_mass"], "bb02": [], "cc03": ["edema", "pleural_effusion"],
    }
    positives = {i: sorted(k for k, v in s.labels.items() if v == 1) for i, s in samples.items()}
    assert positives == {
        "aa01": ["cardiomegaly", "nodule_mass"], "bb02": [], "cc03": ["edema", "pleural_effusion", "rib_fracture"],
    }
    assert all(v in (0, 1) for s in samples.values() for v in s.labels.values())
    assert dm.notes["positive_labels_without_region"]["rib_fracture"] == 1
    assert dm.notes["images_entered_grounding"]["nodule_mass"] == 1 and dm.notes["layout"] == "physionet"

    dm.setup()
    for index, image_id in enumerate(samples):
        item = dm.test_set[index]
        assert item["image_id"] == image_id and item["image"].shape == (1, 32, 32)
        for c, key in enumerate(dm.classes):
            expected = native.get((image_id, key))
            assert bool(item["has_mask"][c]) == (expected is not None)
            if expected is not None:
                assert item["masks"][c].equal(resize_mask(expected, 32)), (image_id, key)
    # decoded through the one DICOM reader: MONOCHROME1 inverted, each scaled by its stored bit depth
    decoded = {
        "aa01": (4095 - images["aa01"]["pixels"]) / 4095,
        "bb02": images["bb02"]["pixels"] / 4095,
        "cc03": images["cc03"]["pixels"] / 16383,
    }
    for index, image_id in enumerate(samples):
        expected = resize_image(decoded[image_id].astype(np.float32), 32)
        # the batch image sits on a 16-bit grid: within one step of the float reference
        torch.testing.assert_close(dm.test_set[index]["image"], expected, atol=1 / 65535, rtol=0)


@pytest.fixture(scope="module")
def physionet_train(tmp_path_factory):
    root = tmp_path_factory.mktemp("vindr_train")
    images = {"dd04": dict(pixels=ramp(10, 5), bits_stored=10), "ee05": dict(pixels=ramp(12, 6), bits_stored=12)}
    boxes = [
        ("dd04", "R1", "Cardiomegaly", (10.0, 10.0, 30.0, 20.0)),
        ("dd04", "R2", "Cardiomegaly", (20.0, 12.0, 40.0, 24.0)),
        ("dd04", "R3", "No finding", None),
        ("dd04", "R1", "Lung cyst", (0.0, 0.0, 8.0, 8.0)),
        ("ee05", "R4", "Pneumothorax", (5.0, 5.0, 25.0, 35.0)),
        ("ee05", "R5", "Pneumothorax", (15.0, 10.0, 30.0, 30.0)),
        ("ee05", "R6", "Pneumothorax", (20.0, 0.0, 50.0, 20.0)),
        ("ee05", "R6", "Pneumothorax", (0.0, 30.0, 10.0, 40.0)),
    ]
    labels = [
        ("dd04", "R1", {"Cardiomegaly": 1, "Lung cyst": 1}),
        ("dd04", "R2", {"Cardiomegaly": 1}),
        ("dd04", "R3", {"No finding": 1}),
        ("ee05", "R4", {"Pneumothorax": 1}),
        ("ee05", "R5", {"Pneumothorax": 1, "Other diseases": 1}),
        ("ee05", "R6", {"Pneumothorax": 1}),
    ]
    return write_physionet(root, "train", images, boxes, labels)


def test_train_readers_union_and_majority(physionet_train):
    union = {s.image_id: s for s in VinDrCXR(root=str(physionet_train), split="train").samples}
    majority = {s.image_id: s for s in VinDrCXR(root=str(physionet_train), split="train", readers="majority").samples}

    def draw(sample, key):
        return sample.regions[key].to_mask(HEIGHT, WIDTH)[0]

    np.testing.assert_array_equal(draw(union["dd04"], "cardiomegaly"), filled((10, 10, 30, 20), (20, 12, 40, 24)))
    np.testing.assert_array_equal(draw(majority["dd04"], "cardiomegaly"), filled((20, 12, 30, 20)))  # 2 of 3 readers
    assert union["dd04"].labels["lung_cyst"] == 1 and majority["dd04"].labels["lung_cyst"] == 0
    assert "lung_cyst" in union["dd04"].regions and "lung_cyst" not in majority["dd04"].regions
    # three readers of ee05: a pixel is kept where at least two of them drew, counting each reader once
    votes = np.zeros((HEIGHT, WIDTH), int)
    for reader_boxes in ([(5, 5, 25, 35)], [(15, 10, 30, 30)], [(20, 0, 50, 20), (0, 30, 10, 40)]):
        votes += filled(*reader_boxes)
    np.testing.assert_array_equal(draw(majority["ee05"], "pneumothorax"), votes >= 2)
    np.testing.assert_array_equal(draw(union["ee05"], "pneumothorax"), votes >= 1)
    assert majority["ee05"].labels["pneumothorax"] == 1


def test_kaggle_layout_and_majority_from_boxes(tmp_path):
    (tmp_path / "train").mkdir()
    rows = [
        ("ff06", "Aortic enlargement", 0, "R1", 1, 1, 9, 9), ("ff06", "Aortic enlargement", 0, "R2", 3, 3, 12, 12),
        ("ff06", "No finding", 14, "R3", "", "", "", ""),
    ]
    columns = ["image_id", "class_name", "class_id", "rad_id", "x_min", "y_min", "x_max", "y_max"]
    pd.DataFrame(rows, columns=columns).to_csv(tmp_path / "train.csv", index=False)
    write_dicom(tmp_path / "train" / "ff06.dicom", ramp(12, 7), bits_stored=12)
    with pytest.warns(UserWarning, match="does not annotate"):
        (sample,) = VinDrCXR(root=str(tmp_path), split="train", readers="majority").samples
    assert sample.labels["aortic_enlargement"] == 1 and sample.labels["cardiomegaly"] == 0
    assert sample.labels["rib_fracture"] == -1 and sample.labels["lung_cyst"] == -1
    np.testing.assert_array_equal(sample.regions["aortic_enlargement"].to_mask(HEIGHT, WIDTH)[0], filled((3, 3, 9, 9)))
    with pytest.raises(ValueError, match="only the train split"):
        _ = VinDrCXR(root=str(tmp_path)).samples


def test_real_kaggle_train_csv(real_data, tmp_path):
    source = real_file(real_data, "vindr/kaggle_train.csv.gz")
    with gzip.open(source, "rt") as handle:
        (tmp_path / "train.csv").write_text(handle.read())
    raw = pd.read_csv(tmp_path / "train.csv")
    (tmp_path / "train").mkdir()
    for image_id in raw["image_id"].unique():
        (tmp_path / "train" / f"{image_id}.dicom").touch()  # never decoded by the index

    boxed = raw[raw["class_name"] != "No finding"]
    readers = boxed.groupby(["class_name", "image_id"])["rad_id"].nunique()
    spelled = SPELLINGS["vindr_kaggle"]
    any_reader = {spelled[name]: int(n.size) for name, n in readers.groupby(level=0)}
    two_readers = {spelled[name]: int((n >= 2).sum()) for name, n in readers.groupby(level=0)}
    assert len(any_reader) == 14

    for rule, expected in (("union", any_reader), ("majority", two_readers)):
        with pytest.warns(UserWarning, match="does not annotate"):
            dm = VinDrCXR(root=str(tmp_path), split="train", readers=rule)
            samples = dm.samples
        assert len(samples) == 15000 and dm.notes["readers_per_image"] == {"3": 15000}
        with_region = {key: sum(key in s.regions for s in samples) for key in spelled.values()}
        assert with_region == expected, rule
        assert {k: v for k, v in dm.notes["images_entered_grounding"].items() if k in expected} == expected
        positives = {key: sum(s.labels[key] == 1 for s in samples) for key in spelled.values()}
        assert positives == expected, rule
        assert sum(s.labels["rib_fracture"] == -1 for s in samples) == 15000
        if rule == "union":
            assert sum(len(region.xyxy) for s in samples for region in s.regions.values()) == len(boxed)


def test_bad_input_names_file_and_row(physionet_test, tmp_path):
    root, _ = physionet_test
    bad = tmp_path / "bad"
    write_physionet(bad, "test", {"aa01": dict(pixels=ramp(12, 8), bits_stored=12)},
                    [("aa01", "R8", "Cardiomegally", (1.0, 1.0, 5.0, 5.0))], [("aa01", None, {})])
    with pytest.raises(ValueError, match=r"'Cardiomegally' in .*annotations_test.csv, line 2"):
        _ = VinDrCXR(root=str(bad)).samples
    write_physionet(bad, "test", {}, [("zz99", "R8", "No finding", None)], [("aa01", None, {}), ("zz99", None, {})])
    with pytest.raises(FileNotFoundError, match=r"image_labels_test.csv, line 3: image zz99 has no file"):
        _ = VinDrCXR(root=str(bad)).samples
    write_physionet(bad, "test", {}, [("yy98", "R8", "No finding", None)], [("aa01", None, {})])
    with pytest.raises(ValueError, match="no label row for image yy98"):
        _ = VinDrCXR(root=str(bad)).samples

    empty = tmp_path / "empty"
    write_physionet(empty, "test", {"aa01": dict(pixels=ramp(12, 9), bits_stored=12, pixel_data=False)},
                    [("aa01", "R8", "No finding", None)], [("aa01", None, {})])
    dm = VinDrCXR(root=str(empty), num_workers=0)
    dm.setup()
    with pytest.raises(ImageReadError, match=r"aa01.dicom has no pixel data"):
        dm.test_set[0]
    with pytest.raises(FileNotFoundError, match="neither annotations/"):
        _ = VinDrCXR(root=str(tmp_path)).samples


def test_cli_baseline_end_to_end(physionet_test, tmp_path):
    root, _ = physionet_test
    results = main(run_args("centre_prior", "vindr", root, tmp_path, image_size=32))
    assert results["data"]["images_evaluated"] == 3 and len(results["classes"]) == 21
    pairs = {key: v["pairs"] for key, v in results["grounding"]["per_class"].items() if v["pairs"]}
    assert pairs == {"cardiomegaly": 1, "nodule_mass": 1, "pleural_effusion": 1}
    assert results["data"]["notes"]["layout"] == "physionet"
