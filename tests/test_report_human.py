"""The human scale in every report (issue 49.5): the phantom's synthetic second reader run as
``--model human`` beside models, through ``python -m xbench.test``, ``xbench.analyze`` and
``xbench.report``. The gaps are checked against a brute-force bootstrap written here: each
replicate's radiographs drawn from the same stream, every read of a drawn radiograph copied in,
each metric a plain mean over the copied pairs of ``pairs.csv.gz``."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pandas as pd
import pytest
from conftest import run_args

from xbench.analysis.tables import HUMAN_GAP_METRICS, MACRO
from xbench.analyze import main as analyze_main
from xbench.data.phantom import MISSED, Phantom
from xbench.metrics.bootstrap import random_stream
from xbench.reads import radiograph_of
from xbench.report import main as report_main
from xbench.reporting.analysis_summary import NO_HUMAN_LINE
from xbench.results.folder import folder_name
from xbench.test import main

REPLICATES, SEED, CONFIDENCE = 60, 0, 0.95
DATASET, CLASSES = "phantom", ("nodule", "mass", "consolidation")
#: Small runs: 10 radiographs of 64 pixels, scored in a 32-pixel frame.
PHANTOM = ("--data.num_images", "10", "--data.native_size", "64", "--data.seed", "5", "--data.second_reader", "true")


def run_set(root, results, models, *extra):
    """Each of ``models`` and ``--model human`` on the same phantom; the folder of each by model."""
    for model in (*models, "human"):
        main(run_args(model, "phantom", root, results, "--trainer.logger", "false", *PHANTOM, *extra,
                      image_size=32))
    return {json.loads((f / "metrics.json").read_text())["model"]: f for f in results.iterdir()}


@pytest.fixture(scope="module")
def reads(tmp_path_factory):
    """Two reads per radiograph: centre prior, random maps and the human reader."""
    root = tmp_path_factory.mktemp("human_reads")
    folders = run_set(root / "phantom", root / "results", ("centre_prior", "random"), "--data.reads", "2")
    analyze_main([str(root / "results"), "--out", str(root / "analysis"), "--replicates", str(REPLICATES)])
    report_main([str(root / "results"), "--out", str(root / "report"), "--replicates", str(REPLICATES)])
    return root, folders


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """One sample per radiograph: centre prior and the human reader."""
    root = tmp_path_factory.mktemp("human_images")
    folders = run_set(root / "phantom", root / "results", ("centre_prior",))
    analyze_main([str(root / "results"), "--out", str(root / "analysis"), "--replicates", str(REPLICATES)])
    return root, folders


# -- the second reader ----------------------------------------------------------------------------


def test_the_phantoms_second_reader_is_deterministic_and_imperfect(tmp_path):
    def reader(**options):
        data = Phantom(root=str(tmp_path / "set"), num_images=30, native_size=64, seed=2, **options)
        data.prepare_data()
        return data, data.reader_set()

    data, first = reader(second_reader=True)
    assert reader()[1] is None  # without the option the dataset has no reader to score
    assert reader(second_reader=True)[1] == first  # the same marks every time
    regions = [(s.image_id, key, region) for s in data.samples for key, region in s.regions.items()]
    marks = [first.marks[image_id][key] for image_id, key, _ in regions]
    missed = sum(mark.label == 0 and mark.region is None for mark in marks)
    assert 0 < missed < len(marks) and abs(missed / len(marks) - MISSED) < 0.2
    moved = [mark.region.xyxy != region.xyxy for mark, (_, _, region) in zip(marks, regions) if mark.label == 1]
    assert all(moved) and all(mark.label in (0, 1) for mark in marks)

    read_data, read_set = reader(second_reader=True, reads=3)
    assert read_data.reads and read_set.name == "phantom-second-x3"
    ids = read_data.image_ids()
    assert ids[:3] == [f"{data.image_ids()[0]}#R{k}" for k in (1, 2, 3)] and len(ids) == 3 * len(data.samples)
    assert {radiograph_of(i) for i in ids} == set(data.image_ids())
    assert read_set.marks[ids[0]] != read_set.marks[ids[1]]  # each read its own jitter


def test_a_human_run_writes_its_folder_under_a_safe_name_with_its_flags(reads, images):
    _, folders = reads
    human = folders["human:phantom-second-x2"]
    assert human.name.startswith("human-phantom-second-x2__phantom__") and ":" not in human.name
    assert folder_name("human:a", "b", "t") == "human-a__b__t"
    payload = json.loads((human / "metrics.json").read_text())
    assert payload["human"] is True and payload["instrument"] is False and payload["data"]["reads"] is True
    assert payload["reader_set"]["name"] == "phantom-second-x2" and "scored against" in payload["reader_set"]["rule"]
    assert payload["names"]["model"] == "phantom-second-x2"
    model = json.loads((folders["centre_prior"] / "metrics.json").read_text())
    assert model["human"] is False and model["data"]["reads"] is True
    plain = json.loads((images[1]["human:phantom-second"] / "metrics.json").read_text())
    assert plain["data"]["reads"] is False


# -- the gaps, by brute force -------------------------------------------------------------------


def pair_values(folder) -> pd.DataFrame:
    """The graded pairs of ``pairs.csv.gz`` with each metric at τ = 0.5, read directly."""
    table = pd.read_csv(folder / "pairs.csv.gz", dtype={"image_id": str})
    table = table[table["graded"]].copy()
    inter, predicted, region = table["inter_050"], table["pred_050"], table["region_px"]
    table["pointing_game"] = table["hit"].astype(float)
    table["dice@0.5"] = 2 * inter / (predicted + region)
    table["iou@0.5"] = inter / (predicted + region - inter)
    return table


def brute_force(folders: dict, model: str, human: str, reads: bool) -> dict:
    """(class or macro, metric) -> (model value, human value, [R] differences, [R] decreases): each
    replicate draws the radiographs with replacement from the analysis' stream and copies every read
    of each drawn radiograph; a class's value is the mean over the copied pairs, macro over classes."""
    tables = {name: pair_values(folders[name]) for name in (model, human)}
    samples = sorted(pd.read_csv(folders[model] / "pairs.csv.gz", dtype={"image_id": str})["image_id"].unique())
    radiographs = sorted({radiograph_of(s) if reads else s for s in samples})
    of = {g: [s for s in samples if (radiograph_of(s) if reads else s) == g] for g in radiographs}
    rng = random_stream(SEED, DATASET, "test")
    draws = [radiographs] + [[radiographs[k] for k in row] for row in rng.integers(0, len(radiographs),
                                                                                    size=(REPLICATES, len(radiographs)))]

    def values(table, drawn):
        copied = pd.concat([table[table["image_id"] == s] for g in drawn for s in of[g]])
        per_class = {c: {m: copied.loc[copied["class"] == c, m].mean() if (copied["class"] == c).any() else np.nan
                         for m in HUMAN_GAP_METRICS} for c in CLASSES}
        per_class[MACRO] = {m: np.nanmean([per_class[c][m] for c in CLASSES]) for m in HUMAN_GAP_METRICS}
        return per_class

    found = [(values(tables[model], d), values(tables[human], d)) for d in draws]
    out = {}
    for key in (*CLASSES, MACRO):
        for metric in HUMAN_GAP_METRICS:
            a = np.array([m[key][metric] for m, _ in found])
            b = np.array([h[key][metric] for _, h in found])
            with np.errstate(divide="ignore", invalid="ignore"):
                decrease = np.where(b != 0, (b - a) / b, np.nan)
            out[(key, metric)] = (a[0], b[0], a - b, decrease)
    return out


