"""The paper's tables and figures from results folders: ``python -m xbench.report RESULTS_DIR... --out report/``.

Reads every results folder at or below the given folders (the newest run of each model x
dataset; older ones are listed as superseded) and writes, without re-running any model:

- ``tables/<name>.md``, ``.csv`` and ``.tex``: Table 1 (Pointing Game, Dice and IoU at the best
  threshold per model and dataset) and its fixed-threshold twin, Dice at the calibrated
  threshold, a per-class Pointing Game table per multi-class dataset, the recognition table, the
  paired differences between models and the lesion-size strata per dataset, and the R² of
  recognition against grounding; with a human reader set, its row in each grounding table (marked
  *human*, never ranked) and each model's gap to it per finding (model − human and the percentage
  decrease, with paired intervals), with a summary line per dataset at the top of the report;
- ``figures/<name>.png``: recognition against grounding with R², Dice at tau = 0.5 against the
  best tau, Dice against tau, grounding by lesion size, each model's grounding per finding against
  the human readers' band (where a human reader set ran, ``--model human``), and the saliency
  overlays of the same images for every model;
- ``analysis/``: the analysis behind the intervals, as ``python -m xbench.analyze`` writes it;
- with runs that ran the sanity or faithfulness check (``--sanity.images``, ``--faithfulness.images``):
  plausibility, faithfulness and sanity side by side, the cascade of each model as a table and a
  figure, and plausibility against faithfulness (``xbench.reporting.explanations``);
- with runs on a gaze dataset (REFLACX, EGD-CXR, the phantom's ``--data.gaze``): a gaze table per
  dataset and the overlays of the radiologist's gaze beside each model's map (``xbench.reporting.gaze``);
- with robustness runs (``data.augment``): a table and a figure of every model under each
  perturbation, beside its unperturbed run;
- a reproduction section: the paper's published numbers (Tables 1-5, Figs. 3 and 4) beside XBench's
  wherever the results cover them, with a summary line at the top of the report; with
  ``--reference FILE`` (a CSV of the paper's columns and each value's decimals, each cell once) or
  ``--reference FOLDER`` (other results folders), that reference's numbers as well; ``--fail-outside-interval`` then exits 1 naming every cell whose
  reference value lies outside XBench's interval, and 2 on a reference it cannot judge by
  (``xbench.reporting.reproduction``);
- with ``--published paper`` (or ``--published FILE``, a CSV of the reference columns): the paper's
  (the file's) values as rows of the report's own tables, for the datasets the results cover, so a
  new model sits beside the published ones -- marked *published*, as printed, never ranked or judged;
- ``report.md``: all of it in one page, with the runs it was built from.

Every number comes with its bootstrap interval (``61.6 [58.9, 64.2]``) from ``xbench.analysis``;
``--no-analysis`` leaves the intervals, the calibrated tau, the differences and the strata out.
"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from xbench.cli import InputError, run
from xbench.console import counted
from xbench.analysis.settings import Settings, add_arguments, from_arguments
from xbench.reporting.analysis_summary import NO_HUMAN_LINE, gaze_reach_lines, reach_lines
from xbench.reporting.benchmark import Benchmark
from xbench.reporting.explanations import explanation_figures, explanation_tables
from xbench.reporting.figures import DPI, paper_figures, robustness
from xbench.reporting.gaze import gaze_overlays, gaze_tables
from xbench.files import atomic_write
from xbench.reporting.paper_tables import ReportAnalysis, not_comparable_line, paper_tables, robustness_table
from xbench.reporting.render import markdown_grid, to_csv, to_latex, to_markdown
from xbench.reporting.table import format_interval
from xbench.reporting.reproduction import (COLUMNS, Comparison, Reference, ReferenceError, compare, failures,
                                           paper_reference, read_reference, reproduction_tables,
                                           results_reference, summary_line)

ANALYSIS_FOLDER = "analysis"


def _runs_section(bench: Benchmark) -> list[str]:
    runs = [(m, d, None, bench_run) for (m, d), bench_run in
            [*bench.runs.items(), *bench.humans.items(), *bench.ceilings.items()]]
    runs += [(m, d, p, bench_run) for (m, d, p), bench_run in bench.perturbed.items()]
    rows = []
    for model, dataset, perturbation, bench_run in runs:
        data = bench_run.results["data"]
        label = bench.model_label(model) + (" (ceiling)" if bench_run.instrument else " (human)" if bench_run.human
                                            else "")
        rows.append([label, bench.dataset_label(dataset), perturbation or "–",
                     f"{data['images_evaluated']} of {data['images_in_split']}", bench_run.results["created"],
                     f"`{bench_run.folder}`"])
    lines = ["## Runs", "", *markdown_grid(["Model", "Dataset", "Perturbation", "Images", "Created", "Folder"], rows,
                                          text_columns=3)]
    if bench.superseded:
        lines += ["", "Superseded by a newer run of the same model, dataset and perturbation (not used): "
                  + ", ".join(f"`{run.folder}`" for run in bench.superseded) + "."]
    return lines


def progress(text: str) -> AbstractContextManager:
    """A progress line for one of the report's long steps (the analysis, the figures), on stderr
    while it runs and gone after; none where stderr is not a terminal (a log, a pipe, CI), so that a
    log holds only the report's own lines."""
    console = Console(stderr=True)
    return console.status(text) if console.is_terminal else nullcontext()


