"""Faithfulness: do the pixels a map ranks highest drive the model's score? Deletion and insertion
AUC (RISE) and ROAD, per (image, class) pair, on a subset of the split's images.

A Lightning callback (``--faithfulness.*`` of ``xbench.test``; a script adds it to its ``Trainer``).
On each batch it takes the chosen images' graded pairs (positive, with a region: the pairs the
grounding metrics grade), runs the model on its own input, places each map on the input's pixels
and scores the perturbed inputs (`xbench.metrics.faithfulness` has the definitions). The class
score is the class's logit, as the model's zero-shot rule gives it. A pair whose map points nowhere
(near-constant, a Pointing Game miss) has no order to follow: it is counted, and its values are
left undefined. The section ``faithfulness`` of ``metrics.json`` holds per-class and macro means
and the mean curves; ``faithfulness.csv.gz`` one row per pair, which the analysis resamples.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from xbench.checks.common import PairCheck, input_of, input_side, run_model
from xbench.geometry.maps import near_constant
from xbench.metrics.faithfulness import (
    ROAD_PERCENTILES,
    FaithfulnessRecords,
    blurred,
    class_means,
    deletion_insertion_inputs,
    input_saliency,
    macro_mean,
    pair_values,
    removal_rank,
    road_inputs,
)
from xbench.models.base import XBenchModel
from xbench.results.payload import json_number, pair_section
from xbench.seeds import sample_seed

SECTION = "faithfulness"
#: How the section describes what was perturbed, for a reader of metrics.json.
DEFINITION = (
    "score: the class's logit. Map on the input: the raw map resampled onto the model's input pixels by the "
    "model's map rule (padding pixels take its minimum); order: decreasing saliency, ties in raster order. "
    "Deletion: the first floor(k n / K) pixels set to 0 in every channel of the input at step k; insertion: from "
    "the input blurred (Gaussian 11 px, sigma 5), the same pixels restored. AUC: trapezoid over the removed fraction. "
    "ROAD: pytorch-grad-cam's MoRF/LeRF noisy linear imputation at each percentile, logit after minus before; "
    "road = (LeRF - MoRF) / 2."
)


class Faithfulness(PairCheck):
    """Deletion and insertion AUC and ROAD of the model's maps on a subset of images.

    Args:
        images: how many of the split's images with a graded pair to score, evenly spaced in sorted
            id order (the same for every model); 0 turns the check off.
        steps: K, the steps of the deletion and insertion curves (each pair costs 2 (K + 1) forwards),
            1 to the pixels of the model's input (each step removes at least one pixel).
        road_percentiles: ROAD's percentiles p, distinct whole numbers from 1 to 99, each costing two
            imputations and two forwards per pair.
        seed: the seed of ROAD's imputation noise (with each image's index and class), 0 to 2**32 - 1.
    """

    section = SECTION

    def __init__(self, images: int = 0, steps: int = 20, road_percentiles: list[int] = list(ROAD_PERCENTILES),
                 seed: int = 0) -> None:
        super().__init__(images, seed)
        if type(steps) is not int or steps < 1:
            raise ValueError(f"--faithfulness.steps must be a whole number of at least 1; got {steps!r}")
        percentiles = list(road_percentiles)
        if (not percentiles or any(type(p) is not int or not 0 < p < 100 for p in percentiles)
                or len(set(percentiles)) < len(percentiles)):
            raise ValueError(f"--faithfulness.road_percentiles must be distinct whole percentiles from 1 to 99, at "
                             f"least one; got {road_percentiles!r}")
        self.steps, self.road_percentiles = steps, percentiles

    def new_records(self) -> FaithfulnessRecords:
        return FaithfulnessRecords(self.steps, len(self.road_percentiles))

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: XBenchModel) -> None:
        pixels = input_side(pl_module, trainer.datamodule) ** 2
        if self.images and self.steps > pixels:
            raise ValueError(f"--faithfulness.steps must be 1 to {pixels}, the pixels of the model's input (each "
                             f"step removes at least one); got {self.steps}")
        super().on_test_epoch_start(trainer, pl_module)

    def score_rows(self, trainer: L.Trainer, model: XBenchModel, batch: dict, rows: list[int]) -> None:
        """Score every graded pair of the batch's ``rows``."""
        inputs, windows = input_of(model, batch)
        inputs, windows = inputs[rows], windows[rows]
        chunk = len(batch["image_id"])
        logits, maps = run_model(trainer, model, inputs, chunk)
        saliency = input_saliency(maps, windows, inputs.shape[-1], tuple(batch["masks"].shape[-2:]), model.map_upsample)
        constant = near_constant(maps)
        substrates = blurred(inputs)
        graded = batch["has_mask"][rows]
        index = batch["index"][rows]
        for r, c in graded.nonzero().tolist():
            curves = self.score_pair(trainer, model, inputs[r], substrates[r], saliency[r, c], c, logits[r, c],
                                     int(index[r]), chunk) if not constant[r, c] else self.undefined()
            self.records.update(index[r:r + 1], torch.tensor([c], device=index.device), constant[r:r + 1, c],
                                *(curve.unsqueeze(0).to(index.device) for curve in curves))

    def undefined(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        nan = lambda n: torch.full((n,), torch.nan, dtype=torch.float64)  # noqa: E731
        return nan(self.steps + 1), nan(self.steps + 1), nan(len(self.road_percentiles)), nan(len(self.road_percentiles))

    def score_pair(self, trainer: L.Trainer, model: XBenchModel, image: Tensor, substrate: Tensor, saliency: Tensor,
                   c: int, logit: Tensor, index: int, chunk: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One pair's deletion and insertion curves [K + 1] and ROAD differences (MoRF, LeRF) [P]."""
        deletion, insertion = deletion_insertion_inputs(image, substrate, removal_rank(saliency.flatten()), self.steps)
        morf, lerf = road_inputs(image, saliency, self.road_percentiles, sample_seed(sample_seed(self.seed, index), c))
        scores, _ = run_model(trainer, model, torch.cat([deletion, insertion, morf, lerf]), chunk, maps=False)
        curves = scores[:, c].double().split([self.steps + 1, self.steps + 1, len(morf), len(lerf)])
        return curves[0], curves[1], curves[2] - logit.double(), curves[3] - logit.double()

    def section_of(self, records, classes: list[str]) -> tuple[dict, dict[str, Tensor]]:
        """The ``metrics.json`` section and the per-pair records (``faithfulness.csv.gz``)."""
        values = pair_values(records["deletion"], records["insertion"], records["road_morf"], records["road_lerf"])
        cls = records["class"]
        curves = {name: class_means(records[name], cls, len(classes))[0]
                  for name in ("deletion", "insertion", "road_morf", "road_lerf")}
        section = {
            "applicable": True,
            "images_requested": self.images,
            "steps": self.steps,
            "road_percentiles": self.road_percentiles,
            "seed": self.seed,
            "definition": DEFINITION,
            **pair_section(records["index"], cls, records["constant"], values, classes),
            # the mean curve over the classes with a defined pair (each class's mean curve first)
            "curves": {name: [json_number(v) for v in _macro_curve(curve)] for name, curve in curves.items()},
        }
        # each pair's curves beside its values: deletion_000, ..., road_morf_curve_000 (one per percentile), ...
        return section, {"index": records["index"], "class": cls, "constant_map": records["constant"], **values,
                         **{name if name in ("deletion", "insertion") else f"{name}_curve": records[name]
                            for name in curves}}


def _macro_curve(per_class: Tensor) -> list[float]:
    """The mean over classes (rows) of per-class curves [C, n], where defined."""
    return [macro_mean(per_class[:, k]) for k in range(per_class.shape[1])]
