"""MS-CXR (Microsoft; PhysioNet, credentialed access): report phrases grounded by boxes on
MIMIC-CXR-JPG radiographs.

The release is one CSV, ``MS_CXR_Local_Alignment_v1.1.0.csv`` (``..._v1.0.0.csv``: the same
without the ``split`` column), one row per box: ``dicom_id, category_name, label_text, path, x, y,
w, h, image_width, image_height[, split]``. ``path`` is relative to the MIMIC-CXR-JPG folder
(``files/p10/p10000032/s50414267/<dicom_id>.jpg``); MS-CXR ships no images. A box ``x, y, w, h``
is in pixels of its image, whose size the row states (``image_width x image_height``): boxes are
drawn on that grid scaled to the decoded image ([`GridBoxes`][xbench.data.regions.GridBoxes]),
exactly as given on MIMIC-CXR-JPG's full-size files, and in place on a resized copy of them. The
rows with the same ``(dicom_id, category_name, label_text)`` are the boxes of one phrase.

Every image is one sample, in the order of its first row in the file. Its queries are its phrases
in file order, each a [`Query`][xbench.data.queries.Query] (``label_text``, the finding of
``category_name``, all the phrase's boxes as one region); its region
for a finding is the union of the boxes of that finding's phrases.

Labels: 1 for each finding with a phrase on the image. MS-CXR does not assert absences -- an image
carries the phrases chosen for it, not a full reading -- so every other finding is unknown (-1)
and left out of the classification metrics (which, with positives only, report NaN AUROC: MS-CXR
is a grounding set).
"""

from __future__ import annotations

import csv
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from xbench.data.annotation_files import read_csv_rows, split_file_path
from xbench.files import open_text
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.queries import Query
from xbench.data.regions import Boxes, GridBoxes
from xbench.findings import finding_key

RELEASE_FILE = "MS_CXR_Local_Alignment_v1.1.0.csv"
#: What the release files are called, in every version (v1.0.0 and v1.1.0).
RELEASE_PATTERN = "MS_CXR_Local_Alignment_v*.csv"
COLUMNS = ("dicom_id", "category_name", "label_text", "path", "x", "y", "w", "h", "image_width", "image_height")
SPLITS = ("train", "val", "test")
IMAGES_HINT = (
    "MS-CXR ships the boxes only; the images are MIMIC-CXR-JPG's (PhysioNet, credentialed access): point "
    "`data.images_root` at the MIMIC-CXR-JPG folder that holds files/p10/... (its version folder, e.g. "
    "physionet.org/files/mimic-cxr-jpg/2.0.0)."
)


@dataclass
class _Image:
    """What the rows of one image must agree on, and where it first appears."""

    line: int
    path: str
    width: int
    height: int
    split: str
    phrases: dict[tuple[str, str], list[tuple[float, float, float, float]]] = field(default_factory=dict)


