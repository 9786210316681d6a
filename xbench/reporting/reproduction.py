"""XBench's numbers beside a reference's, cell by cell: the paper's published tables (package data,
``xbench/reporting/paper/``), a CSV of the same columns, or another set of results folders.

A *cell* is one number XBench computes: (dataset, model, finding key or ``mean``, metric). A
reference prints one or more values per cell (the paper prints a dataset's mean Pointing Game in
Table 1 and again in the Mean column of its per-class table). Each covered cell is judged against
XBench's bootstrap interval (stretched to reach XBench's own estimate where it does not); a printed
value stands for everything that rounds to it, so it is inside when it lies within the interval
widened by half its last printed digit.

Where the reference disagrees with itself the cell is not judged but shown with every value: two
printed values of one cell that differ, or a printed mean that is not the unweighted mean of the
printed class values (the rule Table 1 follows). When a row's printed means agree with each other
but not with its class values, the class values are the suspects: marked unverified, not judged.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import torch

from xbench.analysis.correlation import r_squared
from xbench.analysis.tables import MACRO
from xbench.files import read_yaml
from xbench.findings import DEFAULT_CLASSES, PAPER_CLASSES, dataset_name, short_name, spellings_of
from xbench.metrics.names import ANALYSIS_ONLY, BY_KEY, METRICS, short
from xbench.reporting.benchmark import Benchmark
from xbench.reporting.table import Cell, Column, Row, Table

#: The columns of a reference CSV, the paper's included.
COLUMNS = ("table", "dataset", "model", "finding", "metric", "value_percent")
#: The finding of a mean over classes.
MEAN = "mean"
#: The metrics a reference may hold: those in percent that ``metrics.json`` has and the analysis
#: gives intervals for.
COMPARED_METRICS = tuple(m.key for m in METRICS if m.analysed and m.unit == "percent"
                         and m.section in ("grounding", "classification") and m.key not in ANALYSIS_ONLY)
#: Two printed values of one number agree when they differ by at most the paper's rounding (pp).
AGREEMENT = 0.01
#: Marks in the tables: the reference's value outside XBench's interval; the reference disagrees
#: with itself on this cell; a class value of a row whose printed mean is not its class mean.
OUTSIDE, INCONSISTENT, UNVERIFIED = "†", "‡", "?"
PAPER = files("xbench.reporting") / "paper"

CellKey = tuple[str, str, str, str]  # dataset, model, finding, metric


@dataclass(frozen=True)
class Printed:
    """One value as the reference prints it: its table, the value (a fraction), half its last printed
    digit (a fraction; 0 for full precision) and its line in the source file."""

    table: str
    value: float
    half_unit: float
    line: int


@dataclass
class Reference:
    """Printed values by cell, in the source's order, and what the source says about them."""

    name: str
    source: str
    values: dict[CellKey, list[Printed]]
    tables: dict[str, str]
    model_labels: dict[str, str] = field(default_factory=dict)
    not_reproducible: dict[str, str] = field(default_factory=dict)
    figures: dict = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(printed) for printed in self.values.values())


class ReferenceError(ValueError):
    """A reference file that cannot be read as cells XBench computes."""


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


