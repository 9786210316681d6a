"""The saliency overlays a run keeps: the same positive pairs for every model, carried to rank 0.

Which pairs: for each class, the first ``per_class`` images (by sorted image id) that are
positive for the class and carry its region. The choice depends only on the dataset and the
class list, so every model on a dataset saves the same images and the report can set them side
by side (the paper's Fig. 2) without re-running any model.

What is kept per pair, in the batch geometry: the radiograph and the normalised map as uint8
(0..255) and the region as a 0/1 uint8 mask; on a gaze dataset also the pair's gaze density
scaled to its maximum (0..255; 0 where the pair has no gaze) and whether it has one. Under DDP
each process records the pairs it evaluates; the states are concatenated on sync, so rank 0 holds
them all.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat

from xbench.data.base import Sample
from xbench.metrics.common import MetricValues, RecordsMetric


def choose_overlay_pairs(samples: Sequence[Sample], classes: Sequence[str], per_class: int) -> dict[str, list[int]]:
    """``image_id -> [class index, ...]``: per class the first ``per_class`` positive images with a
    region, taking images in sorted order of their id."""
    chosen: dict[str, list[int]] = defaultdict(list)
    ordered = sorted(samples, key=lambda sample: sample.image_id)
    for c, key in enumerate(classes):
        positives = [s for s in ordered if s.labels.get(key) == 1 and key in s.regions]
        for sample in positives[:per_class]:
            chosen[sample.image_id].append(c)
    return dict(chosen)


def to_uint8(values: Tensor) -> Tensor:
    """[0, 1] floats -> 0..255 (rounded)."""
    return (values.float().clamp(0, 1) * 255).round().to(torch.uint8)


class OverlayRecords(RecordsMetric):
    """Image, normalised map and region of the chosen pairs (see the module docstring).

    Args:
        chosen: ``image_id -> class indices`` from `choose_overlay_pairs`.
        size: side of the batch geometry.
        gaze: the batches carry gaze (a gaze dataset): keep each pair's gaze density too.
    """

    full_state_update = False

    def __init__(self, chosen: dict[str, list[int]], size: int, gaze: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.chosen = chosen
        self.size = size
        self.gaze = gaze
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        square = (self.size, self.size)
        return {
            "ov_index": ((), torch.int64),
            "ov_class": ((), torch.int64),
            "ov_image": (square, torch.uint8),
            "ov_saliency": (square, torch.uint8),
            # uint8, not bool: every backend all-gathers bytes.
            "ov_mask": (square, torch.uint8),
            **({"ov_gaze": (square, torch.uint8), "ov_has_gaze": ((), torch.uint8)} if self.gaze else {}),
        }

    def update(self, image: Tensor, saliency: Tensor, masks: Tensor, index: Tensor, image_ids: Sequence[str],
               gaze: Tensor | None = None, has_gaze: Tensor | None = None) -> None:
        """``image`` [B,1,S,S], ``saliency`` [B,C,S,S] in [0,1], ``masks`` bool [B,C,S,S], ``index`` [B];
        with ``gaze``: the batch's ``gaze`` [B,C,S,S] and ``has_gaze`` [B,C].

        The pairs are found from the batch's image ids, which live on the host, and their rows go
        to the device without waiting for it (a host-to-device copy with ``non_blocking``).
        """
        rows, cols = [], []
        for b, image_id in enumerate(image_ids):
            for c in self.chosen.get(image_id, ()):
                rows.append(b)
                cols.append(c)
        if not rows:
            return
        b = torch.tensor(rows).to(saliency.device, non_blocking=True)
        c = torch.tensor(cols).to(saliency.device, non_blocking=True)
        self.ov_index.append(index[b])
        self.ov_class.append(c)
        self.ov_image.append(to_uint8(image[b, 0]))
        self.ov_saliency.append(to_uint8(saliency[b, c]))
        self.ov_mask.append(masks[b, c].to(torch.uint8))
        if self.gaze:
            density = gaze[b, c].float()
            peak = density.flatten(1).amax(1).clamp(min=torch.finfo(torch.float32).tiny)[:, None, None]
            self.ov_gaze.append(to_uint8(density / peak))
            self.ov_has_gaze.append(has_gaze[b, c].to(torch.uint8))

    def compute(self) -> MetricValues:
        """The records of every process, ordered by (class, image index)."""
        index, cls = dim_zero_cat(self.ov_index), dim_zero_cat(self.ov_class)
        by_index = torch.argsort(index, stable=True)
        order = by_index[torch.argsort(cls[by_index], stable=True)]
        return MetricValues({
            "index": index[order],
            "class": cls[order],
            "image": dim_zero_cat(self.ov_image)[order],
            "saliency": dim_zero_cat(self.ov_saliency)[order],
            "mask": dim_zero_cat(self.ov_mask)[order],
            **({"gaze": dim_zero_cat(self.ov_gaze)[order], "has_gaze": dim_zero_cat(self.ov_has_gaze)[order]}
               if self.gaze else {}),
        })


def overlay_arrays(
    records: MetricValues, classes: Sequence[str], image_ids: Sequence[str]
) -> dict[str, np.ndarray]:
    """The records as the arrays of ``overlays.npz``: ``image_index``, ``image_id``, ``finding``
    (class key), ``image`` and ``saliency`` uint8 [N,S,S], ``mask`` bool [N,S,S]; on a gaze dataset
    also ``gaze`` uint8 [N,S,S] (the density over its maximum) and ``has_gaze`` bool [N]."""
    index = records["index"].cpu().numpy()
    return {
        "image_index": index,
        "image_id": np.asarray([image_ids[i] for i in index], dtype=str),
        "finding": np.asarray([classes[c] for c in records["class"].cpu().numpy()], dtype=str),
        "image": records["image"].cpu().numpy(),
        "saliency": records["saliency"].cpu().numpy(),
        "mask": records["mask"].cpu().numpy().astype(bool),
        **({"gaze": records["gaze"].cpu().numpy(), "has_gaze": records["has_gaze"].cpu().numpy().astype(bool)}
           if "gaze" in records else {}),
    }
