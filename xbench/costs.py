"""What a suite's pairs cost, as measured: the order in which ``xbench.suite`` starts jobs that run
at once (``--devices N``, ``--launcher slurm``), longest first, so that no long job starts last.

The rates are ``bench/throughput.py``'s harness images per second (full-size models with random
weights, 224 x 224, batch 8, float32; the 2-core CPU, 2026-11-26; docs/performance.md,
"Throughput"). Only their ratios order the jobs, so CPU figures serve on a GPU too until GPU
figures are measured. ``bench/suite.py`` prints a fresh measurement beside them.
"""

from __future__ import annotations

from collections.abc import Iterable

#: Harness images per second of each model, keyed by its config's name (lightning_configs/models/).
IMAGES_PER_SECOND: dict[str, float] = {
    "medklip": 12.0,
    "mavl": 7.16,
    "carzero": 4.79,
    "kad": 14.8,
    "clip": 4.83,
    "biomedclip": 5.09,
    "devide": 5.18,
}

#: Images of each dataset's benchmark split, keyed by its config's name (lightning_configs/data/);
#: docs/datasets/index.md, "Split sizes against the paper".
SPLIT_IMAGES: dict[str, int] = {
    "rsna": 5337,
    "siim": 2264,
    "covid_rural": 45,
    "chestx_det10": 542,
    "chexlocalize": 668,
    "chestxray14": 880,
    "vindr": 3000,
}


def seconds(pairs: Iterable[tuple[str, str]]) -> float | None:
    """Seconds of model time of the (model, dataset) pairs at the recorded rates. A dataset whose
    split size is not recorded counts nothing (in a suite every model has it); ``None`` when a
    model's rate is not recorded, or none of the datasets' sizes."""
    total, known = 0.0, False
    for model, dataset in pairs:
        if model not in IMAGES_PER_SECOND:
            return None
        if dataset in SPLIT_IMAGES:
            total, known = total + SPLIT_IMAGES[dataset] / IMAGES_PER_SECOND[model], True
    return total if known else None


def longest_first(estimates: list[float | None]) -> list[int]:
    """The order (indices) to start jobs in: those whose cost is not recorded first, in their given
    order (any of them may be the longest), then the others, longest first."""
    unknown = [i for i, estimate in enumerate(estimates) if estimate is None]
    known = sorted((i for i, estimate in enumerate(estimates) if estimate is not None), key=lambda i: -estimates[i])
    return unknown + known