def _read_rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """The CSV's rows with their line numbers, after checking its header and field counts."""
    try:
        handle = open(path, newline="", encoding="utf-8")
    except OSError as error:
        raise ReferenceError(f"reference {path}: cannot be read ({error.strerror or error}); give a CSV with the "
                             f"columns {', '.join(COLUMNS)} or a folder of results folders") from None
    with handle:
        try:
            lines = list(csv.reader(handle))
        except (csv.Error, UnicodeDecodeError) as error:
            raise ReferenceError(f"reference {path}: not a readable CSV ({error})") from None
    if not lines:
        raise ReferenceError(f"reference {path} is empty; its first line must be the header {','.join(COLUMNS)}")
    header = [name.strip() for name in lines[0]]
    if header != list(COLUMNS):
        missing = [c for c in COLUMNS if c not in header]
        extra = [c for c in header if c not in COLUMNS]
        raise ReferenceError(
            f"reference {path}, line 1: the header is {','.join(header)!r}; expected {','.join(COLUMNS)}"
            + (f" (missing: {', '.join(missing)})" if missing else "")
            + (f" (unknown: {', '.join(map(repr, extra))})" if extra else ""))
    rows = []
    for line, fields in enumerate(lines[1:], start=2):
        if not fields:
            continue
        if len(fields) != len(COLUMNS):
            raise ReferenceError(f"reference {path}, line {line}: {len(fields)} fields, expected {len(COLUMNS)} "
                                 f"({','.join(COLUMNS)}); is the file truncated?")
        rows.append((line, dict(zip(COLUMNS, (value.strip() for value in fields)))))
    if not rows:
        raise ReferenceError(f"reference {path} has a header but no values")
    return rows


def _value(path: Path, line: int, text: str) -> tuple[float, float]:
    """``value_percent`` as a fraction and half its last printed digit."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= 100:
        raise ReferenceError(f"reference {path}, line {line}: value_percent {text!r} is not a number from 0 to "
                             "100 (a percentage)")
    return value / 100, 0.5 * 10 ** -_decimals(text) / 100


def _vocabulary(bench: Benchmark | None = None) -> dict[str, set[str]]:
    """Each dataset's findings: the registered datasets', then those of the results' own datasets."""
    vocabulary = {dataset: set(spellings_of(dataset).values()) for dataset in DEFAULT_CLASSES}
    if bench is not None:
        vocabulary |= {d: set(bench.classes(d)) for d in bench.datasets if d not in vocabulary}
    return vocabulary


def _check_cell(path: Path, line: int, cell: CellKey, vocabulary: dict[str, set[str]],
                runs: set[tuple[str, str]] | None) -> None:
    """A cell XBench computes: a known dataset, one of its findings or ``mean``, a compared metric
    and, where ``runs`` (model, dataset) is given, a run of these results."""
    dataset, model, finding, metric = cell
    where = f"reference {path}, line {line}"
    if dataset not in vocabulary:
        raise ReferenceError(f"{where}: unknown dataset {dataset!r}; XBench's datasets: {', '.join(vocabulary)}")
    if finding != MEAN and finding not in vocabulary[dataset]:
        raise ReferenceError(f"{where}: {finding!r} is not a finding of {dataset}; give '{MEAN}' or one of "
                             f"{', '.join(sorted(vocabulary[dataset]))}")
    if metric not in COMPARED_METRICS:
        raise ReferenceError(f"{where}: unknown metric {metric!r}; a reference compares {', '.join(COMPARED_METRICS)}")
    if runs is not None and (model, dataset) not in runs:
        models = sorted({m for m, d in runs if d == dataset})
        raise ReferenceError(f"{where}: these results have no run of model {model!r} on {dataset}"
                             + (f" (models run on it: {', '.join(models)})" if models else " (no run on it)")
                             + "; run it, or leave the row out of the reference")


def _add(values: dict[CellKey, list[Printed]], path: Path, line: int, cell: CellKey, printed: Printed) -> None:
    same_table = [p for p in values.get(cell, []) if p.table == printed.table]
    if same_table:
        raise ReferenceError(f"reference {path}, line {line}: table {printed.table!r} already gives this cell "
                             f"({', '.join(cell)}) on line {same_table[0].line}; keep one")
    values.setdefault(cell, []).append(printed)


