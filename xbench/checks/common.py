"""What the run-level checks (sanity, faithfulness, robustness) share: which images they look at, whether a
model can be checked, and running the model on inputs of the checks' own making."""

from __future__ import annotations

from collections.abc import Sequence

import warnings

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from xbench.data.base import Sample
from xbench.geometry.maps import whole_frame
from xbench.models.base import XBenchModel
from xbench.seeds import MAX_SEED


def check_images_and_seed(section: str, images: int, seed: int) -> None:
    """The options every check takes, ``--<section>.images`` and ``--<section>.seed``, bounded by what
    they can mean: a count of images (0: off) and a seed in Lightning's range."""
    if type(images) is not int or images < 0:
        raise ValueError(f"--{section}.images must be 0 (off) or a number of images; got {images!r}")
    if type(seed) is not int or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"--{section}.seed must be a whole number from 0 to {MAX_SEED} (the range of "
                         f"--seed_everything); got {seed!r}")


def choose_images(samples: Sequence[Sample], classes: Sequence[str], count: int) -> set[str]:
    """The ids of up to ``count`` images that carry a graded pair (positive for a class of the run,
    with its region), evenly spaced over them in sorted id order: the same images for every model
    on a dataset, spread over the split (a split sorted by finding or site is not cut at its start)."""
    eligible = sorted(s.image_id for s in samples if any(s.labels.get(key) == 1 and key in s.regions for key in classes))
    if count >= len(eligible):
        return set(eligible)
    return {eligible[int(i)] for i in np.linspace(0, len(eligible) - 1, count).round()}


def reads_only_its_input(model: XBenchModel) -> str | None:
    """Why the checks cannot perturb or re-run ``model`` on its input alone, or ``None`` if they can: a
    model that overrides ``infer`` reads more of the batch (the Oracle reads the answer; saved outputs
    and the noise baseline ignore the pixels)."""
    if type(model).infer is not XBenchModel.infer:
        return f"{type(model).__name__} makes its maps from more than its input (it overrides infer)"
    return None


def input_side(model: XBenchModel, datamodule) -> int:
    """The side of the model's square input: its preprocessing's, or the frame's for a model that
    reads the frame."""
    return datamodule.image_size if model.preprocess is None else model.preprocess.size


def input_of(model: XBenchModel, batch: dict) -> tuple[Tensor, Tensor]:
    """The model's input in ``batch`` and the window [B, 4] it covers in the frame."""
    if model.preprocess is None:
        image = batch["image"]
        return image, whole_frame(image.shape[0], tuple(image.shape[-2:]), image.device)
    return batch["model_input"], batch["window"]


@torch.no_grad()
def run_model(trainer: L.Trainer, model: XBenchModel, inputs: Tensor, chunk: int,
              maps: bool = True) -> tuple[Tensor, Tensor | None]:
    """The model's logits [N, C] and (with ``maps``) raw maps of ``inputs`` [N, ...], ``chunk`` inputs
    per forward, in the run's precision (``test_step`` runs in the precision plugin's context, and so
    do these). The maps are the run's (``XBenchModel.explain``, as ``test_step`` makes them); the
    scores alone need only the forward."""
    logits, grids = [], []
    with trainer.precision_plugin.forward_context():
        for start in range(0, inputs.shape[0], chunk):
            part = inputs[start:start + chunk]
            scores, found = model.explain(part) if maps else model(part)
            logits.append(scores.float())
            if maps:
                grids.append(found.float())
    return torch.cat(logits), torch.cat(grids) if maps else None


def chosen_rows(batch: dict, chosen: set[str]) -> list[int]:
    """The rows of ``batch`` whose image is among ``chosen``."""
    return [row for row, image_id in enumerate(batch["image_id"]) if image_id in chosen]


class PairCheck(Callback):
    """A check that scores the graded pairs of ``images`` chosen images batch by batch (faithfulness,
    robustness): the choice, the batch hook, and the section of a model it cannot re-run. A subclass
    names its ``section``, makes its ``new_records`` metric, scores a batch's rows (``score_rows``)
    and turns the records into its ``metrics.json`` section and per-pair records (``section_of``)."""

    section: str

    def __init__(self, images: int, seed: int) -> None:
        check_images_and_seed(self.section, images, seed)
        self.images, self.seed = images, seed
        self.chosen: set[str] = set()
        self.reason: str | None = None
        self.records = None

    def new_records(self):
        raise NotImplementedError

    def score_rows(self, trainer: L.Trainer, model: XBenchModel, batch: dict, rows: list[int]) -> None:
        raise NotImplementedError

    def section_of(self, records, classes: list[str]) -> tuple[dict, dict[str, Tensor]]:
        raise NotImplementedError

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: XBenchModel) -> None:
        if not self.images:
            return
        self.reason = reads_only_its_input(pl_module)
        self.chosen = set() if self.reason else choose_images(trainer.datamodule.samples, pl_module.classes,
                                                              self.images)
        self.records = self.new_records().to(pl_module.device)

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: XBenchModel, outputs: dict, batch: dict,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        rows = chosen_rows(batch, self.chosen) if self.images else []
        if rows:
            self.score_rows(trainer, pl_module, batch, rows)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: XBenchModel) -> None:
        if not self.images:
            return
        records, self.records = self.records, None
        if self.reason:
            warnings.warn(f"{self.section} not scored: {self.reason}", stacklevel=1)
            pl_module.checks[self.section] = ({"applicable": False, "reason": self.reason}, {})
            return
        pl_module.checks[self.section] = self.section_of(records.compute(), pl_module.classes)
