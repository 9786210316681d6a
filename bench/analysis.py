"""Time the whole analysis of 7 models x 5,000 images x 20 classes (target: under a minute on 2 cores).

    python bench/analysis.py [--workdir DIR] [--graded-share 0.18] [--replicates 1000] [--threads 2]

Writes seven synthetic results folders (the real pairs-table writer; the 101-point counts random
but consistent; a share of the (image, class) pairs graded and positive, by default ChestX-Det10's
966 of 542 x 10 = 18 %, the other labels negative or, 5 %, unknown; logits noisy labels) once into
``--workdir``, then times what
``python -m xbench.analyze`` does after Python has started: read the folders, resample
(1,000 replicates), compute every statistic, build the tables and write them. Prints each phase.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from xbench.analysis.grounding import grounding_statistics
from xbench.analysis.pipeline import analyze
from xbench.analysis.runs import GradedPairs
from xbench.analysis.settings import Settings
from xbench.analyze import write_analysis
from xbench.findings import PAPER_CLASSES
from xbench.metrics.grounding import NUM_THRESHOLDS
from xbench.results.folder import MANIFEST, METRICS, PAIRS, SCHEMA, manifest_of
from xbench.results.write import write_pairs

MODELS, IMAGES, CLASSES, IMAGE_SIZE = 7, 5000, 20, 224


def write_folders(workdir: Path, graded_share: float) -> list[Path]:
    """Seven results folders on one dataset's images (reused when already written)."""
    classes = sorted({key for keys in PAPER_CLASSES.values() for key in keys})[:CLASSES]
    image_ids = [f"img{i:05d}.png" for i in range(IMAGES)]
    area = IMAGE_SIZE**2
    rng = np.random.default_rng(0)
    graded = rng.random((IMAGES, CLASSES)) < graded_share
    image, cls = np.nonzero(graded)
    region = np.minimum(rng.lognormal(np.log(0.03 * area), 1.0, size=len(image)).astype(np.int64) + 1, area // 2)
    # As in ChestX-Det10: a finding is positive where it has a region; a few labels unknown.
    labels = np.where(graded, 1, np.where(rng.random((IMAGES, CLASSES)) < 0.05, -1, 0))
    folders = []
    for m in range(MODELS):
        folder = workdir / f"model{m}__bench__{graded_share:g}"
        folders.append(folder)
        if (folder / PAIRS).is_file():
            continue
        folder.mkdir(parents=True, exist_ok=True)
        inside = -np.sort(-rng.integers(0, region[:, None] + 1, size=(len(region), NUM_THRESHOLDS)), axis=1)
        outside = -np.sort(-rng.integers(0, (area - region)[:, None] + 1, size=(len(region), NUM_THRESHOLDS)), axis=1)
        inside[:, 0], outside[:, 0] = region, area - region
        payload = {"schema": SCHEMA, "model": f"model{m}", "dataset": "bench", "classes": classes,
                   "data": {"image_size": IMAGE_SIZE},
                   "grounding": estimates(image, cls, region, inside + outside, inside, classes),
                   "config": {"model": {"class_path": f"bench.Model{m}", "init_args": {}}}}
        write_pairs(
            folder / PAIRS,
            payload,
            {"index": torch.from_numpy(image), "class": torch.from_numpy(cls), "region": torch.from_numpy(region),
             "hit": torch.from_numpy(inside[:, -1] > 0), "predicted": torch.from_numpy(inside + outside),
             "inter": torch.from_numpy(inside), "cnr": torch.full((len(image),), float("nan"), dtype=torch.float64)},
            {"index": torch.arange(IMAGES), "labels": torch.from_numpy(labels).to(torch.int8),
             "logits": torch.from_numpy(labels + rng.normal(0, 1.5, size=labels.shape)).float()},
            image_ids,
        )
        (folder / METRICS).write_text(json.dumps(payload))
        (folder / MANIFEST).write_text(json.dumps(manifest_of(folder)))
    return folders


def estimates(image, cls, region, predicted, inter, classes) -> dict:
    """``metrics.json``'s grounding estimates, which the analysis checks its own against: taken from
    the analysis's kernel here (this script times it; the tests prove it)."""
    pairs = GradedPairs(*(torch.from_numpy(v) for v in (image, cls, region, inter[:, -1] > 0, predicted, inter)),
                        torch.full((len(image),), float("nan"), dtype=torch.float64))
    values = grounding_statistics(pairs, len(classes), torch.ones(1, IMAGES, dtype=torch.float64)).per_class
    keys = ("pointing_game", "dice@0.5", "iou@0.5")
    return {"macro": {key: float(torch.nanmean(values[key][0])) for key in keys},
            "per_class": {name: {key: float(values[key][0, c]) for key in keys} for c, name in enumerate(classes)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "xbench-bench-analysis")
    parser.add_argument("--graded-share", type=float, default=966 / 5420)
    parser.add_argument("--replicates", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    options = parser.parse_args()
    torch.set_num_threads(options.threads)
    folders = write_folders(options.workdir, options.graded_share)
    load_before = os.getloadavg()[0]

    start, start_cpu = time.perf_counter(), time.process_time()
    analysis = analyze(folders, settings=Settings(replicates=options.replicates))
    computed, computed_cpu = time.perf_counter(), time.process_time()
    write_analysis(analysis, options.workdir / "out")
    done, done_cpu = time.perf_counter(), time.process_time()

    pairs = sum(len(run.run.pairs.cls) for run in analysis.datasets[0].runs)
    print(f"{MODELS} models x {IMAGES} images x {CLASSES} classes, {pairs} graded pairs in all "
          f"({options.graded_share:.0%} of pairs), {options.replicates} replicates, {options.threads} threads, "
          f"load average before {load_before:.1f}")
    print("                              wall      CPU (all threads)")
    print(f"read + resample + statistics: {computed - start:6.1f} s  {computed_cpu - start_cpu:6.1f} s")
    print(f"tables + files:               {done - computed:6.1f} s  {done_cpu - computed_cpu:6.1f} s")
    print(f"total:                        {done - start:6.1f} s  {done_cpu - start_cpu:6.1f} s  (target: under 60 s wall)")
    print(f"load average after: {os.getloadavg()[0]:.1f} (other processes share these cores)")


if __name__ == "__main__":
    main()
