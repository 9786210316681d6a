"""Faithfulness of a map to the model's own score: deletion and insertion curves (Petsiuk et al.,
RISE, 2018) and ROAD (Rong et al., ICML 2022), on the model's input.

The definitions (``docs/explanations.md`` states them for readers):

- **The map on the input** (`input_saliency`): the model's raw map covers its input, as the
  input covers its window of the frame; each input pixel takes the map's value at its centre by the
  model's map rule (the same rule that places the map in the frame, so it is the frame map's
  value at the frame point the pixel shows, without resampling twice). An input pixel that shows no
  part of the frame (letterbox padding) takes the map's minimum.
- **The order** (`removal_rank`): pixels by decreasing saliency, equal values in raster order.
- **Deletion**: at step k of K the first ``floor(k n / K)`` pixels of the order are set to 0 in
  every channel of the input (RISE's substrate: the normalisation mean of a model that normalises,
  black for a model that reads the [0, 1] frame). **Insertion**: starts from the input blurred
  (Gaussian, kernel 11, sigma 5: RISE's size, not its kernel or border; `blurred`) and puts back the
  same pixels of the original. The curve is the class's logit at the K + 1 steps; its AUC the
  trapezoid over the removed fraction in [0, 1] (`curve_auc`). A faithful map: a low deletion AUC,
  a high insertion AUC.
- **ROAD** (`road_inputs`): pytorch-grad-cam's own ``RemoveMostRelevantFirst`` and
  ``RemoveLeastRelevantFirst`` with its ``NoisyLinearImputer`` at each percentile p (MoRF imputes the
  pixels at or above the p-th percentile of the map normalised to [0, 1], LeRF those at or above the
  p-th percentile of 1 - map), its noise drawn from a seeded generator. A value is the logit after
  imputation minus the logit before; MoRF and LeRF are their means over the percentiles and
  ROAD = (LeRF - MoRF) / 2, the library's ``ROADCombined``: higher is more faithful.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat
from torchvision.transforms.functional import gaussian_blur

from xbench.geometry.maps import place_in_frame, whole_frame
from xbench.geometry.preprocess import MapUpsample
from xbench.metrics.common import MetricValues, RecordsMetric

#: The blur of the insertion substrate: RISE's Gaussian kernel size (11 pixels) and sigma (5).
BLUR_KERNEL, BLUR_SIGMA = 11, 5.0
#: ROAD's percentiles, pytorch-grad-cam's ``ROADCombined`` default.
ROAD_PERCENTILES = (10, 20, 30, 40, 50, 60, 70, 80, 90)
#: The per-pair numbers a faithfulness record yields, in the tables' order.
PAIR_VALUES = ("deletion_auc", "insertion_auc", "road_morf", "road_lerf", "road")


def input_saliency(maps: Tensor, windows: Tensor, side: int, frame: tuple[int, int], mode: MapUpsample) -> Tensor:
    """Raw maps [B, K, h, w] covering the model's input -> maps [B, K, side, side] on its pixels.

    ``windows`` [B, 4] (top, left, height, width in frame pixels): what each input shows of the frame
    of size ``frame``. Input pixels whose centre falls outside the frame (letterbox padding) take
    each map's minimum.
    """
    batch = maps.shape[0]
    placed = place_in_frame(maps, whole_frame(batch, (side, side), maps.device), (side, side), mode)
    centres = (torch.arange(side, device=maps.device, dtype=torch.float64) + 0.5) / side
    windows = windows.double()
    rows = windows[:, 0:1] + centres * windows[:, 2:3]  # [B, side]: the frame row each input row shows
    columns = windows[:, 1:2] + centres * windows[:, 3:4]
    inside = ((rows >= 0) & (rows < frame[0]))[:, :, None] & ((columns >= 0) & (columns < frame[1]))[:, None, :]
    return torch.where(inside[:, None], placed, maps.float().amin(dim=(-2, -1), keepdim=True))


def removal_rank(saliency: Tensor) -> Tensor:
    """int64 [..., n]: each pixel's place in the removal order of flat maps [..., n] -- decreasing
    saliency, equal values in raster order."""
    order = torch.sort(saliency, dim=-1, descending=True, stable=True).indices
    positions = torch.arange(saliency.shape[-1], device=saliency.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, positions)


def removed_counts(pixels: int, steps: int) -> Tensor:
    """int64 [steps + 1]: pixels removed (or inserted) after each step, ``floor(k n / K)``."""
    return torch.arange(steps + 1, dtype=torch.int64) * pixels // steps


def blurred(inputs: Tensor) -> Tensor:
    """The insertion substrate of inputs [B, ch, s, s]: torchvision's Gaussian blur, reflected at the
    border (RISE pads with zeros; docs/explanations.md gives the difference)."""
    return gaussian_blur(inputs, [BLUR_KERNEL, BLUR_KERNEL], [BLUR_SIGMA, BLUR_SIGMA])


def deletion_insertion_inputs(image: Tensor, substrate: Tensor, rank: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """One input [ch, s, s], its blurred ``substrate`` and the flat ``rank`` [s * s] of its pixels ->
    the deletion and insertion inputs [steps + 1, ch, s, s] (step 0 first)."""
    counts = removed_counts(rank.numel(), steps).to(rank.device)
    removed = (rank[None] < counts[:, None]).view(steps + 1, 1, *image.shape[-2:])
    deletion = image.expand(steps + 1, *image.shape).masked_fill(removed, 0.0)
    insertion = torch.where(removed, image, substrate)
    return deletion, insertion


def curve_auc(curves: Tensor) -> Tensor:
    """The area under curves [..., K + 1] sampled at removed fractions 0, 1/K, ..., 1 (trapezoid)."""
    return torch.trapezoid(curves, dx=1.0 / (curves.shape[-1] - 1), dim=-1)


def road_inputs(image: Tensor, saliency: Tensor, percentiles: Sequence[int], seed: int) -> tuple[Tensor, Tensor]:
    """ROAD's perturbed inputs of one input [ch, s, s] and its map [s, s] on the input: MoRF and LeRF
    [P, ch, s, s] at each percentile, by pytorch-grad-cam's own perturbation and imputer.

    The map is min-max normalised first (the library's LeRF removes the top of ``1 - map``). The
    imputer's noise comes from torch's generator, seeded with ``seed`` modulo 2**64 (torch's range)
    before the first imputation (MoRF at each percentile, then LeRF), the caller's generator state
    left as it was.
    """
    from pytorch_grad_cam.metrics.perturbation_confidence import RemoveLeastRelevantFirst, RemoveMostRelevantFirst
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer

    low, spread = saliency.min(), saliency.max() - saliency.min()
    cam = ((saliency - low) / torch.where(spread > 0, spread, 1.0)).float().cpu()
    source = image.float().cpu()
    perturbed = {RemoveMostRelevantFirst: [], RemoveLeastRelevantFirst: []}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed % 2**64)
        for kind, made in perturbed.items():
            for percentile in percentiles:
                made.append(kind(percentile, NoisyLinearImputer())(source, cam))
    morf, lerf = (torch.stack(made).to(image.device, image.dtype) for made in perturbed.values())
    return morf, lerf


def pair_values(deletion: Tensor, insertion: Tensor, road_morf: Tensor, road_lerf: Tensor) -> dict[str, Tensor]:
    """Per pair, from its curves [P, K + 1] and ROAD differences [P, percentiles]: the numbers of
    `PAIR_VALUES` [P] (NaN where the curves are: a map that points nowhere)."""
    morf, lerf = road_morf.mean(-1), road_lerf.mean(-1)
    return {"deletion_auc": curve_auc(deletion), "insertion_auc": curve_auc(insertion), "road_morf": morf,
            "road_lerf": lerf, "road": (lerf - morf) / 2}


def class_means(values: Tensor, classes: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Per class, the mean of the pairs' ``values`` [P, ...] where defined (not NaN) and the count of
    those pairs: float64 [C, ...] (NaN without a pair) and int64 [C, ...]."""
    values = values.double()
    defined = ~values.isnan()
    shape = (num_classes, *values.shape[1:])
    index = classes.view(-1, *([1] * (values.ndim - 1))).expand_as(values)
    sums = torch.zeros(shape, dtype=torch.float64, device=values.device).scatter_add_(
        0, index, values.nan_to_num(0.0))
    counts = torch.zeros(shape, dtype=torch.int64, device=values.device).scatter_add_(0, index, defined.long())
    return sums / counts, counts


def pair_order(index: Tensor, classes: Tensor) -> Tensor:
    """The order of records by (image index, class)."""
    by_class = torch.argsort(classes, stable=True)
    return by_class[torch.argsort(index[by_class], stable=True)]


def macro_mean(per_class: Tensor) -> float:
    """The mean over classes where the value is defined (NaN if none is)."""
    defined = per_class[~per_class.isnan()]
    return float(defined.mean()) if defined.numel() else math.nan


class FaithfulnessRecords(RecordsMetric):
    """One row per scored (image, class) pair: the curves and ROAD differences, gathered across
    processes like every record state."""

    full_state_update = False

    def __init__(self, steps: int, percentiles: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.steps, self.percentiles = steps, percentiles
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        curve, road = (self.steps + 1,), (self.percentiles,)
        return {"fa_index": ((), torch.int64), "fa_class": ((), torch.int64), "fa_constant": ((), torch.uint8),
                "fa_deletion": (curve, torch.float64), "fa_insertion": (curve, torch.float64),
                "fa_road_morf": (road, torch.float64), "fa_road_lerf": (road, torch.float64)}

    def update(self, index: Tensor, classes: Tensor, constant: Tensor, deletion: Tensor, insertion: Tensor,
               road_morf: Tensor, road_lerf: Tensor) -> None:
        self.fa_index.append(index)
        self.fa_class.append(classes)
        self.fa_constant.append(constant.to(torch.uint8))
        for name, value in (("fa_deletion", deletion), ("fa_insertion", insertion), ("fa_road_morf", road_morf),
                            ("fa_road_lerf", road_lerf)):
            getattr(self, name).append(value.double())

    def compute(self) -> MetricValues:
        """Every process's rows, ordered by (image index, class)."""
        index, cls = dim_zero_cat(self.fa_index), dim_zero_cat(self.fa_class)
        order = pair_order(index, cls)
        return MetricValues({
            "index": index[order], "class": cls[order], "constant": dim_zero_cat(self.fa_constant)[order].bool(),
            "deletion": dim_zero_cat(self.fa_deletion)[order], "insertion": dim_zero_cat(self.fa_insertion)[order],
            "road_morf": dim_zero_cat(self.fa_road_morf)[order], "road_lerf": dim_zero_cat(self.fa_road_lerf)[order],
        })
