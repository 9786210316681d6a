"""Is the map an explanation? The sanity check (cascading randomisation) against Quantus' MPRT and
the faithfulness check (deletion, insertion, ROAD) against a brute-force loop and pytorch-grad-cam's
own ROAD, on a tiny random convolutional model; the kernels against scipy; the checks through
``trainer.test`` and ``python -m xbench.test``, the analysis and the report. (The shipped models:
``conftest.CHECK_ARGS`` in the CLI tests of those with a tiny checkpoint, ``conftest.check_layer_groups``
for those tested at full size.)"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pandas as pd
import pytest
import scipy.stats
import torch
import torch.nn.functional as F
from torch import nn

from conftest import CONFIGS, only_folder, run_args
from xbench.checks.faithfulness import Faithfulness
from xbench.checks.sanity import Sanity, cascade_steps, randomise
from xbench.data.phantom import Phantom
from xbench.geometry.maps import place_in_frame, whole_frame
from xbench.metrics.faithfulness import (
    deletion_insertion_inputs,
    input_saliency,
    removal_rank,
    road_inputs,
)
from xbench.metrics.map_quality import SECTIONS
from xbench.metrics.sanity import spearman, ssim
from xbench.models.base import LayerGroup, XBenchModel
from xbench.test import main

SIZE = 32  # the frame, which the tiny model reads


class TinyConv(XBenchModel):
    """Two strided convolutions and a 1x1 head per class: maps [B, C, S/4, S/4], logit = 4 x their mean.
    Reads the frame image (``preprocess`` None); weights drawn from ``seed``."""

    layer_groups = (LayerGroup("head", ("head.*",)), LayerGroup("body", ("body.*",), blocks="body"))

    def __init__(self, seed: int = 0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.seed = seed
        self.body: nn.Module | None = None

    def build(self, classes: list[str]) -> None:
        if self.body is not None:
            return
        self.body = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(),
                                  nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.Tanh())
        self.head = nn.Conv2d(6, len(classes), 1)
        generator = torch.Generator().manual_seed(self.seed)
        with torch.no_grad():
            for value in self.parameters():
                value.copy_(torch.randn(value.shape, generator=generator) * 0.7)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        maps = self.head(self.body(image - 0.5))
        return 4 * maps.mean(dim=(2, 3)), maps


def tiny(classes: list[str], seed: int = 0) -> TinyConv:
    model = TinyConv(seed)
    model.classes = classes
    model.build(classes)
    return model.eval()


def run(model: XBenchModel, phantom_root, *callbacks, batch_size: int = 4) -> XBenchModel:
    data = Phantom(root=str(phantom_root), image_size=SIZE, batch_size=batch_size, num_workers=0, cache=False)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False, accelerator="cpu", callbacks=list(callbacks))
    trainer.test(model, datamodule=data, verbose=False)
    return model


def frame_images(phantom_root, ids) -> dict[str, torch.Tensor]:
    """The frame images [1, S, S] of ``ids``, as the loader gives them."""
    data = Phantom(root=str(phantom_root), image_size=SIZE, batch_size=4, num_workers=0, cache=False)
    data.setup("test")
    found = {}
    for batch in data.test_dataloader():
        for row, image_id in enumerate(batch["image_id"]):
            if image_id in ids:
                found[image_id] = batch["image"][row]
    return found


# -- the kernels ------------------------------------------------------------------------------------


def test_spearman_equals_scipy_with_ties_and_constant_rows():
    generator = torch.Generator().manual_seed(0)
    a = torch.randint(0, 5, (6, 40), generator=generator).double()  # many ties
    b = a + torch.randint(-2, 3, (6, 40), generator=generator).double()
    a[5] = 3.0  # a constant row: undefined
    got = spearman(a, b)
    for row in range(5):
        assert got[row].item() == pytest.approx(scipy.stats.spearmanr(a[row], b[row])[0], abs=1e-12)
    assert math.isnan(got[5])
    same = torch.rand(3, 8, 8, generator=generator)
    assert torch.allclose(ssim(same, same), torch.ones(3, dtype=torch.float64))


def test_map_on_the_input_equals_a_pixel_loop_through_a_letterbox_window():
    """A 4x4 map over an 8-pixel input whose window reaches 2 frame pixels outside a 12-pixel frame
    at the top (letterbox) and is cropped at the left: each input pixel takes the map's bilinear value,
    padding pixels (those that show no frame) the map's minimum."""
    maps = torch.rand(1, 1, 4, 4, generator=torch.Generator().manual_seed(1)) + 1
    windows = torch.tensor([[-2.0, 1.0, 16.0, 10.0]])
    got = input_saliency(maps, windows, 8, (12, 12), "bilinear")
    dense = F.interpolate(maps, size=(8, 8), mode="bilinear", align_corners=False)
    for i in range(8):
        for j in range(8):
            row, column = -2 + (i + 0.5) * 16 / 8, 1 + (j + 0.5) * 10 / 8
            inside = 0 <= row < 12 and 0 <= column < 12
            expected = dense[0, 0, i, j] if inside else maps.min()
            assert got[0, 0, i, j].item() == pytest.approx(expected.item(), abs=1e-6), (i, j)
    assert (got[0, 0, 0] == maps.min()).all()  # the top row shows the letterbox


