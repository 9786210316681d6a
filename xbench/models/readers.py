"""``HumanReader``: a radiologist's marks scored like a model's maps, against the same reference.

The datamodule says who is read and against what (its ``reader_set``, `xbench.data.readers`); this
model turns each mark into a frame map by that module's one rule and hands it to the base's test step,
so the run writes an ordinary results folder under the model name ``human:<reader set>``. Its
``metrics.json`` is marked ``human``: the report shows it beside the models, never ranked, and the
analysis measures each model's gap to it on the same images.

Where the reader set names findings for cheXlocalize's protocol (``native_protocol``: their human
benchmark), each of those pairs with a region is also scored at the image's native size as their
``eval.py`` scores the human benchmark (`xbench.metrics.human_benchmark.reader_row`), in the rows
a saved-map model's ``native_protocol`` writes (`xbench.metrics.native.ChexlocalizeRecords`): the
results folder's ``chexlocalize_pairs.csv.gz``, and per finding ``reader_set.chexlocalize_protocol``.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from xbench.metrics.human_benchmark import reader_row
from xbench.metrics.native import ChexlocalizeRecords, chexlocalize_means, chexlocalize_records
from xbench.models.base import XBenchModel


class HumanReader(XBenchModel):
    """The reader under test of a dataset with several readers (its ``reader_set``)."""

    name = "human"
    human = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.readers = None
        self.chexlocalize_records: ChexlocalizeRecords | None = None

    def build(self, classes: list[str]) -> None:
        datamodule = self.trainer.datamodule
        readers = datamodule.reader_set()
        if readers is None:
            raise ValueError(
                f"--model human scores a second reader, and {type(datamodule).__name__} as configured has none: "
                "choose a dataset option that names one (docs/human-agreement.md lists each dataset's)."
            )
        if getattr(datamodule, "augment", None) is not None:
            raise ValueError("--model human draws the reader's marks on the image as read; they cannot follow "
                             "--data.augment (the reference would move and the reader's marks stay). Drop one of them.")
        self.readers = readers
        self.frame = (datamodule.image_size, datamodule.mask_threshold)
        self.chexlocalize_records = ChexlocalizeRecords(len(classes)) if self.native_findings() else None

    def native_findings(self) -> list[tuple[int, str]]:
        """(class index, key) of the run's findings scored by cheXlocalize's protocol as well."""
        return [(c, key) for c, key in enumerate(self.classes) if key in self.readers.native_protocol]

    def run_metrics(self) -> list:
        return [*super().run_metrics(), *([self.chexlocalize_records] if self.chexlocalize_records is not None else [])]

    def run_name(self) -> str:
        return self.readers.model_name if self.readers is not None else self.model_name()

    def infer(self, batch: dict) -> tuple[Tensor, Tensor]:
        logits, maps = self.readers.frame_maps(batch["image_id"], self.classes, batch["native_size"], *self.frame)
        if self.chexlocalize_records is not None:
            self.score_natively(batch)
        device = batch["image"].device
        return logits.to(device), maps.to(device)

    def score_natively(self, batch: dict) -> None:
        """cheXlocalize's protocol at native size on the batch's pairs with a region: the reader's
        mark against the region drawn at the image's ``native_size``."""
        samples = self.trainer.datamodule.samples
        for index, (height, width) in zip(batch["index"].tolist(), batch["native_size"].tolist()):
            sample = samples[index]
            for c, key in self.native_findings():
                if key not in sample.regions:
                    continue
                mask = torch.from_numpy(sample.regions[key].to_mask(height, width)[0])
                native_map, region, points = self.readers.native_mark(sample.image_id, key, height, width)
                self.chexlocalize_records.update(mask, c, index, partial(reader_row, native_map, region, points, mask))

    def display(self) -> str:
        """The reader set's name (``phantom-second``): the report marks its rows *human*."""
        return self.readers.name if self.readers is not None else self.model_name()

    def extra_results(self) -> dict:
        # beside metrics.json's flag "human": true (the base's), which a section under the same key would replace
        section = {"name": self.readers.name, "rule": self.readers.rule}
        if self.chexlocalize_records is not None:
            section["chexlocalize_protocol"] = {
                "findings": [key for _, key in self.native_findings()],
                "per_class": chexlocalize_means(self.chexlocalize_records.compute(), self.classes)}
        return {"reader_set": section}

    def extra_records(self) -> dict:
        if self.chexlocalize_records is None:
            return {}
        return {"chexlocalize": chexlocalize_records(self.chexlocalize_records.compute())}
