"""Where the radiologist looked: a reading's fixations, the gaze density they make in the metric
frame, and the batch keys a gaze dataset (REFLACX, EGD-CXR) adds.

A reading's fixations ([`Fixations`][xbench.data.gaze.Fixations]) are points on the image's native
grid, each a Gaussian of its own spread (REFLACX: 1° of visual angle from the fixation's angular
resolution; EGD-CXR: 150 native pixels) and weight (REFLACX: its duration; EGD-CXR: 1), drawn only
over the part of the image that was shown when it happened (REFLACX's zoom and pan; EGD-CXR: the
whole image). Native pixel ``(row r, col c)`` is centred at the point ``(c, r)``, the authors' grid
(their Gaussian is evaluated at pixel indices).

The density is drawn in the metric frame directly: each frame pixel is scored at its centre's
native coordinates (``(k + 0.5) W / S - 0.5`` for column k), each Gaussian keeps its normalising
constant (so a zoomed-in fixation, whose degree spans more pixels, is flatter, as in the authors'
``multivariate_normal`` pdf), and the sum is normalised to 1. Drawing in the frame rather than at
native size and then shrinking costs a matrix product of ``S x F`` by ``F x S`` per reading
instead of F native-size images (the authors' script is "relatively slow"); it samples the same
Gaussians at the frame's pixel centres. A fixation's **count** is the frame pixel its native pixel
falls in. Fixations whose point lies outside the image are left out of both (counted by the
dataset).

The gaze **tied to a finding** on a sample (``gaze``, ``fixations``, ``has_gaze`` of the batch) is
made of one or more readings ([`Gaze`][xbench.data.gaze.Gaze]): the density is the mean of the
readings' densities (each summing to 1), the counts their sum. ``shuffled_fixations`` are the
counts of every other radiograph of the split (all of their readings' fixations, the whole
reading): the split's total minus the sample's own radiograph, so a read never draws negatives
from another read of the same image. The keys are computed in the DataLoader workers from the
parsed fixations (cheap: one matrix product per reading), the same code with the decoded-image
cache on or off and for any worker count; the cache holds no gaze.

The centre-bias baseline (`GazeDataModule.gaze_baseline`) is the mean of the frame densities of
the training split's readings, normalised to sum 1 (Lanfredi et al.'s rule, ricbl/etsaliencymaps
``get_center_bias.py``, averages the readings' heatmaps after aligning each image's chest box to
the mean box; in the metric frame every image is already stretched to the same square, so the mean
is taken there without that alignment).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch.utils.data import Dataset

from xbench.data.base import XBenchDataModule
from xbench.findings import MENTIONS
from xbench.geometry.image import aspect_matches

GazeMode = Literal["reading", "finding"]
GAZE_MODES = ("reading", "finding")
#: The finding-specific window: from this many seconds before the sentence that mentions the
#: finding starts (but not before the previous sentence starts) to the start of the word that ends
#: the sentence's last mention of it: Lanfredi et al.'s default (``1.5s_startofsentence_lastmention``
#: in ricbl/eye-tracking-localization ``src/find_fixations_all_sentences.py``, commit b35517b, the
#: code of "Localization supervision of chest x-ray classifiers using label-specific eye-tracking
#: annotation", Frontiers in Radiology 2023), each fixation weighted by its overlap with the window.
WINDOW_BEFORE_S = 1.5


def finite_number(value: str, where: str, column: str) -> float:
    """A file's field as a finite number, else an error naming ``where`` and the column."""
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{where}: {column} is {value!r}, not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{where}: {column} is {value!r}, not a finite number")
    return number