def read_reference(path: Path, bench: Benchmark) -> Reference:
    """A reference CSV in XBench's own keys (dataset, model, finding key or ``mean``, metric), every
    row a cell these results compute: an unknown name, or a model not run on the dataset, is an
    error that names the line."""
    runs, vocabulary = set(bench.runs), _vocabulary(bench)
    values: dict[CellKey, list[Printed]] = {}
    for line, row in _read_rows(path):
        if not row["table"]:
            raise ReferenceError(f"reference {path}, line {line}: the table is empty; give each row a table label")
        cell = (row["dataset"], row["model"], row["finding"], row["metric"])
        _check_cell(path, line, cell, vocabulary, runs)
        _add(values, path, line, cell, Printed(row["table"], *_value(path, line, row["value_percent"]), line))
    tables = {printed.table: printed.table for cell in values.values() for printed in cell}
    return Reference(f"`{path}`", str(path), values, tables)


def paper_reference() -> Reference:
    """The paper's Tables 1-5 (``paper/tables.csv``, as printed), in XBench's keys by ``paper/paper.yaml``."""
    about = read_yaml(Path(str(PAPER / "paper.yaml")))
    path, vocabulary = Path(str(PAPER / "tables.csv")), _vocabulary()
    values: dict[CellKey, list[Printed]] = {}
    for line, row in _read_rows(path):
        finding = MEAN if row["finding"] == MEAN else about["findings"][row["table"]][row["finding"]]
        cell = (about["datasets"][row["dataset"]], about["models"][row["model"]], finding, row["metric"])
        _check_cell(path, line, cell, vocabulary, None)
        _add(values, path, line, cell, Printed(row["table"], *_value(path, line, row["value_percent"]), line))
    return Reference(
        f"the paper (arXiv {about['arxiv']})", about["url"], values, about["tables"],
        {key: label for label, key in about["models"].items()}, about["not_reproducible"], about["figures"])


def results_reference(bench: Benchmark, source: str) -> Reference:
    """Every compared metric of another set of results folders, per class and mean, at full precision."""
    values: dict[CellKey, list[Printed]] = {}
    for (model, dataset), run in bench.runs.items():
        for metric in COMPARED_METRICS:
            for finding in (*run.results["classes"], MEAN):
                value = xbench_value(run.results, finding, metric)
                if value is not None:
                    values[(dataset, model, finding, metric)] = [Printed("results", value, 0.0, 0)]
    return Reference(f"the results in `{source}`", source, values, {"results": "the reference results"},
                     {model: bench.model_label(model) for model in bench.models})


def xbench_value(results: dict, finding: str, metric: str) -> float | None:
    """A cell's value in a run's ``metrics.json``."""
    section = BY_KEY[metric].section
    if finding == MEAN:
        return results[section]["macro"].get(metric)
    return (results[section].get("per_class", {}).get(finding) or {}).get(metric)


# -- the comparison ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """One cell: the reference's values, whether they agree, and XBench's value and interval."""

    cell: CellKey
    printed: tuple[Printed, ...]
    state: str  # "consistent", "inconsistent" or "unverified"
    class_mean: float | None  # the mean of the printed class values, where it decides the state
    covered: bool
    value: float | None = None
    interval: tuple[float, float] | None = None

    def inside(self, printed: Printed) -> bool | None:
        """Whether a printed value lies within the interval (``None``: not judged, no interval). The
        interval is taken to reach XBench's own estimate, which a percentile interval of a number
        chosen on the evaluated set (tau*, max-F1: re-chosen in every replicate) can miss."""
        if self.value is None or self.interval is None or any(map(math.isnan, self.interval)):
            return None
        low, high = min(self.interval[0], self.value), max(self.interval[1], self.value)
        return low - printed.half_unit - 1e-12 <= printed.value <= high + printed.half_unit + 1e-12

    @property
    def status(self) -> str:
        """``not covered``, ``no value``, ``inconsistent``, ``unverified``, ``no interval``, ``inside``
        or ``outside``."""
        if not self.covered:
            return "not covered"
        if self.value is None:
            return "no value"
        if self.state != "consistent":
            return self.state
        inside = self.inside(self.printed[0])
        return "no interval" if inside is None else ("inside" if inside else "outside")

    def delta(self, printed: Printed) -> float | None:
        return None if self.value is None else self.value - printed.value

    def describe(self) -> str:
        dataset, model, finding, metric = self.cell
        return f"{dataset_name(dataset)} {model} {finding} {metric}"


