"""The gaze's human scale (issue 51.4): on REFLACX's release-format fixture in reads mode (the
interobserver ceiling), ``--model human``, ``random`` and ``gaze_centre_bias`` run through
``python -m xbench.test`` and ``xbench.report``. Each model's gap to the interobserver reader is
checked against a brute-force bootstrap written here: each replicate's radiographs drawn from the
analysis' stream, every read of a drawn radiograph copied in, each metric a plain mean over the
copied pairs of ``gaze.csv.gz`` where it is defined, the macro mean over classes."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest
from conftest import run_args
from test_reflacx import write_release

from xbench.analysis.tables import GAZE_GAP_METRICS, MACRO
from xbench.metrics.bootstrap import random_stream
from xbench.reads import radiograph_of
from xbench.report import main as report_main
from xbench.test import main

REPLICATES, SEED, CONFIDENCE = 40, 0, 0.95
HUMAN, MODELS = "human:reflacx-interobserver", ("random", "gaze_centre_bias")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("gaze_gap")
    write_release(root / "reflacx", root / "mimic")
    for model in ("human", *MODELS):
        main(run_args(model, "reflacx", root / "reflacx", root / "results", "--data.images_root", str(root / "mimic"),
                      "--trainer.logger", "false", "--data.reads", "true", "--data.split", "all", image_size=16))
    # the fixture's interobserver images are two radiographs: two folds for the cross-fitted τ
    report_main([str(root / "results"), "--out", str(root / "report"), "--replicates", str(REPLICATES),
                 "--folds", "2"])
    folders = {json.loads((f / "metrics.json").read_text())["model"]: f for f in (root / "results").iterdir()}
    return root, folders


def brute_force(folders: dict, model: str, classes: list[str]) -> dict:
    """(class or macro, metric) -> ([R + 1] model values, [R + 1] human values), row 0 the full set."""
    tables = {name: pd.read_csv(folders[name] / "gaze.csv.gz", dtype={"image_id": str}) for name in (model, HUMAN)}
    samples = sorted(pd.read_csv(folders[model] / "pairs.csv.gz", dtype={"image_id": str})["image_id"].unique())
    radiographs = sorted({radiograph_of(s) for s in samples})
    of = {g: [s for s in samples if radiograph_of(s) == g] for g in radiographs}
    rng = random_stream(SEED, "reflacx", "test")
    draws = [radiographs] + [[radiographs[k] for k in row] for row in rng.integers(0, len(radiographs),
                                                                                    size=(REPLICATES, len(radiographs)))]

    def values(table, drawn):
        copied = pd.concat([table[table["image_id"] == s] for g in drawn for s in of[g]])
        per_class = {}
        for c in classes:
            rows = copied[copied["class"] == c]
            per_class[c] = {m: rows[m].dropna().mean() if rows[m].notna().any() else np.nan for m in GAZE_GAP_METRICS}
        with np.errstate(all="ignore"):
            per_class[MACRO] = {m: np.nanmean([per_class[c][m] for c in classes]) for m in GAZE_GAP_METRICS}
        return per_class

    found = [(values(tables[model], d), values(tables[HUMAN], d)) for d in draws]
    return {(key, m): (np.array([a[key][m] for a, _ in found]), np.array([h[key][m] for _, h in found]))
            for key in (*classes, MACRO) for m in GAZE_GAP_METRICS}


def interval(values: np.ndarray) -> list[float]:
    alpha = 1 - CONFIDENCE
    return [values[0], *np.nanquantile(values[1:], [alpha / 2, 1 - alpha / 2])]


def test_each_gaze_gap_equals_the_brute_force_bootstrap(report):
    root, folders = report
    classes = json.loads((folders[HUMAN] / "metrics.json").read_text())["classes"]
    gaps = pd.read_csv(root / "report" / "analysis" / "gaze_gaps.csv")
    assert set(gaps["model"]) == set(MODELS) and set(gaps["human"]) == {HUMAN}
    assert len(gaps) == len(MODELS) * len(GAZE_GAP_METRICS) * (len(classes) + 1)
    assert set(gaps.loc[gaps["lower_better"], "metric"]) == {"kl_divergence"}
    checked = 0
    for model in MODELS:
        for (key, metric), (a, b) in brute_force(folders, model, classes).items():
            (row,) = gaps[(gaps["model"] == model) & (gaps["class"] == key) & (gaps["metric"] == metric)].to_dict(
                "records")
            where = (model, key, metric)
            if np.isnan(a[0]) or np.isnan(b[0]):  # a finding no read of the fixture dictated
                assert np.isnan(row["difference"]), where
                continue
            np.testing.assert_allclose([row["model_value"], row["human_value"]], [a[0], b[0]], rtol=1e-9,
                                       err_msg=str(where))
            np.testing.assert_allclose([row["difference"], row["difference_lower"], row["difference_upper"]],
                                       interval(a - b), rtol=1e-9, atol=1e-12, err_msg=str(where))
            ahead = (b - a if row["lower_better"] else a - b)[1:]
            ahead = ahead[~np.isnan(ahead)]
            assert row["model_better"] == pytest.approx(((ahead > 0).sum() + 0.5 * (ahead == 0).sum()) / len(ahead))
            with np.errstate(divide="ignore", invalid="ignore"):
                share = np.where(b != 0, a / b, np.nan)
            np.testing.assert_allclose([row["share"], row["share_lower"], row["share_upper"]], interval(share),
                                       rtol=1e-9, atol=1e-12, err_msg=str(where))
            assert row["replicates"] == int((~np.isnan(share[1:])).sum())
            checked += 1
    assert checked >= 2 * len(MODELS) * len(GAZE_GAP_METRICS)  # at least two findings and the mean
    human_macro = json.loads((folders[HUMAN] / "metrics.json").read_text())["gaze"]["macro"]
    for metric in GAZE_GAP_METRICS:  # the human's value is its own run's
        (value,) = gaps.loc[(gaps["model"] == "random") & (gaps["class"] == MACRO) & (gaps["metric"] == metric),
                            "human_value"]
        assert value == pytest.approx(human_macro[metric], rel=1e-9)


def row_text(gaps: pd.DataFrame, model: str, metric: str) -> str:
    (row,) = gaps[(gaps["model"] == model) & (gaps["class"] == MACRO) & (gaps["metric"] == metric)].to_dict("records")
    return f"{row['difference']:.2f} [{row['difference_lower']:.2f}, {row['difference_upper']:.2f}]"


def test_the_report_shows_the_interobserver_row_apart_and_the_gap_table(report):
    root, _ = report
    tables = root / "report" / "tables"
    gaze = (tables / "gaze_reflacx.md").read_text()
    (human,) = re.findall(r"^\| \*reflacx-interobserver \(human\)\* \|(.*)$", gaze, re.M)
    assert "**" not in human and "<ins>" not in human  # never ranked
    assert gaze.index("| random |") < gaze.index("*reflacx-interobserver (human)*")  # after the models
    gaps = pd.read_csv(root / "report" / "analysis" / "gaze_gaps.csv")
    table = pd.read_csv(tables / "gaze_gap_reflacx.csv")
    assert set(table["Model"]) == set(MODELS) and "Mean" in set(table["group"])
    shorts = {"nss": "NSS", "kl_divergence": "KL", "shuffled_ncc": "sNCC"}
    for cells in table.to_dict("records"):
        key = MACRO if cells["group"] == "Mean" else next(
            c for c in gaps["class"].unique() if cells["group"].lower().replace("/", "_") == c)
        for metric, name in shorts.items():
            (gap,) = gaps[(gaps["model"] == cells["Model"]) & (gaps["class"] == key)
                          & (gaps["metric"] == metric)].to_dict("records")
            np.testing.assert_allclose(
                [cells[f"M − H {name}"], cells[f"M − H {name} low"], cells[f"M − H {name} high"]],
                [gap["difference"], gap["difference_lower"], gap["difference_upper"]], rtol=1e-9)
    assert "for KL (lower is better" in (tables / "gaze_gap_reflacx.md").read_text()

    nss = gaps[(gaps["class"] == MACRO) & (gaps["metric"] == "nss")]
    best = nss.loc[nss["model_value"].idxmax()]
    line = (f"On REFLACX, the best model, {best['model']}, reaches {best['share']:.2f} [{best['share_lower']:.2f}, "
            f"{best['share_upper']:.2f}] of the interobserver NSS (reflacx-interobserver: {best['human_value']:.2f}).")
    assert f"- {line}" in (root / "report" / "report.md").read_text()
    summary = (root / "report" / "analysis" / "summary.md").read_text()  # the analysis names runs by their keys
    assert line.replace("On REFLACX", "On reflacx").replace("(reflacx-interobserver", f"({HUMAN}") in summary
    assert f"| random − {HUMAN} | {row_text(gaps, 'random', 'nss')} |" in summary
    keys = json.loads((root / "report" / "analysis" / "analysis.json").read_text())["wandb"]
    row = gaps[(gaps["model"] == "random") & (gaps["class"] == MACRO) & (gaps["metric"] == "kl_divergence")].iloc[0]
    assert keys["random__reflacx"][f"human_gap/{HUMAN}/kl_divergence/macro"] == pytest.approx(row["difference"])
    assert keys["random__reflacx"][f"human_share/{HUMAN}/kl_divergence/macro/upper"] == pytest.approx(
        row["share_upper"])
