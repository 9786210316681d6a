"""VinDr-CXR's three readers: each radiologist scored against the other two (``readers: leave_one_out``).

The human run's per-finding Pointing Game, Dice and IoU at τ = 0.5 are recomputed here read by read
from the release-format files' rows with numpy loops: boxes drawn at native size, resized by exact
area coverage (γ, never vanishing), the reader's map binary (1 inside their region), a hit where
the region meets the reference, a constant map (no region, or one covering the frame) a miss.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from contextlib import nullcontext

import numpy as np
import pandas as pd
import pytest

from conftest import only_folder, real_file, run_args
from test_vindr import HEIGHT, WIDTH, ramp, write_dicom, write_physionet
from xbench.data.vindr import VinDrCXR
from xbench.findings import SPELLINGS
from xbench.test import main

SIZE = 24  # the frame: 40 x 56 native pixels into 24 x 24, so the resize matters
# (image, reader, class, xyxy or None): three readers per image; overlapping, disjoint, float,
# tiny (kept by never-vanish), clipped at the border, covering the whole image, and a reader who
# marked nothing.
BOXES = [
    ("r001", "R1", "Cardiomegaly", (10.0, 10.0, 30.0, 20.0)),
    ("r001", "R2", "Cardiomegaly", (20.0, 12.0, 40.0, 24.0)),
    ("r001", "R3", "Cardiomegaly", (12.0, 8.0, 28.0, 22.0)),
    ("r001", "R1", "Nodule/Mass", (2.0, 3.0, 3.5, 4.2)),
    ("r001", "R2", "Nodule/Mass", (50.0, 30.0, 54.0, 36.0)),
    ("r002", "R1", "Pneumothorax", (0.0, 0.0, 56.0, 40.0)),
    ("r002", "R4", "Pneumothorax", (5.0, 5.0, 25.0, 35.0)),
    ("r002", "R5", "Pneumothorax", (15.0, 10.0, 30.0, 30.0)),
    ("r002", "R5", "Pneumothorax", (0.0, 30.0, 10.0, 40.0)),
    ("r002", "R1", "Aortic enlargement", (30.5, 10.2, 33.7, 13.9)),
    ("r002", "R4", "Aortic enlargement", (31.2, 11.0, 35.0, 14.5)),
    ("r003", "R2", "No finding", None),
    ("r003", "R4", "No finding", None),
    ("r003", "R6", "Lung Opacity", (5.0, 5.0, 15.0, 15.0)),
    ("r004", "R1", "Pleural effusion", (-3.0, 30.0, 10.0, 45.0)),
    ("r004", "R2", "Pleural effusion", (0.0, 28.0, 12.0, 40.0)),
    ("r004", "R3", "Pleural effusion", (40.0, 26.0, 56.0, 40.0)),
    ("r004", "R3", "Lung Opacity", (20.0, 10.0, 36.0, 22.0)),
    ("r004", "R2", "Lung Opacity", (24.0, 14.0, 30.0, 30.0)),
]
#: Labels a reader gave without drawing a box (the PhysioNet label file only).
LABEL_ONLY = {("r001", "R3"): {"Pleural effusion"}, ("r004", "R1"): {"Lung Opacity"}}
KAGGLE_IDS = {name: class_id for class_id, name in enumerate(SPELLINGS["vindr_kaggle"])}
READERS = {"r001": ["R1", "R2", "R3"], "r002": ["R1", "R4", "R5"], "r003": ["R2", "R4", "R6"],
           "r004": ["R1", "R2", "R3"]}


def write_images(root):
    (root / "train").mkdir(parents=True, exist_ok=True)
    for seed, image_id in enumerate(READERS):
        write_dicom(root / "train" / f"{image_id}.dicom", ramp(12, 20 + seed), bits_stored=12,
                    monochrome1=seed % 2 == 1)


def positive_names(image_id, reader, layout):
    boxed = {name for i, r, name, box in BOXES if (i, r) == (image_id, reader) and box}
    return boxed | LABEL_ONLY.get((image_id, reader), set()) if layout == "physionet" else boxed


@pytest.fixture(scope="module", params=["physionet", "kaggle"])
def release(request, tmp_path_factory):
    """The train split in its release format: PhysioNet's two CSVs or Kaggle's train.csv, with DICOMs."""
    root = tmp_path_factory.mktemp(f"vindr-{request.param}")
    write_images(root)
    if request.param == "physionet":
        labels = [(i, r, {name: 1 for name in positive_names(i, r, "physionet")}
                   | ({"No finding": 1} if not positive_names(i, r, "physionet") else {}))
                  for i, readers in READERS.items() for r in readers]
        # a reader with no row in the box file still has a label row: every reader of the image gets one
        write_physionet(root, "train", {}, BOXES, labels)
    else:
        rows = [(i, name, KAGGLE_IDS.get(name, 14), r,
                 *(box if box else ("", "", "", ""))) for i, r, name, box in BOXES]
        # Kaggle lists a reader who found nothing as a 'No finding' row
        rows += [(i, "No finding", 14, r, "", "", "", "") for i, readers in READERS.items() for r in readers
                 if not any((b[0], b[1]) == (i, r) for b in BOXES)]
        pd.DataFrame(rows, columns=["image_id", "class_name", "class_id", "rad_id", *"x_min y_min x_max y_max".split()]
                     ).to_csv(root / "train.csv", index=False)
    return request.param, root


# --- the independent recomputation -----------------------------------------------------------------

def draw(boxes, height=HEIGHT, width=WIDTH):
    """Half-open boxes, corners floored, at least one pixel a side, clipped to the image."""
    mask = np.zeros((height, width), bool)
    for x1, y1, x2, y2 in boxes:
        c0, r0 = math.floor(x1), math.floor(y1)
        c1, r1 = max(math.floor(x2), c0 + 1), max(math.floor(y2), r0 + 1)
        for r in range(max(r0, 0), min(r1, height)):
            for c in range(max(c0, 0), min(c1, width)):
                mask[r, c] = True
    return mask


def overlap(source: int, target: int, n_source: int, n_target: int) -> int:
    """Length of source pixel ``source`` inside target pixel ``target``, in units of 1 / (n_source n_target)."""
    lo = max(source * n_target, target * n_source)
    hi = min((source + 1) * n_target, (target + 1) * n_source)
    return max(hi - lo, 0)


def resize(mask, size=SIZE, gamma=0.5):
    """Exact area coverage of each frame pixel, set at >= γ of a pixel; a region never vanishes."""
    height, width = mask.shape
    covered = np.zeros((size, size), np.int64)
    for i in range(size):
        for j in range(size):
            covered[i, j] = sum(overlap(r, i, height, size) * overlap(c, j, width, size)
                                for r in range(height) for c in range(width) if mask[r, c])
    out = covered >= gamma * height * width
    if mask.any() and not out.any():
        out = covered == covered.max()
    return out


def expected_agreement(layout, reference, classes):
    """Per class: the graded reads' Pointing Game, Dice and IoU at 0.5, and the reference positives."""
    boxes = defaultdict(list)
    for image_id, reader, name, box in BOXES:
        if box:
            boxes[image_id, reader, SPELLINGS["vindr"][name]].append(box)
    scores = defaultdict(lambda: defaultdict(list))
    positives, referenced = defaultdict(int), defaultdict(int)
    for image_id, readers in READERS.items():
        for held_out in readers:
            others = [r for r in readers if r != held_out]
            for key in classes:
                drawn = [draw(boxes[image_id, r, key]) for r in others if boxes[image_id, r, key]]
                labelled = sum(key in {SPELLINGS["vindr"][n] for n in positive_names(image_id, r, layout)}
                               for r in others)
                if reference == "union":
                    native = np.any(drawn, axis=0) if drawn else None
                    positives[key] += labelled >= 1
                else:  # both of the two others
                    native = np.all(drawn, axis=0) if len(drawn) == 2 else None
                    positives[key] += labelled == 2
                if native is None:
                    continue
                referenced[key] += 1  # a majority of disjoint boxes is empty: a reference, but no pair
                if not native.any():
                    continue
                truth = resize(native)
                own = resize(draw(boxes[image_id, held_out, key]))
                constant = not own.any() or own.all()
                binary = np.zeros_like(own) if constant else own
                inter, union = (binary & truth).sum(), (binary | truth).sum()
                scores[key]["pointing_game"].append(float(not constant and inter > 0))
                scores[key]["dice@0.5"].append(2 * inter / (binary.sum() + truth.sum()))
                scores[key]["iou@0.5"].append(inter / union)
    return {key: {name: float(np.mean(v)) for name, v in s.items()} | {"pairs": len(s["pointing_game"])}
            for key, s in scores.items()}, dict(positives), dict(referenced)