class MSCXR(XBenchDataModule):
    """MS-CXR phrase grounding; ``split="test"`` of the v1.1.0 release is the benchmark split.

    Args:
        root: the MS-CXR folder, holding the release CSV.
        images_root: the MIMIC-CXR-JPG folder the CSV's ``path`` column is relative to (default:
            ``root``).
        annotations: the release CSV, relative to ``root`` or absolute (v1.1.0 by default; v1.0.0
            has no ``split`` column and is read with ``split="all"``).
        split: the rows whose ``split`` is ``test``, ``val`` or ``train``; ``all``: every row.
    """

    name = "ms_cxr"

    def __init__(
        self,
        root: str,
        images_root: str | None = None,
        annotations: str = RELEASE_FILE,
        split: Literal["test", "val", "train", "all"] = "test",
        **kwargs,
    ) -> None:
        super().__init__(root=root, **kwargs)
        if split not in (*SPLITS, "all"):
            raise ValueError(f"--data.split must be one of test, val, train, all; got {split!r}")
        self.images_root = Path(images_root).expanduser() if images_root is not None else self.root
        self.annotations = annotations
        self.split = split

    def index(self) -> list[Sample]:
        path = self._release_file()
        has_split = "split" in _header(path)
        if self.split != "all" and not has_split:
            raise ValueError(
                f"MSCXR: {path} has no split column (the v1.0.0 layout), so split {self.split!r} cannot be "
                f"selected. Read the v1.1.0 release ({RELEASE_FILE}, with train/val/test; --data.annotations), "
                "or every row of this file with --data.split all."
            )
        images = self._read_rows(path, has_split)
        selected = {dicom_id: image for dicom_id, image in images.items() if self.split in ("all", image.split)}
        if not selected:
            found = sorted({image.split for image in images.values()})
            raise ValueError(f"MSCXR: {path} has no rows of split {self.split!r} (its splits: {found})")
        if not self.images_root.is_dir():
            raise FileNotFoundError(f"MSCXR: the image folder {self.images_root} does not exist. {IMAGES_HINT}")
        supported = self.supported_classes()
        samples = []
        for dicom_id, image in selected.items():
            image_path = self.images_root / image.path
            if not image_path.is_file():
                raise FileNotFoundError(
                    f"{path}, line {image.line}: image {dicom_id} not found at {image_path} (the row's path "
                    f"{image.path} under {self.images_root}). {IMAGES_HINT}"
                )
            stated = f"{path}, line {image.line} (image_width x image_height of {dicom_id}, {image_path})"
            on_grid = lambda boxes: GridBoxes(boxes, image.height, image.width, stated)  # noqa: E731
            phrase_boxes = {(key, text): Boxes.from_xywh(boxes) for (key, text), boxes in image.phrases.items()}
            queries = tuple(Query(text, key, on_grid(boxes)) for (key, text), boxes in phrase_boxes.items())
            regions: dict[str, list] = {}
            for (key, _), boxes in phrase_boxes.items():
                regions.setdefault(key, []).extend(boxes.xyxy)
            samples.append(
                Sample(
                    image_id=dicom_id,
                    path=image_path,
                    labels={key: 1 if key in regions else -1 for key in supported},
                    regions={key: on_grid(Boxes(tuple(boxes))) for key, boxes in regions.items()},
                    queries=queries,
                )
            )
        self._note(path, samples, selected)
        return samples

    def _release_file(self) -> Path:
        """The annotation CSV; when it is missing, an error naming the release files that are there."""
        path = split_file_path(self.root, self.annotations)
        if path.is_file():
            return path
        others = sorted(p.name for p in path.parent.glob(RELEASE_PATTERN)) if path.parent.is_dir() else []
        if others:
            without_split = [name for name in others if "v1.0" in name]
            also = (f" ({', '.join(without_split)} has no split column: read it with --data.split all)"
                    if without_split else "")
            raise FileNotFoundError(
                f"MSCXR: the annotation file {path.name} is not in {path.parent}, but {', '.join(others)} is: "
                f"give --data.annotations {others[-1]}{also}, or put {path.name} there."
            )
        raise FileNotFoundError(
            f"MSCXR: the annotation file {path} not found. Point `data.root` at the MS-CXR folder as downloaded "
            f"from PhysioNet (it holds {RELEASE_FILE}), or name the file with --data.annotations."
        )

    def _read_rows(self, path: Path, has_split: bool) -> dict[str, _Image]:
        """Every row of the file, checked, grouped by image (file order) and by phrase (file order)."""
        images: dict[str, _Image] = {}
        columns = (*COLUMNS, "split") if has_split else COLUMNS
        for line, row in read_csv_rows(path, columns):
            where = f"{path}, line {line}"
            dicom_id = row["dicom_id"]
            if not dicom_id:
                raise ValueError(f"{where}: dicom_id is empty")
            key = finding_key(self.vocabulary_name(), row["category_name"], source=where)
            text = row["label_text"]
            if not text:
                raise ValueError(f"{where}: label_text is empty; every box of MS-CXR belongs to a report phrase")
            if not row["path"]:
                raise ValueError(f"{where}: path is empty; it names the image under the MIMIC-CXR-JPG folder")
            split = row["split"] if has_split else "all"
            if has_split and split not in SPLITS:
                raise ValueError(f"{where}: split is {split!r}; expected one of {', '.join(SPLITS)}")
            width, height = (_pixels(row, name, where) for name in ("image_width", "image_height"))
            box = _box(row, where)
            image = images.setdefault(dicom_id, _Image(line, row["path"], width, height, split))
            for name, value, first in (
                ("path", row["path"], image.path),
                ("image_width", width, image.width),
                ("image_height", height, image.height),
                ("split", split, image.split),
            ):
                if value != first:
                    raise ValueError(
                        f"{where}: image {dicom_id} has {name} {value!r} here but {first!r} at line {image.line}; "
                        "the rows of one image must agree"
                    )
            image.phrases.setdefault((key, text), []).append(box)
        return images

    def _note(self, path: Path, samples: list[Sample], images: dict[str, _Image]) -> None:
        boxes = [box for sample in samples for query in sample.queries for box in query.region.boxes.xyxy]
        outside = sum(
            1
            for image in images.values()
            for found in image.phrases.values()
            for x, y, w, h in found
            if x < 0 or y < 0 or x + w > image.width or y + h > image.height
        )
        phrases = Counter(query.finding for sample in samples for query in sample.queries)
        self.notes.update(
            release_file=path.name,
            split=self.split,
            images=len(samples),
            phrases=sum(phrases.values()),
            boxes=len(boxes),
            phrases_per_finding={key: phrases[key] for key in self.supported_classes()},
            distinct_phrase_texts=len({query.text for sample in samples for query in sample.queries}),
            boxes_outside_image=outside,
            absences="not asserted: a finding without a phrase on an image is unknown (-1)",
        )
        if outside:
            warnings.warn(
                f"MSCXR: {outside} boxes in {path} reach outside their image_width x image_height; they are "
                "clipped at the border and counted in the results' clipped shapes",
                stacklevel=3,
            )


def _header(path: Path) -> list[str]:
    with open_text(path) as handle:
        return [name.strip() for name in next(csv.reader(handle), [])]


def _number(row: dict[str, str], name: str, where: str) -> float:
    try:
        value = float(row[name])
    except ValueError:
        raise ValueError(f"{where}: {name} must be a number; got {row[name]!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{where}: {name} must be finite; got {row[name]!r}")
    return value


def _pixels(row: dict[str, str], name: str, where: str) -> int:
    value = _number(row, name, where)
    if value <= 0 or value != int(value):
        raise ValueError(f"{where}: {name} must be a positive whole number of pixels; got {row[name]!r}")
    return int(value)


def _box(row: dict[str, str], where: str) -> tuple[float, float, float, float]:
    x, y, w, h = (_number(row, name, where) for name in ("x", "y", "w", "h"))
    if w <= 0 or h <= 0:
        raise ValueError(f"{where}: box x={row['x']}, y={row['y']}, w={row['w']}, h={row['h']} needs w > 0 and h > 0")
    return (x, y, w, h)
