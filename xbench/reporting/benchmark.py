"""Results folders gathered into one model x dataset grid, for the report's tables and figures.

Each (model, dataset) takes its newest run (by the ``created`` time in ``metrics.json``); older
runs of the same pair are listed as superseded, never averaged in. Datasets follow the paper's
order (``xbench.findings.PAPER_CLASSES``), then any others by name; models go by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from xbench.findings import PAPER_CLASSES, dataset_name
from xbench.reporting.folder import find_result_folders, read_results


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
    def model_class(self) -> str | None:
        """The class name of the model's ``class_path`` (``CentrePrior``), if the config has one."""
        class_path = (self.results.get("config") or {}).get("model", {}).get("class_path")
        return class_path.rsplit(".", 1)[-1] if class_path else None


class Benchmark:
    """The newest run of every (model, dataset) found under some folders."""

    def __init__(self, runs: list[Run]) -> None:
        newest: dict[tuple[str, str], Run] = {}
        self.superseded: list[Run] = []
        for run in sorted(runs, key=lambda r: (r.results["created"], r.folder.name)):
            key = (run.model, run.dataset)
            if key in newest:
                self.superseded.append(newest[key])
            newest[key] = run
        self.runs = newest
        datasets = {d for _, d in newest}
        paper = [d for d in PAPER_CLASSES if d in datasets]
        self.datasets: list[str] = paper + sorted(datasets - set(paper))
        self.models: list[str] = sorted({m for m, _ in newest})
        self._model_labels = self._labels()

    @classmethod
    def from_folders(cls, paths: list[Path]) -> Benchmark:
        folders = find_result_folders(paths)
        if not folders:
            raise FileNotFoundError(
                f"no results folders (with metrics.json) under {', '.join(map(str, paths))}; "
                "run `python -m xbench.test` or `python -m xbench.suite` first"
            )
        return cls([Run(folder, read_results(folder)) for folder in folders])

    def _labels(self) -> dict[str, str]:
        """Model labels: the class name (``MedKLIP``) where it names one model, else the model name."""
        by_class: dict[str | None, set[str]] = {}
        for run in self.runs.values():
            by_class.setdefault(run.model_class, set()).add(run.model)
        labels = {}
        for run in self.runs.values():
            unique = run.model_class is not None and len(by_class[run.model_class]) == 1
            labels[run.model] = run.model_class if unique else run.model
        return labels

    def get(self, model: str, dataset: str) -> Run | None:
        return self.runs.get((model, dataset))

    def model_label(self, model: str) -> str:
        return self._model_labels[model]

    def dataset_label(self, dataset: str) -> str:
        return dataset_name(dataset)

    def models_on(self, dataset: str) -> list[str]:
        return [m for m in self.models if (m, dataset) in self.runs]

    def classes(self, dataset: str) -> list[str]:
        """The classes of a dataset over all its runs, in the order the runs list them."""
        seen: dict[str, None] = {}
        for model in self.models_on(dataset):
            seen.update(dict.fromkeys(self.runs[(model, dataset)].results["classes"]))
        return list(seen)
