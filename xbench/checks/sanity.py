"""Sanity: cascading model-parameter randomisation (Adebayo et al., "Sanity Checks for Saliency
Maps", NeurIPS 2018). A map that barely changes when the model's weights are re-initialised explains
the image, not the model.

A Lightning callback (``--sanity.*`` of ``xbench.test``; a script adds it to its ``Trainer``). During
the test loop it keeps the chosen images' inputs; after it (``on_test_epoch_end``, before the model's
results are made) it re-initialises the model's layer groups one step at a time, from the output down
(``XBenchModel.layer_groups``; cumulative: step k has every group up to k randomised), and at each
step compares the maps of the graded pairs with the original ones (`xbench.metrics.sanity`:
Spearman's rank correlation, plain and of absolute values, and SSIM) and grades the randomised maps
with the run's grounding metrics. The model's weights are restored afterwards, exactly.

Re-initialisation, as Quantus' MPRT does it: each sub-module whose own parameters all belong to the
step and that has ``reset_parameters`` calls it, torch's generator seeded with ``seed`` before each;
any other parameter of the step (an attention's packed projection, a bare embedding or projection
matrix) is drawn from a normal distribution with mean 0 and that parameter's own standard deviation,
the generator seeded the same way. A one-element parameter without a ``reset_parameters`` (a logit
scale) stays. The test is only meaningful with the authors' weights: random weights have nothing to
destroy.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from xbench.checks.common import (
    check_images_and_seed,
    choose_images,
    chosen_rows,
    input_of,
    reads_only_its_input,
    run_model,
)
from xbench.geometry.maps import place_in_frame
from xbench.metrics.faithfulness import class_means, macro_mean
from xbench.metrics.grounding import GroundingMetrics
from xbench.metrics.sanity import SIMILARITIES, SanityRecords, similarities
from xbench.models.base import XBenchModel
from xbench.results.payload import json_number

SECTION = "sanity"
#: The grounding metrics of the randomised model at each step (macro means over the subset's pairs).
STEP_GROUNDING = ("pointing_game", "dice@0.5", "iou@0.5")


@dataclass(frozen=True)
class CascadeStep:
    """One step of the cascade: what it adds to the randomised layers."""

    name: str
    parameters: tuple[str, ...]
    text: bool


def cascade_steps(model: nn.Module, groups: Sequence) -> list[CascadeStep]:
    """The steps of ``model``'s declared layer ``groups`` (``XBenchModel.layer_groups``), from the
    output down: a group with ``blocks`` gives one step per block, the last first, then one for its
    other parameters. A group that matches no parameter, or a parameter of more than one element in
    no group, is an error: the declaration no longer fits the model."""
    parameters = dict(model.named_parameters())
    owner: dict[str, int] = {}
    for g, group in enumerate(groups):
        for name in parameters:
            if name not in owner and any(fnmatch.fnmatchcase(name, pattern) for pattern in group.patterns):
                owner[name] = g
    what = f"{type(model).__name__}.layer_groups"
    uncovered = [name for name, value in parameters.items() if name not in owner and value.numel() > 1]
    if uncovered:
        raise ValueError(f"{what}: {len(uncovered)} parameters are in no layer group (e.g. {uncovered[:3]}); "
                         "every parameter of more than one element must be randomised by some group")
    steps = []
    for g, group in enumerate(groups):
        members = [name for name in parameters if owner.get(name) == g]
        if not members:
            raise ValueError(f"{what}: group {group.name!r} matches no parameter (patterns {list(group.patterns)})")
        if group.blocks is None:
            steps.append(CascadeStep(group.name, tuple(members), group.text))
            continue
        prefix = group.blocks + "."
        blocks = sorted({int(name[len(prefix):].split(".")[0]) for name in members if name.startswith(prefix)})
        if not blocks:
            raise ValueError(f"{what}: group {group.name!r} holds no parameter under its blocks {group.blocks!r}")
        for block in reversed(blocks):
            inside = tuple(name for name in members if name.startswith(f"{prefix}{block}."))
            steps.append(CascadeStep(f"{group.name}: block {block}", inside, group.text))
        rest = tuple(name for name in members if not name.startswith(prefix))
        if rest:
            steps.append(CascadeStep(f"{group.name}: other layers", rest, group.text))
    return steps


@torch.no_grad()
def randomise(model: nn.Module, names: Sequence[str], seed: int) -> None:
    """Re-initialise the parameters ``names`` of ``model`` in place (the module docstring's rule);
    torch's generators are left as they were."""
    chosen = set(names)
    parameters = dict(model.named_parameters())
    devices = sorted({p.device.index or 0 for p in parameters.values() if p.device.type == "cuda"})
    done: set[str] = set()
    with torch.random.fork_rng(devices=devices):
        for prefix, module in model.named_modules():
            own = [f"{prefix}.{name}" if prefix else name for name, _ in module.named_parameters(recurse=False)]
            if own and hasattr(module, "reset_parameters") and all(name in chosen for name in own):
                torch.manual_seed(seed)
                module.reset_parameters()
                done.update(own)
        for name in names:
            value = parameters[name]
            if name in done or value.numel() < 2:
                continue
            torch.manual_seed(seed)
            value.normal_(0.0, float(value.float().std()))


class Sanity(Callback):
    """Cascading model-parameter randomisation of the model's maps on a subset of images.

    Args:
        images: how many of the split's images with a graded pair to check, evenly spaced in sorted id
            order (the same for every model); 0 turns the check off.
        seed: the seed of the re-initialisation (the same weights for every image and run), 0 to
            2**32 - 1.
    """

    def __init__(self, images: int = 0, seed: int = 0) -> None:
        check_images_and_seed(SECTION, images, seed)
        self.images, self.seed = images, seed
        self.chosen: set[str] = set()
        self.kept: list[dict] = []
        self.steps: list[CascadeStep] = []
        self.reason: str | None = None

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: XBenchModel) -> None:
        if not self.images:
            return
        self.reason = reads_only_its_input(pl_module)
        if self.reason is None and not pl_module.layer_groups:
            self.reason = (f"{type(pl_module).__name__} declares no layer groups (its class attribute layer_groups; "
                           "a model without weights has none)")
        # a stale declaration fails here, before the loop, not after it
        self.steps = [] if self.reason else cascade_steps(pl_module, pl_module.layer_groups)
        self.chosen = set() if self.reason else choose_images(trainer.datamodule.samples, pl_module.classes,
                                                              self.images)
        self.kept = []

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: XBenchModel, outputs: dict, batch: dict,
                          batch_idx: int, dataloader_idx: int = 0) -> None:
        rows = chosen_rows(batch, self.chosen) if self.images else []
        if not rows:
            return
        inputs, windows = input_of(pl_module, batch)
        self.kept.append({"input": inputs[rows].cpu(), "window": windows[rows].cpu(),
                          "masks": batch["masks"][rows].cpu(),
                          "has_mask": batch["has_mask"][rows].cpu(), "index": batch["index"][rows].cpu(),
                          "image": batch["image"][rows].cpu(), "image_id": [batch["image_id"][r] for r in rows],
                          "chunk": len(batch["image_id"])})

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: XBenchModel) -> None:
        if not self.images:
            return
        if self.reason:
            warnings.warn(f"sanity check not run: {self.reason}", stacklevel=1)
            pl_module.checks[SECTION] = ({"applicable": False, "reason": self.reason}, {})
            return
        kept, self.kept = self.kept, []
        records = SanityRecords().to(pl_module.device)
        grounding = [GroundingMetrics(len(pl_module.classes), validate_args=False).to(pl_module.device)
                     for _ in range(len(self.steps) + 1)]
        original = [self.maps(trainer, pl_module, part) for part in kept]
        strip = strip_pair(kept)
        strip_maps = []
        snapshot = {name: value.detach().to("cpu", copy=True)
                    for name, value in [*pl_module.named_parameters(), *pl_module.named_buffers()]}
        try:
            for step, cascade in enumerate([None, *self.steps]):
                if cascade is not None:
                    randomise(pl_module, cascade.parameters, self.seed)
                    if cascade.text:
                        pl_module.build(pl_module.classes)
                for p, (part, maps) in enumerate(zip(kept, original)):
                    now = maps if cascade is None else self.maps(trainer, pl_module, part)
                    self.compare(records, grounding[step], part, step, maps, now)
                    if strip is not None and strip[0] == p:
                        strip_maps.append(now[1][strip[1], strip[2]].cpu())
        finally:
            restore(pl_module, snapshot)
            if any(step.text for step in self.steps):
                pl_module.build(pl_module.classes)
        section, pairs = self.section(records.compute(), [g.compute() for g in grounding], pl_module.classes)
        if strip is not None:
            pairs["arrays"] = strip_arrays(kept[strip[0]], strip[1], strip[2], torch.stack(strip_maps),
                                           pl_module.classes, [step["layers"] for step in section["steps"]])
        pl_module.checks[SECTION] = (section, pairs)

    def maps(self, trainer: L.Trainer, model: XBenchModel, part: dict[str, Tensor]
             ) -> tuple[Tensor, Tensor, Tensor | None]:
        """The frame maps of the kept images, before and after normalisation [n, C, S, S], and the
        frame pixels the model saw [n, S, S] (``None``: all)."""
        device = model.device
        batch = {"masks": part["masks"].to(device), "window": part["window"].to(device)}
        _, raw = run_model(trainer, model, part["input"].to(device), part["chunk"])
        frame = tuple(part["masks"].shape[-2:])
        return place_in_frame(raw, batch["window"], frame, model.map_upsample), *model.frame_saliency(raw, batch)

    @staticmethod
    def compare(records: SanityRecords, grounding: GroundingMetrics, part: dict[str, Tensor], step: int,
                original: tuple[Tensor, Tensor, Tensor | None],
                randomised: tuple[Tensor, Tensor, Tensor | None]) -> None:
        """Grade the step's maps and record their similarity to the original maps, per graded pair."""
        device = randomised[1].device
        has_mask, index = part["has_mask"].to(device), part["index"].to(device)
        grounding.update(randomised[1], part["masks"].to(device), has_mask, index, seen=randomised[2])
        rows, classes = has_mask.nonzero(as_tuple=True)
        values = similarities(original[0][rows, classes], randomised[0][rows, classes],
                              original[1][rows, classes], randomised[1][rows, classes])
        records.update(index[rows], classes, step, values)

    def section(self, records, grounding: list, classes: list[str]) -> tuple[dict, dict[str, Tensor]]:
        """The ``metrics.json`` section and the per-pair records (``sanity.csv.gz``)."""
        steps = []
        for step, name in enumerate(["original", *(s.name for s in self.steps)]):
            at = records["step"] == step
            per_class = {value: class_means(records[value][at], records["class"][at], len(classes))[0]
                         for value in SIMILARITIES}
            steps.append({
                "step": step, "layers": name,
                "parameters": 0 if step == 0 else len(self.steps[step - 1].parameters),
                **{value: json_number(macro_mean(per_class[value])) for value in SIMILARITIES},
                "grounding": {metric: json_number(grounding[step][f"macro/{metric}"]) for metric in STEP_GROUNDING},
            })
        last = records["step"] == len(self.steps)
        cls = records["class"][last]
        final = {value: class_means(records[value][last], cls, len(classes)) for value in SIMILARITIES}
        section = {
            "applicable": True,
            "images_requested": self.images,
            "images": int(torch.unique(records["index"]).numel()),
            "pairs": int(last.sum()),
            "seed": self.seed,
            "undefined_spearman": int(records["spearman"][last].isnan().sum()),
            # after the last step: every layer group randomised
            "macro": {value: json_number(macro_mean(final[value][0])) for value in SIMILARITIES},
            "per_class": {key: {"pairs": int((cls == c).sum()),
                                **{value: json_number(final[value][0][c]) for value in SIMILARITIES}}
                          for c, key in enumerate(classes)},
            "steps": steps,
        }
        return section, {name: records[name] for name in ("index", "class", "step", *SIMILARITIES)}