def interval(values: np.ndarray) -> tuple[float, float, float]:
    alpha = 1 - CONFIDENCE
    lower, upper = np.nanquantile(values[1:], [alpha / 2, 1 - alpha / 2])
    return values[0], lower, upper


@pytest.mark.parametrize("scenario", ["reads", "images"])
def test_each_gap_equals_the_brute_force_bootstrap(reads, images, scenario):
    root, folders = {"reads": reads, "images": images}[scenario]
    human = next(name for name in folders if name.startswith("human:"))
    gaps = pd.read_csv(root / "analysis" / "human_gaps.csv")
    models = [m for m in folders if not m.startswith("human:")]
    assert sorted(gaps["model"].unique()) == sorted(models) and set(gaps["human"]) == {human}
    assert len(gaps) == len(models) * len(HUMAN_GAP_METRICS) * (len(CLASSES) + 1)
    for model in models:
        expected = brute_force(folders, model, human, scenario == "reads")
        for (key, metric), (model_value, human_value, difference, decrease) in expected.items():
            (row,) = gaps[(gaps["model"] == model) & (gaps["class"] == key) & (gaps["metric"] == metric)].to_dict(
                "records")
            where = (model, key, metric)
            np.testing.assert_allclose([row["model_value"], row["human_value"]], [model_value, human_value],
                                       rtol=1e-9, err_msg=str(where))
            np.testing.assert_allclose([row["difference"], row["difference_lower"], row["difference_upper"]],
                                       interval(difference), rtol=1e-9, atol=1e-12, err_msg=str(where))
            if np.isnan(decrease[0]):
                assert np.isnan(row["decrease"]), where
                continue
            np.testing.assert_allclose([row["decrease"], row["decrease_lower"], row["decrease_upper"]],
                                       interval(decrease), rtol=1e-9, atol=1e-12, err_msg=str(where))
            assert row["replicates"] == int((~np.isnan(decrease[1:])).sum())
    human_macro = json.loads((folders[human] / "metrics.json").read_text())["grounding"]["macro"]
    rows = gaps[(gaps["class"] == MACRO)].set_index(["model", "metric"])
    for metric in HUMAN_GAP_METRICS:  # the human's value is its own run's, at its binary map
        assert rows.loc[(models[0], metric), "human_value"] == pytest.approx(human_macro[metric], rel=1e-9)


