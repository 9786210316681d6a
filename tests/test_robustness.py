"""The robustness check (max-sensitivity, the local Lipschitz estimate) against Quantus' own
``MaxSensitivity`` and ``LocalLipschitzEstimate`` on the tiny convolutional model of
``test_checks.py``, a constant map among the pairs; its noise: bounded, of the asked spread, seeded
per draw and so independent of the batch."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
import pytest
import torch

from test_checks import SIZE, Logits, TinyConv, run, tiny
from xbench.checks.robustness import GAUSSIAN, UNIFORM, Robustness, input_noise, nan_max, noise_seed
from xbench.data.phantom import Phantom
from xbench.geometry.maps import as_relevance

#: The class whose map the thresholded model makes constant on the clean inputs (nodule: graded on two
#: of the three chosen phantom images).
CONSTANT_CLASS = 0


class Thresholded(TinyConv):
    """The tiny model with one class's map cut at ``threshold`` (``relu(map - threshold)``): above
    every clean input's map, it is constant (all zeros) on the clean inputs, and the noise lifts a
    few pixels above it -- a constant original map against non-constant noisy ones."""

    threshold = 0.0

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, maps = super().forward(image)
        cut = (maps[:, CONSTANT_CLASS] - self.threshold).clamp(min=0)
        return logits, torch.cat([maps[:, :CONSTANT_CLASS], cut[:, None], maps[:, CONSTANT_CLASS + 1:]], dim=1)


def frame_images(phantom_root) -> dict[str, torch.Tensor]:
    """Every frame image [1, S, S] of the phantom by id, as the loader gives them."""
    data = Phantom(root=str(phantom_root), image_size=SIZE, batch_size=4, num_workers=0, cache=False)
    data.setup("test")
    return {image_id: batch["image"][row] for batch in data.test_dataloader()
            for row, image_id in enumerate(batch["image_id"])}


def relevance_of(model: TinyConv, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The run's map of each input's target class [n, 1, S, S], float64: ``explain`` ->
    ``frame_saliency`` (the whole frame: the tiny model reads it) -> ``as_relevance``."""
    x = torch.as_tensor(inputs)
    with torch.no_grad():
        _, raw = model.explain(x)
    saliency, _ = model.frame_saliency(raw, {"masks": torch.zeros(len(x), 1, SIZE, SIZE)})
    chosen = as_relevance(saliency)[torch.arange(len(x)), torch.as_tensor(targets)]
    return chosen[:, None].double().numpy()


def replayed_noise(rows: list[int], seed: int, kind: int, scale: float):
    """A Quantus ``perturb_func`` whose k-th call (sample step k) adds to each row of its batch the
    noise XBench draws for that row's image and sample k."""
    calls = itertools.count()

    def perturb(arr: np.ndarray, indices: np.ndarray, **kwargs) -> np.ndarray:
        sample = next(calls)
        noise = [input_noise((1, SIZE, SIZE), seed, index, kind, sample, scale).numpy().reshape(-1) for index in rows]
        return arr + np.stack(noise)

    return perturb


