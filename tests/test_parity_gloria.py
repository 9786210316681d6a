"""Golden parity: GLoRIA's whole path in XBench equals its authors' code.

``tests/golden/gloria.npz`` holds what ``tools/parity/gloria.py`` computed with the authors' own code
(``marshuang80/gloria``: their model built from the file's config and loaded as ``load_gloria``
does, ``process_img``, ``process_text``, ``get_similarities(..., "both")``, and the word-region
attention their ``attention_fn`` returns inside that call) from the seeded random weights
``xbench.models.random_weights.write_gloria`` writes (the full ResNet-50, a 4-layer BERT 768 wide)
and three real radiographs (a square NIH PNG, two non-square CheXlocalize JPEGs). Here XBench runs
from the image file, offline: decode, the model's ``preprocess``, the network, the score and the
map. Measured when the golden file was made: logits within 6.0e-8 (values 0.11 to 0.19), maps 3.4e-8
(spread at least 4.7e-3), windows exact; the bounds (``conftest.PARITY_*``) leave room for another
machine's float order only.
"""

from __future__ import annotations

import json

import pytest

from conftest import assert_whole_path_matches_golden, read_golden
from xbench.models import random_weights
from xbench.models.gloria import TEXT_FOLDER, GLoRIA


@pytest.fixture(scope="module")
def golden():
    return read_golden("gloria")


@pytest.fixture(scope="module")
def model(golden, tmp_path_factory):
    meta = json.loads(str(golden["meta"]))
    folder = random_weights.write_gloria(tmp_path_factory.mktemp("gloria"), seed=meta["seed"])
    text = json.loads((folder / TEXT_FOLDER / "config.json").read_text())
    assert {key: text[key] for key in meta["text_config"]} == meta["text_config"], "the golden file has another BERT"
    built = GLoRIA(checkpoint_dir=str(folder), results_dir=None)
    built.build([str(key) for key in golden["classes"]])
    assert built.prompts == meta["prompts"]
    return built.eval()


@pytest.mark.parametrize("index", range(3))
def test_whole_path_equals_the_authors(golden, model, real_data, index, no_network):
    assert_whole_path_matches_golden(model, golden, real_data, index)
