"""Worked example: your own dataset, a folder of PNGs with a CSV of boxes, and a finding XBench lacks.

The layout it reads::

    root/images/*.png          every image of the split (one sample each, in name order)
    root/boxes.csv             image,finding,x1,y1,x2,y2 -- one row per box, in native pixels;
                               an image with no row is negative for every finding

The class states its vocabulary -- the raw labels of the CSV, spelled into XBench's finding keys,
with one finding that is not in XBench's table (``large_opacity``) declared here -- so nothing in
XBench is edited. Run it with ``examples/`` on the import path::

    python examples/png_folder.py --demo /tmp/my_xrays      # writes a small folder to try it on
    PYTHONPATH=examples python -m xbench.test --config lightning_configs/models/centre_prior.yaml \\
      --config examples/png_folder.yaml --data.root /tmp/my_xrays
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from pathlib import Path

from xbench.data.annotation_files import read_csv_rows
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.regions import Boxes
from xbench.findings import Finding, finding_key

COLUMNS = ["image", "finding", "x1", "y1", "x2", "y2"]


class PngFolder(XBenchDataModule):
    name = "png_folder"
    display_name = "My PNG folder"
    findings = (Finding("large_opacity", "Large Opacity", "LOPA"),)
    spellings = {"Nodule": "nodule", "Mass": "mass", "Large opacity": "large_opacity"}

    def index(self) -> list[Sample]:
        images = self.require(self.root / "images", "the image folder images/")
        table = self.require(self.root / "boxes.csv", "the box table boxes.csv")
        names = sorted(path.name for path in images.glob("*.png"))
        boxes: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        # XBench's CSV reader names the file and line of a bad row (and a file that is not UTF-8)
        for line, row in read_csv_rows(table, COLUMNS):
            where = f"{table}, line {line}"
            if row["image"] not in names:
                raise FileNotFoundError(f"{where}: image {row['image']!r} is not in {images}")
            try:
                x1, y1, x2, y2 = (float(row[column]) for column in COLUMNS[2:])
            except ValueError:
                raise ValueError(f"{where}: x1, y1, x2, y2 must be numbers; got {[row[c] for c in COLUMNS[2:]]}") from None
            if not all(map(math.isfinite, (x1, y1, x2, y2))) or not (x2 > x1 and y2 > y1):
                raise ValueError(f"{where}: the box needs finite corners with x2 > x1 and y2 > y1; got {x1, y1, x2, y2}")
            boxes[row["image"]][finding_key(self.name, row["finding"], source=where)].append((x1, y1, x2, y2))
        return [
            Sample(
                image_id=name,
                path=images / name,
                labels={key: int(key in boxes[name]) for key in self.supported_classes()},
                regions={key: Boxes(tuple(found)) for key, found in boxes[name].items()},
            )
            for name in names
        ]


def write_demo(root: Path, num_images: int = 12) -> None:
    """A folder in this layout, made from XBench's phantom (its consolidations become "Large opacity")."""
    from xbench.data.phantom import generate_phantom

    generate_phantom(root / "phantom", num_images, size=128, seed=0)
    (root / "phantom" / "test_data").rename(root / "images")
    spelled = {"Consolidation": "Large opacity"}
    with (root / "boxes.csv").open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(COLUMNS)
        for entry in json.loads((root / "phantom" / "test.json").read_text()):
            for sym, box in zip(entry["syms"], entry["boxes"]):
                writer.writerow([entry["file_name"], spelled.get(sym, sym), *box])
    (root / "phantom" / "test.json").unlink()
    (root / "phantom").rmdir()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Write a small demo folder in PngFolder's layout.")
    parser.add_argument("--demo", type=Path, required=True, help="the folder to create")
    args = parser.parse_args()
    write_demo(args.demo)
    print(f"wrote {args.demo}/images and {args.demo}/boxes.csv")
