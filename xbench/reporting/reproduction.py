"""XBench's numbers beside a reference's, cell by cell: the paper's published tables (package data,
``xbench/reporting/paper/``), a CSV of the same columns with each value's precision, or another set
of results folders.

A *cell* is one number XBench computes: (dataset, model, finding key or ``mean``, metric). Each
covered cell is judged against XBench's bootstrap interval (stretched to reach XBench's own estimate
where it does not); a value stands for everything that rounds to it at its source's stated precision
(the paper's two decimals; a CSV's ``decimals`` column), so it is inside when it lies within the
interval widened by half that last digit.

A reference gives each cell once, and every cell it gives is judged: a cell given twice (in two
tables or two rows, equal or not) is an error naming both lines. The one exception is the paper's,
declared in its package data (``paper.yaml``): the Mean columns of its Tables 2-5 reprint Table 1,
and where they or the class values disagree the cell is shown with every value and not judged.
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
from xbench.cli import InputError
from xbench.files import open_text, read_yaml, regular_file
from xbench.findings import DEFAULT_CLASSES, PAPER_CLASSES, dataset_name, spellings_of
from xbench.metrics.names import ANALYSIS_ONLY, BY_KEY, METRICS, short
from xbench.reporting.benchmark import Benchmark
from xbench.reporting.table import Cell, Column, Row, Table

#: The columns of the paper's tables (its precision is stated once, in ``paper.yaml``) and of a
#: reference CSV, which states each value's: the digits after the point its source prints.
PAPER_COLUMNS = ("table", "dataset", "model", "finding", "metric", "value_percent")
COLUMNS = (*PAPER_COLUMNS, "decimals")
#: The most decimals a CSV may state (10: +-5e-11 pp, a value at full precision).
MAX_DECIMALS = 10
#: The largest reference file read: a reference is a small table (the paper's 539 values take 26 KB,
#: 8 MiB some 200,000 rows), refused before it is read rather than filling the memory.
MAX_BYTES = 8 * 2**20
#: The finding of a mean over classes.
MEAN = "mean"
#: The metrics a reference may hold: those in percent that ``metrics.json`` has and the analysis
#: gives intervals for.
COMPARED_METRICS = tuple(m.key for m in METRICS if m.analysed and m.unit == "percent"
                         and m.section in ("grounding", "classification") and m.key not in ANALYSIS_ONLY)
#: Marks in the tables: the reference's value outside XBench's interval; the paper disagrees with
#: itself on this cell; a class value of a row whose printed mean is not its class mean.
OUTSIDE, INCONSISTENT, UNVERIFIED = "†", "‡", "?"
PAPER = files("xbench.reporting") / "paper"

CellKey = tuple[str, str, str, str]  # dataset, model, finding, metric


@dataclass(frozen=True)
class Printed:
    """One value as the reference gives it: its table, the value (a fraction), half the last digit
    its source prints (a fraction; 0 for full precision) and its line in the source file."""

    table: str
    value: float
    half_unit: float
    line: int

    @property
    def digits(self) -> int:
        """The decimals of the percentage as its source prints it (the paper's 2)."""
        return round(-math.log10(200 * self.half_unit))


@dataclass
class Reference:
    """Printed values by cell, in the source's order, and what the source says about them:
    ``disputed``, the cells it declares inconsistent or unverified (only the paper's data can)."""

    name: str
    source: str
    values: dict[CellKey, list[Printed]]
    tables: dict[str, str]
    model_labels: dict[str, str] = field(default_factory=dict)
    not_reproducible: dict[str, str] = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    disputed: dict[CellKey, str] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(printed) for printed in self.values.values())


class ReferenceError(InputError):
    """A reference that cannot be read as cells XBench judges: an input error (exit 2)."""


