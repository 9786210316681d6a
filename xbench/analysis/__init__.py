"""Analyses of finished runs, from their results folders alone (no model is re-run).

- paired bootstrap intervals (images resampled, the same draws for every model on a dataset) for
  every headline number, the best tau re-chosen inside each replicate;
- a calibrated threshold per class, chosen on a validation run or by K-fold cross-fitting;
- lesion-size strata; the recognition-vs-grounding R².

``analyze(folders, validation=..., settings=Settings(...))`` returns an :class:`Analysis`; the
functions in :mod:`xbench.analysis.tables` turn it into plain tables. ``python -m
xbench.analyze`` writes them to disk.
"""

from xbench.analysis.pipeline import Analysis, DatasetAnalysis, RunAnalysis, Settings, analyze
from xbench.analysis.runs import Run, load_run
from xbench.analysis.tables import (
    analysis_tables,
    calibration_table,
    correlation_table,
    difference_table,
    format_interval,
    interval_table,
    strata_table,
)

__all__ = [
    "Analysis", "DatasetAnalysis", "Run", "RunAnalysis", "Settings", "analysis_tables", "analyze",
    "calibration_table", "correlation_table", "difference_table", "format_interval", "interval_table",
    "load_run", "strata_table",
]
