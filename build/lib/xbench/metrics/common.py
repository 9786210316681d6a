"""Pieces both metrics share: the result container and typed per-row record states."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torchmetrics import Metric


class MetricValues:
    """Named result tensors, kept exactly as computed.

    Deliberately not a ``dict``: torchmetrics squeezes every one-element tensor inside a returned
    collection, which would turn a one-class dataset's per-class ``[1]`` tensors into scalars.
    """

    def __init__(self, values: dict[str, Tensor | dict[str, Tensor]]) -> None:
        self._values = dict(values)

    def __getitem__(self, key: str):
        return self._values[key]

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def keys(self):
        return self._values.keys()

    def items(self):
        return self._values.items()

    def __repr__(self) -> str:
        return f"MetricValues({sorted(self._values)})"


class RecordsMetric(Metric):
    """A ``Metric`` whose per-row records are concatenated states of fixed dtype and row shape.

    Each record state starts as a list holding one empty tensor of its dtype and row shape, so a
    process that receives no samples (fewer samples than processes) still joins the all-gather
    with matching tensors instead of torchmetrics' untyped placeholder.
    """

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Record state name -> (row shape, dtype)."""
        raise NotImplementedError

    def _add_record_states(self) -> None:
        for name in self.record_layout():
            self.add_state(name, [], dist_reduce_fx="cat")
        self._seed_records()

    def _seed_records(self) -> None:
        for name, (row_shape, dtype) in self.record_layout().items():
            getattr(self, name).append(torch.zeros(0, *row_shape, dtype=dtype, device=self.device))

    def reset(self) -> None:
        super().reset()
        self._seed_records()
