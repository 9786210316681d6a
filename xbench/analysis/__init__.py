"""Analyses of finished runs, from their results folders alone (no model is re-run).

- paired bootstrap intervals (images resampled, the same draws for every model on a dataset) for
  every headline number, the best tau re-chosen inside each replicate;
- a calibrated threshold per class, chosen on a validation run or by K-fold cross-fitting;
- lesion-size strata; the recognition-vs-grounding R².

``analyze(folders, validation=..., settings=Settings(...))`` returns an `Analysis`; the
functions in [`xbench.analysis.tables`][xbench.analysis.tables] turn it into plain tables. ``python
-m xbench.analyze`` writes them to disk.

The names below load on first use, so that ``xbench.analysis.settings`` (the CLIs' options)
imports without torch.
"""

from importlib import import_module

_HOMES = {
    "Analysis": "pipeline", "DatasetAnalysis": "pipeline", "RunAnalysis": "pipeline", "analyze": "pipeline",
    "Settings": "settings",
    "Run": "runs", "load_run": "runs",
    "analysis_tables": "tables", "calibration_table": "tables", "correlation_table": "tables",
    "difference_table": "tables", "interval_table": "tables", "strata_table": "tables",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
