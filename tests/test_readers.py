"""The reader map rule (xbench/data/readers.py) against a brute-force drawing of the same marks."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from xbench.data.readers import MARKED_LOGIT, POINT_VALUE, REGION_VALUE, ReaderMark, ReaderSet
from xbench.data.regions import Boxes
from xbench.reads import radiograph_of, read_id


def brute_region(box, height, width, size, threshold):
    """Each frame pixel's exact covered fraction of a half-open box, by summing source pixels."""
    x1, y1, x2, y2 = box
    native = np.zeros((height, width), bool)
    native[int(y1):int(y2), int(x1):int(x2)] = True
    out = np.zeros((size, size), bool)
    coverage = np.zeros((size, size), dtype=object)
    for i in range(size):
        for j in range(size):
            total = Fraction(0)
            for r in range(height):
                overlap_r = max(Fraction(0), min(Fraction(i + 1) * height / size, r + 1) - max(Fraction(i) * height / size, r))
                if not overlap_r:
                    continue
                for c in range(width):
                    if native[r, c]:
                        overlap_c = max(Fraction(0), min(Fraction(j + 1) * width / size, c + 1) - max(Fraction(j) * width / size, c))
                        total += overlap_r * overlap_c
            coverage[i, j] = total / (Fraction(height, size) * Fraction(width, size))
            out[i, j] = coverage[i, j] >= threshold
    if native.any() and not out.any():
        best = max(coverage.ravel())
        out = coverage == best
    return out


@pytest.mark.parametrize("native", [(12, 18), (18, 12), (7, 7)])
def test_frame_maps_follow_the_rule(native):
    height, width = native
    size, threshold = 6, 0.5
    box = (1.0, 2.0, 9.0, 6.0)
    points = ((3.5, 4.2), (width - 0.5, height - 0.5))
    readers = ReaderSet("test", "reader 2 against reader 1", {
        "a": {"x": ReaderMark(1, Boxes((box,)), points), "y": ReaderMark(1, Boxes((box,))), "z": ReaderMark(0)},
    })
    logits, maps = readers.frame_maps(["a"], ["x", "y", "z", "w"], torch.tensor([[height, width]]), size, threshold)
    region = brute_region(box, height, width, size, threshold)
    expected = np.where(region, REGION_VALUE, 0.0)
    with_points = expected.copy()
    for x, y in points:
        with_points[int(y * size / height), int(x * size / width)] = POINT_VALUE
    np.testing.assert_array_equal(maps[0, 0].numpy(), with_points)
    np.testing.assert_array_equal(maps[0, 1].numpy(), expected)
    assert not maps[0, 2:].any()  # marked absent, or not marked: a constant map (a Pointing Game miss)
    assert logits.tolist() == [[MARKED_LOGIT, MARKED_LOGIT, -MARKED_LOGIT, -MARKED_LOGIT]]


def test_a_sample_without_marks_is_named():
    readers = ReaderSet("hb", "rule", {"a": {}})
    with pytest.raises(KeyError, match="reader set 'hb' has no marks for sample 'b'"):
        readers.frame_maps(["b"], ["x"], torch.tensor([[4, 4]]), 2, 0.5)


def test_read_ids_name_their_radiograph():
    assert read_id("img1", "R8") == "img1#R8"
    assert radiograph_of(read_id("img1", "R8")) == "img1"
    assert radiograph_of("img1") == "img1"
    with pytest.raises(ValueError, match="separates them"):
        read_id("a#b", "R1")
