"""EGD-CXR: one radiologist's eye gaze and dictation on 1,083 MIMIC-CXR images (Karargyris et al., Sci Data 2021).

Read as released on PhysioNet (``egd-cxr/1.0.0``; ``root`` is that folder): ``master_sheet.csv``
(``dicom_id, path, patient_id`` and the condition flags ``Normal, CHF, pneumonia``),
``fixations.csv`` (a row per fixation: ``DICOM_ID, Time (in secs)``, the screen position ``FPOGX,
FPOGY`` and the image position ``X_ORIGINAL, Y_ORIGINAL``, -1 where the gaze left the image) and
``audio_segmentation_transcripts/<dicom_id>/transcript.json`` (``time_stamped_text``: ``phrase,
begin_time, end_time``). Images are MIMIC-CXR-JPG's, found from ``path`` under ``images_root``; the
anatomy boxes (``bounding_boxes.csv``) are not findings, so no region is graded.

- **Gaze**: the authors' static heatmap (cxr-eye-gaze/eye-gaze-dataset,
  ``DataProcessing/DataPostProcessing/create_heatmap_images_and_or_videos.py``): each fixation adds 1
  at its image pixel, blurred by a Gaussian of σ = `SIGMA_PIXELS` native pixels
  (``ndimage.gaussian_filter(record, sigma=150)``); here each fixation is that Gaussian drawn in the
  frame (`xbench.data.gaze`), normalised to sum 1. ``gaussian_filter`` reflects at the border the mass
  that falls outside; this density keeps only the mass inside the image, so it differs within about
  2σ of the border. With ``gaze: finding``, the fixations whose time falls in the windows of
  `xbench.data.gaze` before each phrase that names the finding; the transcript times phrases, not
  words, so a window ends where the phrase that names the finding starts.
- **Labels**: ``CHF`` and ``pneumonia`` (0/1); ``Normal`` is their absence.
- **Split**: the release has none; the authors' experiments split by patient
  (``Experiments/utils/dataset.py``, ``split_dataset``: the master sheet's patient ids in order of
  appearance, shuffled by Python's ``random`` seeded 1, the first 80 % train, half of the rest dev,
  the rest test), which `split` reproduces.
- **Skipped and counted** (``notes``): fixations outside the image (``X_ORIGINAL`` or
  ``Y_ORIGINAL`` outside it, the release's -1 included); images without fixations (no gaze).
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from typing import Literal

import numpy as np
from PIL import Image

from xbench.data.annotation_files import read_csv_rows
from xbench.data.base import Sample
from xbench.data.gaze import (Fixations, Gaze, GazeDataModule, GazeTarget, Sentence, Word, finding_windows,
                              finite_number, window_overlap)
from xbench.findings import spellings_of

SIGMA_PIXELS = 150.0
MASTER_COLUMNS = ("dicom_id", "path", "patient_id")
FIXATION_COLUMNS = ("DICOM_ID", "Time (in secs)", "X_ORIGINAL", "Y_ORIGINAL")
SPLITS = ("train", "dev", "test", "all")
#: The authors' split: the seed, the train share, and the dev share of the rest.
SPLIT_SEED, TRAIN_SHARE, DEV_SHARE = 1, 0.8, 0.5


def authors_split(patients: list[str]) -> dict[str, str]:
    """patient id -> ``train``/``dev``/``test`` by the authors' ``split_dataset``."""
    shuffled = list(dict.fromkeys(patients))
    random.Random(SPLIT_SEED).shuffle(shuffled)
    train = round(len(shuffled) * TRAIN_SHARE)
    dev = round((len(shuffled) - train) * DEV_SHARE)
    return {patient: "train" if i < train else "dev" if i < train + dev else "test"
            for i, patient in enumerate(shuffled)}