def test_robustness_equals_quantus_own_metrics(phantom_root):
    """Per pair, max-sensitivity and the local Lipschitz estimate equal Quantus' ``MaxSensitivity``
    (``normalise=False``, its default) and ``LocalLipschitzEstimate`` (``normalise=True``, its default:
    a division by 1, every map's maximum) on the same model, inputs, maps and noise; the norms, the
    maximum over samples and the noisy inputs' maps are Quantus'. Among the pairs, constant original
    maps (the uniform rule: all ones) whose noisy maps are not."""
    import quantus  # a test-only dependency (the test extra): missing, the test fails rather than skips

    samples, seed = 3, 5
    images = frame_images(phantom_root)
    with torch.no_grad():
        _, maps = tiny(["nodule", "mass", "consolidation"])(torch.stack(list(images.values())))
    model = tiny_thresholded(float(maps[:, CONSTANT_CLASS].max()) + 1e-4)
    model = run(model, phantom_root, Robustness(images=3, samples=samples, radius=0.2, std=0.1, seed=seed))
    records = model.records["robustness"]
    constant = records["constant_map"]
    assert constant.any() and not constant.all() and (records["class"][constant] == CONSTANT_CLASS).all()
    assert (records["max_sensitivity"][constant] > 0).any(), "the noise never moved a constant map: a weak test"

    ids = model.trainer.datamodule.image_ids()
    rows, classes = records["index"].tolist(), records["class"].tolist()
    x_batch = torch.stack([images[ids[i]] for i in rows]).numpy()
    y_batch = np.array(classes)
    maxima = []

    def explain(model, inputs, targets, **kwargs):
        found = relevance_of(model.model, inputs, targets)
        maxima.append(found.max(axis=(1, 2, 3)))
        return found

    common = dict(nr_samples=samples, disable_warnings=True, display_progressbar=False,
                  return_nan_when_prediction_changes=False)
    sensitivity = quantus.MaxSensitivity(normalise=False, abs=False, lower_bound=0.2,
                                         perturb_func=replayed_noise(rows, seed, UNIFORM, 0.2), **common)
    lipschitz = quantus.LocalLipschitzEstimate(normalise=True, abs=False, perturb_std=0.1,
                                               perturb_func=replayed_noise(rows, seed, GAUSSIAN, 0.1), **common)
    scored = {}
    for name, metric in (("max_sensitivity", sensitivity), ("local_lipschitz", lipschitz)):
        scored[name] = metric(model=Logits(model).eval(), x_batch=x_batch, y_batch=y_batch, a_batch=None,
                              explain_func=explain, channel_first=True, device="cpu", batch_size=len(rows))
    # every map Quantus normalised by its maximum has maximum 1: LocalLipschitzEstimate's normalise is a no-op
    assert np.all(np.concatenate(maxima) == 1.0)
    # XBench's forwards run in chunks of the batch size (4), Quantus' on all pairs at once: float32 maps of
    # batches of other sizes may differ in the last bits, and Quantus' Lipschitz denominator is a float32 norm
    # (its inputs are float32, 1e-7 relative each). Measured: 1e-8 and 5e-8 apart; 1e-6 leaves room for that.
    for name, values in scored.items():
        assert records[name].tolist() == pytest.approx(values, rel=1e-6), name
    assert model.results["robustness"]["constant_maps"] == int(constant.sum())


def tiny_thresholded(threshold: float) -> Thresholded:
    model = Thresholded()
    model.threshold = threshold
    model.classes = ["nodule", "mass", "consolidation"]  # the phantom's
    model.build(model.classes)
    return model.eval()


def test_the_numbers_are_seeded_per_draw_not_per_batch(phantom_root):
    """Batch size 1 and 3 give the same numbers (each draw has its own generator), up to float32
    forwards of other sizes; another seed other numbers; the run's own results do not change."""
    found = {}
    for batch_size, seed in ((1, 0), (3, 0), (3, 1)):
        found[batch_size, seed] = run(TinyConv(), phantom_root, Robustness(images=3, samples=2, seed=seed),
                                      batch_size=batch_size)
    section = found[3, 0].results["robustness"]
    assert section["images"] == 3 and section["pairs"] >= 3 and section["samples"] == 2
    for name in ("max_sensitivity", "local_lipschitz"):
        # the same noise; the maps of float32 forwards of 1 and of 3 inputs differ in the last bits (3e-7 measured,
        # where other noise moves them by 1e-1)
        torch.testing.assert_close(found[1, 0].records["robustness"][name], found[3, 0].records["robustness"][name],
                                   rtol=1e-6, atol=0)
        assert not torch.equal(found[3, 1].records["robustness"][name], found[3, 0].records["robustness"][name])
        defined = [v[name] for v in section["per_class"].values() if v["pairs"]]
        assert section["macro"][name] == pytest.approx(np.mean(defined))
    assert found[1, 0].results["grounding"] == run(TinyConv(), phantom_root, batch_size=1).results["grounding"]


