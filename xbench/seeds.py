"""Per-sample randomness: a sample's random draws depend only on the run's seed and the sample's
index, never on batch size, order or the number of processes. An augmentation pipeline
(``xbench.data.augment``) and the noise baseline (``RandomSaliency``) seed from here."""

from __future__ import annotations

#: The largest seed an option takes: 2**32 - 1, the range of Lightning's ``--seed_everything``.
MAX_SEED = 2**32 - 1


def sample_seed(seed: int, index: int) -> int:
    """The random seed of one sample: depends only on the run's seed and the sample's index."""
    return seed * 1_000_003 + index
