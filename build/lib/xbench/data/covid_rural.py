"""COVID-19 Rural (Tang et al.'s opacity masks for TCIA COVID-19-AR): ``covid_rural_annot/``.

``jpgs/<stem>.jpg`` are 3-channel JPEGs storing grey, non-square; ``pngs_masks/<stem>.png`` the
opacity masks (0/1, same size). As in MAVL, the label is "the mask is non-empty": an image whose
mask file is missing or all zero is negative, counted in ``notes``. Masks are read once here to
decide the label and again, lazily, when drawn.

The benchmark split is MAVL's ``data/covid_rural/test.csv`` (header ``filepath``, file stems; 45
images).
"""

from __future__ import annotations

import os
import warnings

from xbench.data.annotation_files import read_csv_rows, split_file_path
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.regions import MaskFile

CLASS = "covid19"


class COVIDRural(XBenchDataModule):
    """COVID-Rural opacity masks; ``split_file`` (MAVL's test list) selects the benchmark split,
    none means every JPEG in ``jpgs/``.

    Args:
        root: the ``covid_rural_annot`` folder (holding ``jpgs/`` and ``pngs_masks/``).
        split_file: a ``filepath`` list of stems, relative to ``root`` or absolute.
    """

    name = "covid_rural"

    def __init__(self, root: str, split_file: str | None = None, **kwargs) -> None:
        super().__init__(root=root, **kwargs)
        self.split_file = split_file

    def index(self) -> list[Sample]:
        image_dir = self.require(self.root / "jpgs", "the image folder jpgs/")
        mask_dir = self.require(self.root / "pngs_masks", "the mask folder pngs_masks/")
        images = {name for name in os.listdir(image_dir) if name.endswith(".jpg")}
        masks = set(os.listdir(mask_dir))
        if self.split_file is None:
            stems = [(name[: -len(".jpg")], str(image_dir)) for name in sorted(images)]
        else:
            stems = self._read_split()
        samples, missing, empty = [], 0, 0
        for stem, where in stems:
            if f"{stem}.jpg" not in images:
                raise FileNotFoundError(
                    f"{where}: image {stem}.jpg not found in {image_dir}. Point data.root at the "
                    "covid_rural_annot folder of haimingt/opacity_segmentation_covid_chest_X_ray."
                )
            region = MaskFile(mask_dir / f"{stem}.png")
            if f"{stem}.png" not in masks:
                missing += 1
                positive = False
            else:
                positive = bool(region.read().any())
                empty += not positive
            samples.append(
                Sample(
                    image_id=stem,
                    path=image_dir / f"{stem}.jpg",
                    labels={CLASS: int(positive)},
                    regions={CLASS: region} if positive else {},
                )
            )
        if missing or empty:
            warnings.warn(
                f"COVIDRural: {missing} image(s) without a mask file and {empty} with an all-zero mask "
                "are negatives (counted under data.notes in metrics.json)",
                stacklevel=2,
            )
        self.notes.update(
            images=len(samples),
            positive_images=sum(sample.labels[CLASS] for sample in samples),
            negatives_without_mask_file=missing,
            negatives_with_empty_mask=empty,
        )
        return samples

    def _read_split(self) -> list[tuple[str, str]]:
        split_path = self.require(
            split_file_path(self.root, self.split_file),
            "the split file (MAVL's data/covid_rural/test.csv; or set data.split_file)",
        )
        stems, repeated = {}, 0
        for line, row in read_csv_rows(split_path, ("filepath",)):
            if row["filepath"] in stems:
                repeated += 1
            else:
                stems[row["filepath"]] = f"{split_path}, line {line}"
        self.notes.update(split_file=str(split_path), split_rows_merged=repeated)
        return list(stems.items())
