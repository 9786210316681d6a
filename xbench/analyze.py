"""Analyse finished runs: ``python -m xbench.analyze RESULTS_DIR... --out analysis/``.

Reads the results folders (or folders of them), matches models on each dataset by their image
ids, and writes paired bootstrap intervals, paired differences, calibrated thresholds, lesion-size
strata and the recognition-vs-grounding R² as CSV, one JSON file and a Markdown summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd

from xbench.cli import run
from xbench.analysis.pipeline import Analysis, analyze
from xbench.analysis.settings import QUERY_VIEWS, add_arguments, from_arguments
from xbench.analysis.tables import analysis_json, analysis_tables
from xbench.reporting.analysis_summary import analysis_markdown
from xbench.files import atomic_write


def parse_args(args: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m xbench.analyze",
        description="Paired bootstrap intervals, paired differences, calibrated thresholds, lesion-size strata "
                    "and the recognition-vs-grounding R², from results folders (no model is re-run).")
    parser.add_argument("results", nargs="+", metavar="RESULTS_DIR",
                        help="results folders of test-split runs, or folders holding them")
    parser.add_argument("--out", default="analysis", help="output folder (default: analysis/)")
    add_arguments(parser)
    parser.add_argument("--queries", choices=QUERY_VIEWS, default=None,
                        help="phrase datasets (MS-CXR): analyse the (image, query) pairs of queries.csv.gz, grounded "
                             "as each model grounds a phrase (query) or by the finding's name (finding_name), in "
                             "place of the (image, class) pairs")
    return parser.parse_args(args)


def write_analysis(analysis: Analysis, out: Path) -> tuple[dict[str, pd.DataFrame], list[Path]]:
    """Write every table as ``<name>.csv``, all of them in ``analysis.json``, and ``summary.md``
    under ``out``; return the tables and the files written."""
    from xbench.reporting.wandb import human_gap_keys  # noqa: PLC0415 -- Lightning's loggers, only when writing

    tables = analysis_tables(analysis)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, frame in tables.items():
        written.append(out / f"{name}.csv")
        atomic_write(written[-1], lambda p, frame=frame: frame.to_csv(p, index=False))
    payload = analysis_json(analysis, tables)
    payload["wandb"] = human_gap_keys(tables)  # each model's W&B keys of its gaps to the human readers
    written.append(out / "analysis.json")
    atomic_write(written[-1], lambda p: p.write_text(json.dumps(payload, indent=1, allow_nan=False)))
    summary = analysis_markdown(analysis, tables)
    written.append(out / "summary.md")
    atomic_write(written[-1], lambda p: p.write_text(summary))
    return tables, written


def main(args: list[str] | None = None) -> Path:
    """Run the analysis and write its files; return the output folder."""
    options = parse_args(args)
    settings = dataclasses.replace(from_arguments(options), queries=options.queries)
    analysis = analyze(options.results, options.validation, settings)
    out = Path(options.out)
    _, written = write_analysis(analysis, out)
    print((out / "summary.md").read_text())
    print(f"Analysis written to {out}/: {', '.join(path.name for path in written)}")
    return out


def cli() -> None:
    """The command line, ``xbench-analyze`` or ``python -m xbench.analyze``: a failure is a message and exit 1."""
    run(main, "xbench-analyze")


if __name__ == "__main__":
    cli()
