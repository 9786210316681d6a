"""Resampling images: multiplicity weights, folds, percentile intervals, paired differences.

A bootstrap replicate draws N images with replacement; instead of copying them, each replicate
is a row of per-image multiplicities (how often each image was drawn). Every statistic is then a
weighted sum over pairs, so all replicates are one matrix product. Row 0 of every weight matrix
is all ones -- the sample itself -- so the point estimate and the replicates come out of the
same computation: in every ``[R + 1, ...]`` tensor of this package, row 0 is the estimate and
rows 1..R the replicates.

Where a run's samples are reads (several radiologists' reads of one radiograph, `xbench.reads`),
the unit drawn is the radiograph: a replicate draws G radiographs with replacement and every read of
a drawn radiograph comes with it (``groups``), since the reads of one image are not independent.

Random streams are keyed by (seed, dataset, purpose), so a dataset's replicates do not depend on
which other datasets are analysed alongside it, and every model on a dataset gets the same ones
(paired resampling).
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from torch import Tensor

#: The defaults of every interval: bootstrap replicates, their level, and the seed of the random
#: streams (``xbench.analyze``'s and ``xbench.report``'s options start from them; a phrase run's
#: own intervals use them).
REPLICATES = 1000
CONFIDENCE = 0.95
SEED = 0


def random_stream(seed: int, dataset: str, purpose: str) -> np.random.Generator:
    """The generator for one (dataset, purpose): ``"test"``, ``"validation"`` or ``"folds"``."""
    return np.random.default_rng([seed, zlib.crc32(dataset.encode()), zlib.crc32(purpose.encode())])


#: Replicates drawn per block: the draws and their counts take 16 x block x N bytes beside the
#: result, instead of 16 x R x N for all replicates at once.
REPLICATES_PER_BLOCK = 64


def resample_weights(num_images: int, replicates: int, rng: np.random.Generator,
                     block: int = REPLICATES_PER_BLOCK, groups: Tensor | None = None) -> Tensor:
    """float64 [R + 1, N]: row 0 all ones, row r the multiplicities of replicate r (each sums to N).

    Drawn ``block`` replicates at a time from the one stream, in order: the same draws, and so the
    same weights, as drawing all R x N at once. ``groups``: int64 [N], the radiograph (0..G-1) of
    each sample where samples are reads: G radiographs are drawn, and each sample weighs as often as
    its radiograph was drawn (without it, each sample is its own radiograph).
    """
    if groups is not None:
        drawn = _multiplicities(int(groups.max()) + 1 if len(groups) else 0, replicates, rng, block)
        return drawn[:, groups.numpy()].clone()
    return _multiplicities(num_images, replicates, rng, block)


def _multiplicities(num_images: int, replicates: int, rng: np.random.Generator, block: int) -> Tensor:
    weights = np.empty((replicates + 1, num_images))
    weights[0] = 1
    for start in range(0, replicates, block):
        rows = min(block, replicates - start)
        draws = rng.integers(0, num_images, size=(rows, num_images))
        draws += np.arange(0, rows * num_images, num_images)[:, None]  # one bincount for the block's rows
        counts = np.bincount(draws.ravel(), minlength=rows * num_images)
        weights[1 + start : 1 + start + rows] = counts.reshape(rows, num_images)
    return torch.from_numpy(weights)


def assign_folds(num_images: int, folds: int, rng: np.random.Generator, groups: Tensor | None = None) -> Tensor:
    """int64 [N]: the fold of each image, a random partition into ``folds`` near-equal parts;
    ``groups`` (as `resample_weights`'): the radiographs are partitioned, each read in its radiograph's fold."""
    if groups is not None:
        return assign_folds(int(groups.max()) + 1, folds, rng)[groups]
    if not 2 <= folds <= num_images:
        raise ValueError(f"cross-fitting needs 2 <= folds <= images; got {folds} folds for {num_images} images: give "
                         "--folds at most the number of images (or --validation runs)")
    fold = np.empty(num_images, dtype=np.int64)
    fold[rng.permutation(num_images)] = np.arange(num_images) % folds
    return torch.from_numpy(fold)


def percentile_interval(values: Tensor, confidence: float) -> dict[str, Tensor]:
    """Estimate (row 0) and the percentile interval of rows 1..R, per remaining index.

    Replicates where the statistic is undefined (NaN: e.g. a class drawn without any pair) are
    left out; ``replicates`` counts the ones used.
    """
    alpha = 1 - confidence
    replicates = values[1:].double()
    q = torch.tensor([alpha / 2, 1 - alpha / 2], dtype=torch.float64)
    lower, upper = torch.nanquantile(replicates, q, dim=0)
    return {
        "estimate": values[0].double(),
        "lower": lower,
        "upper": upper,
        "replicates": (~replicates.isnan()).sum(0),
    }


def paired_difference(a: Tensor, b: Tensor, confidence: float) -> dict[str, Tensor]:
    """``a - b`` of two models resampled with the same weights: interval and P(a > b).

    ``a_better`` is the fraction of replicates where ``a > b`` among those where both are defined,
    a tie counted as ½: two models that never differ (identical, or both constant) read 0.5, not as
    if B were always ahead.
    """
    difference = a.double() - b.double()
    out = percentile_interval(difference, confidence)
    defined = ~difference[1:].isnan()
    ahead = (difference[1:] > 0).sum(0).double() + 0.5 * (difference[1:] == 0).sum(0).double()
    out["a_better"] = ahead / defined.sum(0)
    return out
