"""The paper's tables and figures from results folders: ``python -m xbench.report RESULTS_DIR... --out report/``.

Reads every results folder at or below the given folders (the newest run of each model x
dataset; older ones are listed as superseded) and writes, without re-running any model:

- ``tables/<name>.md``, ``.csv`` and ``.tex``: Table 1 (Pointing Game, Dice and IoU at the best
  threshold per model and dataset) and its fixed-threshold twin, a per-class Pointing Game table
  per multi-class dataset, the recognition table;
- ``figures/<name>.png``: recognition against grounding with R², Dice at tau = 0.5 against the
  best tau, Dice against tau, and the saliency overlays of the same images for every model;
- ``report.md``: all of it in one page, with the runs it was built from.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path

from xbench.reporting.benchmark import Benchmark
from xbench.reporting.figures import DPI, paper_figures
from xbench.reporting.tables import paper_tables, to_csv, to_latex, to_markdown


def _runs_section(bench: Benchmark) -> list[str]:
    lines = ["## Runs", "", "| Model | Dataset | Images | Created | Folder |", "|---|---|---:|---|---|"]
    for dataset in bench.datasets:
        for model in bench.models_on(dataset):
            run = bench.get(model, dataset)
            data = run.results["data"]
            lines.append(
                f"| {bench.model_label(model)} | {bench.dataset_label(dataset)} | "
                f"{data['images_evaluated']} of {data['images_in_split']} | {run.results['created']} | "
                f"`{run.folder}` |"
            )
    if bench.superseded:
        lines += ["", "Superseded by a newer run of the same model and dataset (not used): "
                  + ", ".join(f"`{run.folder}`" for run in bench.superseded) + "."]
    return lines


def write_report(bench: Benchmark, out: Path) -> list[Path]:
    """Write every table and figure under ``out`` and ``out/report.md``; return the files written."""
    (out / "tables").mkdir(parents=True, exist_ok=True)
    (out / "figures").mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    body = ["# XBench report", "",
            f"Built {datetime.now(timezone.utc).isoformat(timespec='seconds')} from {len(bench.runs)} runs "
            f"({len(bench.models)} models, {len(bench.datasets)} datasets). All numbers in percent.", ""]
    body += ["## Tables", ""]
    for number, table in enumerate(paper_tables(bench), start=1):
        for suffix, text in ((".md", to_markdown(table, number)), (".csv", to_csv(table)),
                             (".tex", to_latex(table))):
            path = out / "tables" / f"{table.name}{suffix}"
            path.write_text(text)
            written.append(path)
        body += [to_markdown(table, number),
                 f"Files: [CSV](tables/{table.name}.csv), [LaTeX](tables/{table.name}.tex)", ""]
    body += ["## Figures", ""]
    for number, plot in enumerate(paper_figures(bench), start=1):
        path = out / "figures" / f"{plot.name}.png"
        plot.figure.savefig(path, dpi=DPI)
        written.append(path)
        body += [f"**Figure {number}.** {plot.caption}", "", f"![Figure {number}](figures/{plot.name}.png)", ""]
    body += _runs_section(bench)
    report = out / "report.md"
    report.write_text("\n".join(body) + "\n")
    return [report, *written]


def main(args: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog="python -m xbench.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", type=Path, help="results folders, or folders that hold them")
    parser.add_argument("--out", type=Path, default=Path("report"), help="where the report goes (default: report/)")
    options = parser.parse_args(args)
    bench = Benchmark.from_folders(options.results)
    files = write_report(bench, options.out)
    print(f"Report of {len(bench.runs)} runs written to {options.out}/:")
    for path in files:
        print(f"  {path}")
    return files


def cli() -> None:
    """The command line, ``xbench-report`` or ``python -m xbench.report``. Not ``main``: it returns
    the files written, which a console script's ``sys.exit`` would take for an error."""
    main()


if __name__ == "__main__":
    cli()
