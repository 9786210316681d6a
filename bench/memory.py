"""Peak resident memory of a VinDr-sized run: the run's loop (metric states), its end (compute and
the results writer) and the analysis of its results folder, each above what the process held
before it.

    python bench/memory.py [--images 15000] [--classes 21] [--graded 0.05] [--size 224] [--batch 8]

The split is synthetic and in memory (no files): ``--images`` samples with VinDr-CXR's classes (its
first ``--classes``), each (image, class) pair a positive with a random box with probability
``--graded`` (about the share of VinDr's training pairs with a region), random images, RandomSaliency
as the model, one process (no DataLoader workers), float32 on the CPU. A thread reads the
process's resident set (``/proc/self/statm``) every 5 ms; each stage's peak is stated above the
resident set when the stage began, and the baseline is what torch, Lightning and XBench take
once imported. glibc's mmap threshold is fixed as XBench's commands fix it
(``xbench.cli.return_large_frees_to_the_system``), unless ``--adaptive-malloc``. The stated
metric states are their tensors' bytes at the end of the loop. Target
(issue 24): the whole run at most 1.5 GB above the baseline.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils.data import Dataset

from xbench.analyze import main as analyze
from xbench.cli import return_large_frees_to_the_system
from xbench.data.base import Sample, XBenchDataModule
from xbench.data.regions import Boxes
from xbench.findings import PAPER_CLASSES
from xbench.models.baselines import RandomSaliency
from xbench.reporting.writer import ResultsWriter

PAGE = os.sysconf("SC_PAGE_SIZE")


def resident() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class PeakResident:
    """The highest resident set seen since ``mark``, sampled by a background thread."""

    def __init__(self, interval: float = 0.005) -> None:
        self.interval, self.start, self.peak = interval, resident(), resident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, resident())
            time.sleep(self.interval)

    def mark(self) -> tuple[int, int]:
        """(start, peak) of the stage that ends now; the next stage starts here."""
        self.peak = max(self.peak, resident())
        stage = (self.start, self.peak)
        self.start = self.peak = resident()
        return stage

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class SyntheticImages(Dataset):
    """The batch contract's sample, from a random image and the sample's boxes drawn at frame size."""

    def __init__(self, samples: list[Sample], classes: list[str], size: int) -> None:
        self.samples, self.classes, self.size = samples, classes, size

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict:
        sample = self.samples[index]
        masks = torch.zeros(len(self.classes), self.size, self.size, dtype=torch.bool)
        for c, key in enumerate(self.classes):
            if key in sample.regions:
                masks[c] = torch.from_numpy(sample.regions[key].to_mask(self.size, self.size)[0])
        generator = torch.Generator().manual_seed(index)
        return {
            "image": torch.rand(1, self.size, self.size, generator=generator),
            "labels": torch.tensor([float(sample.labels[key]) for key in self.classes]),
            "masks": masks,
            "has_mask": masks.flatten(1).any(1),
            "index": index,
            "image_id": sample.image_id,
            "native_size": torch.tensor([self.size, self.size]),
            "clipped_shapes": 0,
            "lost_regions": torch.zeros(len(self.classes), dtype=torch.bool),
        }


class SyntheticVinDr(XBenchDataModule):
    name = "vindr_synthetic"
    spellings = "vindr"
    display_name = "VinDr-CXR (synthetic)"

    def __init__(self, images: int, graded: float, **kwargs) -> None:
        super().__init__(root=tempfile.gettempdir(), cache=False, num_workers=0, **kwargs)
        self.images, self.graded = images, graded

    def index(self) -> list[Sample]:
        rng = np.random.default_rng(0)
        size = self.image_size
        samples = []
        for i in range(self.images):
            positive = [key for key in self.classes if rng.random() < self.graded]
            regions = {}
            for key in positive:
                x, y = rng.integers(0, size * 3 // 4, size=2)
                w, h = rng.integers(4, size // 4, size=2)
                regions[key] = Boxes(((float(x), float(y), float(x + w), float(y + h)),))
            samples.append(Sample(f"{i:06d}", Path(f"{i:06d}.dicom"),
                                  {key: int(key in regions) for key in self.supported_classes()}, regions))
        return samples

    def setup(self, stage: str | None = None) -> None:
        self.test_set = SyntheticImages(self.samples, self.classes, self.image_size)


def state_bytes(metric: torch.nn.Module) -> int:
    total = 0
    for name in metric._defaults:
        value = getattr(metric, name)
        for tensor in value if isinstance(value, list) else [value]:
            total += tensor.numel() * tensor.element_size()
    return total


def mib(value: int) -> str:
    return f"{value / 2**20:8.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=15000)
    parser.add_argument("--classes", type=int, default=21)
    parser.add_argument("--graded", type=float, default=0.05)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--adaptive-malloc", action="store_true",
                        help="leave glibc's mmap threshold adaptive, as a script importing XBench does")
    args = parser.parse_args()
    if not args.adaptive_malloc:
        return_large_frees_to_the_system()  # as XBench's commands do
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    classes = list(PAPER_CLASSES["vindr"][: args.classes])
    with tempfile.TemporaryDirectory(prefix="xbench-memory-") as scratch_name:
        scratch = Path(scratch_name)
        data = SyntheticVinDr(args.images, args.graded, classes=classes, image_size=args.size, batch_size=args.batch)
        data.samples  # noqa: B018 -- the split's records, before the baseline
        model = RandomSaliency()
        trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, use_distributed_sampler=False,
                            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                            callbacks=[ResultsWriter(str(scratch / "results"))])

        class LoopEnd(L.Callback):
            def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
                if batch_idx == trainer.num_test_batches[0] - 1:
                    stages["loop"] = peaks.mark()
                    stages["states"] = sum(state_bytes(m) for m in (pl_module.grounding, pl_module.classification))
                    grounding = pl_module.grounding
                    stages["records"] = sum(len(rows) for rows in grounding.rec_class)
                    stages["record_bytes"] = sum(t.numel() * t.element_size()
                                                 for name in grounding.record_layout() for t in getattr(grounding, name))

        trainer.callbacks.append(LoopEnd())
        baseline = resident()
        peaks = PeakResident()
        stages: dict[str, object] = {}
        start = time.perf_counter()
        trainer.test(model, datamodule=data, verbose=False)
        stages["end"] = peaks.mark()
        run_seconds = time.perf_counter() - start
        (folder,) = (scratch / "results").iterdir()
        pairs_size = (folder / "pairs.csv.gz").stat().st_size
        start = time.perf_counter()
        analyze([str(folder), "--out", str(scratch / "analysis")])
        stages["analysis"] = peaks.mark()
        analysis_seconds = time.perf_counter() - start
        peaks.close()

    graded = sum(len(s.regions) for s in data.samples)
    print(f"\n{args.images} images x {len(classes)} classes at {args.size}², {graded} graded pairs "
          f"({100 * graded / (args.images * len(classes)):.1f} %); baseline resident {mib(baseline)}")
    print(f"metric states at the loop's end     {mib(stages['states'])}")
    every_pair = stages["record_bytes"] / max(stages["records"], 1) * args.images * len(classes)
    print(f"  of which grounding records         {mib(stages['record_bytes'])}   ({stages['records']} graded pairs; "
          f"a record for every pair would take {mib(every_pair).strip()})")
    for stage, what in (("loop", "the loop (metric states, batches)"), ("end", "the run's end (compute, writer)"),
                        ("analysis", "the analysis (bootstrap)")):
        begin, peak = stages[stage]
        print(f"peak above baseline, {what:<36} {mib(peak - baseline)}   (stage began at {mib(begin - baseline)})")
    print(f"run {run_seconds:.0f} s, analysis {analysis_seconds:.0f} s; pairs.csv.gz {mib(pairs_size).strip()}")


if __name__ == "__main__":
    main()
