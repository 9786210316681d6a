"""SIIM-ACR Pneumothorax Segmentation (stage 1): ``train-rle.csv`` + ``dicom-images-train/`` tree.

``train-rle.csv`` (header ``ImageId, EncodedPixels``, with a space) has one row per annotated
instance: a relative, column-major run-length string (decoded in ``regions.RelativeRLE``), or
``-1`` for a negative image; values may carry a leading space. An image's mask is the union of
all its rows. Images are found by stem (``ImageId``) anywhere below ``root``
(``dicom-images-train/<study>/<series>/<ImageId>.dcm``, and ``dicom-images-test/`` for the
stage-1 test images that some copies of the csv include).

The benchmark split is MedKLIP's and MAVL's test file, a row subset of ``train-rle.csv`` in the
same format (2,317 rows, 2,264 images, 594 positive). It selects images; each is one sample,
whose mask unites all its rows in ``train-rle.csv`` -- the split was cut by row, so for some
images it holds only some of their rows (counted in ``notes``).
"""

from __future__ import annotations

from xbench.data.annotation_files import read_csv_rows, split_file_path
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.io import files_by_stem
from xbench.data.regions import RelativeRLE, parse_relative_rle

RLE_FILE = "train-rle.csv"
COLUMNS = ("ImageId", "EncodedPixels")
NEGATIVE = "-1"
CLASS = "pneumothorax"


class SIIMPneumothorax(XBenchDataModule):
    """SIIM-ACR pneumothorax masks; ``split_file`` (MAVL's test file) selects the benchmark split,
    none means every image of ``train-rle.csv``.

    Args:
        root: the folder holding ``train-rle.csv`` and the DICOM tree.
        split_file: an ``ImageId,EncodedPixels`` file, relative to ``root`` or absolute.
    """

    name = "siim"

    def __init__(self, root: str, split_file: str | None = None, **kwargs) -> None:
        super().__init__(root=root, **kwargs)
        self.split_file = split_file

    def index(self) -> list[Sample]:
        rle_path = self.require(self.root / RLE_FILE, f"the annotation file {RLE_FILE}")
        annotations, rle_rows = read_rle_file(rle_path)
        self.notes.update(rle_rows=rle_rows, images_in_rle_file=len(annotations), rle_rows_merged=rle_rows - len(annotations))
        if self.split_file is None:
            image_ids = list(annotations)
        else:
            image_ids = self._read_split(rle_path, annotations)
        dicoms = files_by_stem(self.root)
        samples = []
        for image_id in image_ids:
            if image_id not in dicoms:
                raise FileNotFoundError(
                    f"no DICOM {image_id}.dcm below {self.root} for ImageId {image_id} of {rle_path}. Put "
                    "dicom-images-train/ (and dicom-images-test/ if the csv lists its images) under data.root."
                )
            rows = annotations[image_id]
            lines = ", ".join(str(line) for line, _ in rows)
            positive = rows[0][1] != NEGATIVE
            samples.append(
                Sample(
                    image_id=image_id,
                    path=dicoms[image_id],
                    labels={CLASS: int(positive)},
                    regions={CLASS: RelativeRLE(tuple(text for _, text in rows), f"{rle_path}, line(s) {lines}")}
                    if positive
                    else {},
                )
            )
        self.notes.update(images=len(samples), positive_images=sum(sample.labels[CLASS] for sample in samples))
        return samples

    def _read_split(self, rle_path, annotations) -> list[str]:
        """Unique ImageIds of the split file, each of whose rows must be a row of ``train-rle.csv``."""
        split_path = self.require(
            split_file_path(self.root, self.split_file),
            "the split file (MAVL's data/siimacr/test.csv; or set data.split_file)",
        )
        split, split_rows = read_rle_file(split_path)
        partial = 0
        for image_id, rows in split.items():
            if image_id not in annotations:
                raise ValueError(
                    f"{split_path}, line {rows[0][0]}: ImageId {image_id} has no row in {rle_path}; the split "
                    "file does not belong to this annotation file"
                )
            known = {text for _, text in annotations[image_id]}
            for line, text in rows:
                if text not in known:
                    raise ValueError(
                        f"{split_path}, line {line}: this EncodedPixels of {image_id} is not among its rows in "
                        f"{rle_path}; the split file does not belong to this annotation file"
                    )
            partial += len({text for _, text in rows}) < len(known)
        self.notes.update(
            split_file=str(split_path),
            split_rows=split_rows,
            split_rows_merged=split_rows - len(split),
            split_images_with_rows_only_in_rle_file=partial,
        )
        return list(split)


def read_rle_file(path) -> tuple[dict[str, list[tuple[int, str]]], int]:
    """``ImageId -> [(line, EncodedPixels with runs of spaces collapsed)]`` in file order, and the
    row count. A malformed run-length string, or an image mixing ``-1`` and run-length rows, is an
    error naming the line."""
    annotations: dict[str, list[tuple[int, str]]] = {}
    count = 0
    for line, row in read_csv_rows(path, COLUMNS):
        count += 1
        image_id, text = row["ImageId"], " ".join(row["EncodedPixels"].split())
        if not image_id or not text:
            raise ValueError(f"{path}, line {line}: empty ImageId or EncodedPixels (a negative image is written -1)")
        if text != NEGATIVE:
            try:
                parse_relative_rle(text)
            except ValueError as error:
                raise ValueError(f"{path}, line {line}: {error}") from None
        rows = annotations.setdefault(image_id, [])
        if rows and (rows[0][1] == NEGATIVE) != (text == NEGATIVE):
            raise ValueError(f"{path}, line {line}: {image_id} has both -1 (negative) and run-length rows (line {rows[0][0]})")
        rows.append((line, text))
    return annotations, count
