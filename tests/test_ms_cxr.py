"""MS-CXR: a small fake release (the v1.1.0 CSV and MIMIC-CXR-JPG-style JPEGs) read into samples,
queries and batches with the query axis, with and without the decoded-image cache; v1.0.0; every
bad row's error."""

import shutil

import numpy as np
import pytest
import torch
import yaml

from conftest import CONFIGS, write_ms_cxr
from xbench.data.cache import CachedDataset
from xbench.data.ms_cxr import MSCXR
from xbench.data.queries import Query
from xbench.data.regions import Boxes, GridBoxes
from xbench.data.transforms import resize_mask

WIDTH, HEIGHT = 64, 48
TWO_FINDINGS, TWO_BOXES, SAME_FINDING, REPEATED_TEXT = "d1-two-findings", "d2-two-boxes", "d3-same-finding", "d4-repeat"
PATHS = {
    TWO_FINDINGS: f"files/p10/p10000032/s50414267/{TWO_FINDINGS}.jpg",
    TWO_BOXES: f"files/p10/p10000764/s57375967/{TWO_BOXES}.jpg",
    SAME_FINDING: f"files/p11/p11000011/s51029426/{SAME_FINDING}.jpg",
    REPEATED_TEXT: f"files/p19/p19999987/s58971208/{REPEATED_TEXT}.jpg",
}
ATELECTASIS, CARDIOMEGALY = "Left basilar atelectasis", "Moderate cardiomegaly"
EFFUSIONS, RIGHT_OPACITY, LEFT_OPACITY = "Small bilateral pleural effusions", "Right lower lobe opacity", "Left upper lobe opacity"


def row(dicom_id, category, text, x, y, w, h, split="test", **extra):
    return {"dicom_id": dicom_id, "category_name": category, "label_text": text, "path": PATHS[dicom_id],
            "x": x, "y": y, "w": w, "h": h, "split": split, **extra}


#: File order on purpose: an image's and a phrase's rows are not adjacent; CSV line = index + 2.
ROWS = [
    row(TWO_FINDINGS, "Atelectasis", ATELECTASIS, 4, 30, 12, 10),
    row(TWO_BOXES, "Pleural Effusion", EFFUSIONS, 2, 34, 12, 10),
    row(TWO_FINDINGS, "Cardiomegaly", f"  {CARDIOMEGALY} ", 20, 14, 24, 18),
    row(SAME_FINDING, "Lung Opacity", RIGHT_OPACITY, 6, 28, 14, 12, split="val"),
    row(TWO_BOXES, "Pleural Effusion", EFFUSIONS, 48, 34, 12, 10),
    row(SAME_FINDING, "Lung Opacity", LEFT_OPACITY, 40.0, 8.5, 12.5, 9.5, split="val"),
    row(REPEATED_TEXT, "Cardiomegaly", CARDIOMEGALY, 18, 12, 28, 20),
]
CLASSES = ["atelectasis", "cardiomegaly", "consolidation", "edema", "lung_opacity", "pleural_effusion", "pneumonia",
           "pneumothorax"]
#: Each image's phrases in file order: (text, finding, xywh boxes).
QUERIES = {
    TWO_FINDINGS: [(ATELECTASIS, "atelectasis", [(4, 30, 12, 10)]), (CARDIOMEGALY, "cardiomegaly", [(20, 14, 24, 18)])],
    TWO_BOXES: [(EFFUSIONS, "pleural_effusion", [(2, 34, 12, 10), (48, 34, 12, 10)])],
    SAME_FINDING: [(RIGHT_OPACITY, "lung_opacity", [(6, 28, 14, 12)]),
                   (LEFT_OPACITY, "lung_opacity", [(40.0, 8.5, 12.5, 9.5)])],
    REPEATED_TEXT: [(CARDIOMEGALY, "cardiomegaly", [(18, 12, 28, 20)])],
}
ALL_IMAGES = [TWO_FINDINGS, TWO_BOXES, SAME_FINDING, REPEATED_TEXT]


@pytest.fixture
def release(tmp_path):
    """(MS-CXR folder, MIMIC-CXR-JPG folder) of the fake release."""
    root, images = tmp_path / "ms-cxr", tmp_path / "mimic-cxr-jpg"
    write_ms_cxr(root, ROWS, size=(WIDTH, HEIGHT), images_root=images)
    return root, images


def data(release, **kwargs) -> MSCXR:
    root, images = release
    return MSCXR(root=str(root), images_root=str(images), **kwargs)


def expected_queries(dicom_id: str) -> tuple[Query, ...]:
    return tuple(Query(text, key, GridBoxes(Boxes.from_xywh(boxes), HEIGHT, WIDTH))
                 for text, key, boxes in QUERIES[dicom_id])


