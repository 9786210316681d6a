"""Synthetic radiographs with lesions of known class, position and size, in ChestX-Det10's format.

The demo and the end-to-end tests run through the real ChestX-Det10 loader on these files: grey
images with dark lung fields, a bright mediastinum and spine, rib-like texture and noise; each
lesion is a soft bright opacity inside a lung whose class is its size -- ``nodule`` small,
``mass`` medium, ``consolidation`` large -- and whose box is its tight bounding box. About a
quarter of the images are negatives. Everything follows from ``seed``.

With ``second_reader``, a synthetic radiologist reads every image (`second_reader_set`): each true
box shifted and resized by a seeded jitter, and a share of the lesions missed, so a ``--model human``
run has a human row that is good but not perfect, for the report's human scale to be tested on.
With ``reads`` > 1, each image is read that many times (samples ``<file>#R1``, ``<file>#R2``, ...,
`xbench.reads`), each read with its own jitter: intervals then resample radiographs, every read of a
drawn radiograph with it.
With ``gaze``, every image also has a synthetic eye-tracking reading (`SyntheticReadings`): a
survey of fixations around the middle of the chest and, for each finding present, fixations
around its box; the batch then carries the gaze keys of a gaze dataset (``docs/architecture.md``)
and the datamodule its centre bias (`Phantom.gaze_baseline`), so every model scores gaze end to end.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from xbench.cache import cache_root, check_cache_writable
from xbench.files import staging_folder
from xbench.data.base import Sample
from xbench.data.chestx_det10 import ChestXDet10
from xbench.data.gaze import GazeKeys
from xbench.data.readers import ReaderMark, ReaderSet
from xbench.data.regions import Boxes
from xbench.reads import read_id

#: class key -> (raw ChestX-Det10 spelling, lesion radius range as a fraction of the image side)
LESIONS = {
    "nodule": ("Nodule", (0.025, 0.04)),
    "mass": ("Mass", (0.06, 0.09)),
    "consolidation": ("Consolidation", (0.12, 0.17)),
}
#: Range of a lesion's aspect ratio (its ellipse's semi-axes are radius x aspect and radius / aspect).
ASPECT = (0.75, 1.3)
GENERATOR_VERSION = 1
#: The smallest side at which every lesion covers a pixel centre: the smallest semi-axis (in the
#: [-1, 1] frame: 2 x the nodule's smallest radius, over the aspect's extreme) must reach half a
#: pixel's diagonal, sqrt(2) / side.
MIN_NATIVE_SIZE = math.ceil(math.sqrt(2) / (2 * LESIONS["nodule"][1][0] * min(ASPECT[0], 1 / ASPECT[1])))
#: The second reader: the share of true lesions (per image and finding) it misses, and how far it
#: moves each box's centre and scales its sides, as fractions of the box's side.
MISSED, SHIFT, SCALE = 0.2, 0.3, 0.25
READER_RULE = ("a synthetic second reader: each true box shifted by up to {shift:.0%} and resized by up to "
               "{scale:.0%} of its side (seeded per image and read), {missed:.0%} of the findings missed; scored "
               "against the phantom's true regions")


def reader_name(reads: int) -> str:
    """The reader set's name: ``phantom-second`` (one read per image), ``phantom-second-x3`` (three)."""
    return "phantom-second" if reads == 1 else f"phantom-second-x{reads}"


def second_reader_set(samples: list[Sample], size: int, seed: int, reads: int) -> ReaderSet:
    """The synthetic second reader's marks on every sample (images ``size`` pixels square),
    deterministic in ``seed`` and each sample's index: per finding with a region, missed with
    probability `MISSED`, else every box jittered (`SHIFT`, `SCALE`) and kept inside the image."""
    marks = {}
    for index, sample in enumerate(samples):
        rng = np.random.default_rng([seed, 1, index])
        by_class = {}
        for key, region in sample.regions.items():
            if rng.random() < MISSED:
                by_class[key] = ReaderMark(label=0)
                continue
            boxes = []
            for x1, y1, x2, y2 in region.xyxy:
                width, height = x2 - x1, y2 - y1
                dx, dy = rng.uniform(-SHIFT, SHIFT, 2) * (width, height)
                sx, sy = 1 + rng.uniform(-SCALE, SCALE, 2)
                cx, cy = (x1 + x2) / 2 + dx, (y1 + y2) / 2 + dy
                boxes.append((max(cx - sx * width / 2, 0.0), max(cy - sy * height / 2, 0.0),
                              min(cx + sx * width / 2, size), min(cy + sy * height / 2, size)))
            by_class[key] = ReaderMark(label=1, region=Boxes(tuple(boxes)))
        marks[sample.image_id] = by_class
    rule = READER_RULE.format(shift=SHIFT, scale=SCALE, missed=MISSED)
    return ReaderSet(reader_name(reads), rule + ("" if reads == 1 else f"; {reads} reads per image"), marks)


