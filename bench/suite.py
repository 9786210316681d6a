"""The projected wall time of the paper's suite (``lightning_configs/suites/paper.yaml``) on this
machine, from measured parts, in both suite modes.

    python bench/suite.py [--device cuda] [--models clip medklip ...] [--images 24] [--batch 8]
                          [--loader-workers 2] [--workers 1 8] [--precision bf16-mixed] [--quick]

Measured here, each on its own:

- **process start**: a fresh ``python -c "import xbench.test"`` (interpreter, torch, Lightning's CLI),
  paid once per worker process: 7 times per suite per model, 49 times per pair.
- per model (full size, random weights in the authors' file layout; ``bench/throughput.py``'s
  builders): two ``trainer.test`` runs of the same model object on the cached phantom split
  (ChestX-Det10's 10 classes at 224). The first run's fixed cost less the second's is the **load**
  that per-model mode pays once per process (checkpoint, networks, and whatever a process's first
  run warms up); the second run's fixed cost less its first batch (counted with the images) is the
  **run** cost every pair pays (text side, metrics and results folder); the harness's images/s
  over the second run gives the **per image** cost.
- **per pair**: the grounding pipeline's cost for one more (image, class) pair (upsampling,
  normalisation, the 101-threshold update), from the same pipeline at 1 and 21 classes; a dataset
  of C classes costs (C - 10) of these more per image than the 10-class phantom.
- per dataset reader: ``read_image`` + ``resize_image`` of one file in its format and native size
  (radiograph-like pixels, ``bench/loading.py``; one thread, process CPU time, best of 3) -- what building the decoded-image cache costs per
  image, once per dataset for all models (DataLoader workers in parallel).

The projection: decoding once, plus for every model and dataset the images at the measured rate
(plus the per-pair cost for the dataset's classes), plus the fixed part: per model mode one process
start and one load per model and one run cost per pair; per pair mode a start, a load and a run
cost for every pair. On N devices (``--workers N``, as ``xbench.suite --devices N`` or a cluster with
N free GPUs runs it) the jobs -- a model's pairs per model, a pair per pair -- start longest first,
each on the first device free, and the wall time is when the last ends, plus the decoding (as if
done before, an upper bound). ``--quick`` measures the two baselines (no network) on a few small images and
the cheap formats only: a check that the script runs, not a measurement.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from loading import write_like  # noqa: E402
from throughput import BUILDERS, PAPER_MODELS, duration, measure  # noqa: E402
from timing import best_seconds  # noqa: E402

from xbench.costs import IMAGES_PER_SECOND, SPLIT_IMAGES  # noqa: E402
from xbench.data.io import read_image  # noqa: E402
from xbench.data.phantom import Phantom, generate_phantom  # noqa: E402
from xbench.data.transforms import resize_image  # noqa: E402
from xbench.findings import PAPER_CLASSES  # noqa: E402
from xbench.metrics import GroundingMetrics  # noqa: E402
from xbench.geometry.maps import normalise, place_in_frame, whole_frame  # noqa: E402

#: A file like each dataset's own to time its reader: format, height x width, bits (its split's size:
#: xbench.costs.SPLIT_IMAGES).
DATASETS: dict[str, tuple[str, tuple[int, int], int]] = {
    "rsna": ("dicom", (1024, 1024), 8),
    "siim": ("dicom-jpeg", (1024, 1024), 8),
    "covid_rural": ("jpeg", (2000, 2000), 8),
    "chestx_det10": ("png", (1024, 1024), 8),
    "chexlocalize": ("jpeg", (2828, 2320), 8),
    "chestxray14": ("png", (1024, 1024), 8),
    "vindr": ("dicom-j2k", (2800, 2400), 16),
}
PHANTOM_CLASSES = len(PAPER_CLASSES["chestx_det10"])
FRAME = 224


@dataclass
class ModelCost:
    name: str
    load: float  # s, once per process
    run: float  # s, once per (model, dataset)
    per_image: float  # s, at the phantom's 10 classes


@dataclass
class Projection:
    decoding: float
    fixed: float
    images: float

    @property
    def total(self) -> float:
        return self.decoding + self.fixed + self.images


def project(models: list[ModelCost], start: float, per_pair: float, decode: dict[str, float], workers: int,
            mode: str, datasets: dict[str, tuple[int, int]]) -> Projection:
    """``datasets``: name -> (images, classes); ``decode``: seconds per image of its reader."""
    decoding = sum(images * decode[name] for name, (images, _) in datasets.items()) / max(workers, 1)
    runs = len(datasets)
    if mode == "per-model":
        fixed = sum(start + model.load + runs * model.run for model in models)
    else:
        fixed = sum(runs * (start + model.load + model.run) for model in models)
    images = sum(
        n * (model.per_image + (classes - PHANTOM_CLASSES) * per_pair)
        for model in models for n, classes in datasets.values()
    )
    return Projection(decoding, fixed, images)


def job_seconds(models: list[ModelCost], start: float, per_pair: float, mode: str,
                datasets: dict[str, tuple[int, int]]) -> list[float]:
    """Each job's seconds: per model, a process per model (its start, its load, its datasets); per
    pair, a process per pair. Their sum is :func:`project`'s fixed part and images."""
    jobs = []
    for model in models:
        pairs = [model.run + n * (model.per_image + (classes - PHANTOM_CLASSES) * per_pair) for n, classes in datasets.values()]
        jobs += [start + model.load + sum(pairs)] if mode == "per-model" else [start + model.load + pair for pair in pairs]
    return jobs


