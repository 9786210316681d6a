"""Robustness: does the map stay put when the input barely changes? Max-sensitivity (Yeh et al.,
NeurIPS 2019) and the local Lipschitz estimate (Alvarez-Melis & Jaakkola, 2018), the definitions of
Quantus' ``MaxSensitivity`` and ``LocalLipschitzEstimate``, per (image, class) pair, on a subset of
the split's images.

A Lightning callback (``--robustness.*`` of ``xbench.test``; a script adds it to its ``Trainer``).
On each batch it takes the chosen images' graded pairs (positive, with a region), and per image runs
the model on its own input plus ``samples`` draws of uniform noise and ``samples`` draws of Gaussian
noise, all classes' maps at once, ``batch size`` inputs per forward. Per graded pair, with ``a`` the
model's normalised frame map (``XBenchModel.frame_saliency``; a constant map is uniform relevance,
all ones: `as_relevance`), flattened, and float64 arithmetic:

- **max-sensitivity** = max over s of ``||a - a_s|| / ||a||``, ``a_s`` the map of ``x + u_s``,
  ``u_s`` uniform in [-radius, radius) on every element of the input;
- **local Lipschitz estimate** = max over s of ``||a - a_s|| / ||x - x_s||``, ``x_s = x + g_s``,
  ``g_s`` Gaussian with mean 0 and standard deviation ``std`` on every element.

Euclidean (Frobenius) norms; the maximum leaves out a NaN ratio (NaN if every one is). The noise is
not clipped to the input's range, as Quantus' is not.

Each draw has its own seed (`noise_seed`): the seed option, the image's index in the split, the
kind (0 uniform, 1 Gaussian) and the sample s, so the numbers do not depend on the batch size or on
which images share a batch. The section ``robustness`` of ``metrics.json`` holds per-class and macro
means; ``robustness.csv.gz`` one row per pair, which the analysis resamples.
"""

from __future__ import annotations

import math

import lightning as L
import torch
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat

from xbench.checks.common import PairCheck, input_of, run_model
from xbench.geometry.maps import as_relevance, near_constant
from xbench.metrics.common import MetricValues, RecordsMetric
from xbench.metrics.faithfulness import pair_order
from xbench.models.base import XBenchModel
from xbench.results.payload import pair_section
from xbench.seeds import sample_seed

SECTION = "robustness"
#: The per-pair numbers, in the tables' order.
PAIR_VALUES = ("max_sensitivity", "local_lipschitz")
#: The kinds of noise, as they enter each draw's seed.
UNIFORM, GAUSSIAN = 0, 1
#: The most samples the option takes: each costs two forwards per image, and 10,000 (50 times Quantus'
#: 200, hours per image for a full-size model on a CPU) is a slip rather than a setting.
MAX_SAMPLES = 10_000
#: The largest radius or standard deviation: noise a thousand times an input's range (a model's
#: normalised input spans a few units) drowns the image; beyond it the option is a slip, and a
#: float32 input could no longer hold the image beside the noise.
MAX_NOISE = 1e3
#: How the section describes the numbers, for a reader of metrics.json.
DEFINITION = (
    "a: the model's map of the class in the frame, min-max normalised (a constant map all ones), flattened. "
    "max_sensitivity = max over s of ||a - a_s|| / ||a||, a_s the map of the input plus noise uniform in "
    "[-radius, radius) on every element; local_lipschitz = max over s of ||a - a_s|| / ||x - x_s||, x_s the input "
    "x plus Gaussian noise of standard deviation std on every element. Euclidean norms, samples draws of each, "
    "seeded per (seed, image index, kind, sample); lower is more robust."
)


def noise_seed(seed: int, index: int, kind: int, sample: int) -> int:
    """The seed of one draw: ``sample_seed`` nested over (seed, image index, kind, sample), modulo
    2**64 (torch's range). Distinct draws get distinct seeds while index and sample stay below
    1,000,003 (`xbench.seeds.sample_seed`'s multiplier)."""
    return sample_seed(sample_seed(sample_seed(seed, index), kind), sample) % 2**64