def analyse(bench: Benchmark, settings: Settings, validation: list[Path], out: Path) -> tuple[ReportAnalysis, list[Path]]:
    """Run ``xbench.analysis`` on the report's runs (the newest unperturbed run of every model and
    instrument and human reader set on every dataset) and write its files under ``out``, as ``python -m
    xbench.analyze`` does."""
    from xbench.analysis.pipeline import analyze
    from xbench.analyze import write_analysis

    try:
        folders = [bench.get(model, dataset).folder for dataset in bench.datasets
                   for model in bench.models_on(dataset) + bench.readers_on(dataset) + bench.instruments_on(dataset)]
        analysis = analyze(folders, validation, settings)
    except (ValueError, FileNotFoundError) as error:
        raise type(error)(
            f"{error}\nThe report's intervals come from this analysis; `--no-analysis` builds the report without "
            "them.") from error
    tables, written = write_analysis(analysis, out)
    return ReportAnalysis(settings, tables), written


def _intervals_line(analysis: ReportAnalysis | None, bench: Benchmark) -> str:
    if analysis is None:
        return "Without the analysis (`--no-analysis`): no intervals, calibrated thresholds or lesion-size strata."
    s = analysis.settings
    reads = [bench.dataset_label(d) for d in bench.datasets
             if any(bench.get(m, d).results["data"].get("reads") for m in bench.models_on(d) + bench.readers_on(d))]
    radiographs = (f" (on {', '.join(reads)}, whose samples are radiologists' reads, radiographs are resampled, each "
                   "with all its reads)") if reads else ""
    return (f"Numbers in brackets: {100 * s.confidence:g}% bootstrap percentile intervals, {s.replicates} replicates "
            f"(seed {s.seed}), images resampled with replacement{radiographs} and paired across the models of a "
            "dataset. "
            f"The analysis behind them, for programs: [{ANALYSIS_FOLDER}/]({ANALYSIS_FOLDER}/) "
            "(CSV and JSON, as `python -m xbench.analyze` writes them).")


def load_reference(path: Path, bench: Benchmark) -> Reference:
    """``--reference``: a CSV of the paper's columns in XBench's keys, or a folder of results folders;
    every one of its cells must be one these results compute."""
    if not path.is_dir():
        return read_reference(path, bench)
    try:
        folders = Benchmark.from_folders([path])
    except (ValueError, OSError) as error:  # no results there, or damaged ones
        raise ReferenceError(f"--reference {path}: {error}") from None
    reference = results_reference(folders, str(path))
    lacking = sorted({(model, dataset) for dataset, model, _, _ in reference.values} - set(bench.runs))
    if lacking:
        raise ReferenceError(f"--reference {path} has runs these results lack: "
                             + ", ".join(f"{model} on {dataset}" for model, dataset in lacking)
                             + "; give results that cover them")
    return reference


#: ``--published``'s name of the paper's Tables 1-5 (``xbench/reporting/paper/``).
PAPER = "paper"


def load_published(value: str, bench: Benchmark) -> Reference:
    """``--published``: the paper's values (``paper``) or a CSV of the reference columns, of any
    model, on datasets and findings XBench knows; shown beside the runs, never judged."""
    path = Path(value)
    if value == PAPER:
        return paper_reference()
    if not path.is_file():
        raise InputError(f"--published {value!r} is neither '{PAPER}' nor a file; give '--published {PAPER}' (the "
                         "paper's Tables 1-5) or a CSV with the columns " + ", ".join(COLUMNS))
    try:
        return read_reference(path, bench, judged=False)
    except ReferenceError as error:
        raise ReferenceError(f"--published: {error}") from None


