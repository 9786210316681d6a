"""A model's input made from the native image as its authors make it, stated as data.

[`Preprocess`][xbench.geometry.preprocess.Preprocess] is the one config type every model states its
authors' transform in (resize rule, filter, the library whose rounding they go through, mean/std,
histogram equalisation) and its map rule; called on the decoded native-aspect image in a DataLoader
worker it returns the model's input and the window that input covers in the metric frame. The
statistics below are written once here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import cv2
import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.v2.functional as tvF
from PIL import Image
from torch import Tensor
from torchvision.transforms import InterpolationMode

from xbench.geometry.image import CodedImage
from xbench.geometry.precision import float32

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
#: MRM/MAE chest X-ray statistics (config name ``CXR_MAE``; CARZero), one value for all channels.
CXR_MAE_MEAN = (0.4978, 0.4978, 0.4978)
CXR_MAE_STD = (0.2449, 0.2449, 0.2449)

#: How a model's map reaches the metric frame: nearest-repeat of cells, or bilinear with
#: ``align_corners`` False or True (as ``F.interpolate``).
MapUpsample = Literal["nearest", "bilinear", "bilinear_align_corners"]

#: The filters as the authors' libraries name them; ``area`` is PIL's box filter and OpenCV's INTER_AREA;
#: ``lanczos`` (PIL only) is the filter of PIL's former ``Image.ANTIALIAS``.
PIL_FILTERS = {
    "nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "area": Image.BOX,
    "lanczos": Image.LANCZOS,
}
CV2_FILTERS = {
    "nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR, "bicubic": cv2.INTER_CUBIC, "area": cv2.INTER_AREA
}
#: torchvision's filters for an 8-bit tensor, as transformers maps PIL's (its ``pil_torch_interpolation_mapping``);
#: torchvision has no box filter for tensors.
TORCHVISION_FILTERS = {
    "nearest": InterpolationMode.NEAREST_EXACT, "bilinear": InterpolationMode.BILINEAR,
    "bicubic": InterpolationMode.BICUBIC, "lanczos": InterpolationMode.LANCZOS,
}


@dataclass(frozen=True)
class Preprocess:
    """A model's authors' input transform and map rule, stated as data (one per model, as
    open_clip keeps pretrained configs). Picklable: the datamodule runs it in DataLoader workers
    on the decoded native-aspect image.

    Calling it on a native grey image [H, W] in [0, 1] (float32, or a
    `CodedImage`, which gives the same result bit for bit: every step
    before the resize is pointwise, so it runs on the code's levels) and the metric frame's side
    ``frame`` returns the model's input [3, size, size] and the window (top, left, height, width) that the
    input covers, in frame pixels (the frame is the whole radiograph squashed to frame x frame).

    Fields:
        size: side of the model's square input.
        resize: ``squash`` (both sides to ``resize_to``, aspect not kept), ``shorter_side`` (the
            shorter side to ``resize_to``, aspect kept) or ``longer_side`` (the longer side to
            ``resize_to``, the shorter zero-padded symmetrically to a square); a centre crop of
            ``size`` follows whenever the result is larger.
        resize_to: the side the resize aims at; ``None`` means ``size``.
        interpolation: the authors' resize filter.
        library: ``pil`` or ``cv2`` resize the 8-bit image as the authors' pipelines do (their
            rounding included); ``torchvision`` resizes it as an 8-bit tensor with torchvision's
            antialiased resize (transformers' default image processors since version 5); ``torch``
            resizes in float (antialiased), no 8-bit step.
        crop_rounding: the centre crop's offset, half the margin ``round``-ed (torchvision's
            ``CenterCrop``) or ``floor``-ed (transformers' image processors).
        mean, std: per-channel statistics after grey -> RGB and scaling to [0, 1].
        equalize: global histogram equalisation of the native image first (MedKLIP on RSNA DICOMs).
        map_upsample: how the model's raw map is placed onto the frame through its window.
    """

    size: int
    resize: Literal["squash", "shorter_side", "longer_side"] = "squash"
    resize_to: int | None = None
    interpolation: Literal["nearest", "bilinear", "bicubic", "area", "lanczos"] = "bilinear"
    library: Literal["pil", "cv2", "torchvision", "torch"] = "pil"
    crop_rounding: Literal["round", "floor"] = "round"
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    equalize: bool = False
    map_upsample: MapUpsample = "bilinear"

    def __post_init__(self) -> None:
        if self.size < 1 or self.target < self.size:
            raise ValueError(
                f"Preprocess: size must be positive and resize_to at least size; got size={self.size}, "
                f"resize_to={self.resize_to}"
            )
        filters = {"pil": PIL_FILTERS, "cv2": CV2_FILTERS, "torchvision": TORCHVISION_FILTERS}.get(self.library)
        if filters is not None and self.interpolation not in filters:
            raise ValueError(
                f"Preprocess: library {self.library!r} has no {self.interpolation!r} filter; "
                f"it has {', '.join(filters)}"
            )

    @property
    def target(self) -> int:
        """The side the resize aims at."""
        return self.resize_to if self.resize_to is not None else self.size

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """(rows, columns) of the resized image, with the authors' integer rounding."""
        side = self.target
        if self.resize == "squash":
            return side, side
        short, long = min(height, width), max(height, width)
        if self.resize == "shorter_side":  # torchvision Resize(int): the long side int(size * long / short)
            new_short, new_long = side, int(side * long / short)
            return (new_long, new_short) if width <= height else (new_short, new_long)
        # CARZero's letterbox: the short side int(short * (side / long)), also on a square image
        new_short, new_long = int(float(short) * (side / float(long))), side
        return (new_long, new_short) if height >= width else (new_short, new_long)

    def __call__(self, image: np.ndarray | CodedImage, frame: int) -> tuple[Tensor, Tensor]:
        """Native grey image [H, W] in [0, 1] -> (model input float32 [3, size, size], normalised;
        window float32 [4] = (top, left, height, width) of the input in the ``frame`` x ``frame``
        metric frame, which may reach outside it where the input shows padding)."""
        if len(image.shape) != 2:
            raise ValueError(f"Preprocess expects a grey native image [H, W]; got shape {image.shape}")
        height, width = image.shape
        rows, columns = self.resized_shape(height, width)
        if isinstance(image, CodedImage) and (self.equalize or self.library == "torch"):
            image = image.to_float()
        if self.equalize:
            image = equalize_histogram(torch.from_numpy(np.ascontiguousarray(image))[None, None])[0, 0].numpy()
        resized = self._resize(image, rows, columns)
        # letterbox padding, floor before and ceil after; then torchvision's CenterCrop offsets
        pad_top = (self.target - rows) // 2 if self.resize == "longer_side" else 0
        pad_left = (self.target - columns) // 2 if self.resize == "longer_side" else 0
        if self.resize == "longer_side":
            padding = (pad_left, self.target - columns - pad_left, pad_top, self.target - rows - pad_top)
            resized = F.pad(resized, padding)
        offset = round if self.crop_rounding == "round" else math.floor
        crop_top = int(offset((resized.shape[0] - self.size) / 2.0))
        crop_left = int(offset((resized.shape[1] - self.size) / 2.0))
        crop = resized[crop_top : crop_top + self.size, crop_left : crop_left + self.size]
        mean = torch.tensor(self.mean, dtype=torch.float32)[:, None, None]
        std = torch.tensor(self.std, dtype=torch.float32)[:, None, None]
        inputs = (crop.expand(3, -1, -1) - mean) / std  # grey -> RGB is replication; Normalize's float32 order
        window = torch.tensor(
            [
                (crop_top - pad_top) * frame / rows,
                (crop_left - pad_left) * frame / columns,
                self.size * frame / rows,
                self.size * frame / columns,
            ],
            dtype=torch.float32,
        )
        return inputs, window

    def _resize(self, image: np.ndarray | CodedImage, rows: int, columns: int) -> Tensor:
        """The image at rows x columns, float32 in [0, 1]: through 8 bits for ``pil``/``cv2``/``torchvision``
        (as ``ToTensor``, /255), in float for ``torch`` (a float image here)."""
        if self.library == "torch":
            x = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32))
            if (rows, columns) == tuple(x.shape):
                return x
            if self.interpolation == "area":
                return area_resize(x, rows, columns)
            if self.interpolation == "nearest":
                return F.interpolate(x[None, None], size=(rows, columns), mode="nearest-exact")[0, 0]
            resized = F.interpolate(
                x[None, None], size=(rows, columns), mode=self.interpolation, antialias=True, align_corners=False
            )
            return resized[0, 0].clamp_(0, 1)
        if isinstance(image, CodedImage):
            pixels = image.look_up(self._eight_bit(image.levels))
        else:
            pixels = self._eight_bit(image)
        if (rows, columns) != pixels.shape:
            if self.library == "pil":
                pixels = np.array(Image.fromarray(pixels).resize((columns, rows), PIL_FILTERS[self.interpolation]))
            elif self.library == "torchvision":  # one channel: the separable filter treats RGB's three alike
                resized = tvF.resize(torch.from_numpy(pixels)[None], [rows, columns],
                                     interpolation=TORCHVISION_FILTERS[self.interpolation], antialias=True)
                return resized[0].float().div(255)
            else:
                pixels = cv2.resize(pixels, (columns, rows), interpolation=CV2_FILTERS[self.interpolation])
        return torch.from_numpy(pixels).float().div(255)

    def _eight_bit(self, image: np.ndarray) -> np.ndarray:
        """8 bits as the authors hold the image: an 8-bit file's value exactly (round); after
        equalisation the authors' ``(255 * img).astype(np.uint8)`` truncates. Pointwise."""
        scaled = image * np.float32(255)
        return (np.floor(scaled) if self.equalize else np.round(scaled)).clip(0, 255).astype(np.uint8)


