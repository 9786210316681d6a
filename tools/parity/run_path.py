"""XBench's side of a parity check: the path a run takes, from the image files to the model's outputs.

``run_xbench`` puts the files in a datamodule (`GoldenImages`: one sample per file, no labels
or regions) and runs ``trainer.test`` with the trainer settings of ``python -m xbench.test``, so the
images go through everything a run does -- the decoded-image cache (or the file), the DataLoader
workers that make the model's input and window, batching, the base's ``test_step`` -- and records,
per image, what the model's ``forward`` returned in that run (logits, raw maps) and the window its
batch carried. ``tests/test_parity.py`` calls it, and `compare` holds it against a golden file made
from any weights and radiographs:

    python tools/parity/run_path.py MODEL GOLDEN.npz --checkpoint-dir DIR --real-data ROOT

Runs in XBench's environment; it imports ``common.py``, which the authors' side imports too.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import lightning as L
import numpy as np

from common import (BATCH_SIZE, DATASET, FRAME, MODELS, SETTINGS, build_xbench, check_inputs, classes, differences,
                    golden_inputs, load_golden)
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


def compare(model_name: str, golden: Path, folder: Path, root: Path, scratch: Path
            ) -> dict[tuple[bool, int], dict[str, dict[str, float]]]:
    """XBench's run (`run_xbench`: datamodule, ``trainer.test``) on the golden file's inputs, under
    each of ``SETTINGS``, against the file: ``{(cache, workers): {input name: differences}}``. The
    crops are written into ``scratch``."""
    per_image, _, meta = load_golden(golden)
    inputs = golden_inputs(root, [record["file"] for record in meta["images"]], scratch)
    check_inputs(inputs, golden, meta)
    model = build_xbench(model_name, folder)
    result = {}
    for cache, workers in SETTINGS:
        found = run_xbench(model, {item.key: item.path for item in inputs}, cache=cache, num_workers=workers,
                           batch_size=BATCH_SIZE)
        result[cache, workers] = {
            item.name: differences(model_name, found[item.key], per_image[item.key], model.map_upsample)
            for item in inputs
        }
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="XBench's run against a golden file, per setting and image")
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("golden", type=Path)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--real-data", type=Path, required=True)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        results = compare(args.model, args.golden, args.checkpoint_dir, args.real_data, Path(scratch))
    for (cache, workers), per_image in results.items():
        for name, shares in per_image.items():
            verdict = "ok" if max(shares.values()) <= 1 else "DIFFERS"
            print(f"cache {'on ' if cache else 'off'} workers {workers} {name}: {verdict} "
                  + " ".join(f"{key} {value:.2g}" for key, value in shares.items()))


if __name__ == "__main__":
    main()
