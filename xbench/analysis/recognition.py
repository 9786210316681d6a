"""Recognition statistics of every bootstrap replicate at once, with images weighted by multiplicity.

The definitions are those of :func:`xbench.metrics.classification.classification_scores`: unknown
labels (-1) are left out; AUROC and AUPRC depend only on the order of a class's logits (ties are
the logits' own, as ``rank_scores`` keeps them) and are NaN when the class's known labels in the
replicate are all one value; F1 and accuracy at p >= 0.5 (logit >= 0); max-F1 over the distinct
logits, re-chosen inside every replicate.

For one class, positives and negatives are each sorted by logit once; a replicate only changes
their multiplicities, whose running sums (integers, exact) give for every positive image i, with
P and N the replicate's weighted positives and negatives:

- ``neg_below_i`` / ``neg_upto_i``: negatives with logit < / <= the image's;
- ``TP_i = P - pos_below_i``, ``FP_i = N - neg_below_i``: the counts at threshold logit_i.

Then AUROC = sum_i w_i (neg_below_i + neg_upto_i) / (2 P N) (Mann-Whitney, ties count half);
AUPRC = sum_i w_i TP_i / (TP_i + FP_i) / P (average precision, step-wise, summed per positive);
max-F1 = max_i 2 TP_i / (TP_i + FP_i + P): the best threshold always sits at a positive's logit
(lowering it past negatives only adds false positives), and a positive not drawn in the replicate
repeats the value of the next threshold above it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from xbench.metrics.classification import IGNORE

RECOGNITION = ("auroc", "auprc", "f1@0.5", "accuracy@0.5", "max_f1")


def _running(counts: Tensor, images: Tensor) -> tuple[Tensor, Tensor]:
    """The images' multiplicities [R + 1, n] and their running sums [R + 1, n + 1] with a leading
    0 column, int32 (exact: a replicate's multiplicities sum to N)."""
    selected = counts.index_select(1, images)
    return selected, torch.nn.functional.pad(selected.cumsum(1, dtype=torch.int32), (1, 0))


def recognition_statistics(labels: Tensor, logits: Tensor, weights: Tensor) -> dict[str, Tensor]:
    """name -> float64 [R + 1, C] for ``RECOGNITION``; row 0 the sample, rows 1..R the replicates.

    Args:
        labels: int [N, C] with 1, 0 or -1 (unknown). logits: float [N, C].
        weights: [R + 1, N] image multiplicities (whole numbers).
    """
    rows, num_classes = weights.shape[0], labels.shape[1]
    counts = weights.to(torch.int32)
    out = {name: torch.full((rows, num_classes), float("nan"), dtype=torch.float64) for name in RECOGNITION}
    for c in range(num_classes):
        column = logits[:, c].double()
        if not bool((labels[:, c] != IGNORE).any()):
            continue
        sides = []
        for value in (1, 0):
            images = torch.nonzero(labels[:, c] == value).squeeze(1)
            sorted_logits, order = torch.sort(column[images], stable=True)
            sides.append((sorted_logits, *_running(counts, images[order])))
        (pos_logits, drawn, pos_running), (neg_logits, _, neg_running) = sides
        positives, negatives = pos_running[:, -1].double(), neg_running[:, -1].double()  # [R + 1]
        known = positives + negatives

        # At p >= 0.5 (logit >= 0): the running sums below the threshold give every count.
        zero = torch.zeros(1, dtype=torch.float64)
        tp = positives - pos_running[:, torch.searchsorted(pos_logits, zero)[0]]
        fp = negatives - neg_running[:, torch.searchsorted(neg_logits, zero)[0]]
        fn, tn = positives - tp, negatives - fp
        f1 = 2 * tp / (2 * tp + fp + fn).clamp(min=1)  # no positive and none called: 0, as torchmetrics
        out["f1@0.5"][:, c] = torch.where(known > 0, f1, float("nan"))
        out["accuracy@0.5"][:, c] = torch.where(known > 0, (tp + tn) / known, float("nan"))
        if not len(pos_logits):
            continue

        pos_below = pos_running.index_select(1, torch.searchsorted(pos_logits, pos_logits)).double()
        neg_below = neg_running.index_select(1, torch.searchsorted(neg_logits, pos_logits)).double()
        neg_upto = neg_running.index_select(1, torch.searchsorted(neg_logits, pos_logits, right=True)).double()
        drawn = drawn.double()
        auroc = torch.linalg.vecdot(drawn, neg_below + neg_upto) / (2 * positives * negatives)
        tp_at = positives.unsqueeze(1) - pos_below  # [R + 1, n_pos]
        called = tp_at + (negatives.unsqueeze(1) - neg_below)
        # called = 0 only above every drawn image, where the positive itself is not drawn either
        auprc = torch.linalg.vecdot(drawn, tp_at / called.clamp(min=1)) / positives
        max_f1 = 2 * (tp_at / (called + positives.unsqueeze(1))).amax(1)
        both = (positives > 0) & (negatives > 0)
        out["auroc"][:, c] = torch.where(both, auroc, float("nan"))
        out["auprc"][:, c] = torch.where(both, auprc, float("nan"))
        out["max_f1"][:, c] = torch.where(positives > 0, max_f1, float("nan"))
    return out
