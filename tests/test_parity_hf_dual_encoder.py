"""Golden parity: MedSigLIP, XrayCLIP and XraySigLIP in XBench equal transformers' own whole path.

``tests/golden/<name>.npz`` holds what ``tools/parity/hf_dual_encoder.py`` computed with transformers'
own processor and model (``AutoProcessor``, ``AutoModel``) from the published checkpoint's config at 1
vision block and 1 text block with seeded random weights (``random_weights.write_hf_dual_encoder``),
on the three real radiographs and two extreme-aspect crops (1600 x 600 and 600 x 1600) of the larger
CheXpert JPEG. Here XBench runs from the image file: decode, the model's ``preprocess`` (translated
from the folder's processor config), the network, the score and the map. Measured when the golden
files were made: logits within 1.2e-6 (of values up to 2.7), maps 1.6e-7, windows exact; the bounds
(``conftest.PARITY_*``) leave room for another machine's float order only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import (PARITY_LOGIT_ATOL, PARITY_MAP_ATOL, PARITY_WINDOW_ATOL, assert_whole_path_matches_golden,
                      read_golden)
from xbench.data.io import read_image
from xbench.models import random_weights
from xbench.models.hf_dual_encoder import HFDualEncoder

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "parity"))
import hf_dual_encoder as parity  # noqa: E402


@pytest.fixture(scope="module", params=parity.MODELS)
def golden(request):
    return request.param, read_golden(request.param)


@pytest.fixture(scope="module")
def model(golden, tmp_path_factory):
    name, arrays = golden
    meta = json.loads(str(arrays["meta"]))
    config, preprocessor = random_weights.published_hf_dual_encoder(name, parity.VISION_LAYERS, parity.TEXT_LAYERS)
    folder = random_weights.write_hf_dual_encoder(tmp_path_factory.mktemp(name), config, preprocessor,
                                                  seed=meta["seed"])
    assert json.loads((folder / "config.json").read_text()) == meta["config"], "the golden was made from another config"
    built = HFDualEncoder(str(folder), results_dir=None)
    built.build([str(key) for key in arrays["classes"]])
    assert [list(pair) for pair in built.prompts.values()] == meta["prompts"], "the golden was made from other prompts"
    return built.eval()


@pytest.mark.parametrize("index", range(3))
def test_whole_path_equals_transformers_on_the_radiographs(golden, model, real_data, index):
    assert_whole_path_matches_golden(model, golden[1], real_data, index)


@pytest.mark.parametrize("crop", sorted(parity.CROPS))
def test_whole_path_equals_transformers_on_an_extreme_aspect_crop(golden, model, real_data, crop, tmp_path):
    arrays = golden[1]
    meta = json.loads(str(arrays["meta"]))
    path = parity.write_crop(real_data, crop, tmp_path)
    assert parity.pixel_digest(path) == meta["crops"][crop]["pixels"], f"{crop} is not the crop the golden holds"
    inputs, window = model.preprocess(read_image(path), frame=224)
    with torch.no_grad():
        logits, maps = model(inputs[None])
    np.testing.assert_allclose(window.numpy(), arrays[f"{crop}_window"], atol=PARITY_WINDOW_ATOL, rtol=0)
    np.testing.assert_allclose(logits[0].numpy(), arrays[f"{crop}_logits"], atol=PARITY_LOGIT_ATOL, rtol=0)
    np.testing.assert_allclose(maps[0].numpy(), arrays[f"{crop}_maps"], atol=PARITY_MAP_ATOL, rtol=0)
