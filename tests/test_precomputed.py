"""PrecomputedSaliency: saved outputs score exactly as the live model; boxes, windows, missing pairs,
and pickles that try to run code."""

import importlib.util
import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from conftest import only_folder, run_args
from xbench.metrics.grounding import THRESHOLDS, threshold_counts
from xbench.models.precomputed import PrecomputedSaliency, box_map, native_window_in_frame
from xbench.models.safe_pickle import load_data_pickle
from xbench.suite import load_suite, plan, run_arguments
from xbench.test import main

REPO = Path(__file__).resolve().parents[1]


def load_example():
    spec = importlib.util.spec_from_file_location("precomputed_phantom", REPO / "examples" / "precomputed_phantom.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The README's worked example: CentrePrior's maps and the phantom's boxes saved, then scored;
    its folder and the metrics of each run."""
    out = tmp_path_factory.mktemp("example")
    return out, load_example().saved_and_live(out)


@pytest.fixture(scope="module")
def example_runs(example):
    return example[1]


def comparable(metrics: dict) -> dict:
    """The numbers of a run: grounding and classification, without run-specific fields."""
    return {"grounding": metrics["grounding"], "classification": metrics["classification"]}


@pytest.mark.parametrize("layout", ["per_image", "per_pair"])
def test_saved_maps_score_as_the_live_model(example_runs, layout):
    assert comparable(example_runs[layout]) == comparable(example_runs["centre_prior"])
    assert example_runs[layout]["precomputed"]["missing_pairs"] == 0


def test_boxes_of_the_lesions_score_as_the_oracle(example_runs):
    """Phantom masks are boxes: predicting them as boxes at the native frame equals the oracle."""
    boxes, oracle = example_runs["boxes"]["grounding"], example_runs["oracle"]["grounding"]
    assert boxes["per_class"] == oracle["per_class"]
    assert boxes["macro"]["pointing_game"] == 1.0 and boxes["macro"]["dice@best"] == 1.0


def test_box_map_is_the_score_weighted_union():
    # native 4 x 8 image on a 2 x 4 frame: frame pixel centres at native (1, 1), (1, 3), ..., (3, 7)
    frame_map = box_map([[0, 0, 4, 4], [2, 0, 8, 2]], [0.3, 0.8], (4, 8), (2, 4))
    expected = torch.tensor([[0.3, 0.8, 0.8, 0.8], [0.3, 0.3, 0.0, 0.0]])
    assert frame_map.equal(expected)
    assert box_map([], None, (4, 8), (2, 4)).eq(0).all()


def test_native_window_is_placed_through_the_frame(tmp_path):
    """A map covering the right half of a 100 x 200 image lands in the right half of the frame."""
    window = native_window_in_frame((0, 100, 100, 100), (100, 200), (10, 10))
    assert window.tolist() == [[0, 5, 10, 5]]
    np.savez(tmp_path / "img.npz", maps=np.arange(4, dtype=np.float32).reshape(1, 2, 2), logits=np.zeros(1),
             window=np.array([0, 100, 100, 100]), image_size=np.array([100, 200]))
    model = PrecomputedSaliency(str(tmp_path))
    model.classes = ["nodule"]
    placed, logit = model.frame_map("img", "nodule", (10, 10))
    assert logit == 0.0
    assert placed[:, :5].eq(0).all()  # outside the window: the map's minimum
    assert placed[0, 5] == 0 and placed[-1, -1] == 3


@pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
def test_per_image_files_keyed_by_finding(tmp_path, suffix):
    """A file that states its classes may hold them in any order, and more of them."""
    maps = np.stack([np.full((2, 2), v, np.float32) for v in (1.0, 2.0, 3.0)])
    probs, classes = np.array([0.5, 0.9, 0.1]), ["mass", "nodule", "edema"]
    if suffix == ".npz":
        np.savez(tmp_path / "img.npz", maps=maps, probs=probs, classes=np.array(classes))
    else:
        save_file({"maps": torch.from_numpy(maps), "probs": torch.from_numpy(probs)}, tmp_path / "img.safetensors",
                  metadata={"classes": json.dumps(classes)})
    model = PrecomputedSaliency(str(tmp_path))
    model.classes = ["nodule", "mass"]
    pair = model.read_pair("img", "nodule")
    assert pair.map.eq(2.0).all() and pair.logit == pytest.approx(np.log(0.9 / 0.1))


def test_missing_pairs_error_or_counted_skip(example, tmp_path):
    source = example[0]
    files = sorted((source / "per_image").glob("*.npz"))
    out = tmp_path / "maps"
    out.mkdir()
    for file in files[2:]:  # the first two images' files are missing: 2 x 3 pairs
        (out / file.name).write_bytes(file.read_bytes())
    args = run_args("precomputed_per_image", "phantom", source / "phantom", tmp_path / "results",
                    "--model.path", str(out), "--data.num_images", "9", "--data.native_size", "96", image_size=96)
    first = files[0].name.removesuffix(".npz")
    with pytest.raises(FileNotFoundError, match=rf"6 of 27 .* first: \({first}, "):
        main([*args, "--trainer.logger", "false"])  # no W&B run left open by the error
    with pytest.warns(UserWarning, match="6 pairs have no saved output and are skipped"):
        results = main([*args, "--model.missing", "skip"])
    assert results["precomputed"]["missing_pairs"] == 6
    assert results["data"]["images_evaluated"] == 9
    skipped = {f.name.removesuffix(".npz") for f in files[:2]}
    entries = json.loads((source / "phantom" / "test.json").read_text())
    skipped_regions = sum(len(set(e["syms"])) for e in entries if e["file_name"] in skipped)
    assert skipped_regions > 0

    def graded(metrics):
        return sum(v["pairs"] for v in metrics["grounding"]["per_class"].values())

    assert graded(results) == graded(example[1]["centre_prior"]) - skipped_regions
    assert only_folder(tmp_path / "results").name.startswith("precomputedsaliency__phantom__")


def test_malicious_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil_Cardiomegaly_map.pkl"
    path.write_bytes(pickle.dumps({"map": Payload(), "prob": 0.5}))
    with pytest.raises(pickle.UnpicklingError, match="posix.system, which is not data"):
        load_data_pickle(path)
    assert not marker.exists()
    # the data a cheXlocalize pickle holds still loads
    path.write_bytes(pickle.dumps({"map": torch.ones(1, 1, 2, 2), "prob": 0.5, "task": "Cardiomegaly",
                                   "cxr_dims": (4, 3), "extra": np.arange(3)}))
    info = load_data_pickle(path)
    assert info["map"].equal(torch.ones(1, 1, 2, 2)) and info["extra"].tolist() == [0, 1, 2]


def test_threshold_counts_in_blocks_of_one_pairs_pixels():
    """A native-size pair (more pixels than one chunk of the CPU pass) counts exactly as a direct comparison."""
    gen = torch.Generator().manual_seed(0)
    saliency = torch.rand(2, 1, 1031, 1030, generator=gen)
    saliency[..., 0, :101] = THRESHOLDS  # values exactly on every threshold
    masks = torch.rand(saliency.shape, generator=gen) > 0.6
    predicted, inter = threshold_counts(saliency, masks)
    for k in (0, 1, 37, 50, 99, 100):
        above = saliency >= THRESHOLDS[k]
        assert predicted[..., k].equal(above.sum((-2, -1)))
        assert inter[..., k].equal((above & masks).sum((-2, -1)))


def test_saved_outputs_run_in_a_suite(example, tmp_path, monkeypatch):
    """The saved layouts as suite entries, each with its ``model.path``: same numbers as the live runs.
    Each pair runs in this process with the arguments the suite gives it (that a suite's worker runs
    what these arguments run: tests/test_suite_modes.py, in the slow tier)."""
    out, runs = example
    monkeypatch.chdir(tmp_path)
    models = REPO / "lightning_configs" / "models"
    suite = {
        "results_dir": "results",
        "settings": {"data.root": str(out / "phantom"), "data.num_images": 9, "data.native_size": 96,
                     "data.image_size": 96, "data.num_workers": 0, "trainer.enable_progress_bar": False,
                     "trainer.logger": False},
        "models": [
            {"config": str(models / "precomputed_per_image.yaml"), "settings": {"model.path": str(out / "per_image")}},
            {"config": str(models / "precomputed_boxes.yaml"), "settings": {"model.path": str(out / "boxes.jsonl")}},
        ],
        "datasets": [str(REPO / "lightning_configs" / "data" / "phantom.yaml")],
    }
    (tmp_path / "saved.yaml").write_text(yaml.safe_dump(suite))
    saved = load_suite(tmp_path / "saved.yaml")
    for pair in plan(saved):
        main(run_arguments(saved, pair))
    by_layout = {}
    for folder in (tmp_path / "results").iterdir():
        metrics = json.loads((folder / "metrics.json").read_text())
        by_layout[metrics["precomputed"]["layout"]] = metrics
    assert comparable(by_layout["per_image"]) == comparable(runs["centre_prior"])
    assert comparable(by_layout["boxes"])["grounding"] == comparable(runs["oracle"])["grounding"]