def test_samples_labels_queries_and_class_regions(release):
    dm = data(release, split="all")
    assert dm.classes == CLASSES and MSCXR.default_classes() == tuple(CLASSES)
    assert dm.image_ids() == ALL_IMAGES  # order of each image's first row
    for sample in dm.samples:
        assert sample.path == release[1] / PATHS[sample.image_id]
        assert sample.queries == expected_queries(sample.image_id)
        findings = {key for _, key, _ in QUERIES[sample.image_id]}
        assert sample.labels == {key: 1 if key in findings else -1 for key in CLASSES}  # absences unknown
        union = {key: [] for key in findings}
        for _, key, boxes in QUERIES[sample.image_id]:
            union[key] += boxes
        assert sample.regions == {key: GridBoxes(Boxes.from_xywh(boxes), HEIGHT, WIDTH) for key, boxes in union.items()}
    # one phrase, two boxes: one region
    assert dm.samples[1].queries[0].region.boxes == Boxes(((2, 34, 14, 44), (48, 34, 60, 44)))
    assert dm.phrases == [ATELECTASIS, CARDIOMEGALY, EFFUSIONS, RIGHT_OPACITY, LEFT_OPACITY]
    assert dm.query_slots == 2
    assert dm.notes == {
        "release_file": "MS_CXR_Local_Alignment_v1.1.0.csv", "split": "all", "images": 4, "phrases": 6, "boxes": 7,
        "phrases_per_finding": {key: {"atelectasis": 1, "cardiomegaly": 2, "lung_opacity": 2,
                                      "pleural_effusion": 1}.get(key, 0) for key in CLASSES},
        "distinct_phrase_texts": 5, "boxes_outside_image": 0,
        "absences": "not asserted: a finding without a phrase on an image is unknown (-1)",
    }


def test_split_selection(release):
    test = data(release)  # the default: the benchmark split
    assert test.image_ids() == [TWO_FINDINGS, TWO_BOXES, REPEATED_TEXT]
    assert test.notes["split"] == "test" and test.notes["phrases"] == 4 and test.notes["boxes"] == 5
    val = data(release, split="val")
    assert val.image_ids() == [SAME_FINDING] and val.samples[0].queries == expected_queries(SAME_FINDING)
    with pytest.raises(ValueError, match=r"no rows of split 'train' \(its splits: \['test', 'val'\]\)"):
        _ = data(release, split="train").samples
    with pytest.raises(ValueError, match="--data.split must be one of test, val, train, all; got 'validation'"):
        data(release, split="validation")


def test_images_root_defaults_to_root(tmp_path):
    write_ms_cxr(tmp_path, ROWS, size=(WIDTH, HEIGHT))
    dm = MSCXR(root=str(tmp_path), split="val")
    assert dm.samples[0].path == tmp_path / PATHS[SAME_FINDING]


def test_v1_0_0_without_split_column(tmp_path):
    rows = [{k: v for k, v in r.items() if k != "split"} for r in ROWS]
    write_ms_cxr(tmp_path, rows, version="v1.0.0", size=(WIDTH, HEIGHT))
    v1 = "MS_CXR_Local_Alignment_v1.0.0.csv"
    dm = MSCXR(root=str(tmp_path), annotations=v1, split="all")
    assert dm.image_ids() == ALL_IMAGES and dm.notes["release_file"] == v1
    assert [s.queries for s in dm.samples] == [expected_queries(i) for i in ALL_IMAGES]
    with pytest.raises(ValueError, match=rf"{v1} has no split column .*v1\.1\.0.*--data\.split all"):
        _ = MSCXR(root=str(tmp_path), annotations=v1).samples
    # the default (v1.1.0) is missing, v1.0.0 is there: the error names both
    with pytest.raises(FileNotFoundError, match=r"v1\.1\.0\.csv is not in .*but MS_CXR_Local_Alignment_v1\.0\.0\.csv is"):
        _ = MSCXR(root=str(tmp_path), split="all").samples


def test_missing_release_file_names_the_other_version(release):
    root, _ = release
    with pytest.raises(FileNotFoundError, match=r"v1\.0\.0\.csv is not in .*but MS_CXR_Local_Alignment_v1\.1\.0\.csv is"):
        _ = data(release, annotations="MS_CXR_Local_Alignment_v1.0.0.csv").samples
    (root / "MS_CXR_Local_Alignment_v1.1.0.csv").unlink()
    with pytest.raises(FileNotFoundError, match=r"MS_CXR_Local_Alignment_v1\.1\.0\.csv not found.*MS-CXR folder"):
        _ = data(release).samples