#: The largest side of the cascade's saved maps (``sanity_maps.npz``, the report's strip of maps).
STRIP_SIDE = 128


def strip_pair(kept: list[dict]) -> tuple[int, int, int] | None:
    """(part, row, class) of the pair whose maps the cascade saves: the first graded pair of the
    first kept image (``None`` when none was kept)."""
    for p, part in enumerate(kept):
        graded = part["has_mask"].nonzero().tolist()
        if graded:
            return p, *graded[0]
    return None


def _shrunk(values: Tensor, nearest: bool = False) -> Tensor:
    """Maps [n, S, S] at most `STRIP_SIDE` on a side (area average; ``nearest`` for masks)."""
    if values.shape[-1] <= STRIP_SIDE:
        return values.float()
    size = (STRIP_SIDE, STRIP_SIDE)
    if nearest:
        return F.interpolate(values[:, None].float(), size=size, mode="nearest")[:, 0]
    return F.adaptive_avg_pool2d(values[:, None].float(), size)[:, 0]


def strip_arrays(part: dict, row: int, c: int, maps: Tensor, classes: list[str], layers: list[str]) -> dict:
    """The saved cascade of one pair: its radiograph, region and normalised map at every step, uint8
    at most `STRIP_SIDE` on a side, with the steps' layers (``sanity_maps.npz``)."""
    as_bytes = lambda values: (values.clamp(0, 1) * 255).round().to(torch.uint8).numpy()  # noqa: E731
    return {"image_id": np.array(part["image_id"][row]), "finding": np.array(classes[c]),
            "image": as_bytes(_shrunk(part["image"][row, :1]))[0],
            "mask": _shrunk(part["masks"][row, c][None], nearest=True)[0].to(torch.uint8).numpy(),
            "maps": as_bytes(_shrunk(maps)), "layers": np.array(layers)}


@torch.no_grad()
def restore(model: nn.Module, snapshot: dict[str, Tensor]) -> None:
    """Put back every parameter and buffer of ``model`` from ``snapshot`` (by name)."""
    for name, value in [*model.named_parameters(), *model.named_buffers()]:
        if name in snapshot:
            value.copy_(snapshot[name])
