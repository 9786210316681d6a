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

The test split also carries cheXlocalize's *human benchmark*, beside the ground truth:
``CheXlocalize/hb_segmentations_test.json`` (the same layout as the ground truth's) and
``CheXlocalize/hb_salient_pt_test.json`` (``cxr_id -> {pathology -> [[x, y], ...]}``, x the column,
in native pixels): radiologists independent of the ground truth, who drew each finding and marked
its most representative point. ``human_benchmark=True`` reads them as the reader under test
(`CheXlocalize.reader_set`, scored by ``--model human``); the val split has none.
"""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path, PurePosixPath
from typing import Literal

from PIL import Image

from xbench.files import ANNOTATIONS_CAP, open_text, read_json
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.readers import ReaderMark, ReaderSet
from xbench.data.regions import CocoRLE
from xbench.findings import finding_key

LABEL_VALUES = {1.0: 1, 0.0: 0, -1.0: -1}


class CheXlocalize(XBenchDataModule):
    """CheXlocalize; ``split="test"`` (668 CXRs, 500 patients) is the benchmark split."""

    name = "chexlocalize"

    def __init__(self, root: str, split: Literal["test", "val"] = "test", human_benchmark: bool = False,
                 **kwargs) -> None:
        """``human_benchmark``: read the test split's human benchmark as the reader under test
        (`reader_set`), for ``--model human``."""
        super().__init__(root=root, **kwargs)
        if human_benchmark and split != "test":
            raise ValueError(
                f"--data.human_benchmark: CheXlocalize's human benchmark (hb_segmentations_test.json, "
                f"hb_salient_pt_test.json) exists for the test split only; the {split} split has none. Use "
                "--data.split test, or leave --data.human_benchmark off."
            )
        self.split = split
        self.human_benchmark = human_benchmark
        self._readers: ReaderSet | None = None
        self._segmented: set[str] = set()  # the findings the ground truth JSON names

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
        if self.human_benchmark:  # read with the index, so a bad file stops the run before any image is decoded
            self._readers = self._read_human_benchmark(samples)
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
        """``cxr_id -> {key -> RLE}`` for the non-empty masks (area read from the runs, not drawn);
        the findings the file names, empty masks included, are kept for the human benchmark's protocol."""
        found_by_cxr = self._read_by_pathology(masks_json, "RLE", CocoRLE.from_json)
        self._segmented = {key for found in found_by_cxr.values() for key in found}
        return {cxr_id: {key: rle for key, rle in found.items() if rle.area() > 0}
                for cxr_id, found in found_by_cxr.items()}

    def _read_by_pathology(self, path: Path, holds: str, read) -> dict[str, dict]:
        """``cxr_id -> {key -> read(value, source)}`` of a release JSON ``{cxr_id: {pathology: value}}``."""
        entries = read_json(path, ANNOTATIONS_CAP)
        if not isinstance(entries, dict):
            raise ValueError(f"{path}: expected a JSON object cxr_id -> {{pathology -> {holds}}}")
        out: dict[str, dict] = {}
        for cxr_id, pathologies in entries.items():
            if not isinstance(pathologies, dict):
                raise ValueError(f"{path}, {cxr_id}: expected an object pathology -> {holds}")
            found = {}
            for pathology, value in pathologies.items():
                source = f"{path}, {cxr_id}, {pathology!r}"
                key = finding_key(self.name, pathology, source=f"{path}, {cxr_id}")
                if key in found:
                    raise ValueError(f"{source}: a second {holds} for {key} (both spellings of one finding?)")
                found[key] = read(value, source)
            out[cxr_id] = found
        return out

    def reader_set(self) -> ReaderSet | None:
        """With ``human_benchmark``: the human benchmark on every test CXR (its segmentations as
        regions, its most representative points as salient points), against the ground truth."""
        if not self.human_benchmark:
            return None
        self.samples  # noqa: B018 (the index reads the human benchmark)
        return self._readers

    def _read_human_benchmark(self, samples: list[Sample]) -> ReaderSet:
        folder = self.root / "CheXlocalize"
        segmentations_json = self.require(folder / "hb_segmentations_test.json",
                                          "the human benchmark's segmentation JSON")
        points_json = self.require(folder / "hb_salient_pt_test.json", "the human benchmark's salient-point JSON")
        sizes = {s.image_id: _native_size(s.path) for s in samples}
        segmentations = self._read_by_pathology(segmentations_json, "RLE", CocoRLE.from_json)
        points = self._read_by_pathology(points_json, "point list", _points)
        for path, entries in ((segmentations_json, segmentations), (points_json, points)):
            _check_split(path, entries, sizes, self.split)
        for cxr_id, found in segmentations.items():
            for key, rle in found.items():
                if (rle.height, rle.width) != sizes[cxr_id]:
                    raise ValueError(
                        f"{rle.source}: the mask is {rle.height}x{rle.width} (height x width), the image "
                        f"{sizes[cxr_id][0]}x{sizes[cxr_id][1]}; the human benchmark is drawn at the image's "
                        "native size (is the file from this release?)"
                    )
        for cxr_id, found in points.items():
            height, width = sizes[cxr_id]
            for key, marked in found.items():
                outside = [(x, y) for x, y in marked if not (0 <= x < width and 0 <= y < height)]
                if outside:
                    raise ValueError(
                        f"{points_json}, {cxr_id}, {key}: point (x, y) = {outside[0]} lies outside the "
                        f"{width}x{height} (width x height) image; points are (column, row) in native pixels"
                    )
        marks = {}
        for cxr_id in sizes:
            marks[cxr_id] = {}
            for key in self.classes:
                rle = segmentations.get(cxr_id, {}).get(key)
                region = rle if rle is not None and rle.area() > 0 else None
                salient = points.get(cxr_id, {}).get(key, ())
                if region is not None or salient:
                    marks[cxr_id][key] = ReaderMark(1, region, salient)
        self.notes["human_benchmark"] = {
            "images_without_segmentations": sum(1 for cxr_id in sizes if cxr_id not in segmentations),
            "images_without_salient_points": sum(1 for cxr_id in sizes if cxr_id not in points),
            "segmentations": {key: sum(1 for m in marks.values() if key in m and m[key].region is not None)
                              for key in self.classes},
            "salient_points": {key: sum(1 for m in marks.values() if key in m and m[key].points)
                               for key in self.classes},
        }
        return ReaderSet(
            name="chexlocalize-hb",
            rule=("cheXlocalize's human benchmark (radiologists independent of the ground truth) against the "
                  "ground-truth segmentations of the test split; its Pointing Game reads its most representative "
                  "points"),
            marks=marks,
            native_protocol=tuple(key for key in self.classes if key in self._segmented),
        )

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


def _native_size(path: Path) -> tuple[int, int]:
    """(height, width) of an image from its header."""
    with Image.open(path) as image:
        return image.height, image.width


def _points(value: object, source: str) -> tuple[tuple[float, float], ...]:
    """A salient-point list ``[[x, y], ...]`` of finite numbers."""
    if not isinstance(value, list) or not all(
        isinstance(point, list) and len(point) == 2
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in point)
        for point in value
    ):
        raise ValueError(f"{source}: expected a list of points [[x, y], ...] (numbers, native pixels); got "
                         f"{str(value)[:80]}")
    return tuple((float(x), float(y)) for x, y in value)


def _check_split(path: Path, entries: dict, sizes: dict, split: str) -> None:
    """Every CXR of a human-benchmark file is an image of the split."""
    foreign = sorted(set(entries) - set(sizes))
    if foreign:
        raise ValueError(
            f"{path}: {len(foreign)} of its {len(entries)} CXRs are no image of the {split} split (e.g. "
            f"{foreign[0]}); the human benchmark must be the test split's, from the same release as "
            "gt_segmentations_test.json."
        )


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
