"""Golden parity: CheXzero's whole path in XBench equals its authors' code.

``tests/golden/chexzero.npz`` holds what ``tools/parity/chexzero.py`` computed with the authors'
own code (``rajpurkarlab/CheXzero``: their HDF5 letterbox, Dataset, transform, tokenizer, model and
score) from the seeded random weights ``xbench.models.random_weights.write_chexzero`` writes (ViT-B/32
at 2 vision blocks, 1 text block) and three real radiographs (a square NIH PNG, two non-square
CheXlocalize JPEGs). Here XBench runs from the image file: decode, the model's ``preprocess``, the
network, the score and the map. Measured when the golden file was made: logits within 1.5e-7,
maps 1.3e-7, windows exact; the bounds (``conftest.PARITY_*``) leave room for another machine's float order only.
"""

from __future__ import annotations

import json

import pytest

from conftest import assert_whole_path_matches_golden, read_golden
from xbench.models import random_weights
from xbench.models.chexzero import CheXzero


@pytest.fixture(scope="module")
def golden():
    return read_golden("chexzero")


@pytest.fixture(scope="module")
def model(golden, tmp_path_factory):
    meta = json.loads(str(golden["meta"]))
    folder = tmp_path_factory.mktemp("chexzero")
    arch = random_weights.register_small_chexzero(folder / "arch")
    assert meta["arch"] == random_weights.SMALL_CHEXZERO_CONFIG, "the golden file was made with another architecture"
    random_weights.write_chexzero(folder / "weights", arch=arch, seed=meta["seed"])
    built = CheXzero(checkpoint_dir=str(folder / "weights"), arch=arch, results_dir=None)
    built.build([str(key) for key in golden["classes"]])
    return built.eval()


@pytest.mark.parametrize("index", range(3))
def test_whole_path_equals_the_authors(golden, model, real_data, index):
    assert_whole_path_matches_golden(model, golden, real_data, index)
