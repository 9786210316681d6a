"""Results folders gathered into one model x dataset grid, for the report's tables and figures.

Each (model, dataset) takes its newest run (by the ``created`` time in ``metrics.json``); older
runs of the same pair are listed as superseded, never averaged in. Datasets follow the paper's
order (``xbench.findings.PAPER_CLASSES``), then any others by name; models go by name.

A run whose data went through an ``augment`` pipeline (a robustness run, ``xbench.data.augment``)
is not a benchmark entry: it is kept apart, under its perturbation (the pipeline as recorded in
the run's config), for the robustness table and figure, beside the unperturbed run of the same
model and dataset as the reference.

A run of a test instrument (``"instrument": true`` in ``metrics.json``: the Oracle, which reads the
regions and labels) is not a model either: it is kept apart as the ceiling, shown in the tables
for scale, never ranked and never a point in a fit or a figure. A radiologist scored like a model
(``"human": true``: ``--model human``) is kept apart the same way, as the human scale: a row of the
grounding tables, never ranked, and each model's gap to it (`xbench.analysis.tables.human_gap_table`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xbench.console import counted
from xbench.findings import FINDINGS, OWN_FINDINGS, PAPER_CLASSES, dataset_name
from xbench.results.folder import find_result_folders, read_results
from xbench.results.names import NAMES

#: The sections of ``metrics.json`` the report reads, beyond every reader's (``read_results``).
REPORT_SECTIONS = {
    "created": (str, ()), "thresholds": (list, ()), "grounding": (dict, ("macro", "per_class", "curves")),
    "classification": (dict, ("macro",)), "data": (dict, ("images_evaluated", "images_in_split")),
}


@dataclass(frozen=True)
class Run:
    """One results folder and its ``metrics.json`` payload."""

    folder: Path
    results: dict

    @property
    def model(self) -> str:
        return self.results["model"]

    @property
    def dataset(self) -> str:
        return self.results["dataset"]

    @property
    def perturbation(self) -> str | None:
        """The run's augment pipeline as a label, e.g. ``Rotate(limit=10, border_mode=0)``;
        ``None`` for an unperturbed run (the paper's protocol)."""
        data = ((self.results.get("config") or {}).get("data") or {}).get("init_args") or {}
        return perturbation_label(data.get("augment"), data.get("augment_seed") or 0)

    @property
    def explainer(self) -> dict:
        """Which method made the maps (``metrics.json``'s ``explainer``: ``name``, ``label``); results
        written before explainers were recorded hold the model's own maps."""
        return self.results.get("explainer") or {"name": "native", "label": None}

    @property
    def instrument(self) -> bool:
        return bool(self.results.get("instrument"))

    @property
    def human(self) -> bool:
        return bool(self.results.get("human"))

    @property
    def label(self) -> str:
        """The model as the tables show it: the display name its run wrote (``names.model``), joined by
        a CAM explainer's label (``CLIP · Grad-CAM++``)."""
        explainer = self.explainer["label"]
        display = self.results[NAMES]["model"]
        return display if explainer is None else f"{display} · {explainer}"


def _transform_label(name: str, arguments: dict[str, Any]) -> str:
    shown = ", ".join(f"{key}={value}" for key, value in arguments.items() if not (key == "p" and value == 1))
    return f"{name.rsplit('.', 1)[-1]}({shown})"


def perturbation_label(augment: list | dict | None, seed: int = 0) -> str | None:
    """An augment pipeline, in either YAML form, as one line: its transforms and their arguments
    (``p`` left out where it is 1: always applied), then the seed where it is not 0."""
    if augment is None:
        return None
    if isinstance(augment, dict):  # albumentations' serialised form
        transform = augment.get("transform", {})
        entries = transform.get("transforms", [transform]) if "Compose" in transform.get("__class_fullname__", "") \
            else [transform]
        parts = [_transform_label(e.get("__class_fullname__", "?"), {k: v for k, v in e.items() if not k.startswith("__")})
                 for e in entries]
    else:
        parts = [_transform_label(e["class_path"], e.get("init_args") or {}) for e in augment]
    return " + ".join(parts) + (f", seed {seed}" if seed else "")


def ordered_datasets(names: set[str]) -> list[str]:
    """The paper's dataset order, then any others by name."""
    paper = [d for d in PAPER_CLASSES if d in names]
    return paper + sorted(names - set(paper))


class Benchmark:
    """The newest run of every (model, dataset) found under some folders, and apart from them the
    newest robustness run of every (model, dataset, perturbation)."""

    def __init__(self, runs: list[Run]) -> None:
        newest: dict[tuple[str, str, str | None], Run] = {}
        self.superseded: list[Run] = []
        for run in sorted(runs, key=lambda r: (r.results["created"], r.folder.name)):
            key = (run.model, run.dataset, run.perturbation)
            if key in newest:
                self.superseded.append(newest[key])
            newest[key] = run
        unperturbed = {(m, d): run for (m, d, p), run in newest.items() if p is None}
        self.runs = {key: run for key, run in unperturbed.items() if not (run.instrument or run.human)}
        self.ceilings = {key: run for key, run in unperturbed.items() if run.instrument}
        self.humans = {key: run for key, run in unperturbed.items() if run.human}
        self.perturbed = {key: run for key, run in newest.items() if key[2] is not None}
        self.datasets: list[str] = ordered_datasets({d for _, d in unperturbed})
        self.models: list[str] = sorted({m for m, _ in self.runs})
        self.instruments: list[str] = sorted({m for m, _ in self.ceilings})
        self.readers: list[str] = sorted({m for m, _ in self.humans})
        self._model_labels = self._labels(list(newest.values()))
        self._dataset_labels, self._findings = self._vocabulary(sorted(runs, key=lambda r: r.results["created"]))

    @classmethod
    def from_folders(cls, paths: list[Path]) -> Benchmark:
        folders = find_result_folders(paths)
        if not folders:
            raise FileNotFoundError(
                f"no results folders (with metrics.json) under {', '.join(map(str, paths))}; "
                "run `python -m xbench.test` or `python -m xbench.suite` first"
            )
        return cls([Run(folder, read_results(folder, REPORT_SECTIONS)) for folder in folders])

    @staticmethod
    def _labels(runs: list[Run]) -> dict[str, str]:
        """Model labels: each run's own (`Run.label`); one shown by several models is followed by
        each one's name (``Saved maps (saved_a)``), so no two rows read alike."""
        labels = {run.model: run.label for run in runs}
        shared = {label for label in labels.values() if list(labels.values()).count(label) > 1}
        return {model: f"{label} ({model})" if label in shared else label for model, label in labels.items()}

    @staticmethod
    def _vocabulary(runs: list[Run]) -> tuple[dict[str, str], dict[str, dict]]:
        """The datasets' display names and the findings' names (key -> ``display``, ``short``) the runs
        carry, the newest run's where two differ."""
        datasets, findings = {}, {}
        for run in runs:  # oldest first
            datasets[run.dataset] = run.results[NAMES]["dataset"]
            findings.update(run.results[NAMES]["findings"])
        return datasets, findings

    def scope(self) -> str:
        """What the report is built from, as its header and the command's last line say it: every run
        it reads (models, human reader sets, ceiling instruments, robustness runs), ``5 runs: 2 models
        and 1 ceiling instrument (oracle) on 1 dataset (2 robustness runs among them)``."""
        runs = len(self.runs) + len(self.ceilings) + len(self.humans) + len(self.perturbed)
        models = ({m for m, _ in self.runs} | {m for m, _, _ in self.perturbed}) - set(self.instruments) \
            - set(self.readers)
        datasets = {d for _, d in [*self.runs, *self.ceilings, *self.humans]} | {d for _, d, _ in self.perturbed}
        who = counted(len(models), "model")
        if self.readers:
            who += f", {counted(len(self.readers), 'human reader set')} ({', '.join(self.readers)})"
        if self.instruments:
            who += f" and {counted(len(self.instruments), 'ceiling instrument')} ({', '.join(self.instruments)})"
        robustness = f" ({counted(len(self.perturbed), 'robustness run')} among them)" if self.perturbed else ""
        return f"{counted(runs, 'run')}: {who} on {counted(len(datasets), 'dataset')}{robustness}"

    def get(self, model: str, dataset: str) -> Run | None:
        """The run of a model, a human reader set or an instrument on a dataset."""
        key = (model, dataset)
        return self.runs.get(key) or self.humans.get(key) or self.ceilings.get(key)

    def model_label(self, model: str) -> str:
        return self._model_labels[model]

    def dataset_label(self, dataset: str) -> str:
        """The dataset's display name as its runs carry it (XBench's own name for one no run covers)."""
        return self._dataset_labels.get(dataset) or dataset_name(dataset)

    def finding_name(self, key: str) -> str:
        """A finding's display name as the runs carry it: no user module is needed to read it."""
        return self._finding(key)["display"]

    def short_name(self, key: str) -> str:
        """A finding's short name (``LOPA``) as the runs carry it."""
        return self._finding(key)["short"]

    def _finding(self, key: str) -> dict:
        """The runs' names of a finding; XBench's own table for one no run carries (a column of the
        paper's tables), the key itself for any other."""
        if key in self._findings:
            return self._findings[key]
        if key in OWN_FINDINGS:
            return {"display": FINDINGS[key].display, "short": FINDINGS[key].short}
        return {"display": key, "short": key}

    def models_on(self, dataset: str) -> list[str]:
        return [m for m in self.models if (m, dataset) in self.runs]

    def instruments_on(self, dataset: str) -> list[str]:
        return [m for m in self.instruments if (m, dataset) in self.ceilings]

    def readers_on(self, dataset: str) -> list[str]:
        """The human reader sets run on ``dataset``."""
        return [m for m in self.readers if (m, dataset) in self.humans]

    def classes(self, dataset: str) -> list[str]:
        """The classes of a dataset over all its runs, in the order the runs list them."""
        seen: dict[str, None] = {}
        for model in self.models_on(dataset) + self.readers_on(dataset) + self.instruments_on(dataset):
            seen.update(dict.fromkeys(self.get(model, dataset).results["classes"]))
        return list(seen)

    def robustness_pairs(self) -> list[tuple[str, str]]:
        """Every (model, dataset) with robustness runs, in dataset then model order."""
        pairs = {(m, d) for m, d, _ in self.perturbed}
        return [(m, d) for d in ordered_datasets({d for _, d in pairs}) for m in sorted(m for m, e in pairs if e == d)]

    def robustness_runs(self, model: str, dataset: str) -> list[tuple[str | None, Run]]:
        """The unperturbed reference run (perturbation ``None``), if there is one, then every
        perturbed run of the model on the dataset, by perturbation label."""
        reference = [(None, self.get(model, dataset))] if self.get(model, dataset) is not None else []
        perturbed = [(p, run) for (m, d, p), run in self.perturbed.items() if (m, d) == (model, dataset)]
        return reference + sorted(perturbed, key=lambda item: item[0])
