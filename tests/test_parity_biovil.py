"""Golden parity: BioViL's and BioViL-T's whole paths in XBench equal their authors' code.

``tests/golden/biovil.npz`` (and ``biovil_t.npz``, BioViL-T on single images) holds what
``tools/parity/biovil.py`` computed with the authors' own package (``microsoft/hi-ml``'s
``health_multimodal``: ``load_image``, their transform, ``ImageModel``,
``CXRBertTokenizer``/``CXRBertModel``, the inference engines' score and smoothed similarity map)
from the seeded random weights ``xbench.models.random_weights.write_biovil`` (or ``write_biovil_t``)
writes (the full ResNet-50 image model, a 1-layer CXR-BERT) and three real radiographs (a square NIH
PNG, two non-square CheXlocalize JPEGs). Here XBench runs from the image file: decode, the model's
``preprocess``, the networks, the score and the map. Measured when the golden files were made:
BioViL logits within 1.2e-7 (of values up to 0.16), maps 1.2e-7; BioViL-T 9.7e-8 (values up to 0.07)
and 9.0e-8; windows exact; the bounds (``conftest.PARITY_*``) leave room for another machine's float order only.
"""

from __future__ import annotations

import json

import pytest

from conftest import assert_whole_path_matches_golden, read_golden
from xbench.models import random_weights
from xbench.models.biovil import BioViL, BioViLT


#: Per variant: the XBench model and the random weights' writer the golden file was made with.
VARIANTS = {"biovil": (BioViL, random_weights.write_biovil), "biovil_t": (BioViLT, random_weights.write_biovil_t)}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def variant(request):
    return request.param


@pytest.fixture(scope="module")
def golden(variant):
    return read_golden(variant)


@pytest.fixture(scope="module")
def model(variant, golden, tmp_path_factory):
    meta = json.loads(str(golden["meta"]))
    model_class, writer = VARIANTS[variant]
    folder = writer(tmp_path_factory.mktemp(variant), seed=meta["seed"])
    built = model_class(checkpoint_dir=str(folder), results_dir=None)
    built.build([str(key) for key in golden["classes"]])
    return built.eval()


@pytest.mark.parametrize("index", range(3))
def test_whole_path_equals_the_authors(golden, model, real_data, index):
    assert_whole_path_matches_golden(model, golden, real_data, index)
