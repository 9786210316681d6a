"""Memory at VinDr scale (15,000 images x 21 classes, 5 % of the pairs graded), three places:

    python bench/memory.py [--images 15000] [--classes 21] [--graded-share 0.05] [--replicates 1000]

- writing ``pairs.csv.gz`` (the chunked writer): growth of the process's peak RSS;
- the bootstrap's image weights: peak traced memory against the [R + 1, N] result itself;
- GroundingMetrics' record states after every update: bytes held, against keeping all pairs.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch

from xbench.analysis.bootstrap import resample_weights
from xbench.metrics.grounding import NUM_THRESHOLDS, GroundingMetrics
from xbench.reporting.results import write_pairs


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pairs_file(images: int, classes: int, share: float) -> None:
    rng = np.random.default_rng(0)
    image, cls = np.nonzero(rng.random((images, classes)) < share)
    region = rng.integers(1, 2000, size=len(image))
    inter = np.minimum(-np.sort(-rng.integers(0, 2000, size=(len(image), NUM_THRESHOLDS))), region[:, None])
    inter[:, 0] = region
    grounding = {"index": torch.as_tensor(image), "class": torch.as_tensor(cls), "region": torch.as_tensor(region),
                 "hit": torch.as_tensor(inter[:, -1] > 0), "predicted": torch.as_tensor(inter + 50000),
                 "inter": torch.as_tensor(inter)}
    labels = {"index": torch.arange(images), "logits": torch.randn(images, classes),
              "labels": torch.randint(-1, 2, (images, classes))}
    path = Path(tempfile.mkdtemp()) / "pairs.csv.gz"
    before, start = peak_rss_mib(), time.perf_counter()
    write_pairs(path, {"classes": [f"class{c}" for c in range(classes)]}, grounding, labels,
                [f"img{i:05d}" for i in range(images)])
    print(f"pairs.csv.gz: {len(image)} graded of {images * classes} pairs, peak RSS +{peak_rss_mib() - before:.0f} "
          f"MiB while writing, {time.perf_counter() - start:.1f} s, file {path.stat().st_size / 2**20:.1f} MiB")


def bootstrap_weights(images: int, replicates: int) -> None:
    tracemalloc.start()
    weights = resample_weights(images, replicates, np.random.default_rng(0))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"bootstrap weights: peak {peak / 2**20:.0f} MiB for a {weights.numpy().nbytes / 2**20:.0f} MiB result")


def record_states(images: int, classes: int, share: float, side: int = 4, batch: int = 250) -> None:
    generator = torch.Generator().manual_seed(0)
    metric = GroundingMetrics(classes, validate_args=False)
    for start in range(0, images, batch):
        batch = min(batch, images - start)
        s = torch.rand(batch, classes, side, side, generator=generator)
        s = (s - s.amin((2, 3), keepdim=True)) / (s.amax((2, 3), keepdim=True) - s.amin((2, 3), keepdim=True))
        masks = torch.rand(batch, classes, side, side, generator=generator) < 0.5
        masks[..., 0, 0] = True
        has_mask = torch.rand(batch, classes, generator=generator) < share
        metric.update(s, masks, has_mask, torch.arange(start, start + batch))
    held = sum(t.numel() * t.element_size() for name in metric.record_layout() for t in getattr(metric, name))
    rows = sum(len(t) for t in metric.rec_class)
    every_pair = held / max(rows, 1) * images * classes
    print(f"record states: {rows} graded pairs, {held / 2**20:.1f} MiB (all {images * classes} pairs would take "
          f"{every_pair / 2**20:.1f} MiB)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=15000)
    parser.add_argument("--classes", type=int, default=21)
    parser.add_argument("--graded-share", type=float, default=0.05)
    parser.add_argument("--replicates", type=int, default=1000)
    options = parser.parse_args()
    pairs_file(options.images, options.classes, options.graded_share)  # first: peak RSS only grows
    bootstrap_weights(options.images, options.replicates)
    record_states(options.images, options.classes, options.graded_share)


if __name__ == "__main__":
    main()
