"""Radiologists scored like models: what one reader marked, and the maps it becomes in the frame.

A dataset where several radiologists read the same image names, through
[`XBenchDataModule.reader_set`][xbench.data.base.XBenchDataModule.reader_set], the reader under test
for every sample and keeps the reference (the dataset's separate ground truth, or the other readers)
as the sample's regions. [`HumanReader`][xbench.models.readers.HumanReader] then turns each mark into
a map and the run goes through the same frame, metrics, records and results folder as a model's.

The map rule, one for every dataset: the reader's region is drawn at the image's native size and
brought into the frame exactly as a reference region is (`resize_mask`: area coverage at γ, never
vanishing), at value 0.5; each salient point the reader gave is its frame pixel at value 1; every
other pixel is 0. After min-max normalisation a region without points is 1 inside and 0 outside.
So the Pointing Game (a hit when any pixel of the map's maximum lies in the reference) reads the
reader's points where the dataset gives them (cheXlocalize's rule: any point inside), and otherwise
the whole region, tied over its area: a hit when the region touches the reference. Dice and IoU read
the region (with its points) at every threshold in (0, 0.5]; the curve's other thresholds say nothing
about a binary map. A reader who marked nothing for a finding gives a constant map: a miss.

A reader whose mark is where they looked (an eye-tracking dataset's read,
[`xbench.data.gaze`][xbench.data.gaze]) carries a gaze density instead: its map is that density in
the frame (``gaze.density(size)``, summing to 1), drawn by the same rule the dataset draws
the reference gaze with, and the region and points are not used.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from xbench.data.regions import Region
from xbench.data.transforms import resize_mask

#: A human run's model name: ``human:<reader set>`` (``human:chexlocalize-hb``).
HUMAN_PREFIX = "human:"
#: The logit of a finding the reader marked present, and minus it for one marked absent (the Oracle's).
MARKED_LOGIT = 10.0
REGION_VALUE, POINT_VALUE = 0.5, 1.0


class FrameDensity(Protocol):
    def density(self, size: int) -> np.ndarray:
        """float [size, size]: the reader's density in the metric frame, summing to 1."""


@dataclass(frozen=True)
class ReaderMark:
    """What the reader under test marked for one finding on one image, at the image's native size.

    ``label``: 1 present, 0 absent; ``region``: the reader's region, if any; ``points``: salient
    points as (x, y) = (column, row) in native pixels; ``gaze``: where the reader looked (a gaze
    density, `xbench.data.gaze.Gaze`), which is then the map, in place of region and points."""

    label: int
    region: Region | None = None
    points: tuple[tuple[float, float], ...] = ()
    gaze: FrameDensity | None = None


@dataclass(frozen=True)
class ReaderSet:
    """The reader under test on every sample of a split.

    ``name``: the run's model is ``human:<name>``; ``rule``: who is scored against what, one
    sentence, written to the results; ``marks``: sample ``image_id`` -> class key -> mark (a class
    without a mark: the reader marked it absent); ``native_protocol``: the findings also scored at
    native size by cheXlocalize's human-benchmark protocol (cheXlocalize's own human benchmark: the
    findings its ground truth names; empty for any other reader set)."""

    name: str
    rule: str
    marks: dict[str, dict[str, ReaderMark]] = field(default_factory=dict)
    native_protocol: tuple[str, ...] = ()

    @property
    def model_name(self) -> str:
        return f"{HUMAN_PREFIX}{self.name}"

    def native_mark(self, image_id: str, key: str, height: int, width: int
                    ) -> tuple[Tensor, Tensor | None, tuple[tuple[float, float], ...]]:
        """The reader's mark for one finding at the image's native size: its map by the module's
        rule (float32 [height, width]: the region at 0.5, each point's pixel ``[int(y), int(x)]`` at
        1), its region (bool [height, width], ``None`` where it drew none) and its points."""
        mark = self.marks.get(image_id, {}).get(key)
        native = torch.zeros(height, width)
        if mark is None:
            return native, None, ()
        region = torch.from_numpy(mark.region.to_mask(height, width)[0]) if mark.region is not None else None
        if region is not None:
            native[region] = REGION_VALUE
        for x, y in mark.points:
            native[int(y), int(x)] = POINT_VALUE
        return native, region, mark.points

    def frame_maps(self, image_ids: Sequence[str], classes: Sequence[str], native_sizes: Tensor, size: int,
                   threshold: float) -> tuple[Tensor, Tensor]:
        """Logits [B, C] (±`MARKED_LOGIT`) and maps [B, C, size, size] of the batch's samples, by the
        module's map rule."""
        logits = torch.full((len(image_ids), len(classes)), -MARKED_LOGIT)
        maps = torch.zeros(len(image_ids), len(classes), size, size)
        for row, (image_id, (height, width)) in enumerate(zip(image_ids, native_sizes.tolist())):
            marks = self.marks.get(image_id)
            if marks is None:
                raise KeyError(f"reader set {self.name!r} has no marks for sample {image_id!r}; the datamodule's "
                               "reader_set must cover every sample of the split")
            for column, key in enumerate(classes):
                mark = marks.get(key)
                if mark is None:
                    continue
                logits[row, column] = MARKED_LOGIT if mark.label == 1 else -MARKED_LOGIT
                if mark.gaze is not None:
                    maps[row, column] = torch.from_numpy(np.asarray(mark.gaze.density(size), dtype=np.float32))
                    continue
                if mark.region is not None:
                    native, _ = mark.region.to_mask(height, width)
                    maps[row, column][resize_mask(native, size, threshold)] = REGION_VALUE
                for x, y in mark.points:
                    r = min(max(int(y * size // height), 0), size - 1)
                    c = min(max(int(x * size // width), 0), size - 1)
                    maps[row, column, r, c] = POINT_VALUE
        return logits, maps
