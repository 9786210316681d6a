"""Pieces both metrics share: the result container, typed per-row record states and a sync in a
few collectives."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat, dim_zero_sum
from torchmetrics.utilities.distributed import gather_all_tensors


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


class PackedSyncMetric(Metric):
    """A ``Metric`` whose states cross processes in a few collectives, not three per state.

    torchmetrics gathers each state on its own (a barrier, its shape, its values): 51 collectives
    for a [`GroundingMetrics`][xbench.metrics.grounding.GroundingMetrics] at the end of a run. Here
    the sum states of one dtype travel as one flat tensor, and the concatenated states as one gather
    of every state's row count and one flat tensor per dtype. Results are those of torchmetrics'
    sync: sums over processes in rank order, rows concatenated in rank order. Concatenated states
    must hold at least one (possibly empty) tensor, as `RecordsMetric` ensures.
    """

    def _sync_dist(self, dist_sync_fn=gather_all_tensors, process_group=None) -> None:
        if dist_sync_fn is not gather_all_tensors:  # a caller's own gather: torchmetrics' path
            return super()._sync_dist(dist_sync_fn, process_group)
        group = process_group or self.process_group
        sums = [name for name, fx in self._reductions.items() if fx is dim_zero_sum]
        cats = [name for name, fx in self._reductions.items() if fx is dim_zero_cat]
        if len(sums) + len(cats) != len(self._reductions):
            raise TypeError(f"{type(self).__name__}: the packed sync handles only 'sum' and 'cat' states")
        for names in _by_dtype({name: getattr(self, name) for name in sums}).values():
            total = torch.stack(_all_gather(torch.cat([getattr(self, n).reshape(-1) for n in names]), group)).sum(0)
            for name, part in zip(names, total.split([getattr(self, n).numel() for n in names])):
                setattr(self, name, part.view_as(getattr(self, name)))
        local = {name: dim_zero_cat(getattr(self, name)) for name in cats}
        if not local:
            return
        counts = torch.tensor([len(local[n]) for n in cats], dtype=torch.int64, device=self.device)
        rows = torch.stack(_all_gather(counts, group)).tolist()  # [rank][state]: rows on each process
        for names in _by_dtype(local).values():
            columns = [cats.index(n) for n in names]
            sizes = [[ranks[c] * math.prod(local[n].shape[1:]) for c, n in zip(columns, names)] for ranks in rows]
            longest = max(1, max(map(sum, sizes)))  # gloo and NCCL take equal, non-empty tensors
            flat = torch.cat([local[n].reshape(-1) for n in names])
            gathered = _all_gather(torch.cat([flat, flat.new_zeros(longest - len(flat))]), group)
            pieces = [padded[: sum(size)].split(size) for padded, size in zip(gathered, sizes)]
            for i, name in enumerate(names):
                row_shape = local[name].shape[1:]
                setattr(self, name, torch.cat([of_rank[i].view(-1, *row_shape) for of_rank in pieces]))


def _by_dtype(states: dict[str, Tensor]) -> dict[torch.dtype, list[str]]:
    grouped: dict[torch.dtype, list[str]] = {}
    for name, value in states.items():
        grouped.setdefault(value.dtype, []).append(name)
    return grouped


def _all_gather(tensor: Tensor, group) -> list[Tensor]:
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, tensor.contiguous(), group=group)
    return gathered


class RecordsMetric(PackedSyncMetric):
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