def _ellipse(xx, yy, cx, cy, rx, ry):
    return ((xx - cx) / rx) ** 2 + ((yy - cy) / ry) ** 2


def _radiograph(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list[str], list[list[int]]]:
    axis = (np.arange(size) + 0.5) / size * 2 - 1
    xx, yy = np.meshgrid(axis, axis)
    image = np.full((size, size), 0.06)
    image[_ellipse(xx, yy, 0, 0.05, 0.92, 1.0) < 1] = 0.55
    lungs = []
    for side in (-1, 1):
        cx, cy, rx, ry = side * rng.uniform(0.34, 0.4), rng.uniform(-0.12, -0.02), rng.uniform(0.25, 0.3), rng.uniform(0.5, 0.6)
        lungs.append((cx, cy, rx, ry))
        image[_ellipse(xx, yy, cx, cy, rx, ry) < 1] = 0.24
    image[_ellipse(xx, yy, rng.uniform(0.02, 0.1), 0.3, 0.27, 0.32) < 1] = 0.72
    image[np.abs(xx) < 0.07] += 0.1
    in_lung = np.zeros_like(image, dtype=bool)
    for cx, cy, rx, ry in lungs:
        in_lung |= _ellipse(xx, yy, cx, cy, rx, ry) < 1
    ribs = 0.5 + 0.5 * np.sin(2 * np.pi * 6.5 * (yy + 0.25 * xx**2) + rng.uniform(0, 2 * np.pi))
    image += np.where(in_lung, 0.09 * ribs**4, 0)

    syms, boxes = [], []
    count = 0 if rng.random() < 0.25 else int(rng.integers(1, 3))
    for _ in range(count):
        key = rng.choice(list(LESIONS))
        raw, (low, high) = LESIONS[key]
        radius = rng.uniform(low, high) * 2  # in the [-1, 1] coordinate frame
        cx, cy, rx, ry = lungs[int(rng.integers(0, 2))]
        angle, reach = rng.uniform(0, 2 * np.pi), rng.uniform(0, 0.6)
        lx, ly = cx + reach * rx * np.cos(angle), cy + reach * ry * np.sin(angle)
        aspect = rng.uniform(*ASPECT)
        distance = np.sqrt(_ellipse(xx, yy, lx, ly, radius * aspect, radius / aspect))
        image += 0.28 * np.clip(1.6 * (1 - distance), 0, 1)
        rows, cols = np.nonzero(distance < 1)
        syms.append(raw)
        boxes.append([int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1])
    image += rng.normal(0, 0.025, size=image.shape)
    return (np.clip(image, 0, 1) * 255).round().astype(np.uint8), syms, boxes


#: The synthetic readings: fixations per finding and in the survey (ranges), the spread of a finding's
#: fixations around its box centre (in units of the box's half sides), of the survey's (a fraction of
#: the frame side), and the Gaussian drawn per fixation for the density (a fraction of the frame side).
FINDING_FIXATIONS = (3, 12)
SURVEY_FIXATIONS = (8, 20)
FINDING_SPREAD = 0.8
SURVEY_SPREAD = 0.18
GAZE_SIGMA = 0.03
#: The synthetic training readings the centre bias is the mean density of (images of another stream).
TRAINING_READINGS = 32


