"""Gaze end to end on the phantom's synthetic readings (``--data.gaze true``): ``python -m xbench.test``
scores every model against the gaze, ``metrics.json``'s gaze section equals the kernels run again
pair by pair on the datamodule's own batches and the saved records, the analysis gives intervals, and
``python -m xbench.report`` shows the gaze table (the centre bias, a human row apart) and the overlays."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import only_folder, run_args
from xbench.data.phantom import Phantom
from xbench.metrics.gaze import VALUES, gaze_values
from xbench.models.baselines import GazeCentreBias, RandomSaliency
from xbench.report import main as report
from xbench.reporting.wandb import gaze_rows
from xbench.results.payload import log_keys
from xbench.test import main

SIZE = 48


@pytest.fixture(scope="module")
def gaze_runs(phantom_root, tmp_path_factory):
    """The random model, the centre bias and the phantom's synthetic second reader (a results folder
    marked ``human``, as a dataset's interobserver reader writes one) on the phantom with gaze."""
    out = tmp_path_factory.mktemp("gaze")
    for model in ("random", "gaze_centre_bias", "human"):
        main(run_args(model, "phantom", phantom_root, out / "results" / model, "--data.gaze", "true",
                      "--data.second_reader", "true", "--trainer.logger", "false", "--results.overlay_pairs", "2",
                      image_size=SIZE))
    return out, {model: only_folder(out / "results" / model) for model in ("random", "gaze_centre_bias", "human")}


def datamodule(phantom_root) -> Phantom:
    data = Phantom(root=str(phantom_root), gaze=True, image_size=SIZE, num_workers=0, batch_size=4, cache=False)
    data.prepare_data()
    data.setup("test")
    return data


def brute_force(phantom_root, saliency_of) -> pd.DataFrame:
    """Every (image, class) pair with gaze, the kernels run on that pair alone (a pass of its own over
    the datamodule's samples): ``saliency_of(sample record)`` gives the normalised frame maps [C, S, S]."""
    data = datamodule(phantom_root)
    baseline, rows = data.gaze_baseline(), []
    for index in range(len(data.test_set)):
        record = data.test_set[index]
        maps = saliency_of(record)
        for c in torch.nonzero(record["has_gaze"]).flatten().tolist():
            values = gaze_values(maps[c][None], record["gaze"][c][None], record["fixations"][c][None],
                                 record["shuffled_fixations"][None], baseline)[0]
            rows.append({"image_id": record["image_id"], "class": data.classes[c],
                         **dict(zip(VALUES, values.tolist()))})
    return pd.DataFrame(rows).sort_values(["image_id", "class"]).reset_index(drop=True)


def random_maps(record):
    model = RandomSaliency()
    batch = {"labels": record["labels"][None], "index": torch.tensor([record["index"]]), "image": record["image"][None]}
    _, maps = model.infer(batch)
    return model.frame_saliency(maps, {"masks": record["masks"][None]})[0][0]


def centre_bias_maps(phantom_root):
    """The centre bias as every class's map, normalised into the frame as the run's base does (float32)."""
    model = GazeCentreBias()
    model.baseline, model.classes = datamodule(phantom_root).gaze_baseline(), list(Phantom.default_classes())

    def maps(record):
        _, raw = model(record["image"][None])
        return model.frame_saliency(raw, {"masks": record["masks"][None]})[0][0]
    return maps


def saved(folder) -> pd.DataFrame:
    table = pd.read_csv(folder / "gaze.csv.gz", dtype={"image_id": str})
    return table.sort_values(["image_id", "class"]).reset_index(drop=True)


@pytest.mark.parametrize("model", ["random", "gaze_centre_bias"])
def test_metrics_json_equals_the_kernels_pair_by_pair(gaze_runs, phantom_root, model):
    _, folders = gaze_runs
    folder = folders[model]
    payload = json.loads((folder / "metrics.json").read_text())
    section, records = payload["gaze"], saved(folder)
    expected = brute_force(phantom_root, random_maps if model == "random" else centre_bias_maps(phantom_root))
    assert list(records[["image_id", "class"]].itertuples(index=False)) == \
        list(expected[["image_id", "class"]].itertuples(index=False))
    assert section["pairs"] == len(expected) > 0 and section["images"] == expected["image_id"].nunique()
    for key in VALUES:
        np.testing.assert_allclose(records[key], expected[key], rtol=1e-9, atol=1e-12, err_msg=key)
        means = expected.groupby("class")[key].mean()
        for finding, values in section["per_class"].items():
            if finding in means:
                assert values[key] == pytest.approx(means[finding], rel=1e-9), (finding, key)
                assert values["pairs"] == int((expected["class"] == finding).sum())
            else:
                assert values[key] is None and values["pairs"] == 0
        assert section["macro"][key] == pytest.approx(means.mean(), rel=1e-9)
    if model == "gaze_centre_bias":  # the floor: no information over itself (up to the float32 normalised map)
        assert section["macro"]["information_gain"] == pytest.approx(0, abs=1e-6)
    assert "Gaze on" in (folder / "summary.md").read_text()
    flat = log_keys(payload)
    assert flat["gaze/nss/macro"] == section["macro"]["nss"] and "gaze/shuffled_auc/nodule" in flat
    columns, rows = gaze_rows(payload)  # W&B's gaze table
    assert columns[2:] == ["pairs", *(f"gaze/{key}" for key in VALUES)] and len(rows) == len(payload["classes"])
    assert [row[2] for row in rows] == [section["per_class"][key]["pairs"] for key in payload["classes"]]


