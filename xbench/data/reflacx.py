"""REFLACX: radiologists' eye tracking and dictation on MIMIC-CXR images, with abnormality ellipses.

Read as released on PhysioNet (``reflacx-xray-localization/1.0.0``; ``root`` is the folder that
holds ``main_data/``): ``main_data/metadata_phase_{1,2,3}.csv`` (a row per reading: ``id, split,
eye_tracking_data_discarded, image, dicom_id, subject_id, image_size_x, image_size_y`` and a
column per label; phase 1's labels differ from phases 2-3's, both spelled into the keys of
`xbench.findings`), and per reading ``main_data/<id>/``: ``fixations.csv``,
``timestamps_transcription.csv``, ``anomaly_location_ellipses.csv``. Images are MIMIC-CXR-JPG's,
found from the ``image`` column's DICOM path under ``images_root``.

- **Gaze**: each fixation a Gaussian of σ = 1° of visual angle (the ``angular_resolution_*`` columns,
  pixels per degree, on each axis), weighted by its duration, drawn over the shown part of the image
  (``*_shown_from_image``), the sum normalised to 1 (ricbl/eyetracking ``generate_heatmaps.py``).
  With ``gaze: finding`` a finding's gaze is the fixations of the windows of `xbench.data.gaze`
  (Lanfredi et al.'s: 1.5 s before each sentence that names it, to the start of the word that ends
  its last mention), each weighted by its overlap with the window.
- **Labels**: a reading reports a label when its column holds a value other than 0 (or ``True``;
  the authors' ``value == value and value != 0``, ricbl/etsaliencymaps ``compare_heatmaps.py``); an
  image read several times (phases 1-2) is positive when more than half of its readings report it;
  a key a phase does not ask is unknown (-1) on its images.
- **Regions**: each reading's ellipses of certainty above `CERTAINTY_CUT` (the authors' ``certainty >
  2``: all but "Unlikely"), per label; on an image read several times, the pixels inside the ellipses
  of more than half of its readings.
- **Skipped and counted** (``notes``): readings marked ``eye_tracking_data_discarded`` (they have no
  fixations), fixations whose point lies outside the image.
- **Reads** (``reads: true``): one sample per reading of the images that several radiologists read
  (phases 1-2), each image entering only when none of its readings was discarded (Lanfredi et
  al.'s ``score_interobserver`` takes the images with all five); sample id `xbench.reads.read_id`
  ``(dicom_id, reading id)``. The reference gaze is the mean density of the *other* readings (with
  ``gaze: reading``, the whole of each, their rule; with ``gaze: finding``, the windows of those
  who named the finding), on the findings the held-out radiologist reported (named); the held-out
  reading's own density is the human's map (`reader_set`). Labels and regions are the other
  readings' majority.
"""

from __future__ import annotations

import csv
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from xbench.data.annotation_files import read_csv_rows
from xbench.data.base import Sample
from xbench.data.gaze import (
    Fixations,
    Gaze,
    GazeDataModule,
    GazeTarget,
    Sentence,
    Word,
    finding_windows,
    finite_number,
    window_overlap,
)
from xbench.data.readers import ReaderMark, ReaderSet
from xbench.data.regions import Ellipses, MajorityVote
from xbench.files import open_text
from xbench.findings import spellings_of
from xbench.reads import radiograph_of, read_id

PHASES = (1, 2, 3)
METADATA_COLUMNS = ("id", "split", "eye_tracking_data_discarded", "image", "dicom_id", "subject_id",
                    "image_size_x", "image_size_y")
#: Label columns that are not findings with a place.
NOT_FINDINGS = ("Other", "Quality issue")
FIXATION_COLUMNS = ("timestamp_start_fixation", "timestamp_end_fixation", "x_position", "y_position",
                    "angular_resolution_x_pixels_per_degree", "angular_resolution_y_pixels_per_degree",
                    "xmin_shown_from_image", "ymin_shown_from_image", "xmax_shown_from_image", "ymax_shown_from_image")
WORD_COLUMNS = ("word", "timestamp_start_word", "timestamp_end_word")
ELLIPSE_COLUMNS = ("xmin", "ymin", "xmax", "ymax", "certainty")
#: Ellipses of certainty above this enter the regions (certainties 1, 3, 5, 7, 9; 1 is "Unlikely").
CERTAINTY_CUT = 2
#: σ of each fixation's Gaussian, in degrees of visual angle.
SIGMA_DEGREES = 1.0
SPLITS = ("train", "validate", "test", "all")