def _class_means(reference: Reference) -> dict[tuple[str, str, str], float]:
    """Per (dataset, model, metric) whose reference gives every class of the dataset: the
    unweighted mean of the printed class values (the rule of the paper's Table 1)."""
    by_row: dict[tuple[str, str, str], dict[str, float]] = {}
    for (dataset, model, finding, metric), printed in reference.values.items():
        if finding != MEAN:
            by_row.setdefault((dataset, model, metric), {})[finding] = printed[0].value
    return {row: sum(found.values()) / len(found) for row, found in by_row.items()
            if set(found) == set(DEFAULT_CLASSES.get(row[0], ())) and len(found) > 1}


def _states(reference: Reference) -> dict[CellKey, tuple[str, float | None]]:
    """Each cell's state and, where it decides it, the class mean."""
    class_means = _class_means(reference)
    states: dict[CellKey, tuple[str, float | None]] = {}
    suspects = set()
    for cell, printed in reference.values.items():
        dataset, model, finding, metric = cell
        values = [p.value for p in printed]
        agree = 100 * (max(values) - min(values)) <= AGREEMENT + 1e-9
        mean = class_means.get((dataset, model, metric)) if finding == MEAN else None
        with_mean = mean is None or all(100 * abs(v - mean) <= AGREEMENT + 1e-9 for v in values)
        if agree and not with_mean:
            suspects.add((dataset, model, metric))
        states[cell] = ("consistent" if agree and with_mean else "inconsistent", mean if not with_mean else None)
    for cell in states:
        if cell[2] != MEAN and (cell[0], cell[1], cell[3]) in suspects:
            states[cell] = ("unverified", None)
    return states


def compare(reference: Reference, bench: Benchmark, analysis) -> list[Comparison]:
    """Every reference cell against the benchmark's value and, with the analysis, its interval."""
    out = []
    for cell, (state, class_mean) in _states(reference).items():
        dataset, model, finding, metric = cell
        run = bench.runs.get((model, dataset))
        value = None if run is None else xbench_value(run.results, finding, metric)
        interval = (analysis.interval(dataset, model, MACRO if finding == MEAN else finding, metric)
                    if analysis is not None and value is not None else None)
        out.append(Comparison(cell, tuple(reference.values[cell]), state, class_mean, run is not None, value, interval))
    return out


def failures(comparisons: list[Comparison]) -> list[Comparison]:
    """The covered cells the reference states consistently whose value left the interval (or has none)."""
    return [c for c in comparisons if c.status in ("outside", "no value")]


def summary_line(reference: Reference, comparisons: list[Comparison]) -> str:
    """One line: cells compared, inside the interval, largest |delta|."""
    covered = [c for c in comparisons if c.covered]
    head = f"Reproduction of {reference.name}: {reference.count} values in {len(comparisons)} cells"
    if not covered:
        return f"{head}; no cell is covered by these results (none of its models was run on its datasets)."
    counts = {status: sum(c.status == status for c in covered) for status in
              ("inside", "outside", "inconsistent", "unverified", "no value", "no interval")}
    judged = counts["inside"] + counts["outside"]
    parts = [f"{len(covered)} covered by these results", f"{counts['inside']} of {judged} judged inside XBench's "
             f"interval, {counts['outside']} outside {OUTSIDE}"]
    parts += [f"{n} {status}" + {"inconsistent": f" in the reference {INCONSISTENT}",
                                  "unverified": f" {UNVERIFIED}"}.get(status, "")
              for status, n in counts.items() if n and status not in ("inside", "outside")]
    deltas = [(abs(c.delta(p)), c) for c in covered for p in c.printed if c.delta(p) is not None]
    if deltas:
        largest, where = max(deltas, key=lambda item: item[0])
        parts.append(f"largest |Δ| {100 * largest:.2f} pp ({where.describe()})")
    return f"{head}; " + "; ".join(parts) + "."


