"""The names a results folder carries (``metrics.json``'s ``names``): how its model, its dataset and
each of its findings are shown, written by the run that knew them.

A run may use a finding or a dataset that only the user's module declares (``examples/png_folder.py``),
so every reader -- the report, the analysis, W&B -- shows a folder by the names it carries, and none
needs that module imported. The keys themselves (``model``, ``dataset``, ``classes``) stay where they
are in ``metrics.json``; this section holds only what each key is shown as.
"""

from __future__ import annotations

from pathlib import Path

from xbench.findings import dataset_name, display_name, short_name

NAMES = "names"
#: What each finding carries: its display name (``Large Opacity``) and short name (``LOPA``).
FINDING_FIELDS = ("display", "short")


def names_section(model_display: str, dataset: str, classes: list[str]) -> dict:
    """``names``: the model's display name, the dataset's (``xbench.findings.dataset_name``) and each
    class's display and short name, from the vocabulary the running process has registered."""
    return {"model": model_display, "dataset": dataset_name(dataset),
            "findings": {key: {"display": display_name(key), "short": short_name(key)} for key in classes}}


def check_names(path: Path, payload: dict, fix: str) -> None:
    """``names`` of a ``metrics.json`` at ``path`` (a dict holding ``model``, ``dataset`` and
    ``findings``, as `read_results` checks first): a display name of the model and of the dataset and
    both names of every class, each a non-empty string; else an error naming the field."""
    names = payload[NAMES]
    for part in ("model", "dataset"):
        if not _text(names.get(part)):
            raise ValueError(f"{path}: {NAMES}.{part} is missing or not a non-empty string (the {part}'s display "
                             f"name); {fix}")
    findings = names.get("findings")
    if not isinstance(findings, dict):
        raise ValueError(f"{path}: {NAMES}.findings is missing or not a dict of finding key -> display and short "
                         f"name; {fix}")
    for key in payload["classes"]:
        entry = findings.get(key) if isinstance(key, str) else None
        if not isinstance(entry, dict) or not all(_text(entry.get(field)) for field in FINDING_FIELDS):
            raise ValueError(f"{path}: {NAMES}.findings[{key!r}] is missing or lacks its 'display' and 'short' "
                             f"names (non-empty strings); {fix}")


def finding_display(results: dict, key: str) -> str:
    """A class's display name as the run's ``metrics.json`` payload carries it."""
    return results[NAMES]["findings"][key]["display"]


def _text(value) -> bool:
    return isinstance(value, str) and bool(value.strip())
