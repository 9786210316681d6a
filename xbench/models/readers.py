"""``HumanReader``: a radiologist's marks scored like a model's maps, against the same reference.

The datamodule says who is read and against what (its ``reader_set``, `xbench.data.readers`); this
model turns each mark into a frame map by that module's one rule and hands it to the base's test step,
so the run writes an ordinary results folder under the model name ``human:<reader set>``. Its
``metrics.json`` is marked ``human``: the report shows it beside the models, never ranked, and the
analysis measures each model's gap to it on the same images.
"""

from __future__ import annotations

from torch import Tensor

from xbench.models.base import XBenchModel


class HumanReader(XBenchModel):
    """The reader under test of a dataset with several readers (its ``reader_set``)."""

    name = "human"
    human = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.readers = None

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

    def run_name(self) -> str:
        return self.readers.model_name if self.readers is not None else self.model_name()

    def infer(self, batch: dict) -> tuple[Tensor, Tensor]:
        logits, maps = self.readers.frame_maps(batch["image_id"], self.classes, batch["native_size"], *self.frame)
        device = batch["image"].device
        return logits.to(device), maps.to(device)

    def display(self) -> str:
        """The reader set's name (``phantom-second``): the report marks its rows *human*."""
        return self.readers.name if self.readers is not None else self.model_name()

    def extra_results(self) -> dict:
        # beside metrics.json's flag "human": true (the base's), which a section under the same key would replace
        return {"reader_set": {"name": self.readers.name, "rule": self.readers.rule}}
