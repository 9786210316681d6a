"""Reference points for every table: noise, a centre prior, and the oracle instrument.

``RandomSaliency`` and ``CentrePrior`` are the floors a model must beat; on a gaze dataset,
``GazeCentreBias`` (the dataset's own centre bias as the map) is the floor of the gaze metrics. ``Oracle`` reads the
radiologist masks and the true labels from the batch: it is a test instrument for the harness
(it must score a perfect Pointing Game and best-threshold Dice), never a benchmark entry.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from xbench.seeds import sample_seed
from xbench.models.base import XBenchModel


class RandomSaliency(XBenchModel):
    """Uniform noise maps on a ``grid x grid`` lattice and standard-normal logits.

    The noise of each sample is drawn from a generator seeded by ``seed`` and the sample's global
    index, so results do not depend on batch size, order or the number of processes.
    """

    name = "random"  # its config's name (lightning_configs/models/random.yaml), as a suite lists it

    def __init__(self, seed: int = 0, grid: int = 14, **kwargs) -> None:
        super().__init__(**kwargs)
        if grid < 1:
            raise ValueError(f"--model.grid must be at least 1 (the side of the noise lattice); got {grid}")
        self.seed = seed
        self.grid = grid

    def infer(self, batch: dict) -> tuple[Tensor, Tensor]:
        num_classes = batch["labels"].shape[1]
        logits, maps = [], []
        for index in batch["index"].tolist():
            generator = torch.Generator().manual_seed(sample_seed(self.seed, index))
            maps.append(torch.rand(num_classes, self.grid, self.grid, generator=generator))
            logits.append(torch.randn(num_classes, generator=generator))
        device = batch["image"].device
        return torch.stack(logits).to(device), torch.stack(maps).to(device)


class CentrePrior(XBenchModel):
    """The same centred Gaussian map for every class and image, and a constant logit of 0.

    Args:
        sigma: the Gaussian's standard deviation as a fraction of the image side.
    """

    name = "centre_prior"  # its config's name (lightning_configs/models/centre_prior.yaml)

    def __init__(self, sigma: float = 0.25, **kwargs) -> None:
        super().__init__(**kwargs)
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"--model.sigma must be a positive fraction of the image side; got {sigma}")
        self.sigma = sigma

    def forward(self, image: Tensor) -> tuple[Tensor, Tensor]:
        batch, _, height, width = image.shape
        ys = (torch.arange(height, device=image.device) + 0.5) / height - 0.5
        xs = (torch.arange(width, device=image.device) + 0.5) / width - 0.5
        gaussian = torch.exp(-(ys[:, None] ** 2 + xs[None, :] ** 2) / (2 * self.sigma**2))
        num_classes = len(self.classes)
        maps = gaussian.expand(batch, num_classes, height, width)
        return torch.zeros(batch, num_classes, device=image.device), maps


class GazeCentreBias(XBenchModel):
    """The gaze dataset's centre bias (its ``gaze_baseline()``: the mean gaze density of the training
    readings) as every class's map, and a constant logit of 0: where radiologists look on any image,
    the floor of the gaze metrics as `RandomSaliency` is of grounding (its information gain over the
    centre bias is 0 by construction)."""

    name = "gaze_centre_bias"  # its config's name (lightning_configs/models/gaze_centre_bias.yaml)

    def build(self, classes: list[str]) -> None:
        datamodule = self.trainer.datamodule
        baseline = datamodule.gaze_baseline()
        if baseline is None:
            raise ValueError(f"--model gaze_centre_bias maps a gaze dataset's centre bias, and "
                             f"{type(datamodule).__name__} as configured has no gaze: choose a gaze dataset "
                             "(REFLACX, EGD-CXR, or the phantom with --data.gaze true)")
        self.baseline = baseline

    def forward(self, image: Tensor) -> tuple[Tensor, Tensor]:
        batch, num_classes = image.shape[0], len(self.classes)
        maps = self.baseline.to(image.device, torch.float32).expand(batch, num_classes, *self.baseline.shape)
        return torch.zeros(batch, num_classes, device=image.device), maps


class Oracle(XBenchModel):
    """The mask itself as the map and the true label as a +/-10 logit (unknown labels: 0).

    A test instrument: Pointing Game and best-threshold Dice must be exactly 1. A region that fills
    the whole frame would make the mask a constant map, which the metrics count as pointing
    nowhere; its map is a ramp over the frame instead (non-constant, every pixel inside the region).
    """

    instrument = True

    def infer(self, batch: dict) -> tuple[Tensor, Tensor]:
        labels = batch["labels"]
        logits = torch.where(labels == 1, 10.0, torch.where(labels == 0, -10.0, 0.0))
        masks = batch["masks"]
        maps = masks.float()
        whole = masks.flatten(2).all(-1) & batch["has_mask"]
        if whole.any():
            ramp = torch.arange(masks[0, 0].numel(), dtype=maps.dtype, device=maps.device).view(masks.shape[-2:])
            maps[whole] = ramp
        return logits, maps
