"""XBench's side of a parity check: the path a run takes, from the image files to the model's outputs.

``run_xbench`` puts the files in a datamodule (`GoldenImages`: one sample per file, no labels
or regions) and runs ``trainer.test`` with the trainer settings of ``python -m xbench.test``, so the
images go through everything a run does -- the decoded-image cache (or the file), the DataLoader
workers that make the model's input and window, batching, the base's ``test_step`` -- and records,
per image, what the model's ``forward`` returned in that run (logits, raw maps) and the window its
batch carried. ``tools/parity/common.py compare`` and ``tests/test_parity.py`` both call it.

Runs in XBench's environment.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import numpy as np

from common import DATASET, FRAME, classes
from xbench.data.base import Sample, XBenchDataModule
from xbench.models.base import XBenchModel
from xbench.test import TRAINER_DEFAULTS, TRAINER_INVARIANTS


class GoldenImages(XBenchDataModule):
    """Image files as a dataset, each sample named by its key: CheXlocalize's classes and name (the
    models' prompts depend on the dataset), every label unknown, no regions."""

    name = DATASET
    spellings = DATASET

    def __init__(self, files: dict[str, Path], **kwargs) -> None:
        super().__init__(root=str(Path(next(iter(files.values()))).parent), classes=classes(),
                         image_size=FRAME, **kwargs)
        self.files = dict(files)

    def index(self) -> list[Sample]:
        return [Sample(key, Path(path), {c: -1 for c in self.classes}) for key, path in self.files.items()]


class ForwardRecorder(L.Callback):
    """Per image id: the logits and raw maps the model's ``forward`` returned for its batch in the
    run, and the ``window`` the batch carried (one ``forward`` per batch, checked)."""

    def __init__(self) -> None:
        self.outputs: dict[str, dict[str, np.ndarray]] = {}
        self.calls: list = []

    def on_test_start(self, trainer, pl_module) -> None:
        self.handle = pl_module.register_forward_hook(lambda module, args, output: self.calls.append(output))

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self.calls.clear()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if len(self.calls) != 1:
            raise RuntimeError(f"{type(pl_module).__name__} ran forward {len(self.calls)} times on batch {batch_idx}")
        (logits, maps), window = self.calls[0], batch["window"]
        for row, image_id in enumerate(batch["image_id"]):
            self.outputs[image_id] = {"logits": logits[row].cpu().numpy(), "maps": maps[row].cpu().numpy(),
                                      "window": window[row].cpu().numpy()}

    def on_test_end(self, trainer, pl_module) -> None:
        self.handle.remove()


def run_xbench(model: XBenchModel, files: dict[str, Path], *, cache: bool, num_workers: int, batch_size: int
               ) -> dict[str, dict[str, np.ndarray]]:
    """``trainer.test`` of ``model`` on ``files`` (key -> image file) through `GoldenImages`
    with the decoded-image cache on or off (under ``$XBENCH_CACHE``), ``num_workers`` DataLoader
    workers and ``batch_size`` images a batch, on the CPU in float32: per key, the model's logits
    [C], raw maps [C, h, w] and window [4] in that run."""
    datamodule = GoldenImages(files, cache=cache, num_workers=num_workers, batch_size=batch_size)
    recorder = ForwardRecorder()
    trainer = L.Trainer(**{**TRAINER_DEFAULTS, **TRAINER_INVARIANTS, "accelerator": "cpu", "logger": False,
                           "enable_progress_bar": False, "callbacks": [recorder]})
    trainer.test(model, datamodule=datamodule, verbose=False)
    missing = set(files) - set(recorder.outputs)
    if missing:
        raise RuntimeError(f"the run produced no outputs for {sorted(missing)}")
    return recorder.outputs
