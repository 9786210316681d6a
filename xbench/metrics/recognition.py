"""Recognition metrics with images weighted by multiplicity: the kernel of every bootstrap replicate
at once (weights [R + 1, N]) and, with unit weights, of the run itself.

The definitions are those of `xbench.metrics.classification.classification_scores`: unknown
labels (-1) are left out; AUROC and AUPRC depend only on the order of a class's logits (ties are
the logits' own, as ``rank_scores`` keeps them) and are NaN when the class's known labels in the
replicate are all one value; F1 and accuracy at p >= 0.5 (logit >= 0); max-F1 over the distinct
logits, re-chosen inside every replicate, with its logit threshold and the accuracy there. The run
takes max-F1 from here; AUROC, AUPRC, F1 and accuracy at p >= 0.5 from torchmetrics, and
``tests/test_metric_kernels.py`` proves the two equal for every metric and both weightings.

For one class, let u_1 < ... < u_G be the distinct logits of its positives. Every known image
falls in one cell: a positive in its group g; a negative in the gap below u_g (or above u_G), or
tied with u_g. The replicates' weighted count of every cell is one sparse product of the
cell-membership matrix with the multiplicities, and everything follows from running sums over
the cells, with P and N the replicate's positives and negatives:

- ``neg_below_g`` / ``neg_upto_g``: negatives with logit < / <= u_g;
- ``TP_g = P - pos_below_g``, ``FP_g = N - neg_below_g``: the counts at threshold u_g;
- AUROC = sum_g pos_g (neg_below_g + neg_upto_g) / (2 P N)  (Mann-Whitney, ties count half);
- AUPRC = sum_g pos_g TP_g / (TP_g + FP_g) / P  (average precision, step-wise);
- max-F1 = max_g 2 TP_g / (TP_g + FP_g + P) over the groups drawn in the replicate: the best
  threshold sits at a positive's logit (lowering it past negatives only adds false positives).
  Among equal maxima the lowest threshold wins; F1 is one correctly rounded division of integer
  counts, so mathematically equal values are equal floats and the choice is exact. The accuracy
  there is (TP_g + neg_below_g) / (P + N).

F1 and accuracy at p >= 0.5 come from the same cells plus one: the negatives with logit >= 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

from xbench.metrics.names import analysed_keys

IGNORE = -1
RECOGNITION = analysed_keys("classification")


def _cell_counts(image_weights: Tensor, cells: Tensor, images: Tensor, num_cells: int) -> Tensor:
    """float64 [R + 1, num_cells]: the weighted count of each cell; image ``images[i]`` is in ``cells[i]``."""
    membership = torch.sparse_coo_tensor(
        torch.stack([cells, images]), torch.ones(len(images), dtype=torch.float64),
        (num_cells, image_weights.shape[0]), check_invariants=True,
    )
    return torch.sparse.mm(membership, image_weights).T.contiguous()


def recognition_statistics(labels: Tensor, logits: Tensor, weights: Tensor) -> dict[str, Tensor]:
    """name -> float64 [R + 1, C] for ``RECOGNITION`` and ``max_f1_logit``; row 0 the sample, rows
    1..R the replicates.

    Args:
        labels: int [N, C] with 1, 0 or -1 (unknown). logits: float [N, C].
        weights: float64 [R + 1, N] image multiplicities.
    """
    rows, num_classes = weights.shape[0], labels.shape[1]
    image_weights = weights.T.contiguous()  # [N, R + 1]
    out = {name: torch.full((rows, num_classes), float("nan"), dtype=torch.float64)
           for name in (*RECOGNITION, "max_f1_logit")}
    for c in range(num_classes):
        column, positive, negative = logits[:, c].double().contiguous(), labels[:, c] == 1, labels[:, c] == 0
        if not bool((labels[:, c] != IGNORE).any()):
            continue
        groups = torch.unique(column[positive])  # u_1 < ... < u_G
        g = len(groups)
        below = torch.searchsorted(groups, column)  # groups with u < logit
        tied = (below < g) & (groups[below.clamp(max=max(g - 1, 0))] == column) if g else torch.zeros_like(positive)
        # cells: positives 0..G-1; negatives G + 2a (gap below u_a) or G + 2a + 1 (tied with u_a);
        # last: negatives with logit >= 0, counted a second time
        cell = torch.where(positive, below, g + 2 * below + tied.long())
        known = torch.nonzero(positive | negative).squeeze(1)
        called_negatives = torch.nonzero(negative & (column >= 0)).squeeze(1)
        counts = _cell_counts(
            image_weights,
            torch.cat([cell[known], torch.full((len(called_negatives),), 3 * g + 1)]),
            torch.cat([known, called_negatives]),
            3 * g + 2,
        )
        pos, neg_cells = counts[:, :g], counts[:, g:3 * g + 1]
        pos_upto, neg_running = pos.cumsum(1), neg_cells.cumsum(1)
        positives = pos_upto[:, -1] if g else torch.zeros(rows, dtype=torch.float64)
        negatives = neg_running[:, -1]
        known_count = positives + negatives

        at_zero = int(torch.searchsorted(groups, torch.zeros(1, dtype=torch.float64)))  # groups with u < 0
        tp = positives - (pos_upto[:, at_zero - 1] if at_zero else 0.0)
        fp = counts[:, -1]
        fn, tn = positives - tp, negatives - fp
        f1 = 2 * tp / (2 * tp + fp + fn).clamp(min=1)  # no positive and none called: 0, as torchmetrics
        out["f1@0.5"][:, c] = torch.where(known_count > 0, f1, float("nan"))
        out["accuracy@0.5"][:, c] = torch.where(known_count > 0, (tp + tn) / known_count, float("nan"))
        if not g:
            continue

        neg_below, neg_upto = neg_running[:, 0:2 * g:2], neg_running[:, 1:2 * g:2]
        auroc = (pos * (neg_below + neg_upto)).sum(1) / (2 * positives * negatives)
        tp_at = positives.unsqueeze(1) - (pos_upto - pos)  # [R + 1, G]
        called = tp_at + (negatives.unsqueeze(1) - neg_below)
        # called = 0 only above every drawn image, where the group is not drawn either
        auprc = (pos * (tp_at / called.clamp(min=1))).sum(1) / positives
        f1_at = torch.where(pos > 0, 2 * tp_at / (called + positives.unsqueeze(1)), -1.0)
        best = f1_at.argmax(1, keepdim=True)  # the first, i.e. lowest, threshold among equal maxima
        accuracy = (tp_at.gather(1, best) + neg_below.gather(1, best)).squeeze(1) / known_count
        both = (positives > 0) & (negatives > 0)
        out["auroc"][:, c] = torch.where(both, auroc, float("nan"))
        out["auprc"][:, c] = torch.where(both, auprc, float("nan"))
        drawn = positives > 0
        out["max_f1"][:, c] = torch.where(drawn, f1_at.gather(1, best).squeeze(1), float("nan"))
        out["max_f1_logit"][:, c] = torch.where(drawn, groups[best.squeeze(1)], float("nan"))
        out["accuracy@max_f1"][:, c] = torch.where(drawn, accuracy, float("nan"))
    return out
