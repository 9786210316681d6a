"""Grounding and recognition metrics (torchmetrics ``Metric`` classes with functional twins)."""

from xbench.metrics.classification import ClassificationMetrics, classification_scores
from xbench.metrics.grounding import THRESHOLDS, GroundingMetrics, grounding_records, threshold_counts

__all__ = [
    "THRESHOLDS",
    "ClassificationMetrics",
    "GroundingMetrics",
    "classification_scores",
    "grounding_records",
    "threshold_counts",
]
