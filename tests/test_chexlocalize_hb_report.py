"""cheXlocalize's percentage decrease in the report: the human run and a saved-map run with
``native_protocol`` on release-format files (tools/chexlocalize_hb_golden.py's `write_release`) write
their native-size rows, and the report's table equals what their heatmap_to_segmentation.py, eval.py
and calculate_percentage_decrease.py printed on the same files (tests/golden/chexlocalize_hb.json).
"""

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import run_args
from test_chexlocalize_hb import GOLDEN, SIZES, TASKS, TOOL
from xbench.analyze import main as analyze_main
from xbench.data.chexlocalize import CheXlocalize
from xbench.findings import finding_key
from xbench.metrics.human_benchmark import AVERAGE, ScoreTable, paired_gap
from xbench.metrics.native import CHEXLOCALIZE_COLUMNS, otsu_segmentation, native_upsample, true_positive_iou
from xbench.report import main as report_main
from xbench.test import main

KEYS = {finding_key("chexlocalize", task): task for task in TASKS}
CLASSES = "[" + ",".join(KEYS) + "]"
REPLICATES = 40


def _run(model: str, root, results, *extra: str) -> dict:
    return main(run_args(model, "chexlocalize", root, results, "--data.classes", CLASSES, "--trainer.logger", "false",
                         "--data.cache", "false", *extra, image_size=32))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The human benchmark's run, the saved maps' run with their protocol, and one without it."""
    root = tmp_path_factory.mktemp("chexlocalize_hb_report")
    TOOL.write_release(root)
    results = root / "results"
    _run("human", root, results, "--data.human_benchmark", "true")
    _run("precomputed_chexlocalize", root, results, "--model.path", str(root / "model" / "maps"),
         "--model.native_protocol", "true")
    _run("centre_prior", root, results)
    return root, {json.loads(path.read_text())["model"]: path.parent for path in results.glob("*/metrics.json")}


def _native_rows(folder) -> pd.DataFrame:
    with gzip.open(folder / "chexlocalize_pairs.csv.gz", "rt") as handle:
        return pd.read_csv(handle)


def test_the_human_run_writes_their_per_pair_values_at_native_size(runs):
    """Each row equals a loop over the release: the human benchmark's IoU (NaN unless both drawn) and
    hit (any point in the mask) at native size; the rows are those of the golden's per-CXR tables."""
    root, folders = runs
    rows = _native_rows(folders["human:chexlocalize-hb"])
    manifest = json.loads((folders["human:chexlocalize-hb"] / "manifest.json").read_text())
    assert "chexlocalize_pairs.csv.gz" in manifest["files"]
    datamodule = CheXlocalize(str(root), split="test", human_benchmark=True, cache=False)
    readers = datamodule.reader_set()
    expected = 0
    for sample in datamodule.samples:
        height, width = SIZES[sample.image_id]
        for key, region in sample.regions.items():
            truth = region.to_mask(height, width)[0]
            mark = readers.marks[sample.image_id].get(key)
            drawn = mark.region.to_mask(height, width)[0] if mark is not None and mark.region is not None else None
            iou = (drawn & truth).sum() / (drawn | truth).sum() if drawn is not None else math.nan
            hit = float(any(truth[int(y), int(x)] for x, y in (mark.points if mark else ())))
            row = rows[(rows.image_id == sample.image_id) & (rows["class"] == key)].iloc[0]
            for column in ("chexlocalize_iou_fixed", "chexlocalize_iou_otsu"):
                assert (math.isnan(row[column]) and math.isnan(iou)) or row[column] == pytest.approx(iou, abs=1e-12)
            assert row["chexlocalize_hit_rate"] == hit
            binary = np.zeros((height, width), bool) if drawn is None else drawn.copy()  # the map at tau = 0.5
            for x, y in mark.points if mark else ():
                binary[int(y), int(x)] = True
            assert row["xbench_iou@0.5"] == pytest.approx((binary & truth).sum() / (binary | truth).sum(), abs=1e-12)
            expected += 1
    assert len(rows) == expected
    theirs = {(r["img_id"], task): (r[task], h[task]) for r, h in zip(GOLDEN["hb_iou"]["per_cxr"],
                                                                       GOLDEN["hb_hitmiss"]["per_cxr"]) for task in TASKS}
    for row in rows.itertuples():
        iou, hit = theirs[row.image_id, KEYS[row[3]]]
        assert (iou is None and math.isnan(row.chexlocalize_iou_otsu)) or row.chexlocalize_iou_otsu == pytest.approx(iou)
        assert row.chexlocalize_hit_rate == hit
    payload = json.loads((folders["human:chexlocalize-hb"] / "metrics.json").read_text())
    protocol = payload["reader_set"]["chexlocalize_protocol"]
    assert protocol["findings"] == list(KEYS)  # Lung Lesion's ground truth is empty on every CXR, still a task
    assert protocol["per_class"]["edema"]["pairs"] == int((rows["class"] == "edema").sum())


def test_the_saved_maps_rows_are_their_otsu_iou_and_argmax_hit(runs):
    root, folders = runs
    rows = _native_rows(folders["precomputedsaliency"])
    assert list(rows.columns) == ["image_index", "image_id", "class", *CHEXLOCALIZE_COLUMNS]
    theirs = {(r["img_id"], task): r[task] for r in GOLDEN["maps_iou"]["per_cxr"] for task in TASKS}
    hits = {(r["img_id"], task): r[task] for r in GOLDEN["model_hitmiss"]["per_cxr"] for task in TASKS}
    for row in rows.itertuples():
        iou = theirs[row.image_id, KEYS[row[3]]]
        assert (iou is None and math.isnan(row.chexlocalize_iou_otsu)) or row.chexlocalize_iou_otsu == pytest.approx(iou)
        assert row.chexlocalize_hit_rate == hits[row.image_id, KEYS[row[3]]]
    defined = sum(v is not None for v in theirs.values())
    assert rows.chexlocalize_iou_otsu.notna().sum() == defined > 0


