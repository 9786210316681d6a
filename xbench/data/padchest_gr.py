"""PadChest-GR (BIMCV, University of Alicante and Microsoft; Castro et al., 2024, arXiv 2411.05085):
grounded reports on PadChest radiographs, each finding sentence with its boxes.

The release: ``grounded_reports_<date>.json`` (a list of studies, each ``StudyID``, ``ImageID`` and
``findings``: one entry per sentence of the report, with ``sentence_en``, ``labels`` (PadChest's
label names), ``abnormal`` (true: the sentence states a finding; false: it denies one) and two sets
of boxes, ``boxes`` and ``extra_boxes``, each ``[x1, y1, x2, y2]`` as fractions of the image's
width and height); ``master_table.csv`` (one row per study and sentence; ``StudyID`` and ``split``
are read); the images, PadChest's 16-bit PNGs, named by ``ImageID`` in ``Padchest_GR_files/``.

Every study of the split is one sample (file order). Its sentences are its queries, in file order,
one per finding its labels name (``sentence_en``; the finding through the ``padchest_gr``
spellings of ``xbench.findings``): a positive sentence with the sentence's boxes as one region; a
negative sentence as a denied finding (``asserted=False``, no region), never graded for grounding,
whose score the run records to separate the finding's stated sentences from its denied ones. Its
region for a finding is the union of the boxes of that finding's positive sentences. Labels: 1 for
each finding of a positive sentence, 0 for every other finding (PadChest-GR lists each study's
findings completely; a normal study, one without a positive sentence, is a negative for every
class).

The two sets of boxes are two readers' (the paper: "up to two independent sets of bounding boxes
labelled by different readers"): ``boxes`` the first, ``extra_boxes`` the second. ``readers="first"``
(the default) grades the first reader's boxes of every sentence that has them; ``readers="both"``
keeps only the sentences both readers boxed, on the studies that have one, and names the second
reader as the reader under test (`reader_set`): reader 2 scored against reader 1 on the same pairs
the models are.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from xbench.data.annotation_files import read_csv_rows, split_file_path
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.queries import Query
from xbench.data.readers import ReaderMark, ReaderSet
from xbench.data.regions import Boxes, NormalisedBoxes
from xbench.files import ANNOTATIONS_CAP, read_json
from xbench.findings import spellings_of

#: What the release's report file is called (its date varies by version).
REPORTS_PATTERN = "grounded_reports_*.json"
MASTER_TABLE = "master_table.csv"
IMAGES = "Padchest_GR_files"
#: The box fields of a sentence, by reader.
READER_FIELDS = ("boxes", "extra_boxes")
READER_RULE = (
    "reader 2 (each positive sentence's extra_boxes) scored against reader 1 (its boxes), on the sentences "
    "both readers boxed; a finding's region is the union of its sentences' boxes"
)

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Sentence:
    """One finding sentence as the release gives it: its English text, the findings its labels
    name (canonical keys), whether it states or denies them, each reader's boxes, and the labels
    outside the vocabulary."""

    text: str
    findings: tuple[str, ...]
    abnormal: bool
    boxes: tuple[Box, ...]
    extra_boxes: tuple[Box, ...]
    unknown_labels: tuple[str, ...] = ()


class PadChestGR(XBenchDataModule):
    """PadChest-GR phrase grounding, finding-level through its labels; ``split="test"`` by default.

    Args:
        root: the PadChest-GR folder, holding the grounded reports JSON and ``master_table.csv``.
        annotations: the grounded reports JSON, relative to ``root`` or absolute (default: the one
            ``grounded_reports_*.json`` in ``root``).
        master_table: the table that gives each study's split.
        images: the folder of the PNGs, named by ``ImageID`` (relative to ``root`` or absolute).
        split: the studies whose ``split`` in the master table is this; ``all``: every study.
        readers: ``first``: every sentence the first reader boxed, graded against its boxes;
            ``both``: only the sentences both readers boxed, so that the second reader can be scored
            (``--model human``) on the same pairs as the models.
    """

    name = "padchest_gr"

    def __init__(
        self,
        root: str,
        annotations: str | None = None,
        master_table: str = MASTER_TABLE,
        images: str = IMAGES,
        split: str = "test",
        readers: Literal["first", "both"] = "first",
        **kwargs,
    ) -> None:
        super().__init__(root=root, **kwargs)
        if readers not in ("first", "both"):
            raise ValueError(f"--data.readers must be first or both; got {readers!r}")
        self.annotations = annotations
        self.master_table = master_table
        self.images = images
        self.split = split
        self.readers = readers
        self._marks: dict[str, dict[str, ReaderMark]] = {}

    def index(self) -> list[Sample]:
        reports = self._reports_file()
        splits = self._splits()
        studies = read_json(reports, ANNOTATIONS_CAP)
        if not isinstance(studies, list):
            raise ValueError(f"{reports}: expected a JSON list of studies, got {type(studies).__name__}; is this "
                             "PadChest-GR's grounded reports file?")
        found = sorted(set(splits.values()))
        if self.split != "all" and self.split not in found:
            raise ValueError(f"PadChestGR: {self.root / self.master_table} has no study of split {self.split!r} "
                             f"(its splits: {found}); give --data.split one of them, or all")
        images = split_file_path(self.root, self.images)
        if not images.is_dir():
            raise FileNotFoundError(f"PadChestGR: the image folder {images} does not exist. Unpack PadChest-GR's "
                                    f"images ({IMAGES}/) into {self.root}, or name their folder with --data.images.")
        # what the split's studies hold, for the notes (index reads them anew)
        self._counts, self._unknown, self._denied = Counter(), Counter(), Counter()
        self._contradictions: list[str] = []
        self._marks = {}
        samples = []
        for entry, study in enumerate(studies):
            where = f"{reports}, entry {entry}"
            study_id, image_id, sentences = self._study(study, where)
            where = f"{where} (study {study_id})"
            if study_id not in splits:
                raise ValueError(f"{where}: the study is not in {self.root / self.master_table}; the two files must "
                                 "be of the same release")
            if self.split not in ("all", splits[study_id]):
                continue
            path = images / image_id
            if not path.is_file():
                raise FileNotFoundError(f"{where}: its image {image_id} is not at {path}. Unpack every image of "
                                        f"PadChest-GR's {IMAGES}/ there, or name their folder with --data.images.")
            sample = self._sample(image_id, path, sentences, where)
            if sample is not None:
                samples.append(sample)
        self._note(reports, samples)
        return samples

    def reader_set(self) -> ReaderSet | None:
        """The second reader (``extra_boxes``) on every sample, with ``readers="both"``; else none."""
        if self.readers != "both":
            return None
        _ = self.samples
        return ReaderSet(name="padchest-gr-reader2", rule=READER_RULE, marks=self._marks)

    # -- reading ----------------------------------------------------------------------------------

    def _reports_file(self) -> Path:
        if self.annotations is not None:
            return self.require(split_file_path(self.root, self.annotations), "the grounded reports file")
        found = sorted(self.root.glob(REPORTS_PATTERN))
        if len(found) != 1:
            state = "no" if not found else f"{len(found)} ({', '.join(p.name for p in found)})"
            raise FileNotFoundError(f"PadChestGR: {self.root} holds {state} {REPORTS_PATTERN} files; point "
                                    "`data.root` at the PadChest-GR folder, or name the file with --data.annotations.")
        return found[0]

    def _splits(self) -> dict[str, str]:
        """Each study's split, from the master table's rows (one per sentence; they must agree)."""
        path = self.require(split_file_path(self.root, self.master_table), f"the master table {self.master_table}")
        splits: dict[str, tuple[str, int]] = {}
        for line, row in read_csv_rows(path, ("StudyID", "split")):
            study_id, split = row["StudyID"], row["split"]
            first = splits.setdefault(study_id, (split, line))
            if first[0] != split:
                raise ValueError(f"{path}, line {line}: study {study_id} has split {split!r} here but {first[0]!r} at "
                                 f"line {first[1]}; the rows of one study must agree")
        return {study_id: split for study_id, (split, _) in splits.items()}

    def _study(self, study: object, where: str) -> tuple[str, str, list[Sentence]]:
        if not isinstance(study, dict):
            raise ValueError(f"{where}: expected a study object, got {type(study).__name__}")
        for name in ("StudyID", "ImageID"):
            if not isinstance(study.get(name), str) or not study[name]:
                raise ValueError(f"{where}: {name} must be a non-empty string; got {study.get(name)!r}")
        findings = study.get("findings")
        if not isinstance(findings, list):
            raise ValueError(f"{where} (study {study['StudyID']}): findings must be a list of sentences; got "
                             f"{type(findings).__name__}")
        spellings = spellings_of(self.vocabulary_name())
        sentences = []
        for number, finding in enumerate(findings):
            at = f"{where} (study {study['StudyID']}), finding {number}"
            if not isinstance(finding, dict):
                raise ValueError(f"{at}: expected a sentence object, got {type(finding).__name__}")
            text, labels, abnormal = finding.get("sentence_en"), finding.get("labels"), finding.get("abnormal")
            if not isinstance(text, str):
                raise ValueError(f"{at}: sentence_en must be a string; got {text!r}")
            if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
                raise ValueError(f"{at}: labels must be a list of strings; got {labels!r}")
            if not isinstance(abnormal, bool):
                raise ValueError(f"{at}: abnormal must be true or false; got {abnormal!r}")
            keys = tuple(dict.fromkeys(spellings[label.strip()] for label in labels if label.strip() in spellings))
            unknown = tuple(label.strip() for label in labels if label.strip() not in spellings)
            boxes = {name: _boxes(finding.get(name), f"{at}, {name}") for name in READER_FIELDS}
            if keys and not text.strip():
                raise ValueError(f"{at}: sentence_en is empty; every sentence of a graded finding is a query")
            sentences.append(Sentence(text.strip(), keys, abnormal, boxes["boxes"], boxes["extra_boxes"], unknown))
        return study["StudyID"], study["ImageID"], sentences

    def _sample(self, image_id: str, path: Path, sentences: list[Sentence], where: str) -> Sample | None:
        """The study as a sample (``None``: left out with ``readers="both"``, no sentence both readers boxed)."""
        counts, supported = self._counts, self.supported_classes()
        regions: dict[str, list[Box]] = {}
        marks: dict[str, list[Box]] = {}
        queries, positive = [], set()
        for number, sentence in enumerate(sentences):
            self._unknown.update(sentence.unknown_labels)
            if not sentence.findings:
                counts["sentences_outside_vocabulary"] += 1
                continue
            if not sentence.abnormal:
                if sentence.boxes or sentence.extra_boxes:
                    counts["negative_sentences_with_boxes"] += 1  # neither stated nor denied: left out
                    self._contradictions.append(f"{where}, finding {number}")
                    continue
                counts["negative_sentences"] += 1
                self._denied.update(sentence.findings)
                queries += [Query(sentence.text, key, None, asserted=False) for key in sentence.findings]
                continue
            counts["positive_sentences"] += 1
            positive.update(sentence.findings)
            first, second = sentence.boxes, sentence.extra_boxes
            counts["boxed_by_both" if first and second else "boxed_by_first_only" if first
                   else "boxed_by_second_only" if second else "boxed_by_neither"] += 1
            graded = first and (second or self.readers == "first")
            if not graded:
                continue
            for key in sentence.findings:
                queries.append(Query(sentence.text, key, NormalisedBoxes(Boxes(first))))
                regions.setdefault(key, []).extend(first)
                marks.setdefault(key, []).extend(second)
        # normal: no sentence states a finding (one outside the vocabulary makes the study abnormal too)
        counts["abnormal_studies" if any(sentence.abnormal for sentence in sentences) else "normal_studies"] += 1
        if self.readers == "both" and not set(regions) & set(self.classes):
            counts["studies_without_a_sentence_both_boxed"] += 1
            return None
        if self.readers == "both":
            self._marks[image_id] = {key: ReaderMark(1, NormalisedBoxes(Boxes(tuple(boxes))))
                                     for key, boxes in marks.items()}
        return Sample(
            image_id=image_id,
            path=path,
            labels={key: int(key in positive) for key in supported},
            regions={key: NormalisedBoxes(Boxes(tuple(boxes))) for key, boxes in regions.items()},
            queries=tuple(queries),
        )

    def _note(self, reports: Path, samples: list[Sample]) -> None:
        """The split's studies and sentences as read (with ``readers="both"``, also those left out)."""
        self.notes.update(
            release_file=reports.name,
            split=self.split,
            readers=self.readers,
            images=len(samples),
            queries=sum(query.asserted for sample in samples for query in sample.queries),
            denied_queries=sum(not query.asserted for sample in samples for query in sample.queries),
            **{name: self._counts[name] for name in (
                "abnormal_studies", "normal_studies", "positive_sentences", "negative_sentences",
                "boxed_by_both", "boxed_by_first_only", "boxed_by_second_only", "boxed_by_neither",
                "negative_sentences_with_boxes", "sentences_outside_vocabulary")},
            negative_sentences_per_finding={key: self._denied[key] for key in self.classes},
            labels_outside_vocabulary=dict(self._unknown.most_common()),
        )
        if self.readers == "both":
            self.notes["studies_without_a_sentence_both_boxed"] = self._counts["studies_without_a_sentence_both_boxed"]
        if self._contradictions:
            shown = "; ".join(self._contradictions[:3])
            warnings.warn(
                f"PadChestGR: {len(self._contradictions)} sentences in {reports} have boxes but abnormal: false "
                f"(e.g. {shown}); they are left out of grounding and recognition and counted under "
                "data.negative_sentences_with_boxes",
                stacklevel=3,
            )


def _boxes(value: object, where: str) -> tuple[Box, ...]:
    """A reader's boxes of one sentence (``null`` or a missing field: none), each checked."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ValueError(f"{where}: expected a list of [x1, y1, x2, y2] boxes; got {value!r}")
    boxes = []
    for box in value:
        if (not isinstance(box, list) or len(box) != 4
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)):
            raise ValueError(f"{where}: box {box!r} is not [x1, y1, x2, y2] of finite numbers")
        x1, y1, x2, y2 = (float(v) for v in box)
        if not all(0.0 <= v <= 1.0 for v in (x1, y1, x2, y2)):
            raise ValueError(f"{where}: box {box!r} reaches outside [0, 1]; PadChest-GR's corners are fractions of "
                             "the image's width and height. Is this the release's file?")
        if not (x2 > x1 and y2 > y1):
            raise ValueError(f"{where}: box {box!r} needs x2 > x1 and y2 > y1")
        boxes.append((x1, y1, x2, y2))
    return tuple(boxes)