@dataclass(frozen=True, eq=False)
class Fixations:
    """One reading's fixations (or those of a window of it) on a ``height x width`` native grid.

    ``x``, ``y``: positions in native pixels; ``weight``: each fixation's weight; ``sigma_x``,
    ``sigma_y``: each Gaussian's standard deviation in native pixels; ``shown``: per fixation the
    shown part of the image ``(xmin, ymin, xmax, ymax)`` in native pixels (rounded as the authors
    round), or ``None`` for the whole image. All float64 arrays of one length."""

    height: int
    width: int
    x: np.ndarray
    y: np.ndarray
    weight: np.ndarray
    sigma_x: np.ndarray
    sigma_y: np.ndarray
    shown: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.x)

    def subset(self, keep: np.ndarray, weight: np.ndarray | None = None) -> Fixations:
        """The fixations where ``keep`` holds, with new weights if given (a window's overlaps)."""
        return Fixations(self.height, self.width, self.x[keep], self.y[keep],
                         (self.weight if weight is None else weight)[keep], self.sigma_x[keep], self.sigma_y[keep],
                         None if self.shown is None else self.shown[keep])

    def _axis(self, centre: np.ndarray, sigma: np.ndarray, native: int, size: int, low, high) -> np.ndarray:
        """[F, S]: each fixation's 1-D Gaussian pdf at the frame pixels' centres along one axis,
        zero outside the shown part."""
        at = (np.arange(size) + 0.5) * native / size - 0.5
        values = np.exp(-0.5 * ((at[None, :] - centre[:, None]) / sigma[:, None]) ** 2) / (np.sqrt(2 * np.pi) * sigma[:, None])
        if low is not None:
            pixel = np.floor(at + 0.5)[None, :]
            values *= (pixel >= low[:, None]) & (pixel < high[:, None])
        return values

    def density(self, size: int) -> np.ndarray:
        """float64 [S, S]: the weighted Gaussians at the frame's pixel centres, summing to 1 (all
        zeros when no weight reaches the shown image)."""
        shown = self.shown
        gx = self._axis(self.x, self.sigma_x, self.width, size, *((shown[:, 0], shown[:, 2]) if shown is not None else (None, None)))
        gy = self._axis(self.y, self.sigma_y, self.height, size, *((shown[:, 1], shown[:, 3]) if shown is not None else (None, None)))
        heat = (gy * self.weight[:, None]).T @ gx
        total = heat.sum()
        return heat / total if total > 0 else heat

    def counts(self, size: int) -> np.ndarray:
        """float32 [S, S]: how many fixations fall in each frame pixel."""
        rows = np.floor((self.y + 0.5) * size / self.height).astype(np.int64)
        cols = np.floor((self.x + 0.5) * size / self.width).astype(np.int64)
        grid = np.zeros((size, size), dtype=np.float32)
        np.add.at(grid, (rows, cols), 1)
        return grid


@dataclass(frozen=True)
class Gaze:
    """The gaze of one or more readings of one image: the mean of their densities, the sum of
    their counts (a finding's gaze over the radiologists who tied it; a radiograph's readings)."""

    readings: tuple[Fixations, ...]

    def density(self, size: int) -> np.ndarray:
        """float64 [S, S], summing to 1 (zeros when no reading has weight in the frame)."""
        drawn = [reading.density(size) for reading in self.readings]
        drawn = [heat for heat in drawn if heat.sum() > 0]
        return np.mean(drawn, axis=0) if drawn else np.zeros((size, size))

    def counts(self, size: int) -> np.ndarray:
        total = np.zeros((size, size), dtype=np.float32)
        for reading in self.readings:
            total += reading.counts(size)
        return total


@dataclass(frozen=True)
class Word:
    """A dictated word (EGD-CXR: a whole phrase, its finest timing) and when it was spoken, in
    seconds on the fixations' clock."""

    text: str
    start: float
    end: float


@dataclass(frozen=True)
class Sentence:
    """A dictated sentence (REFLACX: the words up to a period; EGD-CXR: a transcript phrase, one
    `Word`)."""

    words: tuple[Word, ...]

    @property
    def start(self) -> float:
        return self.words[0].start

    def last_mention(self, key: str) -> float | None:
        """When the word that ends the sentence's last mention of ``key`` starts
        (`xbench.findings.MENTIONS`: a term starting a word, in lower case); ``None``: no mention."""
        text, spans, at = "", [], 0
        for word in self.words:
            spans.append((at, at + len(word.text)))
            text += word.text.lower() + " "
            at += len(word.text) + 1
        ends = [match.end() for term in MENTIONS.get(key, ()) for match in re.finditer(rf"\b{re.escape(term)}", text)]
        if not ends:
            return None
        last = max(ends) - 1
        return next(word.start for word, (low, high) in zip(self.words, spans) if low <= last < high)


