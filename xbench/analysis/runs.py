"""Results folders read back as tensors, and runs grouped by dataset for paired analyses.

A results folder (``xbench.results.write``) keeps one row per (image, class) in
``pairs.csv.gz``: the label and logit, and for graded pairs ``|R|``, the Pointing Game hit, the
CNR and the 101-point counts ``|B_k|``, ``|B_k & R|``. That is all an analysis needs; no model is re-run.

Every run's images are put in the order of their sorted ``image_id``, so two runs on the same
images line up row for row, whatever order their loaders used. Where a run's samples are reads
(``data.reads``: ``<image_id>#<reader>``, `xbench.reads`), `Run.radiographs` names the radiograph of
each, which the bootstrap resamples with all its reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from xbench.analysis.explanations import CheckedPairs, load_checks, load_gaze, pair_cells
from xbench.metrics.grounding import NUM_THRESHOLDS
from xbench.metrics.native import CHEXLOCALIZE_COLUMNS, HIT_COLUMNS, TRUE_POSITIVE_ONLY
from xbench.reads import READ_SEPARATOR, radiograph_of
from xbench.results.folder import (
    CHEXLOCALIZE_PAIRS, DAMAGED, METRICS as METRICS_FILE, MODEL_OUTPUT_OPTIONS, PAIRS as PAIRS_FILE, QUERIES as QUERIES_FILE, count_columns,
    holds_results, read_results, read_table,
)

PREDICTED_COLUMNS, INTER_COLUMNS = count_columns(NUM_THRESHOLDS)
PAIR_COLUMNS = ("image_index", "image_id", "class", "label", "logit", "graded", "region_px", "hit", "cnr",
                *PREDICTED_COLUMNS, *INTER_COLUMNS)


@dataclass(frozen=True)
class GradedPairs:
    """The graded (image, class) pairs of a run, at most one per image and class; or a phrase
    dataset's graded (image, query) pairs, each under its finding (several per image and finding)."""

    image: Tensor  # int64 [P]: row of the image in the run's sorted image ids
    cls: Tensor  # int64 [P]: index into the run's classes
    region: Tensor  # int64 [P]: |R|
    hit: Tensor  # bool [P]: Pointing Game hit
    predicted: Tensor  # int64 [P, 101]: |B_k|
    inter: Tensor  # int64 [P, 101]: |B_k & R|
    cnr: Tensor  # float64 [P]: contrast-to-noise ratio, NaN where undefined


@dataclass(frozen=True)
class Run:
    """One results folder, read back: the run's identity and its per-pair records."""

    path: Path
    model: str
    dataset: str
    classes: tuple[str, ...]
    image_size: int
    #: ``{"class_path", "init_args"}`` of the model (output options of older folders aside): what makes
    #: two runs the same model.
    model_config: dict
    image_ids: tuple[str, ...]  # sorted
    labels: Tensor  # int64 [N, C]: 1, 0, -1 unknown
    logits: Tensor  # float64 [N, C]
    pairs: GradedPairs
    #: A test instrument (the Oracle): analysed, but never compared with a model or fitted.
    instrument: bool = False
    #: A radiologist scored like a model (``--model human``): analysed, never ranked or fitted, and
    #: each model's gap to it measured on the same images (`xbench.analysis.tables.human_gap_table`).
    human: bool = False
    #: Each sample is one radiologist's read (``data.reads``): intervals resample radiographs.
    reads: bool = False
    #: The pairs the run's sanity and faithfulness checks scored, by section (``xbench.checks``).
    checks: dict[str, CheckedPairs] = field(default_factory=dict)
    #: The folder's ``metrics.json``: the estimates the records are checked against (`check_estimates`).
    results: dict = field(default_factory=dict)
    #: A gaze dataset's run: the pairs scored against the radiologists' gaze (``gaze.csv.gz``).
    gaze: CheckedPairs | None = None
    #: cheXlocalize's protocol at native size (``chexlocalize_pairs.csv.gz``, `read_chexlocalize_pairs`):
    #: one row per scored (image, class) pair; ``None`` where the run did not score it.
    chexlocalize: pd.DataFrame | None = None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def radiographs(self) -> Tensor:
        """int64 [N]: the radiograph of each sample, numbered 0..G-1 in sorted order; each sample its
        own where the run's samples are not reads."""
        if not self.reads:
            return torch.arange(len(self.image_ids))
        _, index = np.unique([radiograph_of(i) for i in self.image_ids], return_inverse=True)
        return torch.from_numpy(index.astype(np.int64))