def wall_seconds(jobs: list[float], workers: int) -> float:
    """When the last job ends on ``workers`` devices, the jobs started longest first, each on the
    first device free (as ``xbench.suite --devices N`` starts them)."""
    ends = [0.0] * workers
    for seconds in sorted(jobs, reverse=True):
        first_free = ends.index(min(ends))
        ends[first_free] += seconds
    return max(ends)


def process_start(repeats: int) -> float:
    """Wall seconds of a fresh interpreter importing ``xbench.test``, best of ``repeats``."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import xbench.test"], check=True)
        best = min(best, time.perf_counter() - start)
    return best


def pair_cost(device: torch.device, batch: int, repeats: int) -> float:
    """Seconds for one more (image, class) pair of the grounding pipeline: upsample 14x14 maps onto
    the frame, min-max normalise, update the 101-threshold metric."""
    def pipeline(classes: int):
        maps = torch.rand(batch, classes, 14, 14, device=device)
        masks = torch.rand(batch, classes, FRAME, FRAME, device=device) > 0.9
        has_mask = torch.ones(batch, classes, dtype=torch.bool, device=device)
        metric = GroundingMetrics(classes, validate_args=False).to(device)
        window = whole_frame(batch, (FRAME, FRAME), device)

        def step() -> None:
            metric.update(normalise(place_in_frame(maps, window, (FRAME, FRAME), "bilinear")), masks, has_mask)
        return step

    one, many = (best_seconds(pipeline(c), device, repeats) for c in (1, 21))
    print(f"grounding pipeline, batch {batch}: {1e3 * one:.1f} ms at 1 class, {1e3 * many:.1f} ms at 21")
    return max(many - one, 0.0) / (20 * batch)


def decode_cost(kind: str, shape: tuple[int, int], bits: int, folder: Path, repeats: int) -> float:
    """Process CPU seconds to read one file of this kind and resize it to the frame, best of ``repeats``."""
    path = write_like(folder / kind, kind, shape, bits, np.random.default_rng(0))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a DataLoader worker
    try:
        best = float("inf")
        for _ in range(repeats):
            start = time.process_time()
            resize_image(read_image(path), FRAME)
            best = min(best, time.process_time() - start)
    finally:
        torch.set_num_threads(threads)
    return best


def model_cost(name: str, datamodule, args, device: torch.device, scratch: Path) -> ModelCost:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = BUILDERS[name](scratch / "weights", list(datamodule.classes))
    first = measure(name, model, datamodule, args, device, scratch / "results")
    second = measure(name, model, datamodule, args, device, scratch / "results")
    # a run's fixed cost as measured includes its first batch, whose images the projection counts at the rate
    run = max(second.fixed - args.batch / second.harness, 0.0)
    return ModelCost(name, max(first.fixed - second.fixed, 0.0), run, 1 / second.harness)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=list(PAPER_MODELS), choices=list(BUILDERS))
    parser.add_argument("--images", type=int, default=24, help="phantom images per harness run")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--loader-workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 8], metavar="N",
                        help="devices to project the suite's wall time on, jobs run at once, longest first")
    parser.add_argument("--precision", default="32-true", help="the trainer's precision, e.g. bf16-mixed")
    parser.add_argument("--quick", action="store_true", help="baselines, 8 small images, cheap formats: a smoke run")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.images, args.batch, args.loader_workers = ["random", "centre_prior"], 8, 4, 0
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    device = torch.device(args.device)
    native = 256 if args.quick else 1024
    repeats = 1 if args.quick else 3
    with tempfile.TemporaryDirectory(prefix="xbench-suite-bench-") as scratch_name:
        scratch = Path(scratch_name)
        os.environ["XBENCH_CACHE"] = str(scratch / "cache")
        start = process_start(repeats)
        print(f"process start (import xbench.test): {start:.2f} s")
        decode = {}
        for dataset, (kind, shape, bits) in DATASETS.items():
            if args.quick:
                shape = (64, 64)
            decode[dataset] = decode_cost(kind, shape, bits, scratch, repeats)
            print(f"reader {dataset:<13} {kind:<11} {shape[0]}x{shape[1]} {bits}-bit: {1e3 * decode[dataset]:7.1f} ms per image")
        per_pair = pair_cost(device, args.batch, repeats)
        print(f"one more (image, class) pair: {1e3 * per_pair:.2f} ms")

        datamodule = Phantom(num_images=args.images, native_size=native, classes=list(PAPER_CLASSES["chestx_det10"]),
                             batch_size=args.batch, num_workers=args.loader_workers)
        generate_phantom(datamodule.root, args.images, native, datamodule.seed)
        datamodule.prepare_data()
        datamodule.setup("test")
        models = []
        for name in args.models:
            models.append(model_cost(name, datamodule, args, device, scratch))
            cost = models[-1]
            recorded = f"{1e3 / IMAGES_PER_SECOND[name]:.1f} ms" if name in IMAGES_PER_SECOND else "none"
            print(f"model {name:<13} load {cost.load:6.2f} s   run {cost.run:6.2f} s per dataset   "
                  f"{1e3 * cost.per_image:8.1f} ms per image (xbench/costs.py: {recorded})", flush=True)

        datasets = {name: (SPLIT_IMAGES[name], len(PAPER_CLASSES[name])) for name in DATASETS}
        print(f"\nprojected {len(models)} models x {len(datasets)} datasets "
              f"({sum(n for n, _ in datasets.values())} images), device {device}:")
        for mode in ("per-model", "per-pair"):
            p = project(models, start, per_pair, decode, args.loader_workers, mode, datasets)
            print(f"  {mode:<9}  total {duration(p.total):>7}   fixed {duration(p.fixed):>7} "
                  f"({100 * p.fixed / p.total:4.1f} %)   images {duration(p.images):>7}   decoding once {duration(p.decoding)}")
            jobs = job_seconds(models, start, per_pair, mode, datasets)
            for workers in args.workers:
                print(f"    on {workers} device(s): {duration(p.decoding + wall_seconds(jobs, workers)):>7} "
                      f"({len(jobs)} jobs, the longest {duration(max(jobs))})")


if __name__ == "__main__":
    main()