def readers_args(model, root, results, *extra):
    return run_args(model, "vindr", root, results, "--data.split", "train", "--data.readers", "leave_one_out",
                    "--trainer.logger", "false", *extra, image_size=SIZE)


@pytest.mark.parametrize("reference", ["union", "majority"])
def test_human_agreement_equals_a_read_by_read_recomputation(release, reference, tmp_path):
    layout, root = release
    extra = ["--data.reference", reference]
    runs = {}
    for cache in ("true", "false"):
        runs[cache] = main(readers_args("human", root, tmp_path / f"human-{cache}", *extra, "--data.cache", cache))
    assert runs["true"]["grounding"] == runs["false"]["grounding"]
    human = runs["true"]
    classes = human["classes"]
    expected, positives, referenced = expected_agreement(layout, reference, classes)
    assert expected, "the fixture grades some reads"
    per_class = human["grounding"]["per_class"]
    for key in classes:
        if key not in expected:
            assert not per_class[key]["pairs"], key
            continue
        for name, value in expected[key].items():
            assert per_class[key][name] == pytest.approx(value, abs=1e-9), (key, name)
    assert {key: v["positives"] for key, v in human["classification"]["per_class"].items()} == positives
    folder = only_folder(tmp_path / "human-true")
    metrics = json.loads((folder / "metrics.json").read_text())
    name = "vindr-readers" + ("-majority" if reference == "majority" else "")
    assert metrics["model"] == f"human:{name}" and metrics["human"] is True and metrics["reader_set"]["name"] == name
    notes = metrics["data"]["notes"]
    assert notes["reads"] == 12 and notes["images"] == 4 and notes["reference"] == reference
    assert {key: c["reads"] for key, c in notes["reads_with_reference"].items() if c["reads"]} == referenced

    # a model on the same options: the same reads, the same references, row for row
    oracle = main(readers_args("oracle", root, tmp_path / "oracle", *extra))
    assert {k: v["pairs"] for k, v in oracle["grounding"]["per_class"].items()} == \
        {k: v["pairs"] for k, v in per_class.items()}
    assert all(v["pointing_game"] == 1 for v in oracle["grounding"]["per_class"].values() if v["pairs"])
    columns = ["image_index", "image_id", "class", "label", "graded", "region_px"]
    rows = [pd.read_csv(only_folder(tmp_path / run) / "pairs.csv.gz")[columns]
            for run in ("human-true", "oracle")]
    pd.testing.assert_frame_equal(*rows)
    assert sorted(set(rows[0]["image_id"])) == sorted(f"{i}#{r}" for i, readers in READERS.items() for r in readers)


