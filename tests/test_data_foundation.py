"""io, regions, transforms and the DataModule base, against hand-made answers."""

import numpy as np
import pytest
from PIL import Image

from xbench.data.base import ExactlyOnceSampler
from xbench.data.io import ImageReadError, read_image
from xbench.data.regions import Boxes, Polygons
from xbench.data.transforms import area_coverage, resize_image, resize_mask


def test_read_png_8_and_16_bit_and_rgb_grey(tmp_path):
    grey8 = np.array([[0, 128], [255, 3]], dtype=np.uint8)
    Image.fromarray(grey8).save(tmp_path / "a.png")
    np.testing.assert_array_equal(read_image(tmp_path / "a.png"), grey8 / np.float32(255))
    grey16 = np.array([[0, 4095], [65535, 1]], dtype=np.uint16)
    Image.fromarray(grey16).save(tmp_path / "b.png")
    out = read_image(tmp_path / "b.png")
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, grey16 / 65535, rtol=1e-7)
    rgb = np.repeat(grey8[..., None], 3, axis=2)
    Image.fromarray(rgb).save(tmp_path / "c.png")
    np.testing.assert_allclose(read_image(tmp_path / "c.png"), grey8 / 255, rtol=1e-6)
    Image.fromarray(np.full((8, 10), 200, np.uint8)).save(tmp_path / "d.jpg", quality=100)
    jpg = read_image(tmp_path / "d.jpg")
    assert jpg.shape == (8, 10) and abs(jpg.mean() - 200 / 255) < 2 / 255


def test_read_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.png"):
        read_image(tmp_path / "missing.png")
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(ImageReadError, match="broken.png"):
        read_image(tmp_path / "broken.png")


def test_boxes_half_open_and_clipped():
    mask, clipped = Boxes(((1, 2, 4, 3),)).to_mask(5, 6)
    expected = np.zeros((5, 6), bool)
    expected[2:3, 1:4] = True
    np.testing.assert_array_equal(mask, expected)
    assert clipped == 0
    # float corners truncate; xywh helper; a box crossing the border is clipped and counted
    mask, clipped = Boxes.from_xywh([(1.7, 0.2, 2.5, 1.1), (4.0, 3.0, 5.0, 5.0)]).to_mask(5, 6)
    expected = np.zeros((5, 6), bool)
    expected[0:1, 1:4] = True
    expected[3:5, 4:6] = True
    np.testing.assert_array_equal(mask, expected)
    assert clipped == 1
    mask, clipped = Boxes(((10, 10, 12, 12),)).to_mask(5, 6)
    assert not mask.any() and clipped == 1


def test_polygon_fill_includes_outline():
    mask, clipped = Polygons((((1, 1), (4, 1), (4, 3), (1, 3)),)).to_mask(5, 6)
    expected = np.zeros((5, 6), bool)
    expected[1:4, 1:5] = True
    np.testing.assert_array_equal(mask, expected)
    assert clipped == 0


def test_area_coverage_hand_computed():
    # 4x4 source, top-left 2x2 set, to 3x3: each output pixel spans 4/3 source pixels.
    mask = np.zeros((4, 4), bool)
    mask[:2, :2] = True
    fraction = area_coverage(mask, 3, 3) / 16
    np.testing.assert_array_equal(fraction, [[1, 0.5, 0], [0.5, 0.25, 0], [0, 0, 0]])
    # upsampling 2 -> 3: the middle output pixel straddles both source pixels half and half
    np.testing.assert_array_equal(area_coverage(np.array([[True, False]]), 1, 3) / 2, [[1, 0.5, 0]])
    binary = resize_mask(mask, 3)
    np.testing.assert_array_equal(binary.numpy(), [[1, 1, 0], [1, 0, 0], [0, 0, 0]])


def test_area_coverage_matches_brute_force_refinement():
    """Refine source and output to a common grid (each source pixel -> out_h x out_w cells, each output
    pixel -> H x W cells): the covered cells of an output pixel, counted, are its coverage in units
    of 1 / (H W) -- exactly, for down- and upsampling alike."""
    rng = np.random.default_rng(0)
    for _ in range(100):
        height, width = rng.integers(1, 40, size=2)
        out_h, out_w = rng.integers(1, 60, size=2)
        mask = rng.random((height, width)) < rng.random()
        fine = np.repeat(np.repeat(mask, out_h, axis=0), out_w, axis=1)
        expected = fine.reshape(out_h, height, out_w, width).sum(axis=(1, 3))
        np.testing.assert_array_equal(area_coverage(mask, out_h, out_w), expected)


def test_small_region_never_vanishes():
    mask = np.zeros((1024, 1024), bool)
    mask[500:502, 600:602] = True
    out = resize_mask(mask, 224)
    assert out.sum() == 1
    # 1024/224 = 4.571...: rows 500..501 fall in output row 109, columns 600..601 in output column 131
    assert out[109, 131]


def test_resize_image_whole_frame_no_crop():
    image = np.zeros((40, 80), np.float32)
    image[:, 70:] = 1.0  # a stripe at the right edge survives (no centre crop)
    out = resize_image(image, 20)
    assert out.shape == (1, 20, 20)
    assert out[0, :, -1].min() > 0.9 and out[0, :, 0].max() < 1e-6


def test_exactly_once_sampler_covers_every_index_once():
    for n in (0, 1, 7, 10):
        for world in (1, 2, 3, 4):
            seen = [i for rank in range(world) for i in ExactlyOnceSampler(n, world, rank)]
            assert sorted(seen) == list(range(n))