Reproduction = tuple[Reference, list[Comparison]]


def _reproduction_section(reproductions: list[Reproduction], bench: Benchmark,
                          analysis: ReportAnalysis | None) -> tuple[list[str], list]:
    """The summary lines and, for each reference of which the results cover a cell, its tables."""
    lines, tables = [], []
    for number, (reference, comparisons) in enumerate(reproductions):
        lines.append(summary_line(reference, comparisons))
        if any(c.covered for c in comparisons):
            name = "reproduction_paper" if number == 0 else "reproduction_reference"
            tables += reproduction_tables(reference, comparisons, bench, name, analysis.note if analysis else "")
    return lines, tables


def _human_lines(bench: Benchmark, analysis: ReportAnalysis | None) -> list[str]:
    """The human scale's summary lines: how far the best model reaches on each dataset with a human
    reader set; one line saying there is none where no dataset has one (never a made-up ceiling)."""
    if not bench.humans:
        return [NO_HUMAN_LINE]
    if analysis is None:
        return ["The human readers' rows are in the grounding tables; their gaps to the models need the analysis "
                "(drop --no-analysis)."]
    return [*reach_lines(analysis.tables["human_gaps"], bench.dataset_label, bench.model_label),
            *gaze_reach_lines(analysis.tables["gaze_gaps"], bench.dataset_label, bench.model_label),
            *filter(None, (not_comparable_line(bench, analysis, dataset) for dataset in bench.datasets))]


def write_report(bench: Benchmark, out: Path, analysis: ReportAnalysis | None = None,
                 reproductions: list[Reproduction] = (), published: Reference | None = None) -> list[Path]:
    """Write every table and figure under ``out`` and ``out/report.md``; return the files written.
    Everything is read and drawn first: a damaged results file leaves no half-made report folder.
    ``reproductions``: each reference with its comparison, the paper's first; ``published``: values
    shown as rows beside the runs' in the report's own tables (``--published``)."""
    summaries, reproduction = _reproduction_section(list(reproductions), bench, analysis)
    summaries += _human_lines(bench, analysis)
    tables = (paper_tables(bench, analysis, published) + explanation_tables(bench, analysis)
              + gaze_tables(bench, analysis)) if bench.runs else []
    plots = (paper_figures(bench, analysis) + explanation_figures(bench, analysis) + gaze_overlays(bench)
             if bench.runs else [])
    robust_table, robust_plot = robustness_table(bench), robustness(bench)
    tables += [robust_table] if robust_table is not None else []
    plots += [robust_plot] if robust_plot is not None else []
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    body = ["# XBench report", "",
            f"Built {datetime.now(timezone.utc).isoformat(timespec='seconds')} from {bench.scope()}. "
            "All numbers in percent unless marked. " + (_intervals_line(analysis, bench) if bench.runs else ""), ""]
    body += [*(f"- {line}" for line in summaries), ""] if summaries else []
    body += ["## Tables", ""]
    for number, table in enumerate(tables + reproduction, start=1):
        if number == len(tables) + 1:
            body += ["## Reproduction", "", "The references' numbers beside XBench's, cell by cell "
                     "(docs: Reproducing the paper).", ""]
        for suffix, text in ((".md", to_markdown(table, number)), (".csv", to_csv(table)),
                             (".tex", to_latex(table))):
            path = out / "tables" / f"{table.name}{suffix}"
            atomic_write(path, lambda p, text=text: p.write_text(text))
            written.append(path)
        body += [to_markdown(table, number),
                 f"Files: [CSV](tables/{table.name}.csv), [LaTeX](tables/{table.name}.tex)", ""]
    body += ["## Figures", ""]
    for number, plot in enumerate(plots, start=1):
        path = out / "figures" / f"{plot.name}.png"
        atomic_write(path, lambda p, plot=plot: plot.figure.savefig(p, dpi=DPI, format="png"))
        written.append(path)
        body += [f"**Figure {number}.** {plot.caption}", "", f"![Figure {number}](figures/{plot.name}.png)", ""]
    body += _runs_section(bench)
    report = out / "report.md"
    atomic_write(report, lambda p: p.write_text("\n".join(body) + "\n"))
    return [report, *written]