def find_run_folders(paths: Iterable[str | Path]) -> list[Path]:
    """Each path is a results folder (it holds ``metrics.json``) or a folder of them; a folder with
    a run's files but no ``metrics.json`` is an error naming it (`holds_results`)."""
    folders: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir() and holds_results(path):
            folders.append(path)
            continue
        if not path.is_dir():
            raise FileNotFoundError(f"{path}: no such results folder")
        children = sorted(p for p in path.iterdir() if not p.name.startswith(".") and p.is_dir() and holds_results(p))
        if not children:
            raise FileNotFoundError(
                f"{path}: neither a results folder (no {METRICS_FILE}) nor a folder of results folders; "
                "name the folders `python -m xbench.test` wrote, <model>__<dataset>__<time>/"
            )
        folders.extend(children)
    if len(set(map(Path.resolve, folders))) != len(folders):
        raise ValueError("the same results folder was named twice: " + ", ".join(map(str, folders)))
    return folders


def load_run(folder: str | Path, queries: str | None = None) -> Run:
    """Read ``metrics.json`` and ``pairs.csv.gz`` of one results folder, checking them; with
    ``queries`` (a view of a phrase dataset's queries: ``query`` or ``finding_name``), the graded
    pairs are the (image, query) pairs of ``queries.csv.gz`` in that view, each under its finding."""
    folder = Path(folder)
    metrics_path, pairs_path = folder / METRICS_FILE, folder / PAIRS_FILE
    for path in (metrics_path, pairs_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: is {folder} a complete results folder?")
    metrics = read_results(folder, {"data": (dict, ("image_size",)), "grounding": (dict, ("macro", "per_class"))})
    classes = tuple(metrics["classes"])
    table = read_table(pairs_path, dtype={"image_id": str, "class": str}, keep_default_na=False,
                        na_values={c: [""] for c in PAIR_COLUMNS if c not in ("image_id", "class")})
    missing = [c for c in PAIR_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"{pairs_path}: columns missing: {', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}")
    if table["graded"].dtype != bool:
        raise ValueError(f"{pairs_path}: the graded column must hold True or False only; the file was edited or damaged")
    numeric = [c for c in PAIR_COLUMNS if c not in ("image_id", "class", "graded")]
    table[numeric] = table[numeric].apply(pd.to_numeric, errors="coerce")  # text becomes NaN, named by the checks below
    where = lambda rows: f"{pairs_path}, data row(s) {', '.join(str(i + 2) for i in np.flatnonzero(rows)[:5])}"  # noqa: E731

    class_index = pd.Categorical(table["class"], categories=classes).codes.astype(np.int64)
    if (class_index < 0).any():
        raise ValueError(f"{where(class_index < 0)}: class not among metrics.json's classes {list(classes)}")
    image_ids, image_row = np.unique(table["image_id"].to_numpy(dtype=str), return_inverse=True)
    if (table.groupby("image_id")["image_index"].nunique() > 1).any():
        raise ValueError(f"{pairs_path}: an image_id appears under two image_index values (two images, one id)")
    cell = image_row * len(classes) + class_index
    if len(table) != len(image_ids) * len(classes) or len(np.unique(cell)) != len(table):
        raise ValueError(
            f"{pairs_path}: expected one row per (image, class), {len(image_ids)} images x {len(classes)} classes"
            f" = {len(image_ids) * len(classes)} rows; found {len(table)} rows"
        )
    order = np.argsort(cell)
    labels = table["label"].to_numpy()[order].reshape(len(image_ids), len(classes))
    if not np.isin(labels, (-1, 0, 1)).all():
        raise ValueError(f"{pairs_path}: labels must be 1, 0 or -1 (unknown)")
    logits = table["logit"].to_numpy(dtype=np.float64)[order].reshape(len(image_ids), len(classes))
    if not np.isfinite(logits).all():
        raise ValueError(f"{where(~np.isfinite(table['logit'].to_numpy(dtype=np.float64)))}: logit is not a finite number")

    frame_pixels = int(metrics["data"]["image_size"]) ** 2
    graded = table["graded"].to_numpy(dtype=bool)
    pairs = _graded_pairs(table[graded], image_row[graded], class_index[graded], where, np.flatnonzero(graded),
                          frame_pixels)
    graded_cells = np.sort(pair_cells(pairs.image, pairs.cls, len(classes)))
    if queries is not None:
        pairs = _query_pairs(folder, queries, classes, image_ids, frame_pixels)
    reads = bool(metrics["data"].get("reads", False))
    not_reads = [i for i in image_ids if READ_SEPARATOR not in i]
    if reads and not_reads:
        raise ValueError(f"{metrics_path}: data.reads is true, but {len(not_reads)} image id(s) of {pairs_path} are "
                         f"not reads' ids <image_id>{READ_SEPARATOR}<reader> (e.g. {not_reads[:3]}); {DAMAGED}")
    model_section = metrics["config"]["model"]
    return Run(
        path=folder,
        model=metrics["model"],
        dataset=metrics["dataset"],
        classes=classes,
        image_size=int(metrics["data"]["image_size"]),
        model_config={
            "class_path": model_section["class_path"],
            "init_args": {k: v for k, v in model_section.get("init_args", {}).items() if k not in MODEL_OUTPUT_OPTIONS},
        },
        image_ids=tuple(image_ids.tolist()),
        labels=torch.from_numpy(labels.astype(np.int64)),
        logits=torch.from_numpy(logits),
        pairs=pairs,
        instrument=bool(metrics.get("instrument")),
        human=bool(metrics.get("human")),
        reads=reads,
        checks=load_checks(folder, metrics, classes, image_ids, graded_cells),
        results=metrics,
        gaze=load_gaze(folder, metrics, classes, image_ids),
        chexlocalize=read_chexlocalize_pairs(folder, classes, image_ids),
    )


def read_chexlocalize_pairs(folder: Path, classes: Sequence[str], image_ids: np.ndarray) -> pd.DataFrame | None:
    """A folder's ``chexlocalize_pairs.csv.gz`` (``None`` where it has none), checked: every column of
    `CHEXLOCALIZE_COLUMNS`, each row a class and image of the run, at most one row per pair; XBench's
    values in [0, 1], each hit 0 or 1, their IoUs in [0, 1] or empty (NaN: their ``true_pos_only``)."""
    path = Path(folder) / CHEXLOCALIZE_PAIRS
    if not path.exists():
        return None
    table = read_table(path, dtype={"image_id": str, "class": str}, keep_default_na=False,
                        na_values={c: [""] for c in CHEXLOCALIZE_COLUMNS})
    missing = [c for c in ("image_id", "class", *CHEXLOCALIZE_COLUMNS) if c not in table.columns]
    if missing:
        raise ValueError(f"{path}: columns missing: {', '.join(missing)}; {DAMAGED}")
    values = table[list(CHEXLOCALIZE_COLUMNS)].apply(pd.to_numeric, errors="coerce").to_numpy(dtype=np.float64)
    text = table[list(CHEXLOCALIZE_COLUMNS)].notna().to_numpy() & np.isnan(values)  # not a number, not empty
    where = lambda rows: f"{path}, data row(s) {', '.join(str(i + 2) for i in np.flatnonzero(rows)[:5])}"  # noqa: E731
    unknown = ~table["class"].isin(classes).to_numpy() | ~table["image_id"].isin(image_ids).to_numpy()
    if unknown.any():
        raise ValueError(f"{where(unknown)}: class or image_id not among the run's ({DAMAGED})")
    repeated = table.duplicated(["image_id", "class"]).to_numpy()
    if repeated.any():
        raise ValueError(f"{where(repeated)}: a second row for the same (image, class) pair; {DAMAGED}")
    may_be_nan = np.isin(CHEXLOCALIZE_COLUMNS, TRUE_POSITIVE_ONLY)
    hits = np.isin(CHEXLOCALIZE_COLUMNS, HIT_COLUMNS)
    with np.errstate(invalid="ignore"):
        bad = (np.isnan(values) & ~may_be_nan) | ~np.isnan(values) & ((values < 0) | (values > 1))
        bad |= hits & ~np.isin(values, (0, 1)) | text
    if bad.any():
        column = CHEXLOCALIZE_COLUMNS[int(np.flatnonzero(bad.any(0))[0])]
        raise ValueError(f"{where(bad.any(1))}: {column} is not a value of cheXlocalize's protocol (a fraction in "
                         f"[0, 1], a hit 0 or 1; only {' and '.join(TRUE_POSITIVE_ONLY)} may be empty); {DAMAGED}")
    return pd.DataFrame({"image_id": table["image_id"], "class": table["class"],
                         **{c: values[:, k] for k, c in enumerate(CHEXLOCALIZE_COLUMNS)}})


def _graded_pairs(rows: pd.DataFrame, image_row: np.ndarray, class_index: np.ndarray, where, line: np.ndarray,
                  frame_pixels: int) -> GradedPairs:
    """Graded pairs from table ``rows`` (their images and classes given), checked: ``where(mask)``
    names the rows of the file where ``mask`` (over the file's rows) is set; ``line``: each row's;
    a hit is 0 or 1 and no count exceeds the frame's ``frame_pixels``."""
    counts = rows[["region_px", "hit", *PREDICTED_COLUMNS, *INTER_COLUMNS]].to_numpy(dtype=np.float64)
    bad = np.zeros(int(line.max()) + 1 if len(line) else 0, dtype=bool)
    if np.isnan(counts).any():
        bad[line[np.isnan(counts).any(1)]] = True
        raise ValueError(f"{where(bad)}: a graded pair lacks region_px, hit or a pred_/inter_ count")
    outside = ~np.isin(counts[:, 1], (0, 1)) | (counts[:, [0, *range(2, 2 + NUM_THRESHOLDS)]] > frame_pixels).any(1)
    if outside.any():
        bad[line[outside]] = True
        raise ValueError(f"{where(bad)}: hit must be 0 or 1, and region_px and every pred_ count at most the frame's "
                         f"{frame_pixels} pixels; {DAMAGED}")
    counts = torch.from_numpy(counts.astype(np.int64))
    region, hit = counts[:, 0], counts[:, 1].bool()
    predicted, inter = counts[:, 2:2 + NUM_THRESHOLDS], counts[:, 2 + NUM_THRESHOLDS:]
    consistent = (
        (inter[:, 0] == region) & (region > 0) & (inter[:, -1] >= 0) & (inter <= predicted).all(1)
        & (predicted[:, 1:] <= predicted[:, :-1]).all(1) & (inter[:, 1:] <= inter[:, :-1]).all(1)
    )
    if not bool(consistent.all()):
        bad[line[~consistent.numpy()]] = True
        raise ValueError(
            f"{where(bad)}: counts are inconsistent (need inter_000 = region_px > 0, 0 <= inter_k <= pred_k, "
            "both non-increasing in k); the file was edited or damaged"
        )
    return GradedPairs(image=torch.from_numpy(image_row), cls=torch.from_numpy(class_index), region=region, hit=hit,
                       predicted=predicted, inter=inter, cnr=torch.tensor(rows["cnr"].to_numpy(dtype=np.float64)))


def _query_pairs(folder: Path, view: str, classes: tuple[str, ...], image_ids: np.ndarray, frame_pixels: int
                 ) -> GradedPairs:
    """The (image, query) pairs of ``queries.csv.gz`` in ``view``, as graded pairs of their findings."""
    path = folder / QUERIES_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: --queries reads a phrase dataset's run (MS-CXR); {folder} has no queries"
        )
    table = read_table(path, dtype={"image_id": str, "finding": str, "phrase": str, "view": str},
                        keep_default_na=False, na_values={c: [""] for c in ("cnr", "region_px", "hit")})
    where = lambda rows: f"{path}, data row(s) {', '.join(str(i + 2) for i in np.flatnonzero(rows)[:5])}"  # noqa: E731
    chosen = np.flatnonzero(table["view"].to_numpy() == view)
    if not len(chosen) and len(table):
        raise ValueError(f"{path}: no rows of view {view!r} (views: {', '.join(sorted(set(table['view'])))}); a "
                         "fixed-vocabulary model's run has only the query view")
    rows = table.iloc[chosen]
    class_index = pd.Categorical(rows["finding"], categories=classes).codes.astype(np.int64)
    image_row = np.searchsorted(image_ids, rows["image_id"].to_numpy(dtype=str))
    known = (image_row < len(image_ids)) & (
        image_ids[np.minimum(image_row, len(image_ids) - 1)] == rows["image_id"].to_numpy(dtype=str))
    if (class_index < 0).any() or not known.all():
        bad = np.zeros(len(table), dtype=bool)
        bad[chosen[(class_index < 0) | ~known]] = True
        raise ValueError(f"{where(bad)}: finding or image_id not among the run's classes and images")
    return _graded_pairs(rows, image_row, class_index, where, chosen, frame_pixels)