def test_missing_image_names_the_row_folder_and_mimic(release):
    root, images = release
    (images / PATHS[TWO_BOXES]).unlink()
    with pytest.raises(FileNotFoundError, match=(
            rf"v1\.1\.0\.csv, line 3: image {TWO_BOXES} not found at {images / PATHS[TWO_BOXES]}.*"
            rf"under {images}\)\. .*MIMIC-CXR-JPG.*PhysioNet")):
        _ = data(release).samples
    with pytest.raises(FileNotFoundError, match=r"image folder .*nowhere does not exist.*MIMIC-CXR-JPG"):
        _ = MSCXR(root=str(root), images_root=str(root / "nowhere")).samples


BAD_ROWS = [  # (row index, changed values, error); the error names the file and the CSV line
    (2, {"image_width": 0}, "image_width must be a positive whole number of pixels; got '0'"),
    (0, {"image_height": -48}, "image_height must be a positive whole number"),
    (4, {"image_width": "64.5"}, "image_width must be a positive whole number"),
    (1, {"w": 0}, r"box x=2, y=34, w=0, h=10 needs w > 0 and h > 0"),
    (5, {"h": "-9.5"}, r"needs w > 0 and h > 0"),
    (6, {"x": "left"}, "x must be a number; got 'left'"),
    (3, {"y": "nan"}, "y must be finite"),
    (2, {"category_name": "Pneumonitis"}, "unknown ms_cxr label spelling 'Pneumonitis'"),
    (6, {"label_text": "  "}, "label_text is empty"),
    (3, {"split": "validation"}, "split is 'validation'; expected one of train, val, test"),
    (4, {"image_height": 50}, rf"image {TWO_BOXES} has image_height 50 here but 48 at line 3"),
    (2, {"path": PATHS[TWO_BOXES]}, rf"image {TWO_FINDINGS} has path '{PATHS[TWO_BOXES]}' here but .* at line 2"),
    (5, {"split": "test"}, rf"image {SAME_FINDING} has split 'test' here but 'val' at line 5"),
]


@pytest.mark.parametrize(("index", "changed", "error"), BAD_ROWS)
def test_bad_row_error_names_file_and_line(tmp_path, index, changed, error):
    rows = [dict(r) for r in ROWS]
    rows[index].update(changed)
    csv_path = write_ms_cxr(tmp_path, rows, size=(WIDTH, HEIGHT))
    with pytest.raises(ValueError, match=error) as raised:
        _ = MSCXR(root=str(tmp_path), split="all").samples
    assert f"{csv_path}, line {index + 2}" in str(raised.value)


def test_missing_column(tmp_path):
    csv_path = write_ms_cxr(tmp_path, ROWS, size=(WIDTH, HEIGHT))
    header, rest = csv_path.read_text().split("\n", 1)
    csv_path.write_text(header.replace(",h,", ",height,") + "\n" + rest)
    with pytest.raises(ValueError, match=r"lacks the column\(s\) \['h'\]"):
        _ = MSCXR(root=str(tmp_path)).samples


