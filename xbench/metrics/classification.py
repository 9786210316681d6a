"""Recognition metrics over torchmetrics' binary kernels, one class at a time.

Models return log-odds (``sigmoid(logit)`` is the probability of the finding). AUROC and AUPRC
depend only on the order of the scores, so each class's logits are replaced by their dense rank
scaled to [0, 1] before torchmetrics sees them: a float32 sigmoid would saturate large logits to
1.0 and create ties the model never made. Labels of -1 are unknown and ignored everywhere. Max-F1,
its threshold and the accuracy there come from the weighted kernel the bootstrap uses
(`xbench.metrics.recognition`), with every image weighted once.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics.functional.classification import (
    binary_accuracy,
    binary_auroc,
    binary_average_precision,
    binary_f1_score,
)
from torchmetrics.utilities import dim_zero_cat

from xbench.metrics.common import MetricValues, RecordsMetric
from xbench.metrics.names import run_keys
from xbench.metrics.recognition import IGNORE, recognition_statistics


def rank_scores(logits: Tensor) -> Tensor:
    """Per column, the dense rank of each logit scaled to [0, 1]: same order, same ties."""
    columns = []
    for column in logits.T:
        unique, inverse = torch.unique(column, return_inverse=True)
        columns.append(inverse.double() / max(unique.numel() - 1, 1))
    return torch.stack(columns, 1) if columns else logits.double()


def classification_scores(logits: Tensor, labels: Tensor) -> dict[str, Tensor]:
    """Functional twin of
    [`ClassificationMetrics`][xbench.metrics.classification.ClassificationMetrics] on all rows at
    once.

    Args:
        logits: float [N, C] log-odds. labels: [N, C] with 1, 0 or -1 (unknown).
    """
    num_classes = logits.shape[1]
    logits = logits.double()
    target = labels.long()
    known = target != IGNORE
    positives = ((target == 1) & known).sum(0)
    negatives = ((target == 0) & known).sum(0)
    scores = rank_scores(logits).float()
    # p >= 0.5  <=>  logit >= 0; integer predictions are taken as decisions by torchmetrics.
    decisions = (logits >= 0).long()

    chosen = recognition_statistics(target.cpu(), logits.cpu(), torch.ones(1, len(target), dtype=torch.float64))
    per_class = {name: chosen[name][0].to(logits.device) for name in ("max_f1", "max_f1_logit", "accuracy@max_f1")}
    per_class |= {name: torch.full((num_classes,), float("nan"), dtype=torch.float64, device=logits.device)
                  for name in ("auroc", "auprc", "f1@0.5", "accuracy@0.5")}
    for c in range(num_classes):
        rows = known[:, c]
        if not bool(rows.any()):
            continue
        score, truth = scores[rows, c], target[rows, c]
        per_class["f1@0.5"][c] = binary_f1_score(decisions[rows, c], truth)
        per_class["accuracy@0.5"][c] = binary_accuracy(decisions[rows, c], truth)
        if bool(positives[c] > 0) and bool(negatives[c] > 0):
            per_class["auroc"][c] = binary_auroc(score, truth)
            per_class["auprc"][c] = binary_average_precision(score, truth)

    out = {
        "positives": positives,
        "negatives": negatives,
        "unknown": (~known).sum(0),
        **per_class,
        "max_f1_threshold": torch.sigmoid(per_class["max_f1_logit"]),
        "hamming_accuracy": (decisions == target)[known].double().mean(),
        "single_label_value_classes": (known.any(0) & ((positives == 0) | (negatives == 0))).sum(),
    }
    for name in run_keys("classification", "macro"):
        values = out[name][~out[name].isnan()]
        out[f"macro/{name}"] = values.mean() if values.numel() else torch.tensor(float("nan"), dtype=torch.float64)
    return out


class ClassificationMetrics(RecordsMetric):
    """Per-class and macro AUROC, AUPRC, F1 and accuracy at p ≥ 0.5, Hamming accuracy, max-F1.

    ``update(logits [B, C], labels [B, C], index [B])``. AUROC/AUPRC of a class whose known labels
    are all one value are NaN and left out of the macro mean (``single_label_value_classes`` counts
    them). Max-F1, its threshold and the accuracy there are chosen on the evaluated set.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    def __init__(self, num_classes: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {
            "index": ((), torch.int64),
            "logits": ((self.num_classes,), torch.float32),
            "labels": ((self.num_classes,), torch.int8),
        }

    def update(self, logits: Tensor, labels: Tensor, index: Tensor | None = None) -> None:
        if logits.ndim != 2 or logits.shape[1] != self.num_classes or labels.shape != logits.shape:
            raise ValueError(
                f"logits and labels must both be [B, {self.num_classes}]; got {tuple(logits.shape)} and {tuple(labels.shape)}"
            )
        if index is None:
            index = torch.full((logits.shape[0],), -1, dtype=torch.int64, device=logits.device)
        self.index.append(index.long())
        self.logits.append(logits.detach().float())
        self.labels.append(labels.detach().to(torch.int8))

    def compute(self) -> MetricValues:
        records = self.records()
        if not records["index"].numel():
            raise RuntimeError("ClassificationMetrics.compute() called before any update")
        out = classification_scores(records["logits"], records["labels"])
        out["records"] = records
        return MetricValues(out)

    def records(self) -> dict[str, Tensor]:
        """Rows sorted by sample index: ``index`` [N], ``logits`` [N, C], ``labels`` [N, C]."""
        index = dim_zero_cat(self.index)
        order = torch.argsort(index, stable=True)
        return {
            "index": index[order],
            "logits": dim_zero_cat(self.logits)[order],
            "labels": dim_zero_cat(self.labels)[order].long(),
        }