# -- tables ------------------------------------------------------------------------------------


def _finding_label(finding: str) -> str:
    return "Mean" if finding == MEAN else short_name(finding)


def _column_label(key: tuple[str, str, str], varying: tuple[bool, bool, bool]) -> str:
    dataset, finding, metric = key
    parts = [dataset_name(dataset), _finding_label(finding), short(metric)]
    return " ".join(part for part, shown in zip(parts, varying) if shown) or short(metric)


def _marks(comparison: Comparison, printed: Printed) -> str:
    marks = {"inconsistent": INCONSISTENT, "unverified": UNVERIFIED}.get(comparison.state, "")
    return marks + (OUTSIDE if comparison.inside(printed) is False else "")


def _row_label(reference: Reference, bench: Benchmark, model: str) -> str:
    label = bench.model_label(model) if model in bench.models else reference.model_labels.get(model, model)
    why = reference.not_reproducible.get(model)
    return f"{label} (not reproducible: {why})" if why else label


def _disagreements(table: str, comparisons: list[Comparison], labels: dict[str, str]) -> str:
    """The reference's disagreements that touch this table, every printed value named."""
    notes = []
    for c in comparisons:
        if c.state != "inconsistent" or not any(p.table == table for p in c.printed):
            continue
        printed = ", ".join(f"{100 * p.value:.2f} (table {p.table})" for p in c.printed)
        mean = f"; the mean of its class values {100 * c.class_mean:.2f}" if c.class_mean is not None else ""
        notes.append(f"{dataset_name(c.cell[0])} {labels.get(c.cell[1], c.cell[1])} {_finding_label(c.cell[2])} "
                     f"{short(c.cell[3])}: "
                     f"printed {printed}{mean}")
    return "; ".join(notes)


def reproduction_tables(reference: Reference, comparisons: list[Comparison], bench: Benchmark, name: str,
                        analysis_note: str = "") -> list[Table]:
    """Each of the reference's tables in its own layout: its rows (models) and columns (dataset,
    finding, metric as they vary), each column as the reference's value, XBench's and Δ. Files are
    named by the table's place (``<name>_1``, ...), never by a label read from a file."""
    by_cell = {c.cell: c for c in comparisons}
    tables = []
    for number, (table, title) in enumerate(reference.tables.items(), start=1):
        entries = [(cell, p) for cell, printed in reference.values.items() for p in printed if p.table == table]
        if not entries:
            continue
        keys = list(dict.fromkeys((cell[0], cell[2], cell[3]) for cell, _ in entries))
        varying = tuple(len({key[i] for key in keys}) > 1 for i in range(3))
        models = list(dict.fromkeys(cell[1] for cell, _ in entries))
        where = {(cell[1], (cell[0], cell[2], cell[3])): p for cell, p in entries}
        columns = tuple(Column(header, _column_label(key, varying), ranked=False, digits=2)
                        for key in keys for header in ("Ref.", "XBench", "Δ"))
        rows = []
        for model in models:
            cells = []
            for key in keys:
                printed = where.get((model, key))
                if printed is None:
                    cells += [Cell(None)] * 3
                    continue
                c = by_cell[(key[0], model, key[1], key[2])]
                cells += [Cell(printed.value), Cell(c.value, c.interval),
                          Cell(c.delta(printed), mark=_marks(c, printed))]
            rows.append(Row(_row_label(reference, bench, model), tuple(cells)))
        disagreements = _disagreements(table, comparisons, reference.model_labels)
        caption = (
            f"{title}, from {reference.name} ({reference.source}). Ref.: the value it prints; XBench: this "
            "report's value [interval]; Δ = XBench − Ref. (percentage points); – : not covered by these results. "
            f"{OUTSIDE}: the reference's value (± half its last printed digit) lies outside XBench's interval. "
            + (f"{INCONSISTENT}: the reference disagrees with itself on this cell, not judged: {disagreements}. "
               if disagreements else "")
            + (f"{UNVERIFIED}: a class value of a row whose printed mean is not the mean of its class values "
               "(unverified, not judged). " if any(by_cell[cell].state == "unverified" for cell, _ in entries)
               else "")
            + analysis_note)
        tables.append(Table(f"{name}_{number}", f"Reproduction: {title}", caption.strip(), "Model", columns,
                            tuple(rows)))
    if reference.figures:
        tables.append(figure_table(reference, bench, name))
    return tables