def _theirs(name: str) -> dict[str, dict]:
    return {(row[""] if row[""] == AVERAGE else finding_key("chexlocalize", row[""])): row for row in GOLDEN[name]}


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    root, _ = runs
    out = tmp_path_factory.mktemp("report")
    report_main([str(root / "results"), "--out", str(out), "--replicates", str(REPLICATES)])
    return out


def test_the_reports_table_is_their_percentage_decrease(report):
    """Every number of their two pct_decrease tables, to the digit they print, and their Average row."""
    table = pd.read_csv(report / "analysis" / "chexlocalize_decrease.csv", keep_default_na=False, na_values=[""])
    assert set(table.model) == {"precomputedsaliency"} and set(table.human) == {"human:chexlocalize-hb"}
    for metric, golden in (("miou", "maps_miou_pct_decrease"), ("hitrate", "hitrate_pct_decrease")):
        ours = table[table.metric == metric].set_index("class")
        theirs = _theirs(golden)
        assert list(ours.index) == [*KEYS, AVERAGE]
        for key, row in theirs.items():
            for column in ("hb", "pred", "pct_diff", "pct_diff_lower", "pct_diff_upper"):
                value, expected = ours.loc[key, column], row[column]
                if expected is None:
                    assert math.isnan(value), (metric, key, column)
                elif math.isinf(expected) or key == AVERAGE or column != "hb" and column != "pred":
                    assert value == expected, (metric, key, column)  # as they print it
                else:
                    assert value == pytest.approx(expected, rel=1e-12), (metric, key, column)


def test_the_paired_form_beside_it_is_one_resample_of_both(runs, report):
    """XBench's columns equal `paired_gap` on per-CXR tables built here from the release (their
    Otsu segmentation of each map, the human benchmark's drawn masks)."""
    root, _ = runs
    table = pd.read_csv(report / "analysis" / "chexlocalize_decrease.csv")
    datamodule = CheXlocalize(str(root), split="test", human_benchmark=True, cache=False)
    readers = datamodule.reader_set()
    import pickle
    model, human = {}, {}
    for sample in datamodule.samples:
        height, width = SIZES[sample.image_id]
        for key, region in sample.regions.items():
            truth = torch.from_numpy(region.to_mask(height, width)[0])
            with open(root / "model" / "maps" / f"{sample.image_id}_{KEYS[key]}_map.pkl", "rb") as handle:
                raw = pickle.load(handle)["map"][0, 0]
            upsampled = native_upsample(raw, (height, width))
            normalised = (upsampled - upsampled.min()) / (upsampled - upsampled.min()).max()
            model[sample.image_id, key] = true_positive_iou(otsu_segmentation(normalised)[1], truth)
            mark = readers.marks[sample.image_id].get(key)
            drawn = torch.zeros_like(truth) if mark is None or mark.region is None else \
                torch.from_numpy(mark.region.to_mask(height, width)[0])
            human[sample.image_id, key] = true_positive_iou(drawn, truth)
    tables = [ScoreTable.from_pairs(scores, SIZES, list(KEYS)) for scores in (model, human)]
    expected = paired_gap(*tables, replicates=REPLICATES, seed=0)
    ours = table[table.metric == "miou"].set_index("class")
    for key, entry in expected.items():
        for column, value in (("model_value", entry["model"]), ("human_value", entry["human"]),
                              ("difference", entry["difference"]["estimate"]),
                              ("difference_lower", entry["difference"]["lower"]),
                              ("decrease", entry["percentage_decrease"]["estimate"] / 100),
                              ("decrease_upper", entry["percentage_decrease"]["upper"] / 100)):
            assert (math.isnan(value) and math.isnan(ours.loc[key, column])) or \
                ours.loc[key, column] == pytest.approx(value, abs=1e-9), (key, column)


def test_the_rendered_table_and_the_model_without_native_rows(report):
    text = (report / "tables" / "chexlocalize_decrease_chexlocalize.md").read_text()
    assert "% decrease (theirs)" in text and "Average" in text
    average = _theirs("maps_miou_pct_decrease")[AVERAGE]
    assert f"{average['pct_diff']:.3f} [{average['pct_diff_lower']:.3f}, {average['pct_diff_upper']:.3f}]" in text
    line = "Not comparable by cheXlocalize's protocol on CheXlocalize"
    assert line in text and "centre_prior" in text.split(line)[1]
    assert line in (report / "report.md").read_text()
    apart = pd.read_csv(report / "analysis" / "chexlocalize_not_comparable.csv")
    assert list(apart.model) == ["centre_prior"]


def test_xbench_analyze_writes_the_same_table(runs, report, tmp_path):
    root, _ = runs
    analyze_main([str(root / "results"), "--out", str(tmp_path), "--replicates", str(REPLICATES)])
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "chexlocalize_decrease.csv"),
                                  pd.read_csv(report / "analysis" / "chexlocalize_decrease.csv"))
    assert "cheXlocalize's percentage decrease" in (tmp_path / "summary.md").read_text()