def _read_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """The CSV's rows with their line numbers, after checking it is a file of at most `MAX_BYTES`
    (read by the shared reader: a byte-order mark tolerated), its header and its field counts."""
    try:
        size = regular_file(path).stat().st_size
        if size <= MAX_BYTES:
            with open_text(path) as handle:
                lines = list(csv.reader(handle))
    except OSError as error:
        raise ReferenceError(f"reference {path}: cannot be read ({error.strerror or error}); give a CSV with the "
                             f"columns {', '.join(columns)} or a folder of results folders") from None
    except ValueError as error:  # not a regular file, not UTF-8, not CSV: the shared readers' messages name the path
        raise ReferenceError(f"reference {error}") from None
    if size > MAX_BYTES:
        raise ReferenceError(f"reference {path} is {size:,} bytes; a reference is a small table, read up to "
                             f"{MAX_BYTES // 2**20} MiB (the paper's 539 values take 26 KB): is it the right file?")
    if not lines:
        raise ReferenceError(f"reference {path} is empty; its first line must be the header {','.join(columns)}")
    header = [name.strip() for name in lines[0]]
    if header != list(columns):
        missing = [c for c in columns if c not in header]
        extra = [c for c in header if c not in columns]
        raise ReferenceError(
            f"reference {path}, line 1: the header is {','.join(header)!r}; expected {','.join(columns)}"
            + (f" (missing: {', '.join(missing)})" if missing else "")
            + (f" (unknown: {', '.join(map(repr, extra))})" if extra else ""))
    rows = []
    for line, fields in enumerate(lines[1:], start=2):
        if not fields:
            continue
        if len(fields) != len(columns):
            raise ReferenceError(f"reference {path}, line {line}: {len(fields)} fields, expected {len(columns)} "
                                 f"({','.join(columns)}); is the file truncated?")
        rows.append((line, dict(zip(columns, (value.strip() for value in fields)))))
    if not rows:
        raise ReferenceError(f"reference {path} has a header but no values")
    return rows


def _value(path: Path, line: int, text: str) -> float:
    """``value_percent`` as a fraction."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0 <= value <= 100:
        raise ReferenceError(f"reference {path}, line {line}: value_percent {text!r} is not a number from 0 to "
                             "100 (a percentage)")
    return value / 100


def _half_unit(path: Path, line: int, decimals: str) -> float:
    """Half the last digit a source prints its values to, as a fraction: what a value stands for
    (``decimals`` 2: +-0.005 pp), stated by the source, never read off how a value is written."""
    if not decimals.isdigit() or int(decimals) > MAX_DECIMALS:
        raise ReferenceError(f"reference {path}, line {line}: decimals {decimals!r} is not a whole number from 0 to "
                             f"{MAX_DECIMALS}; give the digits after the point the source prints (2 for 61.62: the "
                             "value stands for 61.615 to 61.625)")
    return 0.5 * 10 ** -int(decimals) / 100


def _vocabulary(bench: Benchmark | None = None) -> dict[str, set[str]]:
    """Each dataset's findings: the registered datasets', then those of the results' own datasets."""
    vocabulary = {dataset: set(spellings_of(dataset).values()) for dataset in DEFAULT_CLASSES}
    if bench is not None:
        vocabulary |= {d: set(bench.classes(d)) for d in bench.datasets if d not in vocabulary}
    return vocabulary


def _check_cell(path: Path, line: int, cell: CellKey, vocabulary: dict[str, set[str]],
                bench: Benchmark | None) -> None:
    """A cell XBench computes: a known dataset, one of its findings or ``mean``, a compared metric
    and, where ``bench`` is given, a run of these results that is judged (not an instrument)."""
    dataset, model, finding, metric = cell
    where = f"reference {path}, line {line}"
    if dataset not in vocabulary:
        raise ReferenceError(f"{where}: unknown dataset {dataset!r}; XBench's datasets: {', '.join(vocabulary)}")
    if finding != MEAN and finding not in vocabulary[dataset]:
        raise ReferenceError(f"{where}: {finding!r} is not a finding of {dataset}; give '{MEAN}' or one of "
                             f"{', '.join(sorted(vocabulary[dataset]))}")
    if metric not in COMPARED_METRICS:
        raise ReferenceError(f"{where}: unknown metric {metric!r}; a reference compares {', '.join(COMPARED_METRICS)}")
    if bench is None:
        return
    if (model, dataset) in bench.ceilings:
        raise ReferenceError(f"{where}: {model!r} on {dataset} is an instrument, which reads the answer: a ceiling "
                             "shown for scale, never judged against a reference; leave the row out of the reference")
    if (model, dataset) not in bench.runs:
        models = sorted(bench.models_on(dataset))
        raise ReferenceError(f"{where}: these results have no run of model {model!r} on {dataset}"
                             + (f" (models run on it: {', '.join(models)})" if models else " (no run on it)")
                             + "; run it, or leave the row out of the reference")