class SyntheticReadings:
    """One reading per sample, deterministic by ``seed`` and the sample's index, in the metric frame
    of side ``size``: per finding present, its fixations' (row, column) positions (those outside the
    frame dropped), and the survey's. ``native_sizes``: each sample's (height, width), which its boxes
    are in."""

    def __init__(self, samples: list[Sample], classes: list[str], native_sizes: list[tuple[int, int]], size: int,
                 seed: int) -> None:
        self.classes, self.size = list(classes), size
        self.readings = [self._reading(sample, native, np.random.default_rng([seed, 51, index]))
                         for index, (sample, native) in enumerate(zip(samples, native_sizes))]
        self.total = sum(self._counts(np.concatenate([*reading.values()])) for reading in self.readings)

    def _reading(self, sample: Sample, native: tuple[int, int], rng: np.random.Generator
                 ) -> dict[str | None, np.ndarray]:
        scale = self.size / np.asarray(native, dtype=float)  # (rows, columns)
        centre = np.array([0.45, 0.5]) * self.size
        reading = {None: self._inside(centre + rng.normal(0, SURVEY_SPREAD * self.size,
                                                          (int(rng.integers(*SURVEY_FIXATIONS)), 2)))}
        for key in self.classes:
            region = sample.regions.get(key)
            if region is None:
                continue
            x1, y1, x2, y2 = region.xyxy[int(rng.integers(len(region.xyxy)))]
            middle = np.array([(y1 + y2) / 2, (x1 + x2) / 2]) * scale
            half = np.array([(y2 - y1) / 2, (x2 - x1) / 2]) * scale
            count = int(rng.integers(*FINDING_FIXATIONS))
            reading[key] = self._inside(middle + rng.normal(0, 1, (count, 2)) * FINDING_SPREAD * np.maximum(half, 1))
        return reading

    def _inside(self, positions: np.ndarray) -> np.ndarray:
        return positions[((positions >= 0) & (positions < self.size)).all(1)]

    def _counts(self, positions: np.ndarray) -> np.ndarray:
        counts = np.zeros((self.size, self.size))
        np.add.at(counts, (positions[:, 0].astype(int), positions[:, 1].astype(int)), 1)
        return counts

    def density(self, positions: np.ndarray) -> np.ndarray:
        """A Gaussian of `GAZE_SIGMA` per fixation over the frame's pixel centres, summing to 1."""
        axis = np.arange(self.size) + 0.5
        sigma = GAZE_SIGMA * self.size
        rows = np.exp(-((axis[None] - positions[:, :1]) ** 2) / (2 * sigma**2))
        cols = np.exp(-((axis[None] - positions[:, 1:]) ** 2) / (2 * sigma**2))
        density = rows.T @ cols
        return density / density.sum()

    def keys(self, index: int, native_size: tuple[int, int]) -> dict[str, torch.Tensor]:
        """The gaze keys of sample ``index`` (`xbench.data.gaze.GazeKeys` adds them): ``gaze``,
        ``fixations`` [C, S, S], ``has_gaze`` [C] and ``shuffled_fixations`` [S, S] (every other
        reading's fixations); drawn in the frame, whatever the native size."""
        reading, size = self.readings[index], self.size
        gaze = np.zeros((len(self.classes), size, size), np.float32)
        fixations = np.zeros_like(gaze)
        has = np.zeros(len(self.classes), bool)
        for c, key in enumerate(self.classes):
            if len(reading.get(key, ())):
                gaze[c], fixations[c], has[c] = self.density(reading[key]), self._counts(reading[key]), True
        own = self._counts(np.concatenate([*reading.values()]))
        return {"gaze": torch.from_numpy(gaze), "fixations": torch.from_numpy(fixations),
                "has_gaze": torch.from_numpy(has),
                "shuffled_fixations": torch.from_numpy((self.total - own).astype(np.float32))}

    def mean_density(self) -> torch.Tensor:
        """float32 [S, S]: the mean density of the whole readings (survey and findings)."""
        densities = [self.density(np.concatenate([*reading.values()])) for reading in self.readings]
        return torch.from_numpy(np.mean(densities, 0).astype(np.float32))


def generate_phantom(root: Path, num_images: int, size: int, seed: int) -> None:
    """Write ``test.json`` and ``test_data/*.png`` under ``root`` (atomically: all or nothing)."""
    root = Path(root)
    staging = staging_folder(root.parent, root.name)
    try:
        (staging / "test_data").mkdir()
        rng = np.random.default_rng(seed)
        entries = []
        for i in range(num_images):
            pixels, syms, boxes = _radiograph(rng, size)
            file_name = f"{i:05d}.png"
            Image.fromarray(pixels).save(staging / "test_data" / file_name)
            entries.append({"file_name": file_name, "syms": syms, "boxes": boxes})
        (staging / "test.json").write_text(json.dumps(entries))
        os.replace(staging, root)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


