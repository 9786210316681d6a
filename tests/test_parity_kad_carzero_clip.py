"""Golden parity: KAD (224, 512), CARZero, CLIP and BiomedCLIP equal their authors' code.

``tests/golden/<model>.npz`` holds what the authors' own code computed (``tools/parity/``) from the
seeded random weights ``tools/parity/common.py`` writes and three real radiographs (a square NIH
PNG, two non-square CheXlocalize JPEGs). Here XBench's whole path runs from the image file --
decode, the model's own preprocessing, the network, the map placement -- and must agree:

- logits to 1e-4;
- raw maps to 1e-4 of each map's spread (max - min: the scale of the min-max normalised map the
  metrics see; the attention maps are ~1/196 in absolute terms);
- the window the input covers in the metric frame to 1e-3 frame pixels;
- the map upsampled onto the input by the model's rule to the golden's, which the authors' rule
  made (stored in float16: its rounding, 2^-11 of the value, is allowed on top).

Measured when the goldens were made, with the data side's ``Preprocess`` on the decoded file and
XBench's networks (the models' ``preprocess`` configs as their authors' transforms): logits within
2e-6 (KAD) / 3e-8 (CARZero) / 0 (CLIP, BiomedCLIP), maps within 2e-6 of their spread, windows
exact. The 8-bit rounding of the authors' PIL/OpenCV resizes is reproduced, so no looser bound is
needed. The three inputs are named in each golden file by sha256, so a changed image fails rather
than compares against another's numbers.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import real_file
from xbench.data.io import read_image
from xbench.models.biomedclip import BiomedCLIP
from xbench.models.carzero import CARZero
from xbench.models.clip import CLIP
from xbench.models.kad import KAD
from xbench.models.saliency import place_in_frame

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "parity"))
import common  # noqa: E402

GOLDEN = REPO / "tests" / "golden"
LOGIT_ATOL = 1e-4
MAP_RTOL_OF_SPREAD = 1e-4
WINDOW_ATOL = 1e-3
FLOAT16_RTOL = 2.0**-11


def build(model_name: str, folder: Path):
    if model_name.startswith("kad-"):
        model = KAD(checkpoint_dir=str(folder), variant=int(model_name.removeprefix("kad-")), channels_last=False)
        model.dataset_name = common.DATASET
    else:
        model = {"carzero": CARZero, "clip": CLIP, "biomedclip": BiomedCLIP}[model_name](checkpoint_dir=str(folder))
    model.build(common.classes())
    return model.eval()


@pytest.fixture(scope="module", params=common.MODELS)
def parity(request, tmp_path_factory, real_data):
    """(model name, XBench's model on the seeded random weights, the golden file's contents)."""
    model_name = request.param
    golden, classes, meta = common.load_golden(common.golden_path(GOLDEN, model_name))
    assert classes == common.classes(), f"{model_name}: the golden file was made for {classes}"
    folder = common.write_weights(model_name, tmp_path_factory.mktemp(model_name) / "weights")
    model = build(model_name, folder)
    shutil.rmtree(folder)  # up to 900 MB at full size; the model holds its weights now
    return model_name, model, golden, meta, real_data


def test_prompts_are_the_goldens(parity):
    """The golden was computed from the prompts XBench sends now (a prompt change needs new goldens)."""
    model_name, _, _, meta, _ = parity
    assert meta["prompts"] == common.prompts(model_name)


@pytest.mark.parametrize("image", common.IMAGES)
def test_whole_path_matches_the_authors(parity, image):
    model_name, model, golden, _, real_data = parity
    path = real_file(real_data, image)
    key = common.image_key(path)
    assert key in golden, f"{path} (sha256 {key}) is not one of the inputs of tests/golden/{model_name}.npz"
    expected = golden[key]
    inputs, window = model.preprocess(read_image(path), frame=common.FRAME)
    with torch.no_grad():
        logits, maps = model(inputs[None])
    np.testing.assert_allclose(logits[0].numpy(), expected["logits"], rtol=0, atol=LOGIT_ATOL)

    spread = expected["maps"].max(axis=(1, 2), keepdims=True) - expected["maps"].min(axis=(1, 2), keepdims=True)
    error = np.abs(maps[0].float().numpy() - expected["maps"]) / spread
    assert error.max() <= MAP_RTOL_OF_SPREAD, f"{model_name} {image}: raw maps off by {error.max():.2e} of their spread"

    np.testing.assert_allclose(np.asarray(window, dtype=np.float32), expected["window"], rtol=0, atol=WINDOW_ATOL)

    # The map upsampled onto the model's input (window = the whole input) by the model's rule; for
    # KAD the input is the whole frame, so this is its placement in the frame itself.
    whole_input = torch.tensor([[0.0, 0.0, common.FRAME, common.FRAME]])
    chosen = list(common.UPSAMPLED_CLASSES)
    upsampled = place_in_frame(maps[:, chosen], whole_input, (common.FRAME, common.FRAME), model.preprocess.map_upsample)
    reference = expected["upsampled"].astype(np.float32)
    allowed = MAP_RTOL_OF_SPREAD * spread[chosen] + FLOAT16_RTOL * np.abs(reference)
    excess = np.abs(upsampled[0].numpy() - reference) - allowed
    assert excess.max() <= 0, f"{model_name} {image}: the upsampled map departs from the authors' rule"
