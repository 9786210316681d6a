"""CheXlocalize (Stanford AIMI): CheXpert val/test radiographs with radiologist segmentations.

The download holds two folders; ``root`` is the folder that contains both:

- ``CheXpert/{val,test}/patient<N>/study<M>/view<K>_<frontal|lateral>.jpg`` and the labels
  ``CheXpert/{val,test}_labels.csv`` (``Path`` of the val CSV reads ``CheXpert-v1.0/valid/...``
  and of the test CSV ``test/...``; the image is found by its ``patient.../study.../view...``
  part under the split folder);
- ``CheXlocalize/gt_segmentations_{val,test}.json``: ``cxr_id -> {pathology -> COCO RLE}`` at
  native size, where ``cxr_id`` is that path part joined by ``_`` without ``.jpg``.

Labels (0/1, CheXpert's -1 read as unknown) come from the CSV for all 13 classes; masks exist for
10 (``Airspace Opacity`` in the JSON is ``Lung Opacity`` in the CSV). An image absent from the
JSON, or an all-zero RLE, has no region for that class. RLEs stay encoded until a worker draws them.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path, PurePosixPath
from typing import Literal

from xbench.files import ANNOTATIONS_CAP, open_text, read_json
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.regions import CocoRLE
from xbench.findings import finding_key

LABEL_VALUES = {1.0: 1, 0.0: 0, -1.0: -1}


class CheXlocalize(XBenchDataModule):
    """CheXlocalize; ``split="test"`` (668 CXRs, 500 patients) is the benchmark split."""

    name = "chexlocalize"

    def __init__(self, root: str, split: Literal["test", "val"] = "test", **kwargs) -> None:
        super().__init__(root=root, **kwargs)
        self.split = split

    def index(self) -> list[Sample]:
        labels_csv = self.require(self.root / "CheXpert" / f"{self.split}_labels.csv", "the label CSV")
        image_dir = self.require(self.root / "CheXpert" / self.split, f"the image folder CheXpert/{self.split}/")
        masks_json = self.require(
            self.root / "CheXlocalize" / f"gt_segmentations_{self.split}.json", "the ground-truth segmentation JSON"
        )
        regions = self._read_segmentations(masks_json)
        present = {
            Path(folder, name).relative_to(image_dir).as_posix()
            for folder, _, names in os.walk(image_dir)
            for name in names
        }
        samples, seen = [], set()
        with open_text(labels_csv) as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            columns = self._label_columns(header, labels_csv)
            for line, row in enumerate(reader, start=2):
                where = f"{labels_csv}, line {line}"
                if len(row) != len(header):
                    raise ValueError(f"{where}: {len(row)} fields, the header has {len(header)}")
                relative = _relative_image_path(row[0], where)
                if relative not in present:
                    raise FileNotFoundError(
                        f"{where}: image {row[0]} not found as {image_dir / relative}. Place the CheXpert "
                        f"folder of the CheXlocalize download under {self.root}."
                    )
                cxr_id = relative.removesuffix(".jpg").replace("/", "_")
                if cxr_id in seen:
                    raise ValueError(f"{where}: image {row[0]} is listed twice")
                seen.add(cxr_id)
                labels = {key: _label(row[i], where, header[i]) for key, i in columns.items()}
                samples.append(
                    Sample(image_id=cxr_id, path=image_dir / relative, labels=labels, regions=regions.get(cxr_id, {}))
                )
        unlisted = sorted(set(regions) - seen)
        if unlisted:
            raise ValueError(
                f"{masks_json}: {len(unlisted)} CXRs have masks but no row in {labels_csv} (e.g. {unlisted[0]}); "
                "the JSON and the CSV must be of the same split."
            )
        self._note(samples, len(regions))
        return samples

    def _label_columns(self, header: list[str], labels_csv: Path) -> dict[str, int]:
        """Canonical key -> column index. Columns that are no finding spelling (``Sex``, ``AP/PA``,
        ``No Finding``, ...) are metadata; every supported class must have its column."""
        if not header or header[0] != "Path":
            raise ValueError(f"{labels_csv}: expected a header starting with 'Path', got {header[:3]}")
        spellings = self.spelling_table()
        columns: dict[str, int] = {}
        for i, name in enumerate(header):
            key = spellings.get(name.strip())
            if key is None:
                continue
            if key in columns:
                raise ValueError(f"{labels_csv}: columns {header[columns[key]]!r} and {name!r} are the same finding")
            columns[key] = i
        missing = [key for key in self.supported_classes() if key not in columns]
        if missing:
            raise ValueError(f"{labels_csv}: no label column for {missing}; expected the CheXpert label columns")
        return columns

    def _read_segmentations(self, masks_json: Path) -> dict[str, dict[str, CocoRLE]]:
        """``cxr_id -> {key -> RLE}`` for the non-empty masks (area read from the runs, not drawn)."""
        entries = read_json(masks_json, ANNOTATIONS_CAP)
        if not isinstance(entries, dict):
            raise ValueError(f"{masks_json}: expected a JSON object cxr_id -> {{pathology -> RLE}}")
        regions: dict[str, dict[str, CocoRLE]] = {}
        for cxr_id, pathologies in entries.items():
            if not isinstance(pathologies, dict):
                raise ValueError(f"{masks_json}, {cxr_id}: expected an object pathology -> RLE")
            found = {}
            for pathology, rle in pathologies.items():
                source = f"{masks_json}, {cxr_id}, {pathology!r}"
                key = finding_key(self.name, pathology, source=f"{masks_json}, {cxr_id}")
                if key in found:
                    raise ValueError(f"{source}: a second mask for {key}")
                region = CocoRLE.from_json(rle, source)
                if region.area() > 0:
                    found[key] = region
            regions[cxr_id] = found
        return regions

    def _note(self, samples: list[Sample], json_entries: int) -> None:
        def per_class(condition) -> dict[str, int]:
            return {key: sum(1 for s in samples if condition(s, key)) for key in self.classes}

        self.notes = {
            "split": self.split,
            "images": len(samples),
            "images_in_segmentation_json": json_entries,
            "images_entered_grounding": per_class(lambda s, key: key in s.regions),
            "positive_labels_without_mask": per_class(lambda s, key: s.labels[key] == 1 and key not in s.regions),
            "masks_on_non_positive_labels": per_class(lambda s, key: key in s.regions and s.labels[key] != 1),
        }


def _relative_image_path(path: str, where: str) -> str:
    """``patient<N>/study<M>/view<K>_*.jpg`` from either CSV's ``Path``."""
    parts = PurePosixPath(path).parts
    starts = [i for i, part in enumerate(parts) if part.startswith("patient")]
    if not starts or len(parts) - starts[0] != 3 or not path.endswith(".jpg"):
        raise ValueError(f"{where}: Path {path!r} does not end in patient<N>/study<M>/view<K>_<view>.jpg")
    return "/".join(parts[starts[0]:])


def _label(value: str, where: str, column: str) -> int:
    try:
        return LABEL_VALUES[float(value)]
    except (KeyError, ValueError):
        raise ValueError(f"{where}: {column} is {value!r}; expected 1, 0 or -1 (uncertain)") from None