class Phantom(ChestXDet10):
    """The phantom set, generated on first use into ``root`` (default: a cache folder keyed by
    the settings), then read by the ChestX-Det10 loader.

    Args:
        root: where the files are (or will be) written; default ``$XBENCH_CACHE`` or ``~/.cache/xbench``.
        num_images: images in the split. native_size: side of the written PNGs
        (at least `MIN_NATIVE_SIZE`, so that every lesion covers a pixel). seed: the generator's
        seed. second_reader: a synthetic second reader (`second_reader_set`) for ``--model human``.
        reads: samples per image, each a read ``<file>#R<k>`` (``1``: one sample per image, not a read).
        gaze: give every image a synthetic eye-tracking reading (`SyntheticReadings`): the
        batch carries the gaze keys, and `gaze_baseline` the centre bias.
    """

    name = "phantom"
    spellings = "chestx_det10"

    def __init__(
        self, root: str | None = None, num_images: int = 48, native_size: int = 256, seed: int = 0,
        second_reader: bool = False, reads: int = 1, gaze: bool = False, **kwargs
    ) -> None:
        for option, value, least in (("num_images", num_images, 1), ("native_size", native_size, MIN_NATIVE_SIZE),
                                     ("reads", reads, 1)):
            if value < least:
                raise ValueError(f"--data.{option} must be at least {least}; got {value}")
        self.in_cache = root is None
        if root is None:
            root = str(cache_root() / f"phantom-v{GENERATOR_VERSION}-n{num_images}-s{native_size}-seed{seed}")
        super().__init__(root=root, split="test", **kwargs)
        self.num_images = num_images
        self.native_size = native_size
        self.seed = seed
        self.second_reader = second_reader
        self.read_count = reads
        self.reads = reads > 1
        self.gaze = gaze
        self.readings: SyntheticReadings | None = None
        if gaze and self.augment is not None:
            raise ValueError("--data.gaze draws each reading on the image as written; it cannot follow --data.augment "
                             "(a moved image would leave its gaze behind). Drop one of them.")

    @classmethod
    def default_classes(cls) -> tuple[str, ...]:
        return tuple(LESIONS)

    def prepare_data(self) -> None:
        if not (self.root / "test.json").exists():
            if self.in_cache:
                check_cache_writable()
            generate_phantom(self.root, self.num_images, self.native_size, self.seed)
        super().prepare_data()

    def index(self) -> list[Sample]:
        samples = super().index()
        if not self.reads:
            return samples
        return [Sample(read_id(s.image_id, f"R{k}"), s.path, s.labels, s.regions) for s in samples
                for k in range(1, self.read_count + 1)]

    def reader_set(self) -> ReaderSet | None:
        if not self.second_reader:
            return None
        return second_reader_set(self.samples, self.native_size, self.seed, self.read_count)

    def setup(self, stage: str | None = None) -> None:
        super().setup(stage)
        if self.gaze:
            sizes = []
            for sample in self.samples:  # the boxes are in the files' pixels, whatever size wrote them
                with Image.open(sample.path) as image:
                    sizes.append(image.size[::-1])
            self.readings = SyntheticReadings(self.samples, self.classes, sizes, self.image_size, self.seed)
            self.test_set = GazeKeys(self.test_set, self.readings.keys)

    def gaze_baseline(self) -> torch.Tensor | None:
        """The centre bias [S, S]: the mean gaze density of `TRAINING_READINGS` synthetic readings of
        other phantom images (their lesions drawn from another stream of the seed, never the split's),
        as Lanfredi et al. build it from the training readings; ``None`` without ``gaze``."""
        if not self.gaze:
            return None
        rng = np.random.default_rng([self.seed, 51])
        raw_key = {raw: key for key, (raw, _) in LESIONS.items()}
        samples = []
        for _ in range(TRAINING_READINGS):
            _, syms, boxes = _radiograph(rng, self.native_size)
            regions: dict[str, list] = {}
            for sym, box in zip(syms, boxes):
                regions.setdefault(raw_key[sym], []).append(tuple(map(float, box)))
            samples.append(Sample("training", self.root, {}, {k: Boxes(tuple(v)) for k, v in regions.items()}))
        return SyntheticReadings(samples, self.classes, [(self.native_size,) * 2] * len(samples), self.image_size,
                                 self.seed + 1).mean_density()