def main(args: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m xbench.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="results folders, or folders that hold them")
    parser.add_argument("--out", type=Path, default=Path("report"), help="where the report goes (default: report/)")
    parser.add_argument("--no-analysis", action="store_true",
                        help="skip the bootstrap analysis (no intervals, calibrated τ, differences, strata): faster "
                             "on large benchmarks")
    parser.add_argument("--reference", type=Path, action="append",
                        help="numbers to compare with besides the paper's, given once: a CSV with the columns table, "
                             "dataset, model, finding, metric, value_percent, decimals (XBench's keys; finding 'mean' "
                             "for the mean over classes; each cell once), or a folder of results folders (an earlier "
                             "run)")
    parser.add_argument("--fail-outside-interval", action="store_true",
                        help="exit 1, naming every cell, when a value of --reference (without it, of the paper) "
                             "lies outside XBench's interval; the report is written first. A reference it cannot "
                             "judge by exits 2")
    parser.add_argument("--published", metavar="paper|FILE",
                        help="published values as rows beside the runs' in the report's own tables, for the "
                             "datasets the results cover (marked published, at their printed precision, no interval, "
                             "never ranked or judged): 'paper' (the paper's Tables 1-5) or a CSV of --reference's "
                             "columns, of any model")
    group = parser.add_argument_group("analysis (as python -m xbench.analyze)")
    add_arguments(group)
    options = parser.parse_args(args)
    if options.fail_outside_interval and options.no_analysis:
        raise InputError("--fail-outside-interval judges each number against its interval, which --no-analysis "
                         "leaves out; drop one of the two")
    if len(options.reference or ()) > 1:
        raise InputError(f"--reference is given {len(options.reference)} times ("
                         + ", ".join(map(str, options.reference)) + "); the report compares the paper and one "
                         "reference, which the gate judges: combine them into one CSV")
    bench = Benchmark.from_folders(options.results)
    references = [paper_reference(), *(load_reference(path, bench) for path in options.reference or ())]
    published = load_published(options.published, bench) if options.published else None
    analysis, files = None, []
    if bench.runs and not options.no_analysis:
        settings = from_arguments(options)
        runs = len(bench.runs) + len(bench.humans) + len(bench.ceilings)
        with progress(f"Analysing {counted(runs, 'run')}: {settings.replicates} bootstrap replicates..."):
            analysis, files = analyse(bench, settings, options.validation, options.out / ANALYSIS_FOLDER)
    reproductions = [(reference, compare(reference, bench, analysis)) for reference in references]
    with progress("Drawing the tables and figures..."):
        files = write_report(bench, options.out, analysis, reproductions, published) + files
    print(f"Report of {bench.scope()} written to {options.out}/"
          + (f" ({analysis.settings.replicates} bootstrap replicates)" if analysis is not None else "") + ":")
    for path in files:
        print(f"  {path}")
    for reference, comparisons in reproductions:
        print(summary_line(reference, comparisons))
    if options.fail_outside_interval:
        gate(*reproductions[-1])
    return files


class OutsideInterval(Exception):
    """``--fail-outside-interval``: reference values that left XBench's intervals (exit 1)."""


def gate(reference: Reference, comparisons: list[Comparison]) -> None:
    """Raise naming every judged cell whose value lies outside XBench's interval (or that XBench has
    no value for); a reference with no covered cell is an input error (exit 2), never a pass."""
    if not any(c.covered for c in comparisons):
        raise InputError(f"--fail-outside-interval: no cell of {reference.name} is covered by these results, "
                         "so nothing was compared; give results of its models and datasets")
    failed = failures(comparisons)
    if failed:
        raise OutsideInterval(
            f"--fail-outside-interval: {len(failed)} cell(s) of {reference.name} left XBench's interval: " + "; ".join(
                f"{c.describe()} ({f'line {p.line}: ' if (p := c.failing_value()).line else ''}"
                f"{100 * p.value:g}, XBench "
                + ("no value" if c.value is None else format_interval(c.value, *c.interval, digits=2)) + ")"
                for c in failed))


def cli() -> None:
    """The command line, ``xbench-report`` or ``python -m xbench.report``: a failure is a message and exit 1,
    a bad input (a reference it cannot judge by) exit 2."""
    run(main, "xbench-report")


if __name__ == "__main__":
    cli()
