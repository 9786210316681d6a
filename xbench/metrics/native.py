"""Peers' native-resolution protocols: cheXlocalize's beside XBench's, and hi-ml's phrase grounding.

hi-ml (BioViL's ``ImageTextInferenceEngine``) places a map at the image's native resolution
(`himl_native_saliency`) and leaves the pixels outside the model's centre crop out (NaN);
a phrase run with ``--model.phrase_protocol hi-ml`` scores its queries there, against their boxes
drawn at that size (``xbench.models.base``).


cheXlocalize upsamples a raw map bilinearly (``align_corners=False``) to the radiograph's own size,
min-max normalises it, and compares it with the radiologist mask drawn at that size. Here the
same map gives, on the same pixels:

- XBench's definitions: Dice and IoU at the 101 thresholds (``s >= tau_k``, from
  `threshold_counts`) and the Pointing Game with symmetric ties,
  on the map in float32 (as in the frame);
- cheXlocalize's binarisations, as extra, separately named values, computed as their
  ``heatmap_to_segmentation.py`` does, in the saved map's own precision (float64 stays float64):
  IoU at a fixed threshold with its strict ``s > t``; IoU of its Otsu segmentation
  (`otsu_segmentation`: Otsu's level of the 8-bit map ``uint8(255 s)``, the contours of
  ``levels > level`` filled, single-point contours dropped); and its hit, the first maximum in
  row-major order (``np.argmax``) inside the mask.

Per-class thresholds chosen on validation are XBench's calibrated tau: read the IoU curve at the
tau a validation run chose (``xbench.report``), no separate binarisation is needed.

cheXlocalize's code compares a float32 map with a tuned threshold read from a CSV (a float64
scalar); numpy before 2.0 (their pins) compares in float32, as here; numpy 2 in float64.

Which pairs enter their means is their ``eval.py``'s, with its defaults: an IoU is NaN, left out
of the finding's mean, where the predicted segmentation or the radiologist mask is empty
(``calculate_iou`` with ``--true_pos_only True``), and a hit is NaN where the mask is empty
(``get_hitrates``). [`ChexlocalizeRecords`][xbench.metrics.native.ChexlocalizeRecords] keeps one row
per pair and counts the pairs each rule left out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import Tensor
from torchmetrics.utilities import dim_zero_cat

from xbench.geometry.maps import as_float32, near_constant, normalise, place_in_frame, seen_pixels
from xbench.geometry.preprocess import MapUpsample, Preprocess
from xbench.metrics.common import MetricValues, RecordsMetric
from xbench.metrics.grounding import FIXED_TAU_INDEX, threshold_counts

#: ``F.interpolate``'s mode and ``align_corners`` for each map rule, as hi-ml calls it (its
#: ``nearest`` is torch's: source cell ``floor(i * cells / size)``).
HIML_INTERPOLATION = {"nearest": ("nearest", None), "bilinear": ("bilinear", False),
                      "bilinear_align_corners": ("bilinear", True)}


def native_upsample(raw_map: Tensor, image_size: tuple[int, int]) -> Tensor:
    """A raw map [h, w] over the whole image -> [height, width] at the native ``image_size``,
    bilinear with ``align_corners=False`` (cheXlocalize's ``F.interpolate`` call), in float64 for a
    float64 map and float32 otherwise."""
    raw = raw_map if raw_map.dtype == torch.float64 else raw_map.float()
    return F.interpolate(raw[None, None], size=tuple(image_size), mode="bilinear", align_corners=False)[0, 0]


def otsu_threshold(levels: Tensor) -> int:
    """Otsu's threshold of uint8 ``levels`` as OpenCV's ``THRESH_OTSU`` finds it (cheXlocalize's call)."""
    level, _ = cv2.threshold(np.ascontiguousarray(levels.numpy()), 0, 255, cv2.THRESH_OTSU)
    return int(level)


def fill_contours(binary: np.ndarray) -> np.ndarray:
    """cheXlocalize's segmentation of a binary map: every contour OpenCV finds (outer and hole
    boundaries, ``RETR_TREE``, ``CHAIN_APPROX_SIMPLE``) of more than one point, drawn as a polygon
    filled with its outline by Pillow. So holes are filled and single-pixel components dropped."""
    contours, _ = cv2.findContours(binary.astype(np.uint8), cv2.RETR_TREE, cv2.CHAIN_APPROX_SIMPLE)
    canvas = Image.new("1", (binary.shape[1], binary.shape[0]))
    draw = ImageDraw.Draw(canvas)
    for contour in contours:
        if len(contour) > 1:
            draw.polygon([tuple(point) for point in contour[:, 0].tolist()], fill=1, outline=1)
    return np.array(canvas, dtype=bool)


def otsu_segmentation(saliency: Tensor) -> tuple[int, Tensor]:
    """cheXlocalize's Otsu segmentation of a min-max normalised map [H, W] (in its own precision):
    the level of ``uint8(255 s)`` (truncation, as numpy's cast) and the filled contours of the
    pixels above it (`fill_contours`), bool [H, W]."""
    levels = (saliency * 255).to(torch.uint8)
    level = otsu_threshold(levels)
    return level, torch.from_numpy(fill_contours((levels > level).numpy()))


def true_positive_iou(predicted: Tensor, mask: Tensor) -> float:
    """IoU of two bool masks as cheXlocalize's ``calculate_iou`` with its default
    ``true_pos_only=True``: NaN (left out of the mean) where either is empty."""
    if not predicted.any() or not mask.any():
        return float("nan")
    return (predicted & mask).sum().item() / (predicted | mask).sum().item()


def chexlocalize_segmentations(raw_map: Tensor, image_size: tuple[int, int], fixed_threshold: float = 0.5
                               ) -> dict[str, Tensor | int]:
    """cheXlocalize's binarisations of a raw map [h, w] at the native ``image_size``, in the map's
    precision: the ``upsampled`` raw map, its min-max ``normalised`` form (bitwise as their ``(x -
    min) / max(x - min)``), the ``fixed`` segmentation (``s > fixed_threshold``), the ``otsu_level``
    and the ``otsu`` segmentation (`otsu_segmentation`)."""
    upsampled = native_upsample(raw_map, image_size)
    normalised = normalise(upsampled[None, None])[0, 0]
    level, otsu = otsu_segmentation(normalised)
    return {"upsampled": upsampled, "normalised": normalised, "fixed": normalised > fixed_threshold,
            "otsu_level": level, "otsu": otsu}


def native_counts(saliency: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """XBench's counts of a normalised map [H, W] on a bool mask [H, W] at native size, float64
    [101] each: ``|B_k|`` and ``|B_k & R|`` at the 101 thresholds (`threshold_counts`)."""
    predicted, inter = threshold_counts(saliency[None, None], mask.bool()[None, None])
    return predicted[0, 0].double(), inter[0, 0].double()


def xbench_iou_and_hit(saliency: Tensor, mask: Tensor) -> tuple[float, float]:
    """XBench's IoU at τ = 0.5 and Pointing Game hit (1 or 0) of a normalised map [H, W] on a bool
    mask [H, W], at native size: the first two of [`CHEXLOCALIZE_COLUMNS`][xbench.metrics.native.CHEXLOCALIZE_COLUMNS]."""
    predicted, inter = native_counts(saliency, mask)
    region = inter[0]
    k = FIXED_TAU_INDEX
    return float(inter[k] / (predicted[k] + region - inter[k])), float(inter[-1] > 0)


def native_pair_scores(raw_map: Tensor, mask: Tensor, fixed_threshold: float = 0.5) -> dict[str, float | Tensor]:
    """Both protocols for one pair: ``raw_map`` [h, w] over the whole image, ``mask`` bool [H, W] native.

    Returns XBench's ``dice`` and ``iou`` curves (float64 [101]) and ``hit``; cheXlocalize's
    ``iou_fixed`` (``s > fixed_threshold``), ``otsu_level`` and ``iou_otsu`` (its Otsu
    segmentation, `otsu_segmentation`), each NaN where the segmentation or the mask is empty
    ([`true_positive_iou`][xbench.metrics.native.true_positive_iou]), and ``argmax_hit``. XBench's
    values read the map in float32, as in the frame ([`as_float32`][xbench.geometry.maps.as_float32]).
    """
    mask = mask.bool()
    theirs = chexlocalize_segmentations(raw_map, tuple(mask.shape), fixed_threshold)
    ours = theirs["normalised"]
    if ours.dtype != torch.float32:
        ours = normalise(native_upsample(as_float32(raw_map[None, None])[0, 0], tuple(mask.shape))[None, None])[0, 0]
    predicted, inter = native_counts(ours, mask)
    region = inter[0]
    first_max = int(torch.argmax(theirs["upsampled"].flatten()))  # the first maximum, as np.argmax
    return {
        "dice": 2 * inter / (predicted + region),
        "iou": inter / (predicted + region - inter),
        "hit": bool(inter[-1] > 0),
        "iou_fixed": true_positive_iou(theirs["fixed"], mask),
        "otsu_level": theirs["otsu_level"],
        "iou_otsu": true_positive_iou(theirs["otsu"], mask),
        "argmax_hit": bool(mask.flatten()[first_max]),
    }


def model_row(raw_map: Tensor, mask: Tensor, fixed_threshold: float) -> tuple[float, ...]:
    """A model's row of [`CHEXLOCALIZE_COLUMNS`][xbench.metrics.native.CHEXLOCALIZE_COLUMNS] for one
    pair: its raw map [h, w] over the whole image against the native ``mask`` (`native_pair_scores`)."""
    scores = native_pair_scores(raw_map, mask, fixed_threshold)
    return (float(scores["iou"][FIXED_TAU_INDEX]), float(scores["hit"]), scores["iou_fixed"], scores["iou_otsu"],
            float(scores["argmax_hit"]))


#: The values of a [`ChexlocalizeRecords`][xbench.metrics.native.ChexlocalizeRecords] row, each a
#: finding's mean in ``metrics.json`` and a column of the results folder's ``chexlocalize_pairs.csv.gz``.
#: A human reader's row (`xbench.metrics.human_benchmark.reader_row`) holds its segmentation's IoU in
#: both of cheXlocalize's IoU columns: a drawn segmentation needs no binarisation.
CHEXLOCALIZE_COLUMNS = ("xbench_iou@0.5", "xbench_pointing_game", "chexlocalize_iou_fixed", "chexlocalize_iou_otsu",
                        "chexlocalize_hit_rate")
#: The columns cheXlocalize's ``true_pos_only`` leaves a pair out of (NaN: an empty segmentation).
TRUE_POSITIVE_ONLY = ("chexlocalize_iou_fixed", "chexlocalize_iou_otsu")
#: The columns their percentage decrease reads: the IoU of their default segmentation (Otsu's, their
#: ``heatmap_to_segmentation.py`` without ``--threshold_path``) and their hit.
PERCENTAGE_DECREASE_COLUMNS = {"miou": "chexlocalize_iou_otsu", "hitrate": "chexlocalize_hit_rate"}
#: The columns holding a hit, 0 or 1 (the others: a fraction in [0, 1]; their IoUs NaN where left out).
HIT_COLUMNS = ("xbench_pointing_game", "chexlocalize_hit_rate")


class ChexlocalizeRecords(RecordsMetric):
    """cheXlocalize's protocol at native size, one row per (sample, finding) pair with a region.

    ``update(mask bool [H, W], class_index, index, row)`` records ``row()``: a model's
    (`model_row`, with its raw map) or a human reader's
    (`xbench.metrics.human_benchmark.reader_row`, with its marks). A mask empty at native size is counted under
    ``empty_masks`` (their IoU and hit are NaN there; XBench grades no empty region) and gives no
    row. A row holds the sample's ``index`` in the split, its class and
    [`CHEXLOCALIZE_COLUMNS`][xbench.metrics.native.CHEXLOCALIZE_COLUMNS], an IoU NaN where their
    ``true_pos_only`` leaves the pair out. Rows sync by concatenation, so each process scores only
    its own samples.
    """

    full_state_update = False

    def __init__(self, num_classes: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("empty_masks", torch.zeros(num_classes, dtype=torch.int64), dist_reduce_fx="sum")
        self._add_record_states()

    def record_layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"ch_index": ((), torch.int64), "ch_class": ((), torch.int64),
                "ch_scores": ((len(CHEXLOCALIZE_COLUMNS),), torch.float64)}

    def update(self, mask: Tensor, class_index: int, index: int, row: Callable[[], Sequence[float]]) -> None:
        """Count an empty ``mask``, else record ``row()`` (the pair's values in
        [`CHEXLOCALIZE_COLUMNS`][xbench.metrics.native.CHEXLOCALIZE_COLUMNS]' order), scored only then."""
        if not mask.any():
            self.empty_masks[class_index] += 1
            return
        self.ch_index.append(torch.tensor([index], device=self.device))
        self.ch_class.append(torch.tensor([class_index], device=self.device))
        self.ch_scores.append(torch.tensor([row()], dtype=torch.float64, device=self.device))

    def compute(self) -> MetricValues:
        return MetricValues({"empty_masks": self.empty_masks, "index": dim_zero_cat(self.ch_index),
                             "class": dim_zero_cat(self.ch_class), "scores": dim_zero_cat(self.ch_scores)})


def chexlocalize_records(values: MetricValues) -> dict[str, Tensor]:
    """A [`ChexlocalizeRecords`][xbench.metrics.native.ChexlocalizeRecords]' rows as the results
    folder's per-pair records (``index``, ``class``, one column per value), which it writes as
    ``chexlocalize_pairs.csv.gz``."""
    scores = values["scores"]
    return {"index": values["index"], "class": values["class"],
            **{name: scores[:, k] for k, name in enumerate(CHEXLOCALIZE_COLUMNS)}}


def chexlocalize_means(values: MetricValues, classes: list[str]) -> dict[str, dict]:
    """Per finding (those with a pair scored or an empty mask): ``pairs`` graded, ``empty_masks``
    left out, the mean of each of [`CHEXLOCALIZE_COLUMNS`][xbench.metrics.native.CHEXLOCALIZE_COLUMNS]
    over the pairs where it is defined (``None`` where none is; pandas' ``mean`` as their
    ``eval.py`` takes it) and, for their IoUs, the pairs their ``true_pos_only`` left out
    (``<column>_left_out``)."""
    per_class = {}
    for c, key in enumerate(classes):
        rows = values["scores"][values["class"] == c].cpu()
        empty = int(values["empty_masks"][c])
        if not len(rows) and not empty:
            continue
        entry: dict = {"pairs": len(rows), "empty_masks": empty}
        for column, name in enumerate(CHEXLOCALIZE_COLUMNS):
            defined = rows[:, column][~rows[:, column].isnan()]
            entry[name] = float(defined.mean()) if len(defined) else None
            if name in TRUE_POSITIVE_ONLY:
                entry[f"{name}_left_out"] = len(rows) - len(defined)
        per_class[key] = entry
    return per_class


def himl_window(preprocess: Preprocess | None, image_size: tuple[int, int]) -> tuple[int, int, int, int] | None:
    """Where hi-ml's ``convert_similarity_to_image_size`` puts a map on an image of ``image_size``
    (height, width): (top, left, height, width) in native pixels. A shorter-side resize to ``R``
    and a centre crop of ``C``: the square of side ``int(C * shorter / R)``, its margins split
    ``floor`` before, ``ceil`` after; no crop (a map over the whole image): the whole image.
    ``None`` where hi-ml has no rule (a letterboxed or squashed-and-cropped input)."""
    height, width = image_size
    if preprocess is None or (preprocess.resize == "squash" and preprocess.target == preprocess.size):
        return 0, 0, height, width
    if preprocess.resize != "shorter_side":
        return None
    side = int(preprocess.size * min(height, width) / preprocess.target)
    return (height - side) // 2, (width - side) // 2, side, side


def himl_native_saliency(maps: Tensor, preprocess: Preprocess | None, window: Tensor | None, frame: tuple[int, int],
                         image_size: tuple[int, int], rule: MapUpsample) -> tuple[Tensor, Tensor]:
    """One image's raw maps [1, K, h, w] placed at its native ``image_size`` as hi-ml does and
    min-max normalised (a map that points nowhere all zeros), and the pixels the model saw [1, H, W].

    The maps are interpolated onto `himl_window` by the model's rule (``F.interpolate``, as
    hi-ml); the pixels outside, NaN in hi-ml's map, take the minimum of the pixels inside (so the
    normalised map is hi-ml's, min-max normalised over its pixels that are not NaN) and are not seen. Where
    hi-ml has no rule, the model's own ``window`` [4] in the ``frame`` (the batch's; ``None`` only
    for a model without a preprocess, which hi-ml's rule covers) is scaled to native pixels and the
    maps placed through it (`place_in_frame`).
    """
    height, width = image_size
    placement = himl_window(preprocess, image_size)
    if placement is None:
        scale = torch.tensor([height / frame[0], width / frame[1]] * 2, dtype=torch.float64, device=window.device)
        native = (window.double() * scale)[None]
        placed, seen = place_in_frame(maps, native, image_size, rule), seen_pixels(native, image_size)
    else:
        top, left, rows, columns = placement
        mode, align_corners = HIML_INTERPOLATION[rule]
        inner = F.interpolate(maps.float(), size=(rows, columns), mode=mode, align_corners=align_corners)
        placed = inner.amin(dim=(-2, -1), keepdim=True).expand(*maps.shape[:2], height, width).clone()
        placed[..., top : top + rows, left : left + columns] = inner
        seen = torch.zeros(1, height, width, dtype=torch.bool, device=maps.device)
        seen[:, top : top + rows, left : left + columns] = True
    saliency = normalise(placed)
    return saliency.masked_fill_(near_constant(maps)[..., None, None], 0.0), seen
