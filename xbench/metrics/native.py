"""cheXlocalize's protocol beside XBench's: each (image, finding) pair scored at the image's native size.

cheXlocalize upsamples a raw map bilinearly (``align_corners=False``) to the radiograph's own size,
min-max normalises it, and compares it with the radiologist mask drawn at that size. Here the
same map gives, on the same pixels:

- XBench's definitions: Dice and IoU at the 101 thresholds (``s >= tau_k``, from
  :func:`~xbench.metrics.grounding.threshold_counts`) and the Pointing Game with symmetric ties;
- cheXlocalize's binarisations, as extra, separately named values: IoU at a fixed threshold with
  its strict ``s > t``; IoU at Otsu's threshold on the 8-bit map ``uint8(255 s)`` (its
  ``cv2.THRESH_OTSU`` step; cheXlocalize then fills the contours of that binary map, which this
  pixel-wise value does not: see the README for the difference); and its hit, the first maximum in
  row-major order (``np.argmax``) inside the mask.

Per-class thresholds chosen on validation are XBench's calibrated tau: read the IoU curve at the
tau a validation run chose (``xbench.report``), no separate binarisation is needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from xbench.metrics.grounding import threshold_counts
from xbench.geometry.maps import normalise


def native_upsample(raw_map: Tensor, image_size: tuple[int, int]) -> Tensor:
    """A raw map [h, w] over the whole image -> float32 [height, width] at the native ``image_size``,
    bilinear with ``align_corners=False`` (cheXlocalize's ``F.interpolate`` call)."""
    return F.interpolate(raw_map.float()[None, None], size=tuple(image_size), mode="bilinear",
                         align_corners=False)[0, 0]


def otsu_threshold(levels: Tensor) -> int:
    """Otsu's threshold of uint8 ``levels``: the ``t`` maximising the between-class variance of
    ``levels <= t`` and ``levels > t`` (the first such ``t``, as OpenCV's ``THRESH_OTSU``)."""
    hist = torch.bincount(levels.flatten(), minlength=256).double()
    share = hist / hist.sum()
    grey = torch.arange(256, dtype=torch.float64)
    weight = share.cumsum(0)  # class "<= t"
    mean = (share * grey).cumsum(0)
    total = mean[-1]
    between = (total * weight - mean) ** 2 / (weight * (1 - weight))
    between = torch.where((weight > 0) & (weight < 1), between, -1.0)
    return int(between.argmax())


def _iou(predicted: Tensor, mask: Tensor) -> float:
    inter = (predicted & mask).sum().item()
    union = (predicted | mask).sum().item()
    return inter / union if union else float("nan")


def native_pair_scores(raw_map: Tensor, mask: Tensor, fixed_threshold: float = 0.5) -> dict[str, float | Tensor]:
    """Both protocols for one pair: ``raw_map`` [h, w] over the whole image, ``mask`` bool [H, W] native.

    Returns XBench's ``dice`` and ``iou`` curves (float64 [101]) and ``hit``; cheXlocalize's
    ``iou_fixed`` (``s > fixed_threshold``), ``otsu_level`` and ``iou_otsu`` (``uint8(255 s) >
    level``) and ``argmax_hit``. IoU of an empty mask with an empty prediction is NaN (as theirs).
    """
    mask = mask.bool()
    upsampled = native_upsample(raw_map, tuple(mask.shape))
    saliency = normalise(upsampled[None, None])[0, 0]  # bitwise as cheXlocalize's (x - min) / max(x - min)
    predicted, inter = threshold_counts(saliency[None, None], mask[None, None])
    predicted, inter = predicted[0, 0].double(), inter[0, 0].double()
    region = inter[0]
    levels = (saliency * 255).to(torch.uint8)  # truncation, as numpy's uint8 cast in cheXlocalize
    level = otsu_threshold(levels)
    first_max = int(torch.argmax(upsampled.flatten()))  # the first maximum of the raw map, as np.argmax
    return {
        "dice": 2 * inter / (predicted + region),
        "iou": inter / (predicted + region - inter),
        "hit": bool(inter[-1] > 0),
        "iou_fixed": _iou(saliency > fixed_threshold, mask),
        "otsu_level": level,
        "iou_otsu": _iou(levels > level, mask),
        "argmax_hit": bool(mask.flatten()[first_max]),
    }
