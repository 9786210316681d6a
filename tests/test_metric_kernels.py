"""Each metric is defined once: the bootstrap analysis's weighted kernels equal the run-time metrics,
for every analysed metric and both weightings -- every image once (the run itself) and images drawn
several times or not at all (a bootstrap replicate, checked against the run-time metric on the
sample with each image repeated that many times)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xbench.analysis.grounding import grounding_statistics
from xbench.analysis.runs import GradedPairs
from xbench.metrics.classification import classification_scores
from xbench.metrics.grounding import GroundingMetrics, grounding_records, summarise_curves
from xbench.metrics.names import analysed_keys
from xbench.metrics.recognition import recognition_statistics
from xbench.geometry.maps import normalise


def multiplicities(num_images: int, seed: int) -> torch.Tensor:
    """float64 [3, N]: every image once, then two replicates with images drawn 0-3 times."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, 4, size=(2, num_images))
    return torch.from_numpy(np.vstack([np.ones(num_images, dtype=np.int64), drawn])).double()


def assert_same(kernel: torch.Tensor, runtime: torch.Tensor, name: str, tolerance: float) -> None:
    kernel, runtime = kernel.double(), runtime.double().cpu()
    assert torch.equal(kernel.isnan(), runtime.isnan()), name
    defined = ~kernel.isnan()
    assert torch.allclose(kernel[defined], runtime[defined], rtol=0, atol=tolerance), name


@pytest.mark.parametrize("seed", [0, 1])
def test_recognition_kernel_equals_the_run_time_metrics(seed):
    rng = np.random.default_rng(seed)
    n, c = 80, 4
    labels = rng.integers(0, 2, size=(n, c))
    logits = np.round(rng.normal(size=(n, c)) * 2 + labels, 1)  # rounded: genuine ties
    labels[rng.random((n, c)) < 0.15] = -1  # unknown
    labels[:, 2] = np.where(labels[:, 2] == -1, -1, 1)  # positives only: AUROC undefined
    labels[:, 3] = -1  # no known label at all
    labels, logits = torch.from_numpy(labels), torch.from_numpy(logits)
    weights = multiplicities(n, seed)
    kernel = recognition_statistics(labels, logits, weights)
    names = analysed_keys("classification")
    assert set(names) == {"auroc", "auprc", "f1@0.5", "accuracy@0.5", "max_f1", "accuracy@max_f1"}
    for row in range(weights.shape[0]):
        repeated = torch.repeat_interleave(torch.arange(n), weights[row].long())
        runtime = classification_scores(logits[repeated], labels[repeated])
        for name in (*names, "max_f1_logit"):
            # torchmetrics' AUROC/AUPRC/F1/accuracy run in float32; max-F1 shares the kernel: exact
            tolerance = 1e-6 if name in ("auroc", "auprc", "f1@0.5", "accuracy@0.5") else 0.0
            assert_same(kernel[name][row], runtime[name], f"{name}, weighting {row}", tolerance)


@pytest.mark.parametrize("seed", [0, 1])
def test_grounding_kernel_equals_the_run_time_metrics(seed):
    generator = torch.Generator().manual_seed(seed)
    n, c, side = 24, 3, 8
    saliency = torch.rand(n, c, side, side, generator=generator)
    saliency[0, 0] = 0.25  # constant: a miss
    saliency = normalise(torch.round(saliency * 20) / 20)  # tied maxima and flat Dice curves
    masks = torch.rand(n, c, side, side, generator=generator) < 0.3
    masks[1, 1] = False  # an empty region: not graded
    has_mask = torch.rand(n, c, generator=generator) < 0.8
    has_mask[:, 2] = False  # a class without any graded pair
    records = grounding_records(saliency, masks, has_mask)
    graded = records["graded"]
    image, cls = torch.nonzero(graded, as_tuple=True)
    pairs = GradedPairs(image=image, cls=cls, region=records["region"][graded], hit=records["hit"][graded],
                        predicted=records["predicted"][graded], inter=records["inter"][graded],
                        cnr=records["cnr"][graded])
    weights = multiplicities(n, seed)
    kernel = grounding_statistics(pairs, c, weights).per_class
    names = [name for name in analysed_keys("grounding") if not name.endswith("@calibrated")]
    assert set(names) == {"pointing_game", "dice@0.5", "iou@0.5", "dice@best", "dice@best_tau", "iou@best",
                          "iou@best_tau", "cnr"}
    for row in range(weights.shape[0]):
        repeated = torch.repeat_interleave(torch.arange(n), weights[row].long())
        metric = GroundingMetrics(c)
        metric.update(saliency[repeated], masks[repeated], has_mask[repeated], torch.arange(len(repeated)))
        runtime = metric.compute()
        for name in names:
            assert_same(kernel[name][row], runtime[name], f"{name}, weighting {row}", 1e-12)


def test_grounding_macro_means_are_those_of_the_per_class_values():
    """The run's macro means and the analysis's (``RunAnalysis.macro``: a NaN-skipping mean over
    classes) are one definition: the mean over the classes with a graded pair."""
    pairs = torch.tensor([3, 0, 2])
    hits = torch.tensor([1, 0, 2])
    curves = torch.rand(3, 101, dtype=torch.float64)
    cnr_pairs = torch.tensor([2, 0, 0])  # the last class has pairs but no defined CNR
    out = summarise_curves(pairs, hits, curves * pairs[:, None], curves * pairs[:, None],
                           torch.ones(3, 101, dtype=torch.int64), torch.ones(3, 101, dtype=torch.int64),
                           cnr_pairs, torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64))
    assert out["macro/cnr"].item() == 1.5
    for name in ("pointing_game", "dice@0.5", "dice@best", "iou@0.5", "cnr"):
        assert out[f"macro/{name}"].item() == pytest.approx(torch.nanmean(out[name]).item(), abs=1e-15)
