"""ClassificationMetrics against scikit-learn and a brute-force max-F1 sweep."""

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, f1_score, roc_auc_score

from xbench.metrics import ClassificationMetrics


def random_case(seed, n=300, c=5):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=(n, c))
    logits = rng.normal(size=(n, c)) * 3 + labels * rng.uniform(0, 2, size=c)
    logits[rng.random((n, c)) < 0.1] = 40.0  # large logits must not collapse into ties
    logits[:5, 0] = 60.0
    logits = np.round(logits, 1)  # genuine ties
    labels[rng.random((n, c)) < 0.15] = -1  # unknown
    labels[:, 3] = np.where(labels[:, 3] == -1, -1, 1)  # a class with positives only
    return logits.astype(np.float32), labels


def compute(logits, labels, batches=1):
    metric = ClassificationMetrics(logits.shape[1])
    for chunk in np.array_split(np.arange(len(logits)), batches):
        metric.update(torch.from_numpy(logits[chunk]), torch.from_numpy(labels[chunk]), torch.from_numpy(chunk))
    return metric.compute()


def brute_max_f1(scores, truth):
    best = (-1.0, None)
    for t in np.unique(scores):
        pred = scores >= t
        f1 = f1_score(truth, pred, zero_division=0)
        if f1 > best[0]:
            best = (f1, t)
    f1, t = best
    return f1, t, float(((scores >= t) == truth).mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_sklearn(seed):
    logits, labels = random_case(seed)
    out = compute(logits, labels, batches=3)
    for c in range(logits.shape[1]):
        known = labels[:, c] != -1
        y, s = labels[known, c], logits[known, c].astype(np.float64)
        pred = (1 / (1 + np.exp(-s))) >= 0.5
        assert out["f1@0.5"][c].item() == pytest.approx(f1_score(y, pred, zero_division=0), abs=1e-6)
        assert out["accuracy@0.5"][c].item() == pytest.approx((pred == y).mean(), abs=1e-6)
        if len(np.unique(y)) < 2:
            assert np.isnan(out["auroc"][c].item()) and np.isnan(out["auprc"][c].item())
        else:
            assert out["auroc"][c].item() == pytest.approx(roc_auc_score(y, s), abs=1e-6)
            assert out["auprc"][c].item() == pytest.approx(average_precision_score(y, s), abs=1e-6)
        f1, t, acc = brute_max_f1(s, y)
        assert out["max_f1"][c].item() == pytest.approx(f1, abs=1e-6)
        assert out["max_f1_logit"][c].item() == pytest.approx(t, abs=1e-5)
        assert out["accuracy@max_f1"][c].item() == pytest.approx(acc, abs=1e-6)
    assert out["single_label_value_classes"].item() == 1
    valid = [c for c in range(5) if c != 3]
    assert out["macro/auroc"].item() == pytest.approx(np.mean([out["auroc"][c].item() for c in valid]))
    known = labels != -1
    decisions = logits >= 0
    assert out["hamming_accuracy"].item() == pytest.approx(((decisions == labels)[known]).mean(), abs=1e-6)


def test_batching_and_order_invariance():
    logits, labels = random_case(5)
    a, b = compute(logits, labels, 1), compute(logits, labels, 7)
    for key in ("auroc", "auprc", "f1@0.5", "max_f1", "accuracy@max_f1"):
        torch.testing.assert_close(a[key], b[key], equal_nan=True)


def test_one_class_keeps_its_per_class_shape():
    out = compute(np.array([[1.0], [-1.0], [2.0]], np.float32), np.array([[1], [0], [0]]))
    assert out["auroc"].shape == (1,)
    assert out["auroc"][0].item() == pytest.approx(0.5)