def area_weights(size_in: int, size_out: int, device: torch.device | None = None) -> Tensor:
    """Float64 [size_out, size_in]: the share of each input pixel in each output pixel.

    Output pixel ``o`` spans ``[o s, (o + 1) s)`` of the input with ``s = size_in / size_out``; its
    weights are the overlaps with the input pixels divided by ``s``, so each row sums to 1. This is
    OpenCV's ``INTER_AREA`` whenever both axes shrink or both grow (as in any letterbox): exact area
    averaging down, overlap blending up. Built on ``device``: no copy from the host per batch.
    """
    scale = size_in / size_out
    edges = torch.arange(size_out + 1, dtype=torch.float64, device=device) * scale
    pixels = torch.arange(size_in, dtype=torch.float64, device=device)
    overlap = torch.minimum(edges[1:, None], pixels + 1) - torch.maximum(edges[:-1, None], pixels)
    return overlap.clamp_(min=0) / scale


def area_resize(image: Tensor, height: int, width: int) -> Tensor:
    """Images [..., H, W] -> [..., height, width] by exact area weights (`area_weights`),
    in the image's dtype also under mixed precision."""
    rows = area_weights(image.shape[-2], height, image.device).to(image.dtype)
    columns = area_weights(image.shape[-1], width, image.device).to(image.dtype)
    with float32(image):
        return rows @ image @ columns.T