@dataclass
class Reading:
    """One radiologist's reading of one image, as the metadata states it."""

    id: str
    phase: int
    where: str
    dicom_id: str
    image: str
    split: str
    height: int
    width: int
    labels: dict[str, int]
    discarded: bool


def _header(path: Path) -> list[str]:
    with open_text(path) as handle:
        return [name.strip() for name in next(csv.reader(handle), [])]


class REFLACX(GazeDataModule):
    """REFLACX (Lanfredi et al., Sci Data 2022): 3,032 readings of 2,616 MIMIC-CXR images by 5 radiologists.

    Args:
        split: the release's ``split`` column (MIMIC-CXR's): ``test`` (default), ``validate``,
            ``train``, or ``all``.
        reads: one sample per reading of the images several radiologists read (the interobserver
            ceiling, `reader_set`); default one sample per image.
    """

    name = "reflacx"

    def __init__(self, root: str, images_root: str | None = None, split: Literal["train", "validate", "test", "all"] = "test",
                 reads: bool = False, **kwargs) -> None:
        super().__init__(root=root, images_root=images_root, **kwargs)
        if split not in SPLITS:
            raise ValueError(f"--data.split must be one of {list(SPLITS)}; got {split!r}")
        self.split = split
        self.reads = reads
        self._readings: list[Reading] | None = None
        self._fixations: dict[str, Fixations] = {}
        self._times: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._ellipses: dict[str, dict[str, Ellipses]] = {}
        self._reader_set: ReaderSet | None = None
        self.outside: Counter = Counter()
        self.unnamed: set[tuple[str, str]] = set()  # (reading, key): reported, never named

    @property
    def main(self) -> Path:
        return self.root / "main_data"

    # ---- the release's files ----

    def readings(self) -> list[Reading]:
        """Every reading of the three phases, in file order."""
        if self._readings is None:
            spellings = spellings_of(self.name)
            readings = []
            for phase in PHASES:
                path = self.require(self.main / f"metadata_phase_{phase}.csv", f"the phase {phase} metadata")
                label_columns = self._label_columns(path, spellings)
                for line, row in read_csv_rows(path, METADATA_COLUMNS + tuple(label_columns)):
                    where = f"{path}, line {line}"
                    discarded = row["eye_tracking_data_discarded"]
                    if discarded not in ("True", "False"):
                        raise ValueError(f"{where}: eye_tracking_data_discarded is {discarded!r}; expected True or False")
                    labels: dict[str, int] = {}
                    for column, key in label_columns.items():
                        value = row[column]
                        present = value == "True" or (value not in ("", "False") and finite_number(value, where, column) != 0)
                        labels[key] = max(labels.get(key, 0), int(present))
                    readings.append(Reading(
                        id=row["id"], phase=phase, where=where, dicom_id=row["dicom_id"], image=row["image"],
                        split=row["split"], height=int(finite_number(row["image_size_y"], where, "image_size_y")),
                        width=int(finite_number(row["image_size_x"], where, "image_size_x")), labels=labels,
                        discarded=discarded == "True"))
            self._readings = readings
        return self._readings

    def _label_columns(self, path: Path, spellings: dict[str, str]) -> dict[str, str]:
        """The metadata's label columns -> keys; a column that is neither a label nor metadata is named."""
        columns = {}
        for name in _header(path):
            if name in METADATA_COLUMNS or name in NOT_FINDINGS:
                continue
            if name not in spellings:
                raise ValueError(f"{path}: the label column {name!r} is not a REFLACX label spelling "
                                 f"({sorted(spellings)}); add it to xbench/findings.py SPELLINGS['reflacx']")
            columns[name] = spellings[name]
        return columns

    def fixations(self, reading: Reading) -> Fixations:
        """The reading's ``fixations.csv``, its fixations outside the image left out (and counted);
        a negative duration or a non-positive angular resolution is an error naming the line."""
        if reading.id not in self._fixations:
            path = self.require(self.main / reading.id / "fixations.csv", f"the fixations of reading {reading.id}")
            rows = []
            for line, row in read_csv_rows(path, FIXATION_COLUMNS):
                where = f"{path}, line {line}"
                values = [finite_number(row[column], where, column) for column in FIXATION_COLUMNS]
                start, end, x, y, res_x, res_y = values[:6]
                if end < start:
                    raise ValueError(f"{where}: the fixation ends ({end} s) before it starts ({start} s), a negative "
                                     f"duration, in reading {reading.id}; the file is damaged: download it again")
                if res_x <= 0 or res_y <= 0:
                    raise ValueError(f"{where}: the angular resolution is ({res_x}, {res_y}) pixels per degree; "
                                     "it must be positive")
                if not (0 <= x + 0.5 < reading.width and 0 <= y + 0.5 < reading.height):
                    self.outside[reading.id] += 1
                    continue
                rows.append(values)
            table = np.array(rows, dtype=np.float64).reshape(-1, len(FIXATION_COLUMNS))
            self._fixations[reading.id] = Fixations(
                reading.height, reading.width, x=table[:, 2], y=table[:, 3], weight=table[:, 1] - table[:, 0],
                sigma_x=table[:, 4] * SIGMA_DEGREES, sigma_y=table[:, 5] * SIGMA_DEGREES,
                shown=np.round(table[:, 6:10]))
            self._times[reading.id] = (table[:, 0], table[:, 1])
        return self._fixations[reading.id]

    def sentences(self, reading: Reading) -> list[Sentence]:
        """The reading's dictation, sentence by sentence (the words up to a period)."""
        path = self.main / reading.id / "timestamps_transcription.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: reading {reading.id} has no timestamped transcript, which --data.gaze "
                                    "finding needs; download main_data/ again, or use --data.gaze reading")
        sentences, words = [], []
        for line, row in read_csv_rows(path, WORD_COLUMNS):
            where = f"{path}, line {line}"
            if not row["timestamp_start_word"] or not row["timestamp_end_word"]:
                raise ValueError(f"{where}: the word {row['word']!r} of reading {reading.id} has no timestamps, which "
                                 "--data.gaze finding needs; download the file again, or use --data.gaze reading")
            if row["word"] == ".":
                if words:
                    sentences.append(Sentence(tuple(words)))
                words = []
                continue
            words.append(Word(row["word"], finite_number(row["timestamp_start_word"], where, "timestamp_start_word"),
                              finite_number(row["timestamp_end_word"], where, "timestamp_end_word")))
        if words:
            sentences.append(Sentence(tuple(words)))
        return sentences

    def ellipses(self, reading: Reading) -> dict[str, Ellipses]:
        """The reading's ellipses of certainty above the cut, per key (read once)."""
        if reading.id in self._ellipses:
            return self._ellipses[reading.id]
        path = self.require(self.main / reading.id / "anomaly_location_ellipses.csv",
                            f"the ellipses of reading {reading.id}")
        spellings = spellings_of(self.name)
        labels = [name for name in _header(path) if name in spellings]
        boxes: dict[str, list] = defaultdict(list)
        for line, row in read_csv_rows(path, ELLIPSE_COLUMNS + tuple(labels)):
            where = f"{path}, line {line}"
            corners = tuple(finite_number(row[column], where, column) for column in ELLIPSE_COLUMNS[:4])
            if finite_number(row["certainty"], where, "certainty") <= CERTAINTY_CUT:
                continue
            for name in labels:
                if row[name] == "True":
                    boxes[spellings[name]].append(corners)
        self._ellipses[reading.id] = {key: Ellipses(tuple(found)) for key, found in boxes.items()}
        return self._ellipses[reading.id]

    # ---- the samples ----

    def tied(self, reading: Reading, key: str) -> Fixations | None:
        """The reading's gaze tied to ``key``: the whole reading where it reports ``key`` (``gaze:
        reading``), or the windows before the sentences that name it (``gaze: finding``); ``None``
        where it has none."""
        if reading.labels.get(key) != 1:
            return None
        fixations = self.fixations(reading)
        if self.gaze == "reading":
            return fixations
        windows = finding_windows(self.sentences(reading), key)
        if not windows:
            self.unnamed.add((reading.id, key))
            return None
        start, end = self._times[reading.id]
        keep, overlap = window_overlap(start, end, windows)
        return fixations.subset(keep, overlap) if keep.any() else None

    def index(self) -> list[Sample]:
        self.outside, self.unnamed = Counter(), set()
        kept = [r for r in self.readings() if not r.discarded and (self.split == "all" or r.split == self.split)]
        discarded = [r for r in self.readings() if r.discarded and (self.split == "all" or r.split == self.split)]
        by_image: dict[str, list[Reading]] = defaultdict(list)
        for reading in kept:
            by_image[reading.dicom_id].append(reading)
        all_reads = Counter(r.dicom_id for r in self.readings())
        samples, marks, read_once, left_out = [], {}, 0, 0
        for dicom_id, readings in by_image.items():
            path = self.image_path(readings[0].image, readings[0].where, f"reading {readings[0].id} of image {dicom_id}")
            self.radiograph_readings[dicom_id] = Gaze(tuple(self.fixations(r) for r in readings))
            if not self.reads:
                samples.append(self._sample(dicom_id, path, readings))
                continue
            if all_reads[dicom_id] < 2:
                read_once += 1  # no other radiologist to compare with
                continue
            if len(readings) < all_reads[dicom_id]:
                left_out += 1
                continue
            for held_out in readings:
                others = [r for r in readings if r is not held_out]
                sample = self._sample(read_id(dicom_id, held_out.id), path, others, held_out)
                samples.append(sample)
                marks[sample.image_id] = {key: ReaderMark(held_out.labels.get(key, 0),
                                                          gaze=None if (own := self.tied(held_out, key)) is None
                                                          else Gaze((own,)))
                                          for key in self.classes}
        if self.reads:
            self._reader_set = ReaderSet(
                name="reflacx-interobserver",
                rule=f"each REFLACX reading's gaze density (gaze: {self.gaze}) against the mean density of the other "
                     "radiologists who read the image (leave one reader out)",
                marks=marks)
        self.notes = {
            "split": self.split, "gaze": self.gaze, "reads": self.reads,
            "images": len({radiograph_of(sample.image_id) for sample in samples}), "samples": len(samples),
            "readings": len(kept),
            "readings_discarded": len(discarded),
            "fixations_outside_image": sum(self.outside.values()),
            "gaze_reported_but_not_named_in_the_dictation": dict(Counter(key for _, key in sorted(self.unnamed))),
        }
        if self.reads:
            self.notes.update(images_read_once=read_once, images_left_out_of_reads_for_a_discarded_reading=left_out)
        return samples

    def _sample(self, sample_id: str, path: Path, reference: list[Reading], held_out: Reading | None = None) -> Sample:
        """A sample whose labels, regions and gaze come from ``reference`` (majority where several);
        with a ``held_out`` reading, its gaze only on the findings that reading ties gaze to."""
        supported = self.supported_classes()
        labels = {}
        for key in supported:
            votes = [r.labels[key] for r in reference if key in r.labels]
            labels[key] = int(2 * sum(votes) > len(votes)) if votes else -1
        regions = {}
        drawn = [self.ellipses(r) for r in reference]
        for key in self.classes:
            found = [e[key] for e in drawn if key in e]
            if found and labels[key] == 1:
                regions[key] = found[0] if len(reference) == 1 else MajorityVote(tuple(found), len(reference))
        tied = {}
        for key in self.classes:
            if held_out is not None:
                if self.tied(held_out, key) is None:
                    continue
                if self.gaze == "reading":
                    readings = [self.fixations(r) for r in reference]
                else:
                    readings = [f for r in reference if (f := self.tied(r, key)) is not None]
            else:
                readings = [f for r in reference if (f := self.tied(r, key)) is not None]
            if readings:
                tied[key] = Gaze(tuple(readings))
        first = reference[0]
        self.gaze_targets[sample_id] = GazeTarget(tied, first.dicom_id, first.height, first.width, first.where)
        return Sample(image_id=sample_id, path=path, labels=labels, regions=regions)

    def training_readings(self) -> list[Fixations]:
        return [self.fixations(r) for r in self.readings() if r.split == "train" and not r.discarded]

    def reader_set(self) -> ReaderSet | None:
        """With ``reads``: each held-out reading's own gaze density, scored against the others'."""
        if not self.reads:
            return None
        self.samples
        return self._reader_set