def finding_windows(sentences: Sequence[Sentence], key: str) -> list[tuple[float, float]]:
    """The windows of the finding-specific gaze of ``key``, merged where they overlap: for each
    sentence that mentions it, from `WINDOW_BEFORE_S` before the sentence starts (not before the
    previous sentence starts; 0 for the first) to the start of the word that ends its last mention."""
    windows = []
    for number, sentence in enumerate(sentences):
        end = sentence.last_mention(key)
        if end is not None:
            previous = sentences[number - 1].start if number else 0.0
            windows.append((max(sentence.start - WINDOW_BEFORE_S, previous), end))
    merged: list[tuple[float, float]] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def window_overlap(start: np.ndarray, end: np.ndarray, windows: Sequence[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Which fixations ``[start, end]`` reach into the windows (``end > window start`` and ``start <=
    window end``, the authors' test) and for how long (their overlap, summed over the windows)."""
    keep = np.zeros(len(start), dtype=bool)
    overlap = np.zeros(len(start))
    for low, high in windows:
        inside = (end > low) & (start <= high)
        keep |= inside
        overlap += np.where(inside, np.minimum(end, high) - np.maximum(start, low), 0.0)
    return keep, overlap


@dataclass(frozen=True)
class GazeTarget:
    """What a sample's gaze keys are made of: ``tied``: class key -> the gaze tied to it (a class
    absent: no gaze, ``has_gaze`` false); ``radiograph``: the id of the image the sample shows
    (its reads share it) and ``height``/``width``, the native grid the fixations are on."""

    tied: dict[str, Gaze]
    radiograph: str
    height: int
    width: int
    where: str = field(default="", compare=False)


def split_counts(targets: Sequence[GazeTarget], readings: dict[str, Gaze], size: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The split's fixation counts in the frame, in all and per radiograph (``readings``: each
    radiograph's readings, the whole of each)."""
    own = {radiograph: gaze.counts(size) for radiograph, gaze in readings.items()
           if radiograph in {target.radiograph for target in targets}}
    total = np.sum(list(own.values()), axis=0) if own else np.zeros((size, size), dtype=np.float32)
    return total.astype(np.float32), own


class GazeKeys(Dataset):
    """The decoded (or cached) samples with the gaze keys added, computed in the DataLoader workers
    by ``keys(index, native_size)`` (a picklable callable: a release's `ReleaseGaze`, the phantom's
    synthetic readings); the same through ``item``, which the model-input dataset reads."""

    def __init__(self, decoded: Dataset, keys: Callable[[int, tuple[int, int]], dict]) -> None:
        self.decoded = decoded
        self.keys = keys

    def __len__(self) -> int:
        return len(self.decoded)

    def __getitem__(self, index: int) -> dict:
        return self.item(index, with_native=False)[0]

    def item(self, index: int, with_native: bool):
        record, native = self.decoded.item(index, with_native)
        record.update(self.keys(index, tuple(record["native_size"].tolist())))
        return record, native


class ReleaseGaze:
    """A release's gaze keys of each sample: its targets drawn in the frame, and the split's other
    radiographs' fixation counts."""

    def __init__(self, targets: Sequence[GazeTarget], classes: Sequence[str], size: int, total: np.ndarray,
                 own: dict[str, np.ndarray]) -> None:
        self.targets = targets
        self.classes = list(classes)
        self.size = size
        self.total = total
        self.own = own

    def __call__(self, index: int, native_size: tuple[int, int]) -> dict:
        target, size = self.targets[index], self.size
        if not aspect_matches((target.height, target.width), native_size):
            raise ValueError(
                f"{target.where}: image {target.radiograph} is {native_size[1]} x {native_size[0]} (width x height) as "
                f"decoded, but its fixations are on a {target.width} x {target.height} grid, another aspect ratio: the "
                "image is not the one that was read. Point --data.images_root at MIMIC-CXR-JPG as released."
            )
        gaze = torch.zeros(len(self.classes), size, size)
        fixations = torch.zeros(len(self.classes), size, size)
        has_gaze = torch.zeros(len(self.classes), dtype=torch.bool)
        for column, key in enumerate(self.classes):
            tied = target.tied.get(key)
            if tied is None:
                continue
            density = tied.density(size)
            if density.sum() > 0:
                gaze[column] = torch.from_numpy(density.astype(np.float32))
                fixations[column] = torch.from_numpy(tied.counts(size))
                has_gaze[column] = True
        shuffled = self.total - self.own.get(target.radiograph, 0)
        return {"gaze": gaze, "fixations": fixations, "has_gaze": has_gaze,
                "shuffled_fixations": torch.from_numpy(np.asarray(shuffled, dtype=np.float32))}


class GazeDataModule(XBenchDataModule):
    """Base of the eye-tracking datasets: the ``gaze`` option, the gaze keys in every batch and the
    centre-bias baseline. A subclass's ``index`` fills ``self.gaze_targets`` (sample image id ->
    [`GazeTarget`][xbench.data.gaze.GazeTarget]) and ``self.radiograph_readings`` (radiograph -> all
    its readings, whole); its ``training_readings`` gives the release's training readings.

    Args:
        images_root: the MIMIC-CXR-JPG folder (the one holding ``files/``), where the images are read
            (default: ``root``), as MS-CXR's option.
        gaze: ``reading`` (each finding is compared with the whole reading's gaze, on images where the
            radiologist reported it) or ``finding`` (with the fixations of the window before the
            finding is dictated: `WINDOW_BEFORE_S`).
    """

    def __init__(self, root: str, images_root: str | None = None, gaze: GazeMode = "reading", **kwargs) -> None:
        super().__init__(root=root, **kwargs)
        if gaze not in GAZE_MODES:
            raise ValueError(f"--data.gaze must be one of {list(GAZE_MODES)}; got {gaze!r}")
        if self.augment is not None:
            raise ValueError("--data.augment: a gaze dataset's fixations are not moved by an augmentation, so the "
                             "gaze would no longer lie on the image; run a gaze dataset without --data.augment")
        self.images_root = Path(images_root).expanduser() if images_root is not None else self.root
        self.gaze = gaze
        self.gaze_targets: dict[str, GazeTarget] = {}
        self.radiograph_readings: dict[str, Gaze] = {}
        self._baseline: torch.Tensor | None = None

    def image_path(self, stated: str, where: str, what: str) -> Path:
        """The MIMIC-CXR-JPG file of a DICOM path as the release states it (``.../files/pXX/pNNN/sNNN/<dicom_id>.dcm``):
        ``<images_root>/files/pXX/pNNN/sNNN/<dicom_id>.jpg``; a missing file is an error naming ``where``."""
        tail = stated.replace("\\", "/").split("files/")[-1]
        path = (self.images_root / "files" / tail).with_suffix(".jpg")
        if not path.is_file():
            raise FileNotFoundError(
                f"{where}: {what} has no image at {path}. Point --data.images_root at the MIMIC-CXR-JPG folder that "
                f"holds files/ (currently {self.images_root}), with the image downloaded."
            )
        return path

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        targets = [self.gaze_targets[sample.image_id] for sample in self.samples]
        total, own = split_counts(targets, self.radiograph_readings, self.image_size)
        self.test_set = GazeKeys(self.test_set, ReleaseGaze(targets, self.classes, self.image_size, total, own))

    def training_readings(self) -> list[Fixations]:
        """The whole readings of the release's training split, for the centre-bias baseline."""
        raise NotImplementedError(f"{type(self).__name__} names no training readings")

    def gaze_baseline(self) -> torch.Tensor:
        """float32 [S, S]: the centre-bias density, the mean frame density of the training split's
        readings, summing to 1."""
        if self._baseline is None:
            drawn = [reading.density(self.image_size) for reading in self.training_readings()]
            drawn = [heat for heat in drawn if heat.sum() > 0]
            if not drawn:
                raise ValueError(f"{type(self).__name__}: the training split under {self.root} has no reading with "
                                 "fixations on the image; the centre-bias baseline needs at least one")
            mean = np.mean(drawn, axis=0)
            self._baseline = torch.from_numpy((mean / mean.sum()).astype(np.float32))
        return self._baseline