def _add(values: dict[CellKey, list[Printed]], path: Path, cell: CellKey, printed: Printed,
         reprint: bool = False) -> None:
    """Add a value to its cell. A reference gives each cell once, equal or not, under any table
    label: only a reprint the paper's data declares (``reprints``) joins a cell, once per table."""
    earlier = values.setdefault(cell, [])
    again = [p for p in earlier if not reprint or p.table == printed.table]
    if again:
        first = again[0]
        raise ReferenceError(
            f"reference {path}, line {printed.line}: the cell {', '.join(cell)} is given again (table "
            f"{printed.table!r}: {100 * printed.value:g}), line {first.line} gives it already (table {first.table!r}: "
            f"{100 * first.value:g}); a reference gives each cell once: keep one of the two rows")
    earlier.append(printed)


def _check_percent(path: Path, values: dict[CellKey, list[Printed]], bench: Benchmark) -> None:
    """Values in fractions (0.616 for 61.6 %) would leave nearly every interval without saying why:
    every value within [0, 1] % that, times 100, lies nearer XBench's values than as given is an error."""
    pairs = [(p, ours) for cell, printed in values.items() for p in printed
             if (ours := xbench_value(bench.runs[(cell[1], cell[0])].results, cell[2], cell[3])) is not None]
    if not pairs or any(p.value > 0.01 for printed in values.values() for p in printed):
        return
    if sum(abs(ours - 100 * p.value) for p, ours in pairs) < sum(abs(ours - p.value) for p, ours in pairs):
        p, ours = pairs[0]
        raise ReferenceError(
            f"reference {path}: every value_percent lies from 0 to 1, and times 100 they lie near XBench's values "
            f"(line {p.line}: {100 * p.value:g}, XBench {100 * ours:.2f}): fractions, where value_percent is in "
            "percent; multiply the values by 100")


def read_reference(path: Path, bench: Benchmark, judged: bool = True) -> Reference:
    """A reference CSV in XBench's own keys (dataset, model, finding key or ``mean``, metric) with
    each value's stated precision (``decimals``), every row a cell these results judge, given once:
    an unknown name, a model not run on the dataset, an instrument, a cell given twice or values in
    fractions is an error that names the line. Not ``judged`` (``--published``: values shown beside
    the runs'), a row may name any model, run or not."""
    vocabulary = _vocabulary(bench)
    values: dict[CellKey, list[Printed]] = {}
    for line, row in _read_rows(path, COLUMNS):
        if not row["table"]:
            raise ReferenceError(f"reference {path}, line {line}: the table is empty; give each row a table label")
        cell = (row["dataset"], row["model"], row["finding"], row["metric"])
        _check_cell(path, line, cell, vocabulary, bench if judged else None)
        printed = Printed(row["table"], _value(path, line, row["value_percent"]),
                          _half_unit(path, line, row["decimals"]), line)
        _add(values, path, cell, printed)
    if judged:
        _check_percent(path, values, bench)
    tables = {printed.table: printed.table for cell in values.values() for printed in cell}
    return Reference(f"`{path}`", str(path), values, tables)


def _disputed(about: dict, values: dict[CellKey, list[Printed]]) -> dict[CellKey, str]:
    """The paper's declared disagreements (``paper.yaml``) by cell: the mean of each inconsistent
    row, the class values of each unverified row."""
    declared = about["disagreements"]
    rows = {state: {(about["datasets"][dataset], about["models"][model])
                    for dataset, models in declared[state].items() for model in models}
            for state in ("inconsistent", "unverified")}
    disputed = {}
    for dataset, model, finding, metric in values:
        state = "inconsistent" if finding == MEAN else "unverified"
        if metric == declared["metric"] and (dataset, model) in rows[state]:
            disputed[(dataset, model, finding, metric)] = state
    return disputed