def test_the_report_shows_the_gaze_table_and_overlays(gaze_runs):
    out, folders = gaze_runs
    written = report([str(out / "results"), "--out", str(out / "report"), "--replicates", "40"])
    assert out / "report" / "figures" / "gaze_overlays_phantom.png" in written
    table = (out / "report" / "tables" / "gaze_phantom.md").read_text()
    rows = {line.split("|")[1].strip().strip("*"): line for line in table.splitlines()
            if line.startswith("| ") and "---" not in line}
    assert {"random", "gaze_centre_bias", "phantom-second (human)"} <= set(rows)
    assert "**" not in rows["phantom-second (human)"]  # apart (in italics): never ranked
    assert rows["phantom-second (human)"].split("|")[1].strip().startswith("*")
    intervals = pd.read_csv(out / "report" / "analysis" / "intervals.csv")
    for model, folder in (("random", folders["random"]), ("gaze_centre_bias", folders["gaze_centre_bias"])):
        macro = json.loads((folder / "metrics.json").read_text())["gaze"]["macro"]
        for key in VALUES:
            row = intervals[(intervals["model"] == model) & (intervals["class"] == "macro")
                            & (intervals["metric"] == key)]
            assert len(row) == 1 and row["estimate"].item() == pytest.approx(macro[key], rel=1e-9), (model, key)
            assert row["lower"].item() <= row["estimate"].item() + 1e-12 <= row["upper"].item() + 2e-12 or \
                math.isnan(row["lower"].item())


def test_overlays_carry_the_pairs_gaze(gaze_runs, phantom_root):
    _, folders = gaze_runs
    overlays = np.load(folders["random"] / "overlays.npz")
    assert overlays["has_gaze"].any()
    data = datamodule(phantom_root)
    ids = data.image_ids()
    for i in np.flatnonzero(overlays["has_gaze"]):
        record = data.test_set[ids.index(str(overlays["image_id"][i]))]
        density = record["gaze"][data.classes.index(str(overlays["finding"][i]))]
        np.testing.assert_array_equal(overlays["gaze"][i], (density / density.max() * 255).round().to(torch.uint8))


def test_the_synthetic_readings_are_deterministic_and_inside_the_frame(phantom_root):
    """Each finding's gaze is a density of its own fixations, inside the frame (those outside dropped),
    the same on every construction; the shuffled fixations are every other reading's; the centre bias
    is a density drawn from readings of other images."""
    first, again = datamodule(phantom_root), datamodule(phantom_root)
    total = sum(sum(p.shape[0] for p in reading.values()) for reading in first.readings.readings)
    for index in range(len(first.test_set)):
        a, b = first.test_set[index], again.test_set[index]
        for key in ("gaze", "fixations", "has_gaze", "shuffled_fixations"):
            assert torch.equal(a[key], b[key]), key
        reading = first.readings.readings[index]
        own = sum(p.shape[0] for p in reading.values())
        assert float(a["shuffled_fixations"].sum()) == total - own
        for c, key in enumerate(first.classes):
            positions = reading.get(key, np.zeros((0, 2)))
            assert ((positions >= 0) & (positions < SIZE)).all()
            assert bool(a["has_gaze"][c]) == (len(positions) > 0) and float(a["fixations"][c].sum()) == len(positions)
            if len(positions):
                assert float(a["gaze"][c].sum()) == pytest.approx(1, abs=1e-5)
            assert bool(a["has_gaze"][c]) <= (a["labels"][c] == 1)
    baseline = first.gaze_baseline()
    assert baseline.shape == (SIZE, SIZE) and float(baseline.sum()) == pytest.approx(1, abs=1e-5)
    assert torch.equal(baseline, again.gaze_baseline())
    assert Phantom(root=str(phantom_root), image_size=SIZE).gaze_baseline() is None


def test_a_run_without_gaze_beside_gaze_runs_is_named_in_the_gaze_table(gaze_runs, phantom_root, tmp_path):
    """The gaze table never drops a model silently: one run on the same images without gaze is named."""
    out, folders = gaze_runs
    results = tmp_path / "results"
    for model, folder in folders.items():
        shutil.copytree(folder, results / model / folder.name)
    main(run_args("centre_prior", "phantom", phantom_root, results / "centre_prior", "--data.second_reader", "true",
                  "--trainer.logger", "false", image_size=SIZE))
    report([str(results), "--out", str(tmp_path / "report"), "--replicates", "20"])
    table = (tmp_path / "report" / "tables" / "gaze_phantom.md").read_text()
    assert "Run without gaze on these images, so not in this table: centre_prior." in table
    assert "| centre_prior |" not in table
