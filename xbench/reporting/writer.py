"""The output of a test run, as a Lightning ``Callback``: the results folder, the saved overlays and
the W&B run.

A model computes its results (``XBenchModel.results`` and ``records``) and writes nothing; this
callback, like Lightning's own prediction writers, turns them into output. ``xbench.test`` adds it
to every run (``--results.folder``, ``--results.overlay_pairs``); a script adds it to its
``Trainer``::

    trainer = Trainer(callbacks=[ResultsWriter("results")], use_distributed_sampler=False)
    trainer.test(model, datamodule=datamodule)

Under DDP every process records the overlay pairs it evaluates; rank 0 writes the folder and logs.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

from xbench.reporting.overlays import OverlayRecords, choose_overlay_pairs, overlay_arrays
from xbench.reporting.summary import summary_markdown
from xbench.reporting.wandb import log_run
from xbench.results.write import check_writable, write_results


class ResultsWriter(Callback):
    """Write each test run's results folder and overlays, and log it to the trainer's W&B loggers.

    Args:
        folder: the folder that receives ``<model>__<dataset>__<time>/``; ``None`` writes no folder
            (the W&B run, if any, is still logged).
        overlay_pairs: positive pairs per class whose image, map and region are saved for overlays
            (the report's Fig. 2, the W&B panel); the same images for every model.
    """

    def __init__(self, folder: str | None = "results", overlay_pairs: int = 2) -> None:
        if overlay_pairs < 0:
            raise ValueError(f"--results.overlay_pairs must be 0 or more; got {overlay_pairs}")
        self.folder = folder
        self.overlay_pairs = overlay_pairs
        #: The last run's results folder (``None``: none written).
        self.path: Path | None = None
        self.overlays: OverlayRecords | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # before the run, not after it: a run whose results cannot be written is not started
        if self.folder is not None and trainer.is_global_zero:
            check_writable(Path(self.folder), "--results.folder")

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        datamodule = trainer.datamodule
        chosen = choose_overlay_pairs(datamodule.samples, pl_module.classes, self.overlay_pairs)
        gaze = getattr(pl_module, "gaze", None) is not None  # a gaze dataset: keep each pair's gaze density too
        self.overlays = OverlayRecords(chosen, datamodule.image_size, gaze).to(pl_module.device)
        self.path = None

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: dict, batch: dict,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        self.overlays.update(batch["image"], outputs["saliency"], batch["masks"], batch["index"], batch["image_id"],
                             batch.get("gaze"), batch.get("has_gaze"))

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After the model's ``on_test_epoch_end`` (Lightning calls callbacks' epoch-end hooks before
        the module's), so its results are computed; every process joins the overlays' gather."""
        records = self.overlays.compute()
        self.overlays = None
        if not trainer.is_global_zero or pl_module.results is None:
            return
        datamodule = trainer.datamodule
        overlays = overlay_arrays(records, pl_module.classes, datamodule.image_ids())
        if self.folder is not None:
            self.path = write_results(Path(self.folder), pl_module.results, pl_module.records, datamodule,
                                      summary_markdown(pl_module.results), overlays)
        log_run(trainer.loggers, pl_module.results, overlays, self.path)
