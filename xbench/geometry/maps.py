"""A model's map in the metric frame: whether it points anywhere, where it lies, and its scale.

Every layer shares these rules: the model's ``test_step`` applies them to each map, the metrics and
cheXlocalize's native-size protocol normalise with them, and saved outputs are placed with them.

- `near_constant`: a raw map that points nowhere, decided on the model's own grid;
- `place_in_frame`: a map covering its input's window, placed into the frame by the model's
  rule (``MapUpsample``), the frame pixels the model never saw taking the map's minimum;
  `seen_pixels`: which frame pixels it saw (CNR leaves the others out);
- `normalise`: min-max to [0, 1], a constant map all zeros;
- [`as_float32`][xbench.geometry.maps.as_float32]: a map in the frame's precision, a float64
  one normalised before it is rounded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from xbench.geometry.precision import float32
from xbench.geometry.preprocess import MapUpsample

#: Float32 ulps of a map's magnitude within which its spread counts as none (`near_constant`).
NEAR_CONSTANT_ULPS = 8


def near_constant(maps: Tensor) -> Tensor:
    """Bool [B, C]: each raw map [B, C, h, w] whose spread (max - min) is within
    ``NEAR_CONSTANT_ULPS`` ulps of its magnitude (max |value|), exact constants included: ulps of
    float64 for a float64 map (a saved one), of float32 for any other.

    Such a map points nowhere. Decided on the model's own grid, before any resampling: upsampling
    a constant grid leaves differences of an ulp that min-max normalisation would stretch to [0, 1].
    """
    flat = (maps if maps.dtype == torch.float64 else maps.float()).flatten(2)
    low, high = flat.amin(-1), flat.amax(-1)
    magnitude = torch.maximum(low.abs(), high.abs())
    return (high - low) <= NEAR_CONSTANT_ULPS * torch.finfo(flat.dtype).eps * magnitude


def as_float32(maps: Tensor) -> Tensor:
    """Raw maps [B, C, h, w] in float32, the frame's precision, without losing a float64 map's detail.

    A float64 map (a saved one) is min-max normalised in float64 before it is rounded: its values
    may lie beyond float32's range (1e300 would round to infinity), or its spread below float32's
    resolution (it would round to a constant). One near-constant in float64
    ([`near_constant`][xbench.geometry.maps.near_constant]) stays constant, all zeros. Min-max
    normalisation later in the frame undoes the scaling, so the values are those of the map.
    """
    if maps.dtype != torch.float64:
        return maps.float()
    return normalise(maps).masked_fill_(near_constant(maps)[..., None, None], 0.0).float()


def whole_frame(batch: int, frame: tuple[int, int], device: torch.device) -> Tensor:
    """Windows [batch, 4] that cover the whole frame (maps of models without their own crop)."""
    windows = torch.zeros(batch, 4, device=device)
    windows[:, 2] = frame[0]
    windows[:, 3] = frame[1]
    return windows


def _window_offset(size: int, start: Tensor, extent: Tensor) -> tuple[Tensor, Tensor]:
    """Per frame pixel of one axis: its centre's offset from the window's start [B, size] (float64
    frame pixels), and whether the centre lies in the window (``0 <= offset < extent``)."""
    offset = torch.arange(size, dtype=torch.float64, device=start.device) + 0.5 - start
    return offset, (offset >= 0) & (offset < extent)


def seen_pixels(windows: Tensor, frame: tuple[int, int]) -> Tensor:
    """Bool [B, *frame]: the frame pixels whose centre lies in each sample's window (top, left,
    height, width) -- those `place_in_frame` gives the map's values; the model never saw the rest."""
    windows = windows.double()
    rows = _window_offset(frame[0], windows[:, :1], windows[:, 2:3])[1]
    columns = _window_offset(frame[1], windows[:, 1:2], windows[:, 3:4])[1]
    return rows[:, :, None] & columns[:, None, :]