class EGDCXR(GazeDataModule):
    """EGD-CXR: 1,083 MIMIC-CXR images read by one radiologist.

    Args:
        split: the authors' patient split, ``test`` (default), ``dev``, ``train``, or ``all``.
    """

    name = "egd_cxr"

    def __init__(self, root: str, images_root: str | None = None, split: Literal["train", "dev", "test", "all"] = "test",
                 **kwargs) -> None:
        super().__init__(root=root, images_root=images_root, **kwargs)
        if split not in SPLITS:
            raise ValueError(f"--data.split must be one of {list(SPLITS)}; got {split!r}")
        self.split = split
        self._train: list[Fixations] = []

    def _master(self) -> list[tuple[str, dict[str, str]]]:
        path = self.require(self.root / "master_sheet.csv", "master_sheet.csv")
        spellings = spellings_of(self.name)
        return [(f"{path}, line {line}", row)
                for line, row in read_csv_rows(path, MASTER_COLUMNS + tuple(spellings))]

    def _fixations(self) -> tuple[dict[str, list[tuple[float, float, float]]], dict[str, str]]:
        """dicom id -> [(time, x, y)] in file order, and the first line of each image."""
        path = self.require(self.root / "fixations.csv", "fixations.csv")
        found, first = defaultdict(list), {}
        for line, row in read_csv_rows(path, FIXATION_COLUMNS):
            where = f"{path}, line {line}"
            dicom_id = row["DICOM_ID"]
            first.setdefault(dicom_id, where)
            found[dicom_id].append(tuple(finite_number(row[c], where, c) for c in FIXATION_COLUMNS[1:]))
        return found, first

    def sentences(self, dicom_id: str) -> list[Sentence]:
        path = self.root / "audio_segmentation_transcripts" / dicom_id / "transcript.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: image {dicom_id} has no transcript, which --data.gaze finding needs; "
                                    "download audio_segmentation_transcripts/ again, or use --data.gaze reading")
        try:
            phrases = json.loads(path.read_text(encoding="utf-8"))["time_stamped_text"]
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(f"{path}: not a transcript with time_stamped_text ({error!r})") from None
        sentences = []
        for number, phrase in enumerate(phrases):
            where = f"{path}, time_stamped_text[{number}]"
            if not isinstance(phrase, dict) or any(phrase.get(k) in (None, "") for k in ("begin_time", "end_time")):
                raise ValueError(f"{where}: the phrase has no begin_time/end_time, which --data.gaze finding needs; "
                                 "download the transcript again, or use --data.gaze reading")
            sentences.append(Sentence((Word(str(phrase.get("phrase", "")), finite_number(str(phrase["begin_time"]), where, "begin_time"),
                                            finite_number(str(phrase["end_time"]), where, "end_time")),)))
        return sentences

    def index(self) -> list[Sample]:
        master = self._master()
        spellings = spellings_of(self.name)
        split_of = authors_split([row["patient_id"] for _, row in master])
        fixations, _ = self._fixations()
        samples, outside, without, unnamed = [], 0, 0, Counter()
        self._train = []
        for where, row in master:
            dicom_id = row["dicom_id"]
            path = self.image_path(row["path"], where, f"image {dicom_id}")
            with Image.open(path) as image:
                width, height = image.size
            points = np.array(fixations.get(dicom_id, []), dtype=np.float64).reshape(-1, 3)
            inside = (points[:, 1] >= 0) & (points[:, 1] < width) & (points[:, 2] >= 0) & (points[:, 2] < height)
            chosen = split_of[row["patient_id"]] == self.split or self.split == "all"
            outside += int((~inside).sum()) if chosen else 0
            points = points[inside]
            sigma = np.full(len(points), SIGMA_PIXELS)
            whole = Fixations(height, width, points[:, 1], points[:, 2], np.ones(len(points)), sigma, sigma)
            if split_of[row["patient_id"]] == "train":
                self._train.append(whole)
            if not chosen:
                continue
            without += not len(whole)
            labels = {}
            for column, key in spellings.items():
                if row[column] not in ("0", "1", "0.0", "1.0"):
                    raise ValueError(f"{where}: {column} is {row[column]!r}; expected 0 or 1")
                labels[key] = int(row[column].startswith("1"))
            tied = {}
            for key in self.classes:
                if labels[key] != 1 or not len(whole):
                    continue
                if self.gaze == "reading":
                    tied[key] = Gaze((whole,))
                    continue
                windows = finding_windows(self.sentences(dicom_id), key)
                if not windows:
                    unnamed[key] += 1
                    continue
                keep, _ = window_overlap(points[:, 0], points[:, 0], windows)
                if keep.any():
                    tied[key] = Gaze((whole.subset(keep),))
            self.gaze_targets[dicom_id] = GazeTarget(tied, dicom_id, height, width, where)
            self.radiograph_readings[dicom_id] = Gaze((whole,))
            samples.append(Sample(image_id=dicom_id, path=path, labels=labels))
        self.notes = {
            "split": self.split, "gaze": self.gaze, "images": len(samples),
            "fixations_outside_image": outside,
            "images_without_fixations": without,
            "gaze_reported_but_not_named_in_the_dictation": dict(unnamed),
        }
        return samples

    def training_readings(self) -> list[Fixations]:
        self.samples
        return self._train