def test_reads_of_one_radiograph_are_resampled_together(reads):
    """Resampling reads as if independent would give another (narrower) interval: the analysis'
    interval is the radiographs' one, which the brute force above builds; here, the reads' weights."""
    from xbench.analysis.runs import load_run
    from xbench.metrics.bootstrap import resample_weights

    root, folders = reads
    run = load_run(folders["centre_prior"])
    assert run.reads and int(run.radiographs.max()) + 1 == len(run.image_ids) // 2
    weights = resample_weights(len(run.image_ids), REPLICATES, random_stream(SEED, DATASET, "test"),
                               groups=run.radiographs)
    for g in range(int(run.radiographs.max()) + 1):
        members = (run.radiographs == g).nonzero().flatten()
        assert len(members) == 2 and bool((weights[:, members[0]] == weights[:, members[1]]).all())
    assert bool((weights[1:].sum(1) == len(run.image_ids)).all())  # G radiographs of 2 reads each drawn
    analysis = json.loads((root / "analysis" / "analysis.json").read_text())
    assert analysis["datasets"][0]["radiographs"] == len(run.image_ids) // 2
    assert "radiographs resampled, each with all its reads" in (root / "analysis" / "summary.md").read_text()


# -- the report -----------------------------------------------------------------------------------


def test_the_report_shows_the_human_row_the_gaps_the_figure_and_the_summary_line(reads):
    root, folders = reads
    report = (root / "report" / "report.md").read_text()
    gaps = pd.read_csv(root / "analysis" / "human_gaps.csv")
    human_row = re.compile(r"^\| \*phantom-second-x2 \(human\)\* \|(.*)$", re.M)
    for table in ("grounding", "grounding_fixed_tau", "pointing_game_phantom", "lesion_size_phantom"):
        text = (root / "report" / "tables" / f"{table}.md").read_text()
        (cells,) = human_row.findall(text)
        assert "**" not in cells and "<ins>" not in cells, table  # never ranked
        assert "marked (human)" in text
    for table in ("recognition", "threshold_calibration", "differences_phantom"):
        assert "phantom-second" not in (root / "report" / "tables" / f"{table}.md").read_text(), table
    # Table 1's Dice column of the human row is its binary map's Dice at 0.5
    grounding = pd.read_csv(root / "report" / "tables" / "grounding.csv")
    human_cells = grounding[grounding.iloc[:, 0].str.contains("human")].iloc[0]
    macro = gaps[(gaps["class"] == MACRO) & (gaps["model"] == "centre_prior")].set_index("metric")
    dice_column = [c for c in grounding.columns if "Dice" in c][0]
    assert float(human_cells[dice_column]) == pytest.approx(100 * macro.loc["dice@0.5", "human_value"], abs=0.05)

    table = pd.read_csv(root / "report" / "tables" / "human_gap_phantom.csv")
    groups = {"Nodule": "nodule", "Mass": "mass", "Consolidation": "consolidation", "Mean": MACRO}
    assert len(table) == 2 * len(groups) and set(table["group"]) == set(groups)
    shorts = {"pointing_game": "PG", "dice@0.5": "Dice@0.5", "iou@0.5": "IoU@0.5"}
    for cells in table.to_dict("records"):
        for metric, name in shorts.items():
            (gap,) = gaps[(gaps["model"] == cells["Model"]) & (gaps["class"] == groups[cells["group"]])
                          & (gaps["metric"] == metric)].to_dict("records")
            for column, key in (("M − H", "difference"), ("% decrease", "decrease")):
                np.testing.assert_allclose(
                    [cells[f"{name} {column}"], cells[f"{name} {column} low"], cells[f"{name} {column} high"]],
                    [100 * gap[key], 100 * gap[f"{key}_lower"], 100 * gap[f"{key}_upper"]], rtol=1e-9)
    text = (root / "report" / "tables" / "human_gap_phantom.md").read_text()
    row = gaps[(gaps["model"] == "random") & (gaps["class"] == "mass") & (gaps["metric"] == "dice@0.5")].iloc[0]
    shown = (f"{100 * row['difference']:.1f} [{100 * row['difference_lower']:.1f}, "
             f"{100 * row['difference_upper']:.1f}] | {100 * row['decrease']:.1f} [{100 * row['decrease_lower']:.1f}, "
             f"{100 * row['decrease_upper']:.1f}]")
    assert shown in text

    assert (root / "report" / "figures" / "human_band_phantom.png").stat().st_size > 10_000
    assert "![Figure" in report and "figures/human_band_phantom.png" in report

    iou = gaps[(gaps["class"] == MACRO) & (gaps["metric"] == "iou@0.5")]
    best = iou.loc[iou["model_value"].idxmax()]
    reach = best["model_value"] / best["human_value"]
    line = (f"On Phantom, the best model, {best['model']}, reaches {100 * reach:.1f} % of the human readers' IoU@0.5 "
            f"[{100 * (1 - best['decrease_upper']):.1f}, {100 * (1 - best['decrease_lower']):.1f}] "
            f"(phantom-second-x2: {100 * best['human_value']:.1f}).")
    assert f"- {line}" in report
    plain = line.replace("On Phantom", "On phantom").replace("(phantom-second", "(human:phantom-second")
    assert plain in (root / "analysis" / "summary.md").read_text()  # the analysis names runs by their keys
    assert NO_HUMAN_LINE not in report
    keys = json.loads((root / "analysis" / "analysis.json").read_text())["wandb"]
    assert keys["random__phantom"]["human_gap/human:phantom-second-x2/dice@0.5/mass"] == pytest.approx(
        row["difference"])
    assert keys["random__phantom"]["human_decrease/human:phantom-second-x2/dice@0.5/mass/upper"] == pytest.approx(
        row["decrease_upper"])


