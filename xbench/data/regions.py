"""Radiologist regions and their rasterisation at the image's native size.

A region knows how to draw itself on an ``height x width`` grid; it returns the mask and the
number of its shapes that reached outside the image and had to be clipped. Pixel ``(row, col)``
covers ``[col, col + 1) x [row, row + 1)`` in image coordinates (origin top-left, x right, y down).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
from PIL import Image, ImageDraw
from pycocotools import mask as coco_mask

from xbench.files import regular_file
from xbench.geometry.image import aspect_matches


class Region(Protocol):
    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        """Bool mask [height, width] and the number of shapes clipped at the image border."""


@dataclass(frozen=True)
class Boxes:
    """Axis-aligned boxes ``(x1, y1, x2, y2)``, half-open: columns ``[x1, x2)``, rows ``[y1, y2)``.

    Float corners are truncated to the pixel grid (``floor``), as the datasets' reference loaders
    do; a box with positive width keeps at least one column (likewise rows).
    """

    xyxy: tuple[tuple[float, float, float, float], ...]

    @classmethod
    def from_xywh(cls, boxes) -> Boxes:
        return cls(tuple((x, y, x + w, y + h) for x, y, w, h in boxes))

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        mask = np.zeros((height, width), dtype=bool)
        clipped = 0
        for x1, y1, x2, y2 in self.xyxy:
            if not (x2 > x1 and y2 > y1):
                raise ValueError(f"degenerate box (x1={x1}, y1={y1}, x2={x2}, y2={y2}): need x2 > x1 and y2 > y1")
            c0, r0 = math.floor(x1), math.floor(y1)
            c1, r1 = max(math.floor(x2), c0 + 1), max(math.floor(y2), r0 + 1)
            if c0 < 0 or r0 < 0 or c1 > width or r1 > height:
                clipped += 1
            c0, c1 = max(c0, 0), min(c1, width)
            r0, r1 = max(r0, 0), min(r1, height)
            if c1 > c0 and r1 > r0:
                mask[r0:r1, c0:c1] = True
        return mask, clipped


@dataclass(frozen=True)
class Polygons:
    """Closed contours of ``(x, y)`` vertices, filled with their outline by Pillow's rasteriser
    (the rule CheXlocalize's official conversion uses)."""

    contours: tuple[tuple[tuple[float, float], ...], ...]

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        canvas = Image.new("1", (width, height), 0)
        draw = ImageDraw.Draw(canvas)
        clipped = 0
        for contour in self.contours:
            points = [(float(x), float(y)) for x, y in contour]
            if len(points) < 3:
                raise ValueError(f"a polygon needs at least 3 vertices; got {len(points)}")
            if any(x < 0 or y < 0 or x > width or y > height for x, y in points):
                clipped += 1
            draw.polygon(points, fill=1, outline=1)
        return np.array(canvas, dtype=bool), clipped


def parse_relative_rle(text: str) -> tuple[np.ndarray, np.ndarray]:
    """SIIM-ACR's relative run-length string -> the runs' flat start and end (exclusive) indices.

    The string is whitespace-separated ``offset length`` pairs; each offset counts pixels from the
    end of the previous run (the first from pixel 0). Syntax errors are ``ValueError``s.
    """
    try:
        numbers = np.array(text.split(), dtype=np.int64)
    except ValueError:
        raise ValueError(f"not a run-length string of integers: {text[:40]!r}") from None
    if numbers.size == 0 or numbers.size % 2:
        raise ValueError(f"a run-length string needs (offset, length) pairs; got {numbers.size} integers")
    offsets, lengths = numbers[0::2], numbers[1::2]
    if (offsets < 0).any() or (lengths < 1).any():
        raise ValueError("run-length offsets must be >= 0 and lengths >= 1")
    ends = np.cumsum(offsets + lengths)
    return ends - lengths, ends


@dataclass(frozen=True)
class RelativeRLE:
    """SIIM-ACR pneumothorax masks: one relative run-length string per annotated instance, united.

    Pixels are numbered in column-major order (down each column first: index = x * height + y).
    Strings are decoded only when the mask is drawn (in the DataLoader worker); ``source`` names
    the file and lines for error messages.
    """

    encodings: tuple[str, ...]
    source: str = ""

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        coverage = np.zeros(height * width + 1, dtype=np.int32)
        for text in self.encodings:
            starts, ends = parse_relative_rle(text)
            if ends[-1] > height * width:
                raise ValueError(
                    f"{self.source}: a run ends at pixel {ends[-1]}, past the {height}x{width} image "
                    f"({height * width} pixels): the RLE does not belong to this image, or is not SIIM's "
                    "relative column-major RLE"
                )
            np.add.at(coverage, starts, 1)
            np.add.at(coverage, ends, -1)
        flat = np.cumsum(coverage[:-1]) > 0
        return flat.reshape(width, height).T.copy(), 0


@dataclass(frozen=True)
class MaskFile:
    """A binary mask image (values 0 and 1) of the same size as its radiograph, read when drawn."""

    path: Path

    def read(self) -> np.ndarray:
        """The mask as bool [H, W]; a file that is not a 0/1 grey image is an error naming it."""
        try:
            with Image.open(regular_file(self.path)) as image:
                values = np.asarray(image)
        except OSError as error:
            raise ValueError(f"cannot read the mask {self.path}: {error}") from error
        if values.ndim != 2:
            raise ValueError(f"mask {self.path}: expected one grey channel, got shape {values.shape}")
        if not np.isin(values, (0, 1)).all():
            raise ValueError(f"mask {self.path}: expected values 0 and 1 only, found {np.unique(values)[:8].tolist()}")
        return values.astype(bool)

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        mask = self.read()
        if mask.shape != (height, width):
            raise ValueError(
                f"mask {self.path} is {mask.shape[1]}x{mask.shape[0]} (width x height) but its image is "
                f"{width}x{height}: masks must be drawn on the image as distributed"
            )
        return mask, 0


@dataclass(frozen=True)
class CocoRLE:
    """A mask stored as COCO run-length encoding (compressed ``counts`` string, column-major runs)
    at the image's native size, decoded by pycocotools only when drawn (in a DataLoader worker).

    ``source`` names the file and entry it came from, for the error when sizes disagree.
    """

    height: int
    width: int
    counts: str
    source: str = ""

    @classmethod
    def from_json(cls, rle: object, source: str) -> CocoRLE:
        """From ``{"size": [h, w], "counts": "<string>"}`` as pycocotools writes it to JSON."""
        try:
            height, width = (int(v) for v in rle["size"])
            counts = rle["counts"]
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{source}: expected a COCO RLE {{'size': [h, w], 'counts': str}} ({error!r})") from None
        if not isinstance(counts, str):
            raise ValueError(f"{source}: COCO RLE 'counts' must be the compressed string, got {type(counts).__name__}")
        return cls(height, width, counts, source)

    def _rle(self) -> dict:
        return {"size": [self.height, self.width], "counts": self.counts.encode("ascii")}

    def area(self) -> int:
        """Foreground pixel count, read from the runs without drawing the mask."""
        return int(coco_mask.area(self._rle()))

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        if (height, width) != (self.height, self.width):
            raise ValueError(
                f"{self.source}: the mask is {self.height}x{self.width} (height x width) but its image is "
                f"{height}x{width}; the masks must be at the image's native size (is the image from this split?)"
            )
        return coco_mask.decode(self._rle()).astype(bool), 0


@dataclass(frozen=True)
class MajorityVote:
    """Pixels inside the regions of more than half of an image's ``num_readers`` readers.

    ``readers`` holds one region per reader who drew the class; a reader who drew nothing for it
    votes against. Each reader's region is drawn at native size, then the votes are counted.
    """

    readers: tuple[Region, ...]
    num_readers: int

    def __post_init__(self) -> None:
        if not 0 < len(self.readers) <= self.num_readers:
            raise ValueError(f"{len(self.readers)} reader regions for {self.num_readers} readers")

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        votes = np.zeros((height, width), dtype=np.uint16)
        clipped = 0
        for region in self.readers:
            mask, reader_clipped = region.to_mask(height, width)
            votes += mask
            clipped += reader_clipped
        return votes * 2 > self.num_readers, clipped


@dataclass(frozen=True)
class GridBoxes:
    """Boxes annotated on a fixed ``grid_height x grid_width`` pixel grid (NIH: the 1024 x 1024
    PNGs), drawn on an image of any size by scaling x and y separately: mirrors that resize the
    PNGs keep the original box file. The image must have the grid's aspect ratio (up to a resize's
    rounding), or the boxes would be stretched unevenly; ``source`` names the file and line that
    state the grid, for that error."""

    boxes: Boxes
    grid_height: int
    grid_width: int
    source: str = field(default="", compare=False)  # where the boxes were read, not what they are

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        if not aspect_matches((self.grid_height, self.grid_width), (height, width)):
            raise ValueError(
                f"{self.source}: the boxes are on a {self.grid_width} x {self.grid_height} grid (width x height) but the "
                f"image is {width} x {height}, another aspect ratio: they would be stretched unevenly. Correct the "
                "stated size, or use the image the annotation was made on."
            )
        sx, sy = width / self.grid_width, height / self.grid_height
        scaled = Boxes(tuple((x1 * sx, y1 * sy, x2 * sx, y2 * sy) for x1, y1, x2, y2 in self.boxes.xyxy))
        return scaled.to_mask(height, width)


@dataclass(frozen=True)
class Ellipses:
    """Axis-aligned ellipses inscribed in boxes ``(x1, y1, x2, y2)`` (REFLACX's abnormality ellipses),
    united. Pixel ``(row, col)`` is inside when ``((col - cx) / ax)² + ((row - cy) / ay)² < 1``, with
    the centre ``(cx, cy)`` and semi-axes ``(ax, ay)`` of the box and the pixel's indices as its
    coordinates: the rule of ``skimage.draw.ellipse``, which the REFLACX authors draw with
    (ricbl/eye-tracking-localization, ``eyetracking_object.py``)."""

    xyxy: tuple[tuple[float, float, float, float], ...]

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        mask = np.zeros((height, width), dtype=bool)
        rows, cols = np.arange(height)[:, None], np.arange(width)[None, :]
        clipped = 0
        for x1, y1, x2, y2 in self.xyxy:
            if not (x2 > x1 and y2 > y1):
                raise ValueError(f"degenerate ellipse box (x1={x1}, y1={y1}, x2={x2}, y2={y2}): need x2 > x1 and y2 > y1")
            if x1 < 0 or y1 < 0 or x2 > width or y2 > height:
                clipped += 1
            cx, cy, ax, ay = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
            mask |= ((cols - cx) / ax) ** 2 + ((rows - cy) / ay) ** 2 < 1
        return mask, clipped


@dataclass(frozen=True)
class NormalisedBoxes:
    """Boxes whose corners are fractions of the image's width (x) and height (y), in [0, 1]
    (PadChest-GR's): drawn on an image of any size by scaling x by its width and y by its height,
    then as [`Boxes`][xbench.data.regions.Boxes] (half-open, truncated to the pixel grid)."""

    boxes: Boxes

    def to_mask(self, height: int, width: int) -> tuple[np.ndarray, int]:
        scaled = Boxes(tuple((x1 * width, y1 * height, x2 * width, y2 * height) for x1, y1, x2, y2 in self.boxes.xyxy))
        return scaled.to_mask(height, width)
