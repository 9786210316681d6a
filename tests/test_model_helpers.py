"""Map normalisation, upsampling and model-input preprocessing shared by every model."""

import pytest
import torch

from xbench.models.preprocess import IMAGENET_MEAN, IMAGENET_STD, model_input
from xbench.models.saliency import normalise, upsample


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


def test_upsample_modes():
    maps = torch.arange(4.0).view(1, 1, 2, 2)
    assert torch.equal(upsample(maps, (2, 2)), maps)
    nearest = upsample(maps, (4, 4), "nearest")
    assert torch.equal(nearest[0, 0, :2, :2], torch.zeros(2, 2)) and nearest[0, 0, 3, 3] == 3
    bilinear = upsample(maps, (4, 4))
    assert bilinear[0, 0, 0, 0] == 0 and bilinear[0, 0, 3, 3] == 3 and bilinear[0, 0, 1, 1] == pytest.approx(0.75)
    with pytest.raises(ValueError, match="upsample mode"):
        upsample(maps, (4, 4), "cubic")


def test_model_input_grey_to_rgb_with_statistics():
    image = torch.rand(2, 1, 8, 8)
    out = model_input(image, 8, IMAGENET_MEAN, IMAGENET_STD)
    assert out.shape == (2, 3, 8, 8)
    for c in range(3):
        torch.testing.assert_close(out[:, c], (image[:, 0] - IMAGENET_MEAN[c]) / IMAGENET_STD[c])
    with pytest.warns(UserWarning, match="--data.image_size 16"):
        assert model_input(image, 16, IMAGENET_MEAN, IMAGENET_STD).shape == (2, 3, 16, 16)
