"""RSNA Pneumonia Detection Challenge: ``stage_2_train_labels.csv`` + one DICOM per patientId.

The label file has one row per box (``patientId,x,y,width,height,Target``; ``x, y`` the top-left
corner, in pixels of the 1024x1024 DICOM, written as floats) and one row with empty coordinates
and ``Target=0`` per negative image. An image's mask is the union of its boxes.

Images are found by file stem anywhere below ``root``: the Kaggle layout names them
``stage_2_train_images/<patientId>.dcm``; the RSNA/MD.ai release nests them as
``<study>/<series>/<SOPInstanceUID>.dcm``, which the split file's ``img_path`` names.

The benchmark split is MedKLIP's and MAVL's test list (``ID,img_path,boxes,classes``; 5,337
images, 1,218 positive): it selects images, and its labels and boxes must agree with the label file.
"""

from __future__ import annotations

import math
from pathlib import PurePosixPath

from xbench.data.annotation_files import read_csv_rows, split_file_path
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.io import files_by_stem
from xbench.data.regions import Boxes

LABELS_FILE = "stage_2_train_labels.csv"
CLASS = "pneumonia"


class RSNAPneumonia(XBenchDataModule):
    """RSNA pneumonia boxes; ``split_file`` (MAVL's test list) selects the benchmark split, none
    means every image of the label file.

    Args:
        root: the folder holding ``stage_2_train_labels.csv`` and the DICOMs (any nesting).
        split_file: a ``ID,img_path,boxes,classes`` list, relative to ``root`` or absolute.
    """

    name = "rsna"

    def __init__(self, root: str, split_file: str | None = None, **kwargs) -> None:
        super().__init__(root=root, **kwargs)
        self.split_file = split_file

    def index(self) -> list[Sample]:
        labels_path = self.require(self.root / LABELS_FILE, f"the Kaggle label file {LABELS_FILE}")
        targets, boxes, label_rows = read_labels(labels_path)
        dicoms = files_by_stem(self.root)
        if self.split_file is None:
            selected = [(patient, None, str(labels_path)) for patient in targets]
        else:
            split_path = self.require(
                split_file_path(self.root, self.split_file),
                "the split file (MAVL's data/rsna/test.csv; or set data.split_file)",
            )
            selected = self._read_split(split_path, targets, boxes)
        samples = []
        for patient, mdai_stem, where in selected:
            path = dicoms.get(patient) or (mdai_stem and dicoms.get(mdai_stem))
            if not path:
                looked = f"{patient}.dcm" + (f" or {mdai_stem}.dcm (the MD.ai tree)" if mdai_stem else "")
                raise FileNotFoundError(
                    f"{where}: no DICOM for patientId {patient} below {self.root} (looked for {looked}). "
                    "Put the images (Kaggle stage_2_train_images/ or the MD.ai tree) under data.root."
                )
            found = boxes.get(patient, [])
            samples.append(
                Sample(
                    image_id=patient,
                    path=path,
                    labels={CLASS: targets[patient]},
                    regions={CLASS: Boxes.from_xywh(found)} if found else {},
                )
            )
        self.notes.update(
            label_rows=label_rows,
            images_in_label_file=len(targets),
            images=len(samples),
            positive_images=sum(sample.labels[CLASS] for sample in samples),
            boxes=sum(len(boxes.get(sample.image_id, [])) for sample in samples),
        )
        return samples

    def _read_split(self, path, targets, boxes) -> list[tuple[str, str, str]]:
        """(patientId, MD.ai file stem, where) per unique split row; checked against the labels."""
        selected, seen, repeated = [], set(), 0
        for line, row in read_csv_rows(path, ("ID", "img_path", "boxes", "classes")):
            where = f"{path}, line {line}"
            patient = row["ID"]
            if patient not in targets:
                raise ValueError(f"{where}: patientId {patient} is not in {LABELS_FILE}; the split file does not belong to this release")
            if row["classes"] not in ("0", "1") or int(row["classes"]) != targets[patient]:
                raise ValueError(f"{where}: classes={row['classes']!r} but {LABELS_FILE} has Target={targets[patient]} for {patient}")
            split_boxes = parse_split_boxes(row["boxes"], where)
            if sorted(split_boxes) != sorted(boxes.get(patient, [])):
                raise ValueError(f"{where}: boxes {split_boxes} differ from {LABELS_FILE}'s {boxes.get(patient, [])} for {patient}")
            if patient in seen:
                repeated += 1
                continue
            seen.add(patient)
            stem = PurePosixPath(row["img_path"]).stem if row["img_path"] else None
            selected.append((patient, stem, where))
        self.notes.update(split_file=str(path), split_rows_merged=repeated)
        return selected


def read_labels(path) -> tuple[dict[str, int], dict[str, list[tuple[float, ...]]], int]:
    """``stage_2_train_labels.csv`` -> Target per patientId (file order), xywh boxes of positives,
    and the number of rows."""
    targets: dict[str, int] = {}
    boxes: dict[str, list[tuple[float, ...]]] = {}
    rows = 0
    for line, row in read_csv_rows(path, ("patientId", "x", "y", "width", "height", "Target")):
        rows += 1
        where = f"{path}, line {line}"
        patient, target = row["patientId"], row["Target"]
        if target not in ("0", "1"):
            raise ValueError(f"{where}: Target must be 0 or 1, got {target!r}")
        coordinates = [row[key] for key in ("x", "y", "width", "height")]
        if target == "0":
            if any(coordinates):
                raise ValueError(f"{where}: a negative row (Target=0) must leave x,y,width,height empty; got {coordinates}")
        else:
            boxes.setdefault(patient, []).append(_box(coordinates, where))
        if targets.setdefault(patient, int(target)) != int(target):
            raise ValueError(f"{where}: patientId {patient} has rows with Target 0 and rows with Target 1")
    return targets, boxes, rows


def parse_split_boxes(text: str, where: str) -> list[tuple[float, ...]]:
    """MAVL's ``x;y;w;h|x;y;w;h`` (empty or ``nan`` for a negative) -> xywh tuples."""
    if text in ("", "nan"):
        return []
    return [_box(box.split(";"), where) for box in text.split("|")]


def _box(values: list[str], where: str) -> tuple[float, ...]:
    try:
        x, y, width, height = (float(value) for value in values)
    except ValueError:
        raise ValueError(f"{where}: a box needs four numbers x, y, width, height; got {values}") from None
    if not all(math.isfinite(v) for v in (x, y, width, height)) or width <= 0 or height <= 0:
        raise ValueError(f"{where}: box {values} needs finite values and positive width and height")
    return (x, y, width, height)