def input_noise(shape: tuple[int, ...], seed: int, index: int, kind: int, sample: int, scale: float) -> Tensor:
    """Float32 noise [*shape] on the CPU from its own generator (`noise_seed`): uniform in
    [-scale, scale) for `UNIFORM` (``(2 u - 1) scale``, u from ``torch.rand``), Gaussian with
    standard deviation ``scale`` for `GAUSSIAN` (``torch.randn``)."""
    generator = torch.Generator().manual_seed(noise_seed(seed, index, kind, sample))
    if kind == UNIFORM:
        return (torch.rand(shape, generator=generator) * 2 - 1) * scale
    return torch.randn(shape, generator=generator) * scale


def nan_max(values: Tensor, dim: int = 0) -> Tensor:
    """The maximum along ``dim`` of the values that are not NaN; NaN where none is (numpy's nanmax)."""
    undefined = values.isnan()
    largest = values.masked_fill(undefined, -math.inf).amax(dim)
    return largest.masked_fill(undefined.all(dim), math.nan)


def relevance(model: XBenchModel, raw: Tensor, classes: Tensor, frame_masks: Tensor, windows: Tensor) -> Tensor:
    """Float64 [n, K, S * S]: the ``classes`` of raw maps [n, C, h, w] as the run grades them (normalised
    frame maps; ``frame_masks`` gives the frame's size, ``windows`` [n, 4] what each input shows), a
    constant map all ones."""
    saliency, _ = model.frame_saliency(raw[:, classes], {"masks": frame_masks, "window": windows})
    return as_relevance(saliency).flatten(-2).double()


class RobustnessRecords(RecordsMetric):
    """One row per scored (image, class) pair, gathered across processes like every record state."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"ro_index": ((), torch.int64), "ro_class": ((), torch.int64), "ro_constant": ((), torch.uint8),
                "ro_max_sensitivity": ((), torch.float64), "ro_local_lipschitz": ((), torch.float64)}

    def update(self, index: Tensor, classes: Tensor, constant: Tensor, max_sensitivity: Tensor,
               local_lipschitz: Tensor) -> None:
        self.ro_index.append(index)
        self.ro_class.append(classes)
        self.ro_constant.append(constant.to(torch.uint8))
        self.ro_max_sensitivity.append(max_sensitivity.double())
        self.ro_local_lipschitz.append(local_lipschitz.double())

    def compute(self) -> MetricValues:
        """Every process's rows, ordered by (image index, class)."""
        index, cls = dim_zero_cat(self.ro_index), dim_zero_cat(self.ro_class)
        order = pair_order(index, cls)
        return MetricValues({
            "index": index[order], "class": cls[order], "constant": dim_zero_cat(self.ro_constant)[order].bool(),
            **{name: dim_zero_cat(getattr(self, f"ro_{name}"))[order] for name in PAIR_VALUES},
        })


def _check_noise(name: str, value: float) -> None:
    if type(value) not in (int, float) or not 0 < value <= MAX_NOISE:  # NaN fails the comparison too
        raise ValueError(f"--robustness.{name} must be a number above 0 and at most {MAX_NOISE:g}; got {value!r}")