def _axis_weights(size: int, start: Tensor, extent: Tensor, cells: int, mode: MapUpsample) -> tuple[Tensor, Tensor]:
    """Float64 [B, size, cells] sampling weights of one frame axis per sample, and which frame
    pixels each window covers [B, size]; built on the windows' device (no step waits for the host).

    Frame pixel centres are measured from the window's start in cells: ``nearest`` takes the cell
    the centre falls in; ``bilinear`` is ``F.interpolate(align_corners=False)`` (half-cell offset,
    edges held); ``bilinear_align_corners`` maps the window's first and last pixel centres onto the
    first and last cell centres, as ``F.interpolate(align_corners=True)``.
    """
    start, extent = start.double()[:, None], extent.double()[:, None]
    offset, inside = _window_offset(size, start, extent)
    position = offset * cells / extent  # in cells
    if mode == "nearest":
        source = position.floor()
    elif mode == "bilinear":
        source = position - 0.5
    elif mode == "bilinear_align_corners":
        source = (offset - 0.5) * (cells - 1) / (extent - 1).clamp(min=1)
    else:
        raise ValueError(f"map upsampling must be 'nearest', 'bilinear' or 'bilinear_align_corners'; got {mode!r}")
    source = source.clamp(0, cells - 1)
    low = source.floor()
    fraction = (source - low).unsqueeze(-1)
    high = (low + 1).clamp(max=cells - 1)
    weights = F.one_hot(low.long(), cells) * (1 - fraction) + F.one_hot(high.long(), cells) * fraction
    return weights.masked_fill_(~inside.unsqueeze(-1), 0), inside


def place_in_frame(maps: Tensor, windows: Tensor, frame: tuple[int, int], mode: MapUpsample = "bilinear") -> Tensor:
    """Maps [B, C, h, w], each covering its sample's window of the frame -> maps [B, C, *frame].

    ``windows`` [B, 4] are (top, left, height, width) in frame pixels (``model_input``'s window in
    the batch; `whole_frame` for maps of the whole image). Each frame pixel whose centre lies
    in the window takes the map's value there by ``mode``; the rest of the frame, which the model
    never saw, takes the map's minimum, so it cannot attract the maximum. Float32, also under
    mixed precision.
    """
    maps = maps.float()
    rows, inside_rows = _axis_weights(frame[0], windows[:, 0], windows[:, 2], maps.shape[-2], mode)
    columns, inside_columns = _axis_weights(frame[1], windows[:, 1], windows[:, 3], maps.shape[-1], mode)
    with float32(maps):
        placed = rows.float().unsqueeze(1) @ maps @ columns.float().transpose(1, 2).unsqueeze(1)
    covered = (inside_rows[:, :, None] & inside_columns[:, None, :]).unsqueeze(1)
    return torch.where(covered, placed, maps.amin(dim=(-2, -1), keepdim=True))


def normalise(maps: Tensor) -> Tensor:
    """Min-max normalise each (image, class) map of [B, C, H, W] to [0, 1].

    The maximum becomes exactly 1 and the minimum exactly 0 (``(x - lo) / (hi - lo)`` is exact at
    both ends); a constant map becomes all zeros, never NaN.
    """
    flat = maps.flatten(2)
    # amin and amax, not aminmax(dim=...): on CPU the fused one is about 7x slower along a long last dim.
    low, high = flat.amin(dim=-1, keepdim=True), flat.amax(dim=-1, keepdim=True)
    spread = high - low
    # A constant map has x - low == 0 everywhere, and 0 / 1 keeps it 0: no full-size select needed.
    # Dividing in place saves a second full-size buffer (at native size, its page faults cost as
    # much as the division).
    return (flat - low).div_(torch.where(spread > 0, spread, 1.0)).view_as(maps)


def as_relevance(saliency: Tensor) -> Tensor:
    """Normalised maps [..., H, W] as relevance for Quantus' families (``xbench.metrics.map_quality``,
    ``xbench.checks.robustness``): a constant map (all zeros after normalisation) is uniform relevance,
    all ones -- what Quantus' normalisation by the maximum makes of a constant map -- so that its
    mass, ranks and entropy are those of a map that points nowhere, not 0 / 0."""
    constant = saliency.flatten(-2).amax(-1) == 0
    return torch.where(constant[..., None, None], torch.ones_like(saliency), saliency)