def _model_means(bench: Benchmark, model: str, metric: str) -> float | None:
    """A model's macro value averaged over the paper's seven datasets (``None`` unless it ran on all)."""
    values = [xbench_value(bench.runs[(model, d)].results, MEAN, metric) if (model, d) in bench.runs else None
              for d in PAPER_CLASSES]
    return None if any(v is None for v in values) else sum(values) / len(values)


def figure_table(reference: Reference, bench: Benchmark, name: str) -> Table:
    """Fig. 3's R² and Fig. 4's calibration gaps beside XBench's (point estimates, not judged)."""
    figures = reference.figures
    points = [(auroc, pg) for model in reference.model_labels
              if (auroc := _model_means(bench, model, "auroc")) is not None
              and (pg := _model_means(bench, model, "pointing_game")) is not None]
    r2 = None
    if len(points) >= 3:
        x, y = (torch.tensor([[point[i] for point in points]], dtype=torch.float64) for i in (0, 1))
        r2 = r_squared(x, y)[0].item()
    rows = [Row(f"Fig. 3: R² of AUROC and PG over the models (n = {len(points)})",
                (Cell(figures["r_squared"]), Cell(r2), Cell(None if r2 is None else r2 - figures["r_squared"])))]
    for model, gap in figures["dice_gap"].items():
        best, fixed = _model_means(bench, model, "dice@best"), _model_means(bench, model, "dice@0.5")
        ours = None if best is None else 100 * (best - fixed)
        rows.append(Row(f"Fig. 4: ΔDice of {_row_label(reference, bench, model)}",
                        (Cell(gap), Cell(ours), Cell(None if ours is None else ours - gap))))
    return Table(
        f"{name}_figures", "Reproduction: the numbers of Figs. 3 and 4",
        "Fig. 3: R² of each model's AUROC against its Pointing Game, each its macro mean averaged over the seven "
        "datasets, over the models run on all seven. Fig. 4: ΔDice = Dice@τ* − Dice@0.5 in percentage points, "
        "macro means averaged over the seven datasets. Point estimates without intervals, shown and not judged; "
        "– : a model not run on all seven datasets.",
        "Number", tuple(Column(header, ranked=False, percent=False) for header in ("Ref.", "XBench", "Δ")),
        tuple(rows))


#: The columns of a run's reproduction table (W&B).
RUN_COLUMNS = ["table", "finding", "metric", "paper", "xbench", "delta", "paper_state"]


def paper_rows(results: dict) -> list[list]:
    """One run's cells of the paper, one row per printed value, in percent: the paper's value, the
    run's, their difference and whether the paper states the cell consistently (no interval: the
    analysis comes after the runs; the report judges)."""
    reference = paper_reference()
    states = _states(reference)
    rows = []
    for cell, printed in reference.values.items():
        dataset, model, finding, metric = cell
        if (model, dataset) != (results["model"], results["dataset"]):
            continue
        value = xbench_value(results, finding, metric)
        for p in printed:
            ours = None if value is None else 100 * value
            rows.append([p.table, finding, metric, 100 * p.value, ours,
                         None if ours is None else ours - 100 * p.value, states[cell][0]])
    return rows
