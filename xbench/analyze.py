"""Analyse finished runs: ``python -m xbench.analyze RESULTS_DIR... --out analysis/``.

Reads the results folders (or folders of them), matches models on each dataset by their image
ids, and writes paired bootstrap intervals, paired differences, calibrated thresholds, lesion-size
strata and the recognition-vs-grounding R² as CSV, one JSON file and a Markdown summary.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from xbench.analysis.pipeline import DEFAULT_SIZE_BINS, Settings, analyze
from xbench.analysis.tables import analysis_json, analysis_tables, summary_markdown
from xbench.reporting.results import _atomic_write


def parse_args(args: list[str] | None) -> argparse.Namespace:
    defaults = Settings()
    parser = argparse.ArgumentParser(
        prog="python -m xbench.analyze",
        description="Paired bootstrap intervals, paired differences, calibrated thresholds, lesion-size strata "
                    "and the recognition-vs-grounding R², from results folders (no model is re-run).")
    parser.add_argument("results", nargs="+", metavar="RESULTS_DIR",
                        help="results folders of test-split runs, or folders holding them")
    parser.add_argument("--out", default="analysis", help="output folder (default: analysis/)")
    parser.add_argument("--validation", nargs="+", default=[], metavar="VAL_DIR",
                        help="results folders of the same models on the dataset's validation split: each sets "
                             "its model's calibrated τ. Without them τ is cross-fitted over the test images.")
    parser.add_argument("--replicates", type=int, default=defaults.replicates, help="bootstrap replicates")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of resampling and folds")
    parser.add_argument("--confidence", type=float, default=defaults.confidence, help="interval level")
    parser.add_argument("--folds", type=int, default=defaults.folds, help="K of the cross-fitted τ")
    parser.add_argument("--size-bins", type=float, nargs="*", default=list(DEFAULT_SIZE_BINS), metavar="FRACTION",
                        help="lesion-area boundaries as fractions of the image (default: 0.01 0.1)")
    return parser.parse_args(args)


def main(args: list[str] | None = None) -> Path:
    """Run the analysis and write its files; return the output folder."""
    options = parse_args(args)
    settings = Settings(replicates=options.replicates, seed=options.seed, confidence=options.confidence,
                        folds=options.folds, size_bins=tuple(options.size_bins))
    analysis = analyze(options.results, options.validation, settings)
    tables = analysis_tables(analysis)
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        _atomic_write(out / f"{name}.csv", lambda p, frame=frame: frame.to_csv(p, index=False))
    payload = analysis_json(analysis, tables)
    _atomic_write(out / "analysis.json", lambda p: p.write_text(json.dumps(payload, indent=1, allow_nan=False)))
    summary = summary_markdown(analysis, tables)
    _atomic_write(out / "summary.md", lambda p: p.write_text(summary))
    print(summary)
    print(f"Analysis written to {out}/: {', '.join(f'{n}.csv' for n in tables)}, analysis.json, summary.md")
    return out


def cli() -> None:
    """The command line, ``xbench-analyze`` or ``python -m xbench.analyze``. Not ``main``: it returns
    the output folder, which a console script's ``sys.exit`` would take for an error."""
    main()


if __name__ == "__main__":
    cli()
