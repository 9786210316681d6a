"""The decoded radiograph as every layer holds it: integer codes and the grey level of each code.

Made by `xbench.data.io` (from a file) or the decoded-image cache, read by a model's
[`Preprocess`][xbench.geometry.preprocess.Preprocess]: any pointwise step (8-bit rounding, a table)
runs on the levels and is looked up by the codes, so both sources give the same input bit for bit.
And `aspect_matches`: whether a size a file states is the image's, up to a resize's rounding (a
dataset's box grid, a saved output's image size).
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np


@dataclass(frozen=True, eq=False)
class CodedImage:
    """A grey radiograph as ``codes`` (uint8 or uint16 [H, W]) and ``levels`` (float32 [K], every
    code below K): the image is ``levels[codes]``. Any pointwise function of the image is that
    function of ``levels`` looked up by the codes (`look_up`), element for element."""

    codes: np.ndarray
    levels: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape

    def to_float(self) -> np.ndarray:
        """The image, float32 [H, W] in [0, 1]."""
        return self.look_up(self.levels)

    def look_up(self, table: np.ndarray) -> np.ndarray:
        """``table[codes]``: OpenCV's table look-up for 8-bit codes (several times faster than
        numpy's), numpy indexing for 16-bit codes; a look-up either way, no arithmetic."""
        if self.codes.dtype == np.uint8:
            padded = np.zeros(256, dtype=table.dtype)  # cv2.LUT takes exactly 256 entries
            padded[: len(table)] = table[:256]
            return cv2.LUT(self.codes, padded)
        return table[self.codes]


def aspect_matches(stated: tuple[int, int], actual: tuple[int, int]) -> bool:
    """Whether a stated ``(height, width)`` has the aspect ratio of an image of ``actual`` size, up
    to the rounding of a resize: with each side rounded to a whole pixel, ``h * W - w * H`` stays
    within half a pixel times the larger height plus the larger width."""
    (h, w), (height, width) = stated, actual
    return abs(h * width - w * height) <= 0.5 * (max(h, height) + max(w, width))