def test_boxes_follow_a_resized_copy_of_the_images(tmp_path):
    """Boxes are in the pixels of the size the row states; on a copy of MIMIC-CXR-JPG resized to half
    (32 x 24 files for rows saying 64 x 48) they land where they do on the full-size file."""
    rows = [{**row, "image_width": WIDTH, "image_height": HEIGHT} for row in ROWS]
    write_ms_cxr(tmp_path, rows, size=(WIDTH // 2, HEIGHT // 2))
    dm = MSCXR(root=str(tmp_path), cache=False, num_workers=0, image_size=16, split="all")
    dm.setup("test")
    for index, sample in enumerate(dm.samples):
        item = dm.test_set[index]
        for slot, (_, _, boxes) in enumerate(QUERIES[sample.image_id]):
            halved = Boxes(tuple((x / 2, y / 2, (x + w) / 2, (y + h) / 2) for x, y, w, h in boxes))
            expected = resize_mask(halved.to_mask(HEIGHT // 2, WIDTH // 2)[0], 16, dm.mask_threshold)
            assert torch.equal(item["query_masks"][slot], expected), (sample.image_id, slot)


def test_box_outside_image_is_counted(tmp_path):
    rows = [dict(r) for r in ROWS]
    rows[0].update(x=-2)
    write_ms_cxr(tmp_path, rows, size=(WIDTH, HEIGHT))
    dm = MSCXR(root=str(tmp_path), cache=False, num_workers=0, image_size=32)
    with pytest.warns(UserWarning, match="1 boxes .* reach outside"):
        _ = dm.samples
    assert dm.notes["boxes_outside_image"] == 1
    dm.setup("test")
    item = dm.test_set[0]  # the box is its class's and its query's: clipped once, counted once
    assert item["clipped_shapes"] == 1 and item["query_has_mask"].tolist() == [True, True]


def batches(dm: MSCXR) -> list[dict]:
    dm.setup("test")
    return list(dm.test_dataloader())


def test_batches_carry_the_query_axis_with_and_without_the_cache(release, tmp_path, monkeypatch):
    settings = {"split": "all", "image_size": 32, "num_workers": 0, "batch_size": 3}
    plain = data(release, cache=False, **settings)
    got = batches(plain)
    assert [len(b["image_id"]) for b in got] == [3, 1]
    phrases = plain.phrases
    assert phrases == [ATELECTASIS, CARDIOMEGALY, EFFUSIONS, RIGHT_OPACITY, LEFT_OPACITY]
    for batch in got:
        size = len(batch["image_id"])
        assert batch["query_masks"].shape == (size, 2, 32, 32) and batch["query_masks"].dtype == torch.bool
        for name in ("query_class", "query_phrase"):
            assert batch[name].shape == (size, 2) and batch[name].dtype == torch.int64
        assert batch["query_has_mask"].shape == (size, 2) and batch["query_has_mask"].dtype == torch.bool
        for b, dicom_id in enumerate(batch["image_id"]):
            queries = QUERIES[dicom_id]
            used = len(queries)
            assert batch["query_class"][b].tolist() == [CLASSES.index(k) for _, k, _ in queries] + [-1] * (2 - used)
            assert batch["query_phrase"][b].tolist() == [phrases.index(t) for t, _, _ in queries] + [-1] * (2 - used)
            assert batch["query_has_mask"][b].tolist() == [True] * used + [False] * (2 - used)
            assert not batch["query_lost"][b].any()
            assert not batch["query_masks"][b, used:].any()
            for slot, (_, key, boxes) in enumerate(queries):
                native, clipped = Boxes.from_xywh(boxes).to_mask(HEIGHT, WIDTH)
                assert clipped == 0
                expected = resize_mask(native, 32, plain.mask_threshold)
                assert torch.equal(batch["query_masks"][b, slot], expected), (dicom_id, slot)
            for key in {k for _, k, _ in queries}:  # a class's mask: the union of its phrases' boxes
                union = np.logical_or.reduce([Boxes.from_xywh(bx).to_mask(HEIGHT, WIDTH)[0]
                                              for _, k, bx in queries if k == key])
                c = CLASSES.index(key)
                assert torch.equal(batch["masks"][b, c], resize_mask(union, 32, plain.mask_threshold))
                assert batch["has_mask"][b, c] and batch["labels"][b, c] == 1
            assert batch["labels"][b].tolist().count(-1.0) == len(CLASSES) - len({k for _, k, _ in queries})

    monkeypatch.setenv("XBENCH_CACHE", str(tmp_path / "cache"))
    cached = data(release, cache=True, **settings)
    cached.prepare_data()
    assert cached.cache_folder().is_dir()
    cached.setup("test")
    assert isinstance(cached.test_set, CachedDataset)
    again = batches(cached)
    assert len(again) == len(got)
    for want, have in zip(got, again):
        assert want.keys() == have.keys()
        for name, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, have[name]), name
            else:
                assert value == have[name], name


def test_chosen_classes_keep_their_queries_only(release):
    dm = data(release, split="all", classes=["pleural_effusion", "cardiomegaly"], image_size=32, num_workers=0,
              cache=False, batch_size=4)
    assert dm.phrases == [CARDIOMEGALY, EFFUSIONS] and dm.query_slots == 1
    (batch,) = batches(dm)
    assert batch["query_class"][:, 0].tolist() == [1, 0, -1, 1]
    assert batch["query_phrase"][:, 0].tolist() == [0, 1, -1, 0]
    assert batch["query_has_mask"][:, 0].tolist() == [True, True, False, True]


def test_the_config_builds_the_datamodule(release):
    config = yaml.safe_load((CONFIGS / "data" / "ms_cxr.yaml").read_text())["data"]
    assert config["class_path"] == "xbench.data.ms_cxr.MSCXR"
    root, images = release
    dm = MSCXR(root=str(root), **{**config["init_args"], "images_root": str(images)})
    assert dm.split == "test" and dm.image_ids() == [TWO_FINDINGS, TWO_BOXES, REPEATED_TEXT]
    moved = root.parent / "elsewhere"
    shutil.copytree(images, moved)
    assert MSCXR(root=str(root), images_root=str(moved)).samples[0].path.is_relative_to(moved)
