"""VinDr-CXR: clinical DICOMs with boxes by one or several radiologists per image.

Two layouts are read, found from what ``root`` holds:

- PhysioNet 1.0.0: ``{train,test}/<image_id>.dicom``, ``annotations/annotations_{train,test}.csv``
  (``image_id, [rad_id,] class_name, x_min, y_min, x_max, y_max``) and
  ``annotations/image_labels_{train,test}.csv`` (one 0/1 column per label; train has a row per
  radiologist, test one consensus row and spells ``Other disease`` where train has ``Other
  diseases``). Labels come from the image-label file, regions from the boxes.
- Kaggle (VinBigData competition): ``train.csv`` + ``train/<image_id>.dicom``, train split only,
  14 of the 22 local labels; labels come from the boxes, the 8 others are unknown (-1).

Boxes are xyxy floats in the native pixel grid; ``No finding`` rows carry no box. The test split
has one consensus reader (its label file has no ``rad_id``, so every test box is the consensus's,
whatever ``rad_id`` the box file gives); the train split has three per image, merged by
``readers``: ``union`` (any radiologist) or ``majority`` (more than half of the image's
radiologists, for labels and pixel by pixel for regions). Images are decoded by
`xbench.data.io.read_dicom` (MONOCHROME1, 10-16 bit, JPEG 2000).

``readers: leave_one_out`` scores the radiologists against each other: one sample per read (image,
radiologist; sample id `xbench.reads.read_id`), whose reference (labels and regions) is the image's
other radiologists merged by ``reference``, and whose reader under test (`reader_set`) is the
radiologist left out. A model run on the same options gets the same samples and references, so its
results pair with the human run's read by read.
"""

from __future__ import annotations

import csv
import math
import os
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Literal

from xbench.data.annotation_files import read_csv_rows
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.readers import ReaderMark, ReaderSet
from xbench.data.regions import Boxes, MajorityVote
from xbench.files import open_text
from xbench.findings import SPELLINGS, finding_key
from xbench.reads import read_id

NO_FINDING = "No finding"
#: Image-label columns that are global (image-level) labels, not local findings with boxes.
GLOBAL_LABELS = ("COPD", "Lung tumor", "Pneumonia", "Tuberculosis", "Other disease", "Other diseases", NO_FINDING)
BOX_COLUMNS = ("x_min", "y_min", "x_max", "y_max")
#: The reader of a file without ``rad_id`` (the test split's consensus).
CONSENSUS = "consensus"
LEAVE_ONE_OUT = "leave_one_out"
MERGES = ("union", "majority")