def gaussian_blur_by_hand(image: torch.Tensor, size: int = 11, sigma: float = 5.0) -> torch.Tensor:
    """RISE's substrate by hand: a normalised 1-D Gaussian, the image reflected at its border."""
    offsets = torch.arange(size, dtype=torch.float64) - size // 2
    kernel = torch.exp(-offsets**2 / (2 * sigma**2))
    kernel = (kernel / kernel.sum()).float()
    padded = F.pad(image[None], (size // 2,) * 4, mode="reflect")
    rows = F.conv2d(padded, kernel.view(1, 1, size, 1).expand(image.shape[0], 1, size, 1), groups=image.shape[0])
    return F.conv2d(rows, kernel.view(1, 1, 1, size).expand(image.shape[0], 1, 1, size), groups=image.shape[0])[0]


def brute_force_curves(model: TinyConv, image: torch.Tensor, c: int, steps: int) -> tuple[list[float], list[float]]:
    """Deletion and insertion curves of class ``c`` by a plain loop: the map resized to the input,
    pixels sorted by (-saliency, raster index), each step's input made pixel list by pixel list and
    scored alone."""
    with torch.no_grad():
        _, maps = model(image[None])
        saliency = F.interpolate(maps, size=image.shape[-2:], mode="bilinear", align_corners=False)[0, c].flatten()
        order = sorted(range(saliency.numel()), key=lambda p: (-saliency[p].item(), p))
        substrate = gaussian_blur_by_hand(image)
        deletion, insertion = [], []
        for k in range(steps + 1):
            chosen = torch.tensor(order[: k * saliency.numel() // steps], dtype=torch.long)
            deleted, inserted = image.clone().flatten(1), substrate.clone().flatten(1)
            deleted[:, chosen] = 0.0
            inserted[:, chosen] = image.flatten(1)[:, chosen]
            deletion.append(model(deleted.view_as(image)[None])[0][0, c].item())
            insertion.append(model(inserted.view_as(image)[None])[0][0, c].item())
    return deletion, insertion


class Logits(nn.Module):
    """The model as pytorch-grad-cam calls it: logits only."""

    def __init__(self, model: XBenchModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)[0]


@pytest.mark.parametrize("percentile", [30, 80])
def test_road_equals_pytorch_grad_cams_own_metric(percentile):
    """MoRF and LeRF at one percentile: XBench's inputs scored as the library's
    ``ROADMostRelevantFirst``/``ROADLeastRelevantFirst`` score them, the noise from the same seed."""
    from pytorch_grad_cam.metrics.perturbation_confidence import RemoveMostRelevantFirst
    from pytorch_grad_cam.metrics.road import NoisyLinearImputer, ROADLeastRelevantFirst, ROADMostRelevantFirst
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    model = tiny(["a", "b"])
    image = torch.rand(1, SIZE, SIZE, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits, maps = model(image[None])
    saliency = input_saliency(maps, whole_frame(1, (SIZE, SIZE), image.device), SIZE, (SIZE, SIZE), "bilinear")[0, 1]
    morf, lerf = road_inputs(image, saliency, [percentile], seed=11)
    with torch.no_grad():
        ours = [model(x)[0][:, 1] - logits[:, 1] for x in (morf, lerf)]
    cam = ((saliency - saliency.min()) / (saliency.max() - saliency.min())).numpy()[None]
    targets = [ClassifierOutputTarget(1)]
    torch.manual_seed(11)
    library_morf = ROADMostRelevantFirst(percentile)(image[None], cam, targets, Logits(model))
    torch.manual_seed(11)
    RemoveMostRelevantFirst(percentile, NoisyLinearImputer())(image, torch.from_numpy(cam[0]))  # MoRF's draws first
    library_lerf = ROADLeastRelevantFirst(percentile)(image[None], cam, targets, Logits(model))
    assert ours[0].item() == pytest.approx(float(library_morf[0]), abs=1e-5)
    assert ours[1].item() == pytest.approx(float(library_lerf[0]), abs=1e-5)
    assert not torch.equal(morf, lerf)


def test_ties_go_in_raster_order():
    rank = removal_rank(torch.tensor([0.5, 1.0, 0.5, 1.0, 0.0]))
    assert rank.tolist() == [2, 0, 3, 1, 4]
    image = torch.arange(5.0).view(1, 1, 5) + 1
    deletion, insertion = deletion_insertion_inputs(image, torch.zeros_like(image), rank, 5)
    assert deletion[2].flatten().tolist() == [1, 0, 3, 0, 5] and insertion[2].flatten().tolist() == [0, 2, 0, 4, 0]


# -- the checks through trainer.test ----------------------------------------------------------------


def test_faithfulness_equals_a_brute_force_loop_whatever_the_batch(phantom_root):
    """Every scored pair's deletion and insertion curves equal :func:`brute_force_curves`, their AUCs
    the trapezoid by hand; batch size 1 and 4 record the same numbers, and the run's own results do
    not change."""
    steps = 4
    found = {}
    for batch_size in (1, 4):
        check = Faithfulness(images=3, steps=steps, road_percentiles=[50])
        found[batch_size] = run(TinyConv(), phantom_root, check, batch_size=batch_size)
    records = found[4].records["faithfulness"]
    for name, value in records.items():
        torch.testing.assert_close(found[1].records["faithfulness"][name], value, rtol=0, atol=1e-5, equal_nan=True)
    plain = run(TinyConv(), phantom_root)
    assert plain.results["grounding"] == found[4].results["grounding"]
    section = found[4].results["faithfulness"]
    assert section["images"] == 3 and section["pairs"] == len(records["index"]) >= 3
    ids = found[4].trainer.datamodule.image_ids()
    images = frame_images(phantom_root, {ids[i] for i in records["index"].tolist()})
    model = tiny(found[4].classes)
    for p, (index, c) in enumerate(zip(records["index"].tolist(), records["class"].tolist())):
        deletion, insertion = brute_force_curves(model, images[ids[index]], c, steps)
        assert records["deletion"][p].tolist() == pytest.approx(deletion, abs=1e-4)
        assert records["insertion"][p].tolist() == pytest.approx(insertion, abs=1e-4)
        assert records["deletion_auc"][p].item() == pytest.approx(np.trapezoid(deletion, dx=1 / steps), abs=1e-4)
        assert records["insertion_auc"][p].item() == pytest.approx(np.trapezoid(insertion, dx=1 / steps), abs=1e-4)
    macro = section["macro"]
    per_class = [v["deletion_auc"] for v in section["per_class"].values() if v["pairs"]]
    assert macro["deletion_auc"] == pytest.approx(np.mean(per_class))
    assert macro["road"] == pytest.approx(np.mean([v["road"] for v in section["per_class"].values() if v["pairs"]]))


@pytest.mark.parametrize("absolute", [False, True], ids=["plain", "abs"])
def test_sanity_equals_quantus_mprt(phantom_root, absolute):
    """Each cascade step's Spearman correlation per pair equals Quantus' ModelParameterRandomisation
    (MPRT, top-down) on the same model, inputs and maps: its layers are the tiny model's groups in the
    same order (head, body.2, body.0), re-initialised by ``reset_parameters`` from its seed + 1.
    SSIM is not compared: Quantus' is scikit-image's, with another window."""
    import quantus  # a test-only dependency (the test extra): missing, the test fails rather than skips
    check = Sanity(images=3, seed=8)
    model = run(TinyConv(), phantom_root, check)
    records = model.records["sanity"]
    assert set(records["step"].tolist()) == {0, 1, 2, 3}
    ids = model.trainer.datamodule.image_ids()
    first = records["step"] == 0
    pairs = list(zip(records["index"][first].tolist(), records["class"][first].tolist()))
    images = frame_images(phantom_root, {ids[i] for i, _ in pairs})
    x_batch = torch.stack([images[ids[i]] for i, _ in pairs]).numpy()
    y_batch = np.array([c for _, c in pairs])

    def explain(model, inputs, targets, **kwargs):
        with torch.no_grad():
            maps = model.model(torch.as_tensor(inputs))[1]
        placed = place_in_frame(maps, whole_frame(len(inputs), (SIZE, SIZE), maps.device), (SIZE, SIZE))
        return placed[torch.arange(len(inputs)), torch.as_tensor(targets)][:, None].numpy()

    metric = quantus.MPRT(layer_order="top_down", seed=7, abs=absolute, normalise=False, disable_warnings=True,
                          display_progressbar=False)
    scores = metric(model=Logits(tiny(model.classes)).eval(), x_batch=x_batch, y_batch=y_batch, a_batch=None,
                    explain_func=explain, device="cpu", batch_size=len(pairs))
    layers = [name for name in scores if name != "original"]
    assert layers == ["model.head", "model.body.2", "model.body.0"]
    name = "spearman_abs" if absolute else "spearman"
    for step, layer in enumerate(layers, start=1):
        ours = records[name][records["step"] == step]
        # float32 maps computed in batches of other sizes may differ in the last bit, which can swap
        # two near-equal pixels' ranks: a change of about 1e-6 in a correlation over 1024 pixels
        assert ours.tolist() == pytest.approx(scores[layer], abs=1e-5), layer
    assert [s["layers"] for s in model.results["sanity"]["steps"]] == ["original", "head", "body: block 2",
                                                                       "body: block 0"]


def test_sanity_restores_the_weights_and_changes_no_result(phantom_root):
    model = TinyConv()
    model.classes = ["nodule", "mass", "consolidation"]
    checked = run(model, phantom_root, Sanity(images=2))
    state = {k: v.clone() for k, v in checked.state_dict().items()}
    plain = run(TinyConv(), phantom_root)
    assert plain.results["grounding"] == checked.results["grounding"]
    assert plain.results["classification"] == checked.results["classification"]
    assert all(torch.equal(state[k], v) for k, v in plain.state_dict().items())
    steps = checked.results["sanity"]["steps"]
    assert steps[0]["ssim"] == pytest.approx(1.0) and steps[-1]["ssim"] < 1


def test_randomise_is_seeded_and_reaches_parameters_without_reset():
    """An attention's packed projection (no public ``reset_parameters``) is drawn from a normal of its
    own spread; a scalar without one stays; the same seed gives the same weights."""
    def made():
        torch.manual_seed(0)
        module = nn.ModuleDict({"attention": nn.MultiheadAttention(8, 2), "norm": nn.LayerNorm(8)})
        module.scale = nn.Parameter(torch.tensor(2.0))
        return module

    a, b = made(), made()
    before = a.attention.in_proj_weight.detach().clone()
    names = [name for name, _ in a.named_parameters()]
    randomise(a, names, seed=3)
    randomise(b, names, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.attention.in_proj_weight, before) and a.scale.item() == 2.0
    assert a.attention.in_proj_weight.std().item() == pytest.approx(before.std().item(), rel=0.1)
    assert torch.equal(a.norm.weight, torch.ones(8))  # LayerNorm.reset_parameters


def test_a_stale_declaration_is_an_error_naming_the_group():
    model = tiny(["a", "b"])
    with pytest.raises(ValueError, match="group 'decoder' matches no parameter"):
        cascade_steps(model, (*model.layer_groups, LayerGroup("decoder", ("decoder.*",))))
    with pytest.raises(ValueError, match=r"2 parameters are in no layer group \(e.g. \['head.weight'"):
        cascade_steps(model, model.layer_groups[1:])


# -- through python -m xbench.test ------------------------------------------------------------------


def test_baselines_say_why_a_check_does_not_apply(phantom_root, tmp_path):
    """The centre prior has no weights (sanity does not apply) but a forward (faithfulness: a constant
    logit of 0, so every curve is 0); the noise baseline reads more than its input (neither applies)."""
    checks = ["--sanity.images", "2", "--faithfulness.images", "2", "--faithfulness.steps", "2",
              "--faithfulness.road_percentiles", "[90]", "--trainer.logger", "false"]
    with pytest.warns(UserWarning, match="sanity check not run: CentrePrior declares no layer groups"):
        results = main(run_args("centre_prior", "phantom", phantom_root, tmp_path / "centre", *checks))
    reason = "CentrePrior declares no layer groups (its class attribute layer_groups; a model without weights has none)"
    assert results["sanity"] == {"applicable": False, "reason": reason}
    assert results["faithfulness"]["macro"] == {name: 0.0 for name in results["faithfulness"]["macro"]}
    assert not (only_folder(tmp_path / "centre") / "sanity.csv.gz").exists()
    with pytest.warns(UserWarning, match="overrides infer"):
        results = main(run_args("random", "phantom", phantom_root, tmp_path / "random", *checks))
    assert not results["sanity"]["applicable"] and not results["faithfulness"]["applicable"]


def test_checks_through_the_cli_write_their_tables_and_log_keys(phantom_root, tmp_path):
    """The tiny model through ``python -m xbench.test`` with both checks: sections, per-pair tables, the
    logger keys and the options in the recorded config; the analysis reads the tables back (its
    estimates equal metrics.json) and the report draws the explanation table, cascade and scatter."""
    from xbench.analysis.pipeline import analyze
    from xbench.analysis.settings import Settings
    from xbench.analysis.tables import analysis_tables
    from xbench.reporting.benchmark import Benchmark
    from xbench.reporting.explanations import explanation_figures, explanation_tables
    from xbench.reporting.paper_tables import ReportAnalysis
    from xbench.reporting.render import to_markdown
    from xbench.results.payload import log_keys

    results = main(["--model", "test_checks.TinyConv", "--config", str(CONFIGS / "data" / "phantom.yaml"),
                    "--data.root", str(phantom_root), "--data.image_size", str(SIZE), "--data.num_workers", "0",
                    "--results.folder", str(tmp_path / "results"), "--trainer.enable_progress_bar", "false",
                    "--sanity.images", "2", "--faithfulness.images", "2", "--faithfulness.steps", "3",
                    "--faithfulness.road_percentiles", "[40, 90]", "--robustness.images", "2",
                    "--robustness.samples", "2"])
    folder = only_folder(tmp_path / "results")
    assert results["config"]["faithfulness"] == {"images": 2, "steps": 3, "road_percentiles": [40, 90], "seed": 0}
    assert results["config"]["sanity"] == {"images": 2, "seed": 0}
    table = pd.read_csv(folder / "faithfulness.csv.gz")
    assert list(table.columns[:4]) == ["image_index", "image_id", "class", "constant_map"]
    assert {"deletion_003", "road_morf", "road_morf_curve_001"} <= set(table.columns)
    assert len(table) == results["faithfulness"]["pairs"]
    keys = log_keys(results)
    assert {"faithfulness/deletion_auc/macro", "sanity/ssim/macro", "sanity/step_3/pointing_game",
            "robustness/local_lipschitz/macro", "localisation/pixel_auc/macro", "complexity/sparseness/macro",
            "randomisation/random_logit/macro"} <= set(keys)
    assert "Faithfulness on 2 images" in (folder / "summary.md").read_text()

    settings = Settings(replicates=20)
    tables = analysis_tables(analyze([folder], settings=settings))
    intervals = tables["intervals"].set_index(["class", "metric"])
    for section, keys in (("faithfulness", ("deletion_auc", "insertion_auc", "road")),
                          ("sanity", ("spearman", "spearman_abs", "ssim")),
                          ("robustness", ("max_sensitivity", "local_lipschitz")), *SECTIONS.items()):
        for key in keys:
            estimate, lower, upper = intervals.loc[("macro", key), ["estimate", "lower", "upper"]]
            assert estimate == pytest.approx(results[section]["macro"][key]) and lower <= upper, (section, key)
            for cls, values in results[section]["per_class"].items():
                if values[key] is not None:
                    assert intervals.loc[(cls, key), "estimate"] == pytest.approx(values[key])
    bench = Benchmark.from_folders([tmp_path / "results"])
    table, *families, cascade = explanation_tables(bench, ReportAnalysis(settings, tables))
    (row,) = table.rows
    assert row.cells[2].value == results["faithfulness"]["macro"]["deletion_auc"] and row.cells[2].interval
    # 2 checked images, 9 in the split: every interval rests on fewer than 10, is marked and the caption says why
    assert (row.cells[2].mark, row.cells[0].mark) == ("(2 images)", "(9 images)")
    assert "(n images) after an interval: it rests on fewer than 10 images" in table.caption
    assert "Faithfulness on 2 images" in (folder / "summary.md").read_text()
    assert [family.name for family in families] == [f"explanations_{name}" for name in
                                                     ("localisation", "complexity", "randomisation", "robustness")]
    (row,) = families[0].rows  # Pointing Game, Dice, then the localisation values, each with its interval
    assert row.cells[2].value == results["localisation"]["macro"]["relevance_mass"]
    for family in families:
        (row,) = family.rows
        assert all(cell.interval for cell in row.cells), family.name
    assert len(cascade.rows) == len(results["sanity"]["steps"])
    header = to_markdown(families[2]).splitlines()[2]
    assert "Across classes<br>Random logit" in header and "Random logit<br>Random logit" not in header
    assert [plot.name for plot in explanation_figures(bench)] == ["plausibility_vs_faithfulness",
                                                                  "sanity_tinyconv_phantom"]