def test_the_band_figure_draws_the_human_interval_as_a_shaded_band(reads):
    from matplotlib.collections import FillBetweenPolyCollection, PolyCollection

    from xbench.analysis.settings import Settings
    from xbench.report import analyse
    from xbench.reporting.benchmark import Benchmark
    from xbench.reporting.figures import human_band

    root, _ = reads
    bench = Benchmark.from_folders([root / "results"])
    analysis, _ = analyse(bench, Settings(replicates=REPLICATES), [], root / "again")
    plot = human_band(bench, analysis, DATASET)
    pg = plot.figure.axes[0]
    bands = [c for c in pg.collections if isinstance(c, (PolyCollection, FillBetweenPolyCollection))]
    assert len(bands) == len(CLASSES) + 1  # one band per finding and the mean, each from the human's interval
    lower, upper = analysis.interval(DATASET, "human:phantom-second-x2", MACRO, "pointing_game")
    top, bottom = bands[-1].get_paths()[0].vertices[:, 1].max(), bands[-1].get_paths()[0].vertices[:, 1].min()
    assert (bottom, top) == pytest.approx((100 * lower, 100 * upper))


def test_without_a_human_run_the_report_says_so_in_one_line(images, tmp_path):
    root, folders = images
    shutil.copytree(folders["centre_prior"], tmp_path / "models" / folders["centre_prior"].name)
    report_main([str(tmp_path / "models"), "--out", str(tmp_path / "report"), "--replicates", "5"])
    report = (tmp_path / "report" / "report.md").read_text()
    assert report.count(NO_HUMAN_LINE) == 1 and "(human)" not in report
    assert not list((tmp_path / "report" / "tables").glob("human_gap_*"))
    assert not list((tmp_path / "report" / "figures").glob("human_band_*"))
    assert NO_HUMAN_LINE in (tmp_path / "report" / "analysis" / "summary.md").read_text()


def test_a_human_row_without_the_analysis_is_shown_without_gaps(images, tmp_path):
    root, _ = images
    report_main([str(root / "results"), "--out", str(tmp_path / "report"), "--no-analysis"])
    report = (tmp_path / "report" / "report.md").read_text()
    assert "*phantom-second (human)*" in report and "need the analysis" in report
    assert not list((tmp_path / "report" / "tables").glob("human_gap_*"))


def test_models_with_validation_runs_sit_beside_a_human_run_without_one(images):
    """A human reader's binary map needs no calibrated threshold: with the models' validation runs
    given, the human run is cross-fitted, not refused."""
    import dataclasses

    from xbench.analysis.pipeline import analyze_dataset
    from xbench.analysis.runs import group_runs, load_run
    from xbench.analysis.settings import Settings

    _, folders = images
    runs = [load_run(folder) for folder in folders.values()]
    model = next(run for run in runs if not run.human)
    validation = dataclasses.replace(model, path=model.path.with_name("validation"),
                                     image_ids=tuple(f"val-{i}" for i in model.image_ids))
    (group,) = group_runs(runs, [validation])
    assert set(group.validation) == {"centre_prior"}
    analysis = analyze_dataset(group, Settings(replicates=5, folds=2))
    calibration = {run.label: run.calibration for run in analysis.runs}
    assert calibration == {"centre_prior": "validation (validation)",
                           "human:phantom-second": "cross-fitting (2 folds)"}
