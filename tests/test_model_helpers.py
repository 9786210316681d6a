"""Map normalisation, constancy and placement into the frame, shared by every model."""

import pytest
import torch

import torch.nn.functional as F

from xbench.geometry.maps import near_constant, normalise, place_in_frame, whole_frame


def test_normalise_exact_ends_and_constant_maps():
    maps = torch.randn(3, 4, 7, 5) * 1e3 + 17
    maps[1, 2] = 3.25  # constant
    out = normalise(maps)
    flat = out.flatten(2)
    assert torch.equal(flat[1, 2], torch.zeros(35))
    others = torch.ones(3, 4, dtype=torch.bool)
    others[1, 2] = False
    assert torch.equal(flat.amax(-1)[others], torch.ones(int(others.sum())))
    assert torch.equal(flat.amin(-1)[others], torch.zeros(int(others.sum())))
    expected = (maps[0, 0] - maps[0, 0].min()) / (maps[0, 0].max() - maps[0, 0].min())
    torch.testing.assert_close(out[0, 0], expected)


FRAME_MODES = [("nearest", {"mode": "nearest-exact"}), ("bilinear", {"mode": "bilinear", "align_corners": False}),
               ("bilinear_align_corners", {"mode": "bilinear", "align_corners": True})]


@pytest.mark.parametrize(("rule", "interpolate"), FRAME_MODES)
@pytest.mark.parametrize(("grid", "frame"), [((14, 14), (224, 224)), ((7, 5), (30, 19)), ((16, 16), (16, 16))])
def test_whole_frame_placement_equals_interpolate(rule, interpolate, grid, frame):
    """On a window that covers the frame, each map rule is F.interpolate's (float32 noise)."""
    maps = torch.rand(2, 3, *grid)
    placed = place_in_frame(maps, whole_frame(2, frame, maps.device), frame, rule)
    torch.testing.assert_close(placed, F.interpolate(maps, size=frame, **interpolate), atol=1e-6, rtol=1e-6)


def test_nearest_on_whole_multiples_repeats_cells():
    maps = torch.rand(1, 2, 14, 14)
    placed = place_in_frame(maps, whole_frame(1, (224, 224), maps.device), (224, 224), "nearest")
    assert torch.equal(placed, maps.repeat_interleave(16, -2).repeat_interleave(16, -1))


def test_each_sample_is_placed_through_its_own_window():
    """Per-sample windows: a crop's map lands on its window, the frame outside takes the minimum,
    and a window reaching outside the frame (letterbox padding) keeps only what lies inside."""
    maps = torch.arange(16.0).view(1, 1, 4, 4).repeat(2, 1, 1, 1)
    windows = torch.tensor([[2.0, 4.0, 8.0, 8.0], [-4.0, 0.0, 16.0, 16.0]])
    placed = place_in_frame(maps, windows, (16, 16), "nearest")
    first = torch.zeros(16, 16)
    first[2:10, 4:12] = maps[0, 0].repeat_interleave(2, 0).repeat_interleave(2, 1)
    assert torch.equal(placed[0, 0], first)
    second = maps[1, 0].repeat_interleave(4, 0).repeat_interleave(4, 1)[4:]
    assert torch.equal(placed[1, 0, :12], second) and torch.equal(placed[1, 0, 12:], torch.zeros(4, 16))


def test_unknown_map_rule_is_refused():
    with pytest.raises(ValueError, match="map upsampling"):
        place_in_frame(torch.rand(1, 1, 2, 2), whole_frame(1, (4, 4), None), (4, 4), "cubic")


def test_near_constant_maps():
    """Exactly constant and within a few float32 ulps of the magnitude: constant; a real spread,
    however small against 1, is not."""
    maps = torch.rand(1, 5, 14, 14)
    maps[0, 0] = 0.3
    maps[0, 1] = 0.0
    maps[0, 2] = 1 / 196 + torch.randint(-2, 3, (14, 14)) * torch.finfo(torch.float32).eps / 196
    maps[0, 3] = -7.5
    maps[0, 3, 0, 0] = -7.5 + 1e-5
    assert near_constant(maps).tolist() == [[True, True, True, False, False]]


def test_loading_a_bert_prints_no_progress_bar_and_restores_the_setting(tmp_path, capfd):
    """transformers draws a "Loading weights" bar for every BERT: noise a user cannot act on (issue 23.11)."""
    from transformers.utils import logging as hf_logging

    from xbench.models.random_weights import write_bert
    from xbench.models.text import load_pretrained_bert

    write_bert(tmp_path / "bert")
    capfd.readouterr()
    assert hf_logging.is_progress_bar_enabled()
    load_pretrained_bert(tmp_path / "bert", "a test BERT")
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert hf_logging.is_progress_bar_enabled()