def test_the_noise_has_the_asked_range_and_spread():
    """Uniform: within [-radius, radius), reaching both ends; Gaussian: mean 0 and the asked standard
    deviation within five standard errors of n draws (the sample std's is std / sqrt(2 n)); each
    (image, kind, sample) its own draw, the same again for the same seed."""
    shape, radius, std = (3, 64, 64), 0.2, 0.1
    uniform = torch.cat([input_noise(shape, 7, 4, UNIFORM, s, radius).flatten() for s in range(4)])
    gaussian = torch.cat([input_noise(shape, 7, 4, GAUSSIAN, s, std).flatten() for s in range(4)]).double()
    n = uniform.numel()
    assert uniform.min() >= -radius and uniform.max() < radius
    # P(every draw misses the top or bottom 10/n of the range) = (1 - 5/n)^n, about e^-5 each
    assert uniform.min() < -radius * (1 - 10 / n) and uniform.max() > radius * (1 - 10 / n)
    assert abs(float(gaussian.mean())) < 5 * std / math.sqrt(n)
    assert abs(float(gaussian.std()) - std) < 5 * std / math.sqrt(2 * n)
    draws = [input_noise(shape, 7, index, kind, s, 1.0) for index, kind, s in
             ((4, UNIFORM, 0), (5, UNIFORM, 0), (4, GAUSSIAN, 0), (4, UNIFORM, 1))]
    assert all(not torch.equal(a, b) for a, b in itertools.combinations(draws, 2))
    assert torch.equal(input_noise(shape, 7, 4, UNIFORM, 1, 1.0), draws[3])
    assert noise_seed(2**32 - 1, 10**6, GAUSSIAN, 10**4) < 2**64  # within torch's range at the largest options


def test_nan_max_leaves_out_undefined_ratios():
    values = torch.tensor([[1.0, math.nan, math.nan], [3.0, 2.0, math.nan]], dtype=torch.float64)
    got = nan_max(values)
    assert got[:2].tolist() == [3.0, 2.0] and math.isnan(got[2])


def test_robustness_through_the_cli_writes_its_table_and_the_analysis_reads_it(phantom_root, tmp_path):
    """The tiny model through ``python -m xbench.test --robustness.*``: the options in the recorded
    config, one table row per pair, the logger keys, the summary's table and note, and the analysis'
    estimates equal to metrics.json; a model that reads more than its input is not scored, and says why."""
    from conftest import CONFIGS, only_folder, run_args
    from xbench.analysis.pipeline import analyze
    from xbench.analysis.settings import Settings
    from xbench.analysis.tables import analysis_tables
    from xbench.results.payload import log_keys
    from xbench.test import main

    options = ["--robustness.images", "2", "--robustness.samples", "2", "--robustness.radius", "0.1",
               "--robustness.std", "0.05", "--robustness.seed", "9"]
    results = main(["--model", "test_checks.TinyConv", "--config", str(CONFIGS / "data" / "phantom.yaml"),
                    "--data.root", str(phantom_root), "--data.image_size", str(SIZE), "--data.num_workers", "0",
                    "--results.folder", str(tmp_path / "results"), "--trainer.enable_progress_bar", "false",
                    "--trainer.logger", "false", *options])
    section = results["robustness"]
    assert results["config"]["robustness"] == {"images": 2, "samples": 2, "radius": 0.1, "std": 0.05, "seed": 9}
    assert (section["images"], section["samples"], section["radius"], section["std"], section["seed"]) == (
        2, 2, 0.1, 0.05, 9)
    folder = only_folder(tmp_path / "results")
    table = pd.read_csv(folder / "robustness.csv.gz")
    assert list(table.columns) == ["image_index", "image_id", "class", "constant_map", "max_sensitivity",
                                   "local_lipschitz"]
    assert len(table) == section["pairs"] and section["pairs"] >= 2
    assert {"robustness/max_sensitivity/macro", "robustness/local_lipschitz/macro"} <= set(log_keys(results))
    summary = (folder / "summary.md").read_text()
    assert "Robustness on 2 images" in summary and "2 noisy copies of the input" in summary
    intervals = analysis_tables(analyze([folder], settings=Settings(replicates=20)))["intervals"]
    intervals = intervals.set_index(["class", "metric"])
    for key in ("max_sensitivity", "local_lipschitz"):
        assert intervals.loc[("macro", key), "estimate"] == pytest.approx(section["macro"][key])

    with pytest.warns(UserWarning, match="robustness not scored: RandomSaliency makes its maps from more"):
        baseline = main(run_args("random", "phantom", phantom_root, tmp_path / "random", "--trainer.logger", "false",
                                 "--robustness.images", "2", image_size=SIZE))
    assert baseline["robustness"] == {"applicable": False, "reason": "RandomSaliency makes its maps from more than "
                                      "its input (it overrides infer)"}
    assert not (only_folder(tmp_path / "random") / "robustness.csv.gz").exists()