class VinDrCXR(XBenchDataModule):
    """VinDr-CXR; ``split="test"`` (3,000 images, consensus of 5 radiologists) is the benchmark split.

    Args:
        split: ``test`` or ``train`` (the Kaggle layout has only ``train``).
        readers: how the train split's radiologists make the reference: ``union`` or ``majority``
            (one sample per image), or ``leave_one_out`` (one sample per read, train split only).
        reference: with ``leave_one_out``, how the other radiologists of the image are merged into a
            read's reference: ``union`` (the default: either of the two; their majority, both of
            the two, leaves a finding without a reference wherever the two disagree, so it grades
            about half the reads, only findings both others saw) or ``majority``.
        reader: with ``leave_one_out``, only this radiologist's reads (``R8``); default all.
    """

    name = "vindr"

    def __init__(
        self,
        root: str,
        split: Literal["test", "train"] = "test",
        readers: Literal["union", "majority", "leave_one_out"] = "union",
        reference: Literal["union", "majority"] | None = None,
        reader: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(root=root, **kwargs)
        if readers not in (*MERGES, LEAVE_ONE_OUT):
            raise ValueError(f"--data.readers must be 'union', 'majority' or 'leave_one_out'; got {readers!r}")
        if readers != LEAVE_ONE_OUT:
            for option, value in (("reference", reference), ("reader", reader)):
                if value is not None:
                    raise ValueError(f"--data.{option} {value} applies only to --data.readers leave_one_out "
                                     f"(the readers are {readers!r}); drop it or choose leave_one_out")
        elif split != "train":
            raise ValueError("--data.readers leave_one_out needs --data.split train: the test split has one "
                             "consensus reader per image, so no radiologist has another to be scored against")
        reference = reference or ("union" if readers == LEAVE_ONE_OUT else None)
        if reference is not None and reference not in MERGES:
            raise ValueError(f"--data.reference must be 'union' or 'majority'; got {reference!r}")
        self.split = split
        self.readers = readers
        self.reference = reference
        self.reader = reader
        self.reads = readers == LEAVE_ONE_OUT
        self._marks: dict[str, dict[str, ReaderMark]] = {}

    def index(self) -> list[Sample]:
        if (self.root / "annotations").is_dir():
            layout, spelling_set = "physionet", self.name
            box_file = self.require(self.root / "annotations" / f"annotations_{self.split}.csv", "the box file")
            label_file = self.require(
                self.root / "annotations" / f"image_labels_{self.split}.csv", "the image-label file"
            )
        elif (self.root / "train.csv").is_file():
            if self.split != "train":
                raise ValueError(
                    f"VinDrCXR: {self.root} is the Kaggle layout (train.csv), which has only the train split; "
                    "use split: train, or the PhysioNet download for the test split."
                )
            layout, spelling_set, box_file, label_file = "kaggle", "vindr_kaggle", self.root / "train.csv", None
        else:
            raise FileNotFoundError(
                f"VinDrCXR: {self.root} holds neither annotations/ (PhysioNet) nor train.csv (Kaggle). Point "
                "`data.root` at the folder with those files."
            )
        image_dir = self.require(self.root / self.split, f"the image folder {self.split}/")
        annotated = set(SPELLINGS[spelling_set].values())
        if label_file is not None:
            positives, readers, per_reader = self._read_labels(label_file)
            boxes, box_readers, skipped = self._read_boxes(box_file, spelling_set, per_reader)
            self._check_readers(box_readers, readers, label_file)
        else:
            boxes, readers, skipped = self._read_boxes(box_file, spelling_set, per_reader=True)
            positives = defaultdict(lambda: defaultdict(set))
            for image_id, by_class in boxes.items():
                for key, by_reader in by_class.items():
                    for reader in by_reader:
                        positives[image_id][reader].add(key)
        source = label_file or box_file
        if self.reader is not None:
            self._check_reader(readers, source)
        present = set(os.listdir(image_dir))
        merge = MergeReaders(self.supported_classes(), annotated)
        samples, reads, single = [], [], 0
        self._marks = {}
        for image_id, image_readers in readers.items():
            if f"{image_id}.dicom" not in present:
                raise FileNotFoundError(
                    f"{source}, line {min(image_readers.values())}: image {image_id} has no file "
                    f"{image_dir / image_id}.dicom. Download the {self.split}/ folder of VinDr-CXR into {self.root}."
                )
            path = image_dir / f"{image_id}.dicom"
            image_positives, image_boxes = positives.get(image_id, {}), boxes.get(image_id, {})
            if not self.reads:
                labels, regions = merge(self.readers, list(image_readers), image_positives, image_boxes)
                samples.append(Sample(image_id=image_id, path=path, labels=labels, regions=regions))
                continue
            if len(image_readers) < 2:
                single += 1
                continue
            for held_out in image_readers:
                if self.reader is not None and held_out != self.reader:
                    continue
                others = [reader for reader in image_readers if reader != held_out]
                labels, regions = merge(self.reference, others, image_positives, image_boxes)
                try:
                    sample_id = read_id(image_id, held_out)
                except ValueError as error:
                    raise ValueError(f"{source}, line {image_readers[held_out]}: {error}; rename the reader or "
                                     "the image in the file") from None
                samples.append(Sample(image_id=sample_id, path=path, labels=labels, regions=regions))
                reads.append((image_id, held_out))
                self._marks[sample_id] = merge.marks(held_out, image_positives, image_boxes)
        if single:
            warnings.warn(f"VinDrCXR: skipped {single} images of {source} read by one radiologist only: "
                          "leave_one_out has no other reader to score them against", stacklevel=2)
        if not annotated >= set(self.classes):
            warnings.warn(
                f"VinDrCXR: the Kaggle layout does not annotate {sorted(set(self.classes) - annotated)}; their labels "
                "are unknown and they have no regions.",
                stacklevel=2,
            )
        self._note(samples, layout, source, readers, skipped, annotated)
        if self.reads:
            self._note_reads(samples, reads, single)
        return samples

    def reader_set(self) -> ReaderSet | None:
        """With ``readers: leave_one_out``, the radiologist left out of each read: their boxes and
        labels, scored against the other radiologists'; otherwise ``None``."""
        if not self.reads:
            return None
        _ = self.samples  # the marks are read with the samples
        name = f"vindr-{self.reader or 'readers'}" + ("-majority" if self.reference == "majority" else "")
        who = f"radiologist {self.reader}" if self.reader else "each radiologist"
        others = "the union" if self.reference == "union" else "the majority (both)"
        rule = (f"VinDr-CXR train: {who}, on every image they read, against {others} of the image's other "
                "radiologists' labels and boxes")
        return ReaderSet(name=name, rule=rule, marks=self._marks)

    def _check_reader(self, readers: dict[str, dict[str, int]], source: Path) -> None:
        present = {reader for image_readers in readers.values() for reader in image_readers}
        if self.reader not in present:
            raise ValueError(
                f"--data.reader {self.reader!r} read no image of {source}; the readers present are "
                f"{', '.join(sorted(present, key=reader_order))}. Choose one of them, or drop the option "
                "to score every reader."
            )

    def _read_boxes(self, box_file: Path, spelling_set: str, per_reader: bool):
        """``image -> key -> reader -> [xyxy]`` and ``image -> reader -> first line``, in file order;
        boxes of zero width or height skipped and counted; an inverted box is an error naming its line.

        Without ``per_reader`` (the test split, whose labels are one consensus row per image) every
        box belongs to the consensus, whatever its ``rad_id``.
        """
        boxes: dict[str, dict[str, dict[str, list]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
        readers: dict[str, dict[str, int]] = defaultdict(dict)
        skipped = 0
        columns = ["image_id", "class_name", *BOX_COLUMNS, *(["rad_id"] if per_reader else [])]
        for line, row in read_csv_rows(box_file, columns):
            where = f"{box_file}, line {line}"
            image_id, class_name = row["image_id"], row["class_name"]
            reader = row["rad_id"] if per_reader else CONSENSUS
            readers[image_id].setdefault(reader, line)
            corners = [row[name] for name in BOX_COLUMNS]
            if class_name == NO_FINDING:
                if any(corners):
                    raise ValueError(f"{where}: a 'No finding' row must have empty coordinates, got {corners}")
                continue
            key = finding_key(spelling_set, class_name, source=where)
            try:
                x1, y1, x2, y2 = (float(v) for v in corners)
            except ValueError:
                raise ValueError(
                    f"{where}: {class_name!r} needs numeric {', '.join(BOX_COLUMNS)}, got {corners}"
                ) from None
            if not all(map(math.isfinite, (x1, y1, x2, y2))):
                raise ValueError(f"{where}: box {corners} is not finite")
            if x2 < x1 or y2 < y1:
                raise ValueError(f"{where}: box {corners} is inverted (x_max < x_min or y_max < y_min); correct the row")
            if x2 == x1 or y2 == y1:
                skipped += 1
                continue
            boxes[image_id][key][reader].append((x1, y1, x2, y2))
        if skipped:
            warnings.warn(f"VinDrCXR: skipped {skipped} boxes of zero width or height in {box_file}", stacklevel=3)
        return boxes, readers, skipped

    def _read_labels(self, label_file: Path):
        """``image -> reader -> the keys that reader labelled 1``; ``image -> reader -> line``; whether
        the file has a row per reader (``rad_id``) or one consensus row per image (the test split's)."""
        positives: dict[str, dict[str, set]] = defaultdict(dict)
        readers: dict[str, dict[str, int]] = defaultdict(dict)
        with open_text(label_file) as handle:
            rows = csv.reader(handle)
            header = next(rows, [])
            if not header or header[0] != "image_id":
                raise ValueError(f"{label_file}: expected a header starting with image_id, got {header[:3]}")
            per_reader = len(header) > 1 and header[1] == "rad_id"
            first = 2 if per_reader else 1
            columns = {}
            for i, name in enumerate(header[first:], start=first):
                if name.strip() not in GLOBAL_LABELS:
                    columns[i] = finding_key(self.name, name, source=f"{label_file}, header")
            missing = set(self.supported_classes()) - set(columns.values())
            if missing:
                raise ValueError(f"{label_file}: no column for {sorted(missing)}")
            for line, row in enumerate(rows, start=2):
                where = f"{label_file}, line {line}"
                if len(row) != len(header):
                    raise ValueError(f"{where}: {len(row)} fields, the header has {len(header)}")
                image_id = row[0].strip()
                reader = row[1].strip() if per_reader else CONSENSUS
                if reader in readers[image_id]:
                    raise ValueError(f"{where}: a second row for image {image_id}, reader {reader}")
                readers[image_id][reader] = line
                positives[image_id][reader] = found = set()
                for i, key in columns.items():
                    value = row[i].strip()
                    if value not in ("0", "1", "0.0", "1.0"):
                        raise ValueError(f"{where}: {header[i]} is {row[i]!r}; expected 0 or 1")
                    if value.startswith("1"):
                        found.add(key)
        return positives, readers, per_reader

    @staticmethod
    def _check_readers(box_readers: dict, label_readers: dict, label_file: Path) -> None:
        """Every (image, reader) with boxes has its label row: both files are of the same split."""
        for image_id, image_readers in box_readers.items():
            unlabelled = set(image_readers) - set(label_readers.get(image_id, ()))
            if unlabelled:
                raise ValueError(
                    f"{label_file}: no label row for image {image_id}, reader {sorted(unlabelled)[0]}, which has "
                    "rows in the box file; the two files must be of the same split."
                )

    def _note(self, samples, layout, source, readers, skipped, annotated) -> None:
        entered, unboxed = Counter(), Counter()
        for sample in samples:
            entered.update(sample.regions.keys())
            unboxed.update(key for key, label in sample.labels.items() if label == 1 and key not in sample.regions)
        self.notes = {
            "layout": layout,
            "split": self.split,
            "readers": self.readers,
            "images": len(samples),
            "readers_per_image": {str(n): c for n, c in sorted(Counter(map(len, readers.values())).items())},
            "label_source": source.name,
            "degenerate_boxes_skipped": skipped,
            "classes_not_annotated": [key for key in self.classes if key not in annotated],
            "images_entered_grounding": {key: entered[key] for key in self.classes},
            "positive_labels_without_region": {key: unboxed[key] for key in self.classes},
        }

    def _note_reads(self, samples, reads, single) -> None:
        """A leave-one-out split's counts: the reads, their radiographs and readers, and per class
        the reads whose reference has a region, with their radiographs and held-out readers (the
        reads graded for grounding, unless the region is empty in the frame: a majority of boxes
        that do not meet, counted under ``lost_regions``)."""
        graded = {key: [read for sample, read in zip(samples, reads) if key in sample.regions] for key in self.classes}
        self.notes.update({
            "reference": self.reference,
            **({"reader": self.reader} if self.reader is not None else {}),
            "images": len({image_id for image_id, _ in reads}),
            "reads": len(samples),
            "reader_ids": sorted({reader for _, reader in reads}, key=reader_order),
            "images_with_one_reader_skipped": single,
            "reads_with_reference": {
                key: {"reads": len(found), "radiographs": len({image_id for image_id, _ in found}),
                      "readers": len({reader for _, reader in found})}
                for key, found in graded.items()
            },
        })


class MergeReaders:
    """Labels and regions of a group of an image's radiologists merged by a rule, and one
    radiologist's own marks."""

    def __init__(self, supported: tuple[str, ...], annotated: set[str]) -> None:
        self.supported = supported
        self.annotated = annotated

    def __call__(self, rule: str, group: list[str], positives: dict[str, set], boxes: dict[str, dict[str, list]]):
        """``union``: any radiologist of ``group``; ``majority``: more than half of them, for labels
        and pixel by pixel for regions (a radiologist who drew nothing votes against)."""
        count = len(group)
        labels = {
            key: agree(rule, sum(key in positives.get(reader, ()) for reader in group), count)
            if key in self.annotated else -1
            for key in self.supported
        }
        regions = {}
        for key, by_reader in boxes.items():
            drawn = [by_reader[reader] for reader in group if reader in by_reader]
            if not drawn:
                continue
            if rule == "union":
                regions[key] = Boxes(tuple(box for found in drawn for box in found))
            elif agree(rule, len(drawn), count):
                regions[key] = MajorityVote(tuple(Boxes(tuple(found)) for found in drawn), count)
        return labels, regions

    def marks(self, reader: str, positives: dict[str, set], boxes: dict[str, dict[str, list]]) -> dict[str, ReaderMark]:
        """What ``reader`` marked on the image: each class they labelled present or boxed."""
        own = positives.get(reader, set())
        return {
            key: ReaderMark(label=int(key in own),
                            region=Boxes(tuple(boxes[key][reader])) if reader in boxes.get(key, {}) else None)
            for key in self.supported
            if key in own or reader in boxes.get(key, {})
        }


def reader_order(reader: str) -> tuple[int, str]:
    """``R2`` before ``R10``: reader ids in the order a person reads them."""
    return len(reader), reader


def agree(rule: str, votes: int, readers: int) -> int:
    """1 where ``votes`` of ``readers`` radiologists make the finding present under ``rule``."""
    return int(votes > 0) if rule == "union" else int(2 * votes > readers)