@dataclass(frozen=True)
class DatasetRuns:
    """The runs of several models on one dataset's same images, ready to be resampled together.

    ``runs`` maps a label (the model name; the folder name where two runs share a model name) to
    the run; ``validation`` maps the same labels to the run of that model on the dataset's
    validation split (all runs have one, or none does).
    """

    dataset: str
    classes: tuple[str, ...]
    image_ids: tuple[str, ...]
    runs: dict[str, Run]
    validation: dict[str, Run]

    @property
    def reads(self) -> bool:
        """Whether the samples are reads (every run agrees, `group_runs`)."""
        return any(run.reads for run in self.runs.values())


def _id_difference(a: Run, b: Run) -> str:
    only_a = sorted(set(a.image_ids) - set(b.image_ids))
    only_b = sorted(set(b.image_ids) - set(a.image_ids))
    return (f"{len(only_a)} image ids only in {a.path} (e.g. {only_a[:3]}), "
            f"{len(only_b)} only in {b.path} (e.g. {only_b[:3]})")


def group_runs(runs: Sequence[Run], validation: Sequence[Run] = ()) -> list[DatasetRuns]:
    """Group test runs by dataset and attach each model's validation run.

    Runs on one dataset must cover the same image ids with the same classes (the paired
    bootstrap resamples images shared by all models). A validation run belongs to the test run of
    the same dataset and the same model configuration (class path and init args); its images must not overlap the test images.
    """
    by_dataset: dict[str, list[Run]] = {}
    for run in runs:
        by_dataset.setdefault(run.dataset, []).append(run)
    unused = list(validation)
    groups = []
    for dataset, members in by_dataset.items():
        first = members[0]
        for run in members[1:]:
            if run.classes != first.classes:
                raise ValueError(
                    f"{run.path} and {first.path} are both on {dataset} but with different classes "
                    f"({list(run.classes)} vs {list(first.classes)}); run every model with the same `data.classes`"
                )
            if run.image_ids != first.image_ids and (run.human or first.human):
                human, other = (run, first) if run.human else (first, run)
                raise ValueError(
                    f"the human reader's folder {human.path} is on other images of {dataset} than {other.path}: "
                    f"{_id_difference(human, other)}. A model's gap to the human readers is paired on the same "
                    "images: run the models and --model human on the same split and options (the human reader "
                    "set names its samples; run the models with the same data options)"
                )
            if run.image_ids != first.image_ids:
                raise ValueError(
                    f"{run.path} and {first.path} are both on {dataset} but not on the same images: "
                    f"{_id_difference(run, first)}. Paired comparisons need every model on the same split."
                )
        if len({run.reads for run in members}) > 1:
            raise ValueError(f"on {dataset}, " + ", ".join(f"{run.path} ({'reads' if run.reads else 'images'})"
                                                           for run in members)
                             + ": some runs' samples are reads and others' are not (data.reads); the folders were "
                             "edited or come from different XBench versions, re-run them")
        names = [run.model for run in members]
        labels = [run.model if names.count(run.model) == 1 else run.name for run in members]
        attached: dict[str, Run] = {}
        for label, run in zip(labels, members):
            matches = [v for v in unused if v.dataset == dataset and v.model_config == run.model_config]
            if len(matches) > 1:
                raise ValueError(
                    f"{len(matches)} validation folders fit {run.path} (same model settings on {dataset}): "
                    + ", ".join(str(v.path) for v in matches) + "; name one"
                )
            if matches:
                attached[label] = matches[0]
                unused.remove(matches[0])
        lacking = [str(run.path) for label, run in zip(labels, members) if label not in attached and not run.human]
        if attached and lacking:  # a human reader's binary map needs no threshold: its τ is cross-fitted
            raise ValueError(
                f"on {dataset}, some models have a validation folder and these do not: {', '.join(lacking)}. "
                "Give every model its validation run, or none (then thresholds are cross-fitted)"
            )
        for label, val in attached.items():
            test = members[labels.index(label)]
            shared = set(val.image_ids) & set(test.image_ids)
            if shared:
                raise ValueError(
                    f"validation folder {val.path} shares {len(shared)} images with test folder {test.path} "
                    f"(e.g. {sorted(shared)[:3]}): a threshold chosen there is not held out"
                )
            if val.classes != test.classes:
                raise ValueError(f"validation folder {val.path} has classes {list(val.classes)}, "
                                 f"test folder {test.path} has {list(test.classes)}")
        reference = next(iter(attached.values()), None)
        for val in attached.values():
            if val.image_ids != reference.image_ids:
                raise ValueError(
                    f"validation folders {val.path} and {reference.path} are not on the same images: "
                    f"{_id_difference(val, reference)}"
                )
        groups.append(DatasetRuns(dataset, first.classes, first.image_ids, dict(zip(labels, members)), attached))
    if unused:
        raise ValueError(
            "no test folder runs the same model on the same dataset as validation folder(s) "
            + ", ".join(f"{v.path} ({v.model} on {v.dataset})" for v in unused)
        )
    return groups
