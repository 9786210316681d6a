"""ChestX-ray14 box subset (NIH): ``BBox_List_2017.csv`` + the PNGs, wherever they lie under root.

``BBox_List_2017.csv`` has a 9-field header (``Image Index,Finding Label,Bbox [x,y,w,h],,,``)
over 6-field rows (some mirrors add empty fields), so it is read by position: file name, finding,
then float ``x, y, w, h`` in the 1024x1024 PNG grid (scaled to the image if a mirror resized
it). ``Infiltrate`` there is ``Infiltration`` elsewhere. Images are found by file name anywhere
under ``root`` (``images_0XX/images/`` of the Kaggle mirror, ``images/`` of the NIH tarballs, or
flat).

Recognition labels for the 8 box classes come from ``Data_Entry_2017_v2020.csv`` (or the older
``Data_Entry_2017.csv``) in ``root`` when present; a box the entry does not list still makes its
class positive (counted in the notes). Without the file, a boxed class is positive and the other
classes are unknown (-1): the box file has no negatives, so recognition cannot be scored.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections import defaultdict
from pathlib import Path

from xbench.data.annotation_files import read_csv_rows
from xbench.files import open_text
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.io import files_by_stem
from xbench.data.regions import Boxes, GridBoxes
from xbench.findings import finding_key

BOX_FILE = "BBox_List_2017.csv"
LABEL_FILES = ("Data_Entry_2017_v2020.csv", "Data_Entry_2017.csv")
NO_FINDING = "No Finding"
#: The pixel grid of the box coordinates: the 1024 x 1024 PNGs as NIH distributes them.
BOX_GRID = 1024


class ChestXray14Boxes(XBenchDataModule):
    """The 880 images with 984 boxes of 8 findings; all of them are the benchmark split."""

    name = "chestxray14"

    @classmethod
    def supported_classes(cls) -> tuple[str, ...]:
        """Only the 8 box classes: the other Data_Entry findings have no regions to ground."""
        return cls.default_classes()

    def index(self) -> list[Sample]:
        box_file = self.require(self.root / BOX_FILE, f"the box file {BOX_FILE}")
        boxes = self._read_boxes(box_file)
        by_stem = files_by_stem(self.root, (".png",))
        paths = {name: by_stem[Path(name).stem] for name in boxes if Path(name).stem in by_stem}
        missing = [(name, line) for name, (line, _) in boxes.items() if name not in paths]
        if missing:
            name, line = missing[0]
            raise FileNotFoundError(
                f"{box_file}, line {line}: image {name} not found under {self.root} ({len(missing)} box images "
                "missing). Extract images_001..012.tar.gz (or the Kaggle mirror's folders) under the root."
            )
        label_file = next((self.root / n for n in LABEL_FILES if (self.root / n).is_file()), None)
        entries = self._read_entries(label_file, set(boxes), box_file) if label_file else None
        if label_file is None:
            warnings.warn(
                f"ChestXray14Boxes: no {' or '.join(LABEL_FILES)} in {self.root}: labels of classes without a "
                "box are unknown, so recognition metrics are undefined. Put the NIH Data_Entry file there.",
                stacklevel=2,
            )
        samples, boxed_unlisted = [], 0
        for name, (line, by_class) in boxes.items():
            if entries is None:
                labels = {key: 1 if key in by_class else -1 for key in self.supported_classes()}
            else:
                listed = entries[name]
                boxed_unlisted += len(set(by_class) - listed)
                labels = {key: int(key in listed or key in by_class) for key in self.supported_classes()}
            grid = f"{box_file}, line {line} (image {name}, {paths[name]}; boxes on NIH's {BOX_GRID} x {BOX_GRID} grid)"
            regions = {key: GridBoxes(Boxes.from_xywh(found), BOX_GRID, BOX_GRID, grid) for key, found in by_class.items()}
            samples.append(Sample(image_id=name, path=paths[name], labels=labels, regions=regions))
        self.notes = {
            "images": len(samples),
            "boxes": sum(len(found) for _, by_class in boxes.values() for found in by_class.values()),
            "label_source": label_file.name if label_file else f"{BOX_FILE} only (unboxed classes unknown)",
            "boxed_classes_not_in_data_entry": boxed_unlisted,
            "images_entered_grounding": {key: sum(key in s.regions for s in samples) for key in self.classes},
        }
        return samples

    def _read_boxes(self, box_file: Path) -> dict[str, tuple[int, dict[str, list]]]:
        """file name -> (first line, {key -> [(x, y, w, h), ...]}), in file order."""
        boxes: dict[str, tuple[int, dict[str, list]]] = {}
        with open_text(box_file) as handle:
            rows = csv.reader(handle)
            header = next(rows, [])
            if header[:2] != ["Image Index", "Finding Label"]:
                raise ValueError(
                    f"{box_file}: expected the header 'Image Index,Finding Label,Bbox [x,y,w,h]', got {header}"
                )
            for line, row in enumerate(rows, start=2):
                where = f"{box_file}, line {line}"
                if len(row) < 6 or any(field.strip() for field in row[6:]):
                    raise ValueError(f"{where}: expected 6 fields (image, finding, x, y, w, h), got {row}")
                name, label = row[0].strip(), row[1]
                key = finding_key(self.name, label, source=where)
                if key not in self.supported_classes():
                    raise ValueError(f"{where}: {label!r} is not one of the 8 box findings")
                try:
                    x, y, w, h = (float(v) for v in row[2:6])
                except ValueError:
                    raise ValueError(f"{where}: x, y, w, h must be numbers, got {row[2:6]}") from None
                if not all(map(math.isfinite, (x, y, w, h))) or w <= 0 or h <= 0:
                    raise ValueError(f"{where}: box x={x}, y={y}, w={w}, h={h} needs finite values and w, h > 0")
                boxes.setdefault(name, (line, defaultdict(list)))[1][key].append((x, y, w, h))
        return boxes

    def _read_entries(self, label_file: Path, names: set[str], box_file: Path) -> dict[str, set[str]]:
        """file name -> its Data_Entry findings among the box classes, for the box images."""
        entries: dict[str, set[str]] = {}
        supported = set(self.supported_classes())
        for line, row in read_csv_rows(label_file, ("Image Index", "Finding Labels")):
            if row["Image Index"] not in names:
                continue
            where = f"{label_file}, line {line}"
            raw = row["Finding Labels"].split("|")
            found = {finding_key(self.name, label, source=where) for label in raw if label != NO_FINDING}
            entries[row["Image Index"]] = found & supported
        absent = sorted(names - set(entries))
        if absent:
            raise ValueError(
                f"{label_file}: no row for {len(absent)} images of {box_file} (e.g. {absent[0]}); use the full "
                "Data_Entry file of ChestX-ray14."
            )
        return entries
