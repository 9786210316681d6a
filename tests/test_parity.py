"""Golden parity through the path a run takes: every model with a golden file equals its authors' code.

``tests/golden/<model>.npz`` holds what the authors' own code computed (``tools/parity/``,
tests/golden/README.md) from the seeded random weights ``tools/parity/common.py`` writes and five
inputs: a square NIH PNG, the two CheXpert JPEGs of CheXlocalize at native size (shorter sides above
1024) and a 1600 x 600 and a 600 x 1600 crop of one of them (written as PNG here, as by the tools).

Here XBench runs as a user's run does (``tools/parity/run_path.py``): the files in a datamodule,
``trainer.test`` with the decoded-image cache on (read in two DataLoader workers, the default) and,
for one model of each input transform family (``common.BOTH_SETTINGS``), also off (the file
decoded in the main process), two images a batch, the model's outputs recorded in the run. That
the cache-off batch of every other model equals its cache-on batch bit for bit, on these inputs
and with 0 and 2 workers, is ``tests/test_cache_exact.py``'s proof.
Each image's logits, raw maps and window -- and the map upsampled by the model's rule, where the
golden keeps the authors' -- must agree with the authors' at the model's tolerance
(``common.TOLERANCES``: room for another machine's float order and the batch only). A cache, a
worker count or a batch therefore never changes a number without a failure here. The inputs are
checked to be the goldens' (a file by its sha256, a crop by its pixels), so a changed image fails
rather than compares against another's numbers.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools" / "parity"))
import common  # noqa: E402
from run_path import run_xbench  # noqa: E402

GOLDEN = REPO / "tests" / "golden"

pytestmark = pytest.mark.slow  # 14 authors' architectures at full size, through trainer.test


class Parity:
    """One model's golden file, inputs and XBench model; its runs, made once per setting."""

    def __init__(self, model_name: str, scratch: Path, real_data: Path) -> None:
        self.model_name = model_name
        self.golden_file = common.golden_path(GOLDEN, model_name)
        self.golden, classes, self.meta = common.load_golden(self.golden_file)
        assert classes == common.classes(), f"{model_name}: the golden file was made for {classes}"
        self.inputs = common.golden_inputs(real_data, [record["file"] for record in self.meta["images"]],
                                           scratch / "inputs")
        common.check_inputs(self.inputs, self.golden_file, self.meta)
        self.weights = common.write_weights(model_name, scratch / "weights")
        self.model = common.build_xbench(model_name, self.weights)
        self.runs: dict[tuple[bool, int], dict] = {}

    def run(self, setting: tuple[bool, int]) -> dict:
        if setting not in self.runs:
            cache, workers = setting
            self.runs[setting] = run_xbench(self.model, {item.key: item.path for item in self.inputs}, cache=cache,
                                            num_workers=workers, batch_size=common.BATCH_SIZE)
        return self.runs[setting]


@pytest.fixture(scope="module", params=common.MODELS)
def parity(request, tmp_path_factory, real_data):
    scratch = tmp_path_factory.mktemp(request.param)
    yield Parity(request.param, scratch, real_data)
    shutil.rmtree(scratch)  # up to 900 MB of weights at full size


def test_inputs_are_the_goldens(parity):
    """Every golden file holds the five inputs (a model whose authors' code could not run here would
    keep fewer: tests/golden/README.md says which)."""
    assert [record["file"] for record in parity.meta["images"]] == list(common.INPUTS)


def test_prompts_are_the_goldens(parity):
    """The golden was computed from the prompts XBench sends now (a prompt change needs new goldens)."""
    assert parity.meta["prompts"] == common.prompts(parity.model_name)


@pytest.mark.parametrize("image", range(len(common.INPUTS)), ids=lambda i: common.INPUTS[i].replace("/", ":"))
def test_run_matches_the_authors(parity, image):
    if image >= len(parity.inputs):
        pytest.fail(f"{parity.golden_file} has no entry for {common.INPUTS[image]}")
    item = parity.inputs[image]
    for setting in common.settings(parity.model_name):
        found = parity.run(setting)[item.key]
        shares = common.differences(parity.model_name, found, parity.golden[item.key], parity.model.map_upsample)
        assert max(shares.values()) <= 1, (parity.model_name, item.name, setting, shares)


@pytest.mark.parametrize("parity", ["gloria"], indirect=True)
def test_gloria_figure_map_matches_the_authors(parity):
    """``--model.attention_map figure``: GLoRIA's map is the first panel of the authors' attention
    figures (their ``get_attn_maps`` per image and prompt, the maximum over ``[CLS]`` and the
    words), at the zero-shot map's tolerance, through the path a run takes, on the square PNG and
    the wide crop (the map is computed on the model's input; the windows are checked above)."""
    inputs = [parity.inputs[0], parity.inputs[3]]
    parity.model.attention_map = "figure"
    try:
        found = run_xbench(parity.model, {item.key: item.path for item in inputs}, cache=False, num_workers=0,
                           batch_size=common.BATCH_SIZE)
    finally:
        parity.model.attention_map = "zero_shot"
    for item in inputs:
        golden = parity.golden[item.key]
        shares = common.differences("gloria", found[item.key], {**golden, "maps": golden["figure"]}, "bilinear")
        assert max(shares.values()) <= 1, (item.name, shares)
        assert not np.allclose(golden["figure"], golden["maps"], atol=1e-4)  # another map indeed
