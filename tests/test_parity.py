"""Golden parity: MedKLIP, MAVL, KAD (224, 512), CARZero, CLIP and BiomedCLIP equal their authors' code.

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

The comparison itself is ``tools/parity/common.py``'s (``differences``), which a user also runs on
real weights and their own radiographs (``compare``; tests/golden/README.md).

Measured when the goldens were made, with the data side's ``Preprocess`` on the decoded file and
XBench's networks (the models' ``preprocess`` configs as their authors' transforms): logits within
2e-6 (KAD) / 3e-8 (CARZero) / 0 (CLIP, BiomedCLIP) / 8e-7 (MedKLIP, MAVL: their own tokenizer
file, ``[CLS]`` without ``[SEP]``), maps within 2e-6 of their spread, windows exact. The 8-bit rounding of the authors' PIL/OpenCV resizes is reproduced, so no looser bound is
needed. The three inputs are named in each golden file by sha256, so a changed image fails rather
than compares against another's numbers.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from conftest import real_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "parity"))
import common  # noqa: E402

GOLDEN = REPO / "tests" / "golden"


@pytest.fixture(scope="module", params=common.MODELS)
def parity(request, tmp_path_factory, real_data):
    """(model name, XBench's model on the seeded random weights, the golden file's contents, real data)."""
    model_name = request.param
    golden, classes, meta = common.load_golden(common.golden_path(GOLDEN, model_name))
    assert classes == common.classes(), f"{model_name}: the golden file was made for {classes}"
    folder = common.write_weights(model_name, tmp_path_factory.mktemp(model_name) / "weights")
    model = common.build_xbench(model_name, folder)
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
    found = common.differences(model, path, golden[key])
    assert found["logits"] <= common.LOGIT_ATOL, (model_name, image, found)
    assert found["maps"] <= common.MAP_RTOL_OF_SPREAD, (model_name, image, found)
    assert found["window"] <= common.WINDOW_ATOL, (model_name, image, found)
    assert found["upsampled_excess"] <= 0, (model_name, image, found)