def equalize_histogram(image: Tensor, bins: int = 256) -> Tensor:
    """Global histogram equalisation of each image of [B, 1, H, W], as ``skimage.exposure.equalize_hist``.

    ``bins`` equal bins between the image's own minimum and maximum; each pixel becomes the
    cumulative share of pixels, linearly interpolated between bin centres (clamped outside the
    first and last centre), so the output lies in [0, 1]. A constant image is returned unchanged.
    """
    flat = image.float().flatten(1)
    low, high = torch.aminmax(flat, dim=1, keepdim=True)
    spread = high - low
    position = (flat - low) / torch.where(spread > 0, spread, torch.ones_like(spread)) * bins
    counts = torch.zeros(flat.shape[0], bins, dtype=torch.float64, device=flat.device)
    counts.scatter_add_(1, position.floor().long().clamp(0, bins - 1), torch.ones_like(flat, dtype=torch.float64))
    cdf = (counts.cumsum(1) / flat.shape[1]).to(flat.dtype)
    centre = (position - 0.5).clamp(0, bins - 1)  # in units of bins, 0 = first bin centre
    left = centre.floor().long().clamp(max=bins - 2)
    weight = centre - left
    right = (left + 1).clamp(max=bins - 1)
    equalised = torch.gather(cdf, 1, left) * (1 - weight) + torch.gather(cdf, 1, right) * weight
    return torch.where(spread > 0, equalised, flat).view_as(image)