def paper_reference() -> Reference:
    """The paper's Tables 1-5 (``paper/tables.csv``, as printed), in XBench's keys by ``paper/paper.yaml``,
    each value at the paper's two decimals, with the disagreements the data declares."""
    about = read_yaml(Path(str(PAPER / "paper.yaml")))
    path, vocabulary = Path(str(PAPER / "tables.csv")), _vocabulary()
    half_unit = 0.5 * 10 ** -about["decimals"] / 100
    values: dict[CellKey, list[Printed]] = {}
    for line, row in _read_rows(path, PAPER_COLUMNS):
        finding = MEAN if row["finding"] == MEAN else about["findings"][row["table"]][row["finding"]]
        cell = (about["datasets"][row["dataset"]], about["models"][row["model"]], finding, row["metric"])
        _check_cell(path, line, cell, vocabulary, None)
        reprint = finding == MEAN and row["table"] in about["reprints"]
        _add(values, path, cell, Printed(row["table"], _value(path, line, row["value_percent"]), half_unit, line),
             reprint)
    return Reference(
        f"the paper (arXiv {about['arxiv']})", about["url"], values, about["tables"],
        {key: label for label, key in about["models"].items()}, about["not_reproducible"], about["figures"],
        _disputed(about, values))


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
        inside = [self.inside(p) for p in self.printed]
        return "no interval" if None in inside else ("inside" if all(inside) else "outside")

    def failing_value(self) -> Printed:
        """The printed value a failure names: the first outside the interval (else the first)."""
        return next((p for p in self.printed if self.inside(p) is False), self.printed[0])

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
    """Each cell's state, ``consistent`` (judged) unless its source declares it disputed, and for an
    inconsistent mean the mean of its printed class values."""
    class_means = _class_means(reference)
    states = {}
    for cell in reference.values:
        state = reference.disputed.get(cell, "consistent")
        mean = class_means.get((cell[0], cell[1], cell[3])) if state == "inconsistent" and cell[2] == MEAN else None
        states[cell] = (state, mean)
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


def _finding_label(finding: str, bench: Benchmark) -> str:
    return "Mean" if finding == MEAN else bench.short_name(finding)


def _column_label(key: tuple[str, str, str], varying: tuple[bool, bool, bool], bench: Benchmark) -> str:
    dataset, finding, metric = key
    parts = [bench.dataset_label(dataset), _finding_label(finding, bench), short(metric)]
    return " ".join(part for part, shown in zip(parts, varying) if shown) or short(metric)


def _marks(comparison: Comparison, printed: Printed) -> str:
    marks = {"inconsistent": INCONSISTENT, "unverified": UNVERIFIED}.get(comparison.state, "")
    return marks + (OUTSIDE if comparison.inside(printed) is False else "")


def _row_label(reference: Reference, bench: Benchmark, model: str) -> str:
    label = bench.model_label(model) if model in bench.models else reference.model_labels.get(model, model)
    why = reference.not_reproducible.get(model)
    return f"{label} (not reproducible: {why})" if why else label


def _disagreements(table: str, comparisons: list[Comparison], labels: dict[str, str], bench: Benchmark) -> str:
    """The reference's disagreements that touch this table, every printed value named."""
    notes = []
    for c in comparisons:
        if c.state != "inconsistent" or not any(p.table == table for p in c.printed):
            continue
        printed = ", ".join(f"{100 * p.value:.2f} (table {p.table})" for p in c.printed)
        mean = f"; the mean of its class values {100 * c.class_mean:.2f}" if c.class_mean is not None else ""
        notes.append(f"{bench.dataset_label(c.cell[0])} {labels.get(c.cell[1], c.cell[1])} "
                     f"{_finding_label(c.cell[2], bench)} "
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
        columns = tuple(Column(header, _column_label(key, varying, bench), ranked=False, digits=2)
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
        disagreements = _disagreements(table, comparisons, reference.model_labels, bench)
        caption = (
            f"{title}, from {reference.name} ({reference.source}). Ref.: the value it prints; XBench: this "
            "report's value [interval]; Δ = XBench − Ref. (percentage points); – : not covered by these results. "
            f"{OUTSIDE}: the reference's value (± half the last digit its source prints) lies outside XBench's "
            "interval. "
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
