"""Radiologist regions and their rasterisation at the image's native size.

A region knows how to draw itself on an ``height x width`` grid; it returns the mask and the
number of its shapes that reached outside the image and had to be clipped. Pixel ``(row, col)``
covers ``[col, col + 1) x [row, row + 1)`` in image coordinates (origin top-left, x right, y down).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from PIL import Image, ImageDraw


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