def test_one_reader_and_its_marks(release):
    layout, root = release
    dm = VinDrCXR(root=str(root), split="train", readers="leave_one_out", reader="R4", image_size=SIZE)
    with pytest.warns(UserWarning, match="does not annotate") if layout == "kaggle" else nullcontext():
        samples = dm.samples
    assert [s.image_id for s in samples] == ["r002#R4", "r003#R4"] and dm.reads
    readers = dm.reader_set()
    assert readers.name == "vindr-R4" and set(readers.marks) == {"r002#R4", "r003#R4"}
    mark = readers.marks["r002#R4"]["pneumothorax"]
    assert mark.label == 1 and mark.region.xyxy == ((5.0, 5.0, 25.0, 35.0),)
    assert readers.marks["r003#R4"] == {}  # R4 found nothing on r003
    # r002's reference for R4: the union of R1's (the whole image) and R5's two boxes
    assert samples[0].regions["pneumothorax"].xyxy == ((0.0, 0.0, 56.0, 40.0), (15.0, 10.0, 30.0, 30.0),
                                                       (0.0, 30.0, 10.0, 40.0))
    assert dm.notes["reader"] == "R4" and dm.notes["reader_ids"] == ["R4"]


def test_real_kaggle_leave_one_out_indexing(real_data, tmp_path):
    """The real Kaggle train annotations: 15,000 images x 3 readers = 45,000 reads, each read's
    reference made of exactly the other two readers' boxes, the counts per finding as pandas counts."""
    with gzip.open(real_file(real_data, "vindr/kaggle_train.csv.gz"), "rt") as handle:
        (tmp_path / "train.csv").write_text(handle.read())
    raw = pd.read_csv(tmp_path / "train.csv")
    (tmp_path / "train").mkdir()
    for image_id in raw["image_id"].unique():
        (tmp_path / "train" / f"{image_id}.dicom").touch()  # never decoded by the index

    dm = VinDrCXR(root=str(tmp_path), split="train", readers="leave_one_out")
    with pytest.warns(UserWarning, match="does not annotate"):
        samples = dm.samples
    readers = dm.reader_set()
    image_readers = raw.groupby("image_id")["rad_id"].unique()
    expected_ids = {f"{image_id}#{reader}" for image_id, found in image_readers.items() for reader in found}
    assert len(samples) == 45000 and {s.image_id for s in samples} == expected_ids
    assert set(readers.marks) == expected_ids and readers.name == "vindr-readers"
    assert dm.notes["reader_ids"] == sorted(raw["rad_id"].unique(), key=lambda r: int(r[1:])) and len(
        dm.notes["reader_ids"]) == 17

    boxed = raw[raw["class_name"] != "No finding"].copy()
    boxed["key"] = boxed["class_name"].map(SPELLINGS["vindr_kaggle"])
    boxed["xyxy"] = list(zip(boxed.x_min, boxed.y_min, boxed.x_max, boxed.y_max))
    boxed = boxed[(boxed.x_max > boxed.x_min) & (boxed.y_max > boxed.y_min)]
    by_reader = boxed.groupby(["image_id", "key", "rad_id"])["xyxy"].apply(sorted).to_dict()
    for sample in samples:
        image_id, held_out = sample.image_id.split("#")
        others = set(image_readers[image_id]) - {held_out}
        assert len(others) == 2
        for key, region in sample.regions.items():
            expected = sorted(box for r in others for box in by_reader.get((image_id, key, r), []))
            assert sorted(region.xyxy) == expected, sample.image_id
        for key, mark in readers.marks[sample.image_id].items():
            assert sorted(mark.region.xyxy) == by_reader[image_id, key, held_out] and mark.label == 1

    # per finding: the reads graded (the reference has a box), their radiographs and held-out readers
    image_class = boxed.groupby(["image_id", "key"])["rad_id"].unique()
    counts = defaultdict(lambda: {"reads": 0, "radiographs": set(), "readers": set()})
    for (image_id, key), markers in image_class.items():
        for held_out in image_readers[image_id]:
            if set(markers) - {held_out}:  # another reader boxed it
                counts[key]["reads"] += 1
                counts[key]["radiographs"].add(image_id)
                counts[key]["readers"].add(held_out)
    expected = {key: {"reads": c["reads"], "radiographs": len(c["radiographs"]), "readers": len(c["readers"])}
                for key, c in counts.items()}
    graded = {key: c for key, c in dm.notes["reads_with_reference"].items() if c["reads"]}
    assert graded == expected and len(graded) == 14
    assert dm.notes["reads"] == 45000 and dm.notes["images"] == 15000
