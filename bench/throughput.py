"""Images per second of each model's bare forward against a whole ``trainer.test``, and of decoding
against the decoded-image cache (the projected wall time of a suite: ``bench/suite.py``).

    python bench/throughput.py [--device cuda] [--models clip medklip ...] [--images 24] [--batch 8]
                               [--workers 2] [--threads N] [--precision bf16-mixed] [--native 1024]

Data: the phantom split (``xbench.data.phantom``: PNGs of ``--native`` pixels, ChestX-Det10's
layout and its 10 classes) of ``--images`` images, through the real ChestX-Det10 loader at 224.

Loading, once: images/s of a DataLoader over the decoding dataset (read the PNG, draw the boxes,
resize image and masks) against one over the cache (``xbench.data.cache``), and the time to build
the cache.

Per model (random weights in the authors' file layout at full size, ``xbench.models.random_weights``,
written to a temporary folder and loaded through the model's own checkpoint path):

- **bare forward**: ``model.infer(batch)`` (for a model: ``forward(image)``) on batches already on
  the device, in inference mode, as many batches as the harness times; images/s.
- **harness**: ``trainer.test`` on the cached split (logger off, results folder written): images/s
  from the end of the first batch to the end of the last (loading, transfer, forward, upsampling,
  normalisation, metrics, overlays), and the fixed cost of a run (setup -- checkpoint, text side --
  the first batch, and the epoch end -- metrics, results folder).
- **overhead** = bare rate / harness rate - 1 (target on a GPU: at most 10 %).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from xbench.data.phantom import Phantom, generate_phantom
from xbench.findings import PAPER_CLASSES
from xbench.models.base import XBenchModel
from xbench.models.baselines import CentrePrior, RandomSaliency
from xbench.models.biomedclip import BiomedCLIP
from xbench.models.biovil import BioViL, BioViLT
from xbench.models.carzero import CARZero
from xbench.models.chexzero import CheXzero
from xbench.models.clip import CLIP
from xbench.models.devide import DeViDe
from xbench.models.gloria import GLoRIA
from xbench.models.kad import KAD
from xbench.models.mavl import MAVL
from xbench.models.medklip import MedKLIP
from xbench.models.radzero import RadZero
from xbench.models.random_weights import (
    write_bert,
    write_biomedclip,
    write_biovil,
    write_biovil_t,
    write_carzero,
    write_chexzero,
    write_clip,
    write_devide,
    write_gloria,
    write_kad,
    write_mavl,
    write_medklip,
    write_radzero,
)
from xbench.reporting.writer import ResultsWriter
from timing import synchronize

def medklip(folder: Path, classes: list[str]) -> XBenchModel:
    write_bert(folder / "bert")
    write_medklip(folder / "medklip", folder / "bert")
    return MedKLIP(checkpoint_dir=str(folder / "medklip"))


def mavl(folder: Path, classes: list[str]) -> XBenchModel:
    write_bert(folder / "bert")
    write_mavl(folder / "mavl", folder / "bert")
    return MAVL(checkpoint_dir=str(folder / "mavl"))


#: Model name -> (weights folder, the dataset's classes) -> the model, its files written there.
BUILDERS: dict[str, Callable[[Path, list[str]], XBenchModel]] = {
    "clip": lambda folder, classes: CLIP(checkpoint_dir=str(write_clip(folder))),
    "biomedclip": lambda folder, classes: BiomedCLIP(checkpoint_dir=str(write_biomedclip(folder))),
    "medklip": medklip,
    "mavl": mavl,
    "kad": lambda folder, classes: KAD(checkpoint_dir=str(write_kad(folder))),
    "devide": lambda folder, classes: DeViDe(checkpoint_dir=str(write_devide(folder))),
    "carzero": lambda folder, classes: CARZero(checkpoint_dir=str(write_carzero(folder, classes))),
    "chexzero": lambda folder, classes: CheXzero(checkpoint_dir=str(write_chexzero(folder))),
    "biovil": lambda folder, classes: BioViL(checkpoint_dir=str(write_biovil(folder))),
    "biovil_t": lambda folder, classes: BioViLT(checkpoint_dir=str(write_biovil_t(folder))),
    "gloria": lambda folder, classes: GLoRIA(checkpoint_dir=str(write_gloria(folder))),
    "radzero": lambda folder, classes: RadZero(checkpoint_dir=str(write_radzero(folder))),
    "random": lambda folder, classes: RandomSaliency(),
    "centre_prior": lambda folder, classes: CentrePrior(),
}
PAPER_MODELS = ("clip", "biomedclip", "medklip", "mavl", "kad", "devide", "carzero")
#: Every model with a network: the paper's and the newer ones.
NETWORK_MODELS = (*PAPER_MODELS, "chexzero", "biovil", "biovil_t", "gloria", "radzero")


class LoopClock(L.Callback):
    """When the run starts its loop, when its first batch ends and when its last batch ends. The
    device is synchronised only at those points, so the loop runs as asynchronously as in a real run."""

    def __init__(self) -> None:
        self.start = self.first = self.last = 0.0
        self.first_images = 0

    def on_test_start(self, trainer, pl_module) -> None:
        synchronize(pl_module.device)
        self.start = time.perf_counter()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 or batch_idx == trainer.num_test_batches[0] - 1:
            synchronize(pl_module.device)
            now = time.perf_counter()
            if batch_idx == 0:
                self.first, self.first_images = now, len(batch["index"])
            self.last = now


def loader_rate(dataset, batch: int, workers: int) -> float:
    """Images/s of one pass of a DataLoader over ``dataset``."""
    loader = DataLoader(dataset, batch_size=batch, num_workers=workers)
    start = time.perf_counter()
    for _ in loader:
        pass
    return len(dataset) / (time.perf_counter() - start)


@dataclass
class Measured:
    name: str
    bare: float  # images/s
    harness: float  # images/s
    fixed: float  # seconds per run: setup + first batch + epoch end

    @property
    def overhead(self) -> float:
        return self.bare / self.harness - 1

    @property
    def harness_ms(self) -> float:
        """What the harness adds per image, in milliseconds."""
        return 1e3 / self.harness - 1e3 / self.bare


def measure(name: str, model: XBenchModel, datamodule, args, device: torch.device, results: Path) -> Measured:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DeViDe's provisional layout
        clock = LoopClock()
        trainer = L.Trainer(
            accelerator=device.type, devices=[device.index or 0] if device.type == "cuda" else 1,
            precision=args.precision, use_distributed_sampler=False, logger=False,
            callbacks=[clock, ResultsWriter(str(results))],
            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        )
        begin = time.perf_counter()
        trainer.test(model, datamodule=datamodule, verbose=False)
        end = time.perf_counter()
        harness = (len(datamodule.test_set) - clock.first_images) / (clock.last - clock.first)
        fixed = (clock.first - begin) + (end - clock.last)

        # The bare forward (``infer``: what test_step calls), on the model as the harness left it (built,
        # channels-last where it uses that), on as many batches as the harness timed, already on the device.
        model.to(device).eval()
        batches = [{key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in b.items()}
                   for b in datamodule.test_dataloader()]
        with torch.inference_mode(), trainer.precision_plugin.forward_context():
            model.infer(batches[0])
            synchronize(device)
            start = time.perf_counter()
            for batch in batches[1:]:
                model.infer(batch)
            synchronize(device)
        bare = sum(len(batch["index"]) for batch in batches[1:]) / (time.perf_counter() - start)
    return Measured(name, bare, harness, fixed)


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", default=list(BUILDERS), choices=list(BUILDERS))
    parser.add_argument("--images", type=int, default=24, help="images in the split")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads for torch")
    parser.add_argument("--precision", default="32-true", help="the trainer's precision, e.g. bf16-mixed")
    parser.add_argument("--native", type=int, default=1024, help="side of the phantom's PNGs")
    args = parser.parse_args()
    if args.images < 2 * args.batch:
        parser.error("--images must be at least twice --batch: the rates are timed from the first batch's end")
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # "GPU available: ..." per run
    device = torch.device(args.device)
    scratch = Path(tempfile.mkdtemp(prefix="xbench-throughput-"))
    os.environ["XBENCH_CACHE"] = str(scratch / "cache")  # phantom, decoded images, text embeddings
    try:
        classes = list(PAPER_CLASSES["chestx_det10"])
        datamodule = Phantom(num_images=args.images, native_size=args.native, classes=classes,
                             batch_size=args.batch, num_workers=args.workers)
        generate_phantom(datamodule.root, args.images, args.native, datamodule.seed)
        decode = loader_rate(datamodule.decoding_dataset(), args.batch, args.workers)
        start = time.perf_counter()
        datamodule.prepare_data()  # builds the cache
        build = time.perf_counter() - start
        datamodule.setup("test")
        cached = loader_rate(datamodule.test_set, args.batch, args.workers)

        name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{os.cpu_count()} cores"
        print(f"{date.today()}  {platform.node()}, device {device} ({name}), {torch.get_num_threads()} torch threads, "
              f"{args.workers} DataLoader workers, batch {args.batch}, {len(classes)} classes, "
              f"precision {args.precision}, {args.images} phantom images of {args.native}x{args.native} -> 224")
        print(f"loading: decode {decode:.1f} images/s, cached {cached:.1f} images/s ({cached / decode:.0f}x); "
              f"cache build {build:.1f} s")
        rows = []
        for model_name in args.models:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = BUILDERS[model_name](scratch / "weights", classes)
            rows.append(measure(model_name, model, datamodule, args, device, scratch / "results"))
            row = rows[-1]
            overhead = f"{100 * row.overhead:+6.1f} %" if row.name in NETWORK_MODELS else "(no network)"
            print(f"  {row.name:<13} bare {row.bare:9.2f} images/s   harness {row.harness:8.2f} images/s   "
                  f"{row.harness_ms:+6.1f} ms per image   overhead {overhead}   fixed {row.fixed:5.1f} s per run",
                  flush=True)
            shutil.rmtree(scratch / "weights", ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