class Robustness(PairCheck):
    """Max-sensitivity and the local Lipschitz estimate of the model's maps on a subset of images.

    The defaults are Quantus': ``MaxSensitivity(nr_samples=200, lower_bound=0.2)`` and
    ``LocalLipschitzEstimate(nr_samples=200, perturb_std=0.1)``.

    Args:
        images: how many of the split's images with a graded pair to score, evenly spaced in sorted
            id order (the same for every model); 0 turns the check off.
        samples: the noisy copies of each kind per image, 1 to 10,000 (each copy is a forward).
        radius: the half-width of max-sensitivity's uniform noise, in the model's input units, above 0
            and at most 1,000 (`MAX_NOISE`: beyond it the noise is all the model sees).
        std: the standard deviation of the local Lipschitz estimate's Gaussian noise, bounded as
            ``radius``.
        seed: the seed of the noise (with each image's index, the kind and the sample), 0 to 2**32 - 1.
    """

    section = SECTION

    def __init__(self, images: int = 0, samples: int = 200, radius: float = 0.2, std: float = 0.1,
                 seed: int = 0) -> None:
        super().__init__(images, seed)
        if type(samples) is not int or not 1 <= samples <= MAX_SAMPLES:
            raise ValueError(f"--robustness.samples must be a whole number from 1 to {MAX_SAMPLES}; got {samples!r}")
        _check_noise("radius", radius)
        _check_noise("std", std)
        self.samples, self.radius, self.std = samples, float(radius), float(std)

    def new_records(self) -> RobustnessRecords:
        return RobustnessRecords()

    def score_rows(self, trainer: L.Trainer, model: XBenchModel, batch: dict, rows: list[int]) -> None:
        """Score every graded pair of the batch's ``rows``."""
        inputs, windows = input_of(model, batch)
        inputs, windows = inputs[rows], windows[rows]
        chunk = len(batch["image_id"])
        _, raw = run_model(trainer, model, inputs, chunk)
        constant = near_constant(raw)
        graded, index, masks = batch["has_mask"][rows], batch["index"][rows], batch["masks"][rows]
        for r in range(len(rows)):
            classes = graded[r].nonzero().flatten()
            if not classes.numel():  # a region too small for the frame leaves a chosen image without a pair
                continue
            original = relevance(model, raw[r:r + 1], classes, masks[r:r + 1], windows[r:r + 1])[0]
            values = self.score_image(trainer, model, inputs[r], windows[r], masks[r:r + 1], classes, original,
                                      int(index[r]), chunk)
            self.records.update(index[r].expand(len(classes)), classes, constant[r, classes], *values)

    def score_image(self, trainer: L.Trainer, model: XBenchModel, image: Tensor, window: Tensor, frame_masks: Tensor,
                    classes: Tensor, original: Tensor, index: int, chunk: int) -> tuple[Tensor, Tensor]:
        """Max-sensitivity and the local Lipschitz estimate [K] of one input's ``classes``, from their
        maps ``original`` [K, S * S]: both kinds' draws, ``chunk`` noisy inputs per forward."""
        draws = [(kind, s) for kind in (UNIFORM, GAUSSIAN) for s in range(self.samples)]
        ratios = torch.full((2, self.samples, len(classes)), math.nan, dtype=torch.float64, device=image.device)
        scale = {UNIFORM: self.radius, GAUSSIAN: self.std}
        for start in range(0, len(draws), chunk):
            part = draws[start:start + chunk]
            noise = torch.stack([input_noise(tuple(image.shape), self.seed, index, kind, s, scale[kind])
                                 for kind, s in part])
            noisy = image + noise.to(image.device, image.dtype)
            _, raw = run_model(trainer, model, noisy, chunk)
            maps = relevance(model, raw, classes, frame_masks, window.expand(len(part), 4))
            change = (maps - original).norm(dim=-1)  # [n, K]
            kinds = torch.tensor([kind for kind, _ in part], device=image.device)
            moved = (noisy.double() - image.double()).flatten(1).norm(dim=-1)  # ||x - x_s||, as rounded
            ratios[kinds, torch.tensor([s for _, s in part], device=image.device)] = change / torch.where(
                kinds[:, None] == UNIFORM, original.norm(dim=-1)[None], moved[:, None])
        return nan_max(ratios[UNIFORM]), nan_max(ratios[GAUSSIAN])

    def section_of(self, records, classes: list[str]) -> tuple[dict, dict[str, Tensor]]:
        """The ``metrics.json`` section and the per-pair records (``robustness.csv.gz``)."""
        cls, constant = records["class"], records["constant"]
        values = {name: records[name] for name in PAIR_VALUES}
        section = {
            "applicable": True,
            "images_requested": self.images,
            "samples": self.samples,
            "radius": self.radius,
            "std": self.std,
            "seed": self.seed,
            "definition": DEFINITION,
            **pair_section(records["index"], cls, constant, values, classes),
        }
        return section, {"index": records["index"], "class": cls, "constant_map": constant, **values}
