"""A map that points nowhere is never a perfect pointer (issue 23.1): constancy is decided on the
model's raw map, before it is resampled onto the frame, through the real ``trainer.test`` path."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import Tensor

from xbench.data.phantom import Phantom
from xbench.models.base import XBenchModel
from xbench.geometry.preprocess import Preprocess


class FlatMaps(XBenchModel):
    """Every class's raw 14x14 map flat: exactly (``torch.full``), or uniform attention whose
    cells differ by a float32 ulp or two (what a collapsed softmax over 196 tokens gives)."""

    def __init__(self, kind: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.kind = kind
        self.preprocess = Preprocess(16, "squash", library="torch", map_upsample="bilinear")

    def forward(self, model_input: Tensor) -> tuple[Tensor, Tensor]:
        batch, classes = model_input.shape[0], len(self.classes)
        if self.kind == "full":
            maps = torch.full((batch, classes, 14, 14), 0.3)
        else:
            noise = torch.randint(-2, 3, (batch, classes, 14, 14), generator=torch.Generator().manual_seed(0))
            maps = 1 / 196 + noise * torch.finfo(torch.float32).eps / 196
        return torch.zeros(batch, classes), maps


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch_size", [1, 4, 9])
@pytest.mark.parametrize("kind", ["full", "ulp_noise"])
def test_flat_maps_are_counted_constant_and_miss(phantom_root, kind, batch_size, threads):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = FlatMaps(kind)
        data = Phantom(root=str(phantom_root), image_size=48, batch_size=batch_size, num_workers=0, cache=False)
        trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                            use_distributed_sampler=False, accelerator="cpu")
        trainer.test(model, datamodule=data, verbose=False)
    finally:
        torch.set_num_threads(previous)
    per_class = model.results["grounding"]["per_class"]
    graded = {key: values for key, values in per_class.items() if values["pairs"]}
    assert graded
    for values in graded.values():
        assert values["hits"] == 0 and values["pointing_game"] == 0
        assert values["constant_maps"] == values["pairs"]
