"""The report with the analysis: intervals beside every number, the calibrated threshold, paired
differences, lesion-size strata (table and figure) and the R² interval, from results folders whose
numbers the test sets. Every number is checked against a direct computation in this file: the
bootstrap as a loop over the resampled images (copied by multiplicity), the cross-fitted
threshold as a hand-written K-fold loop, AUROC by scikit-learn."""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.collections import LineCollection
from sklearn.metrics import roc_auc_score
from conftest import names, reseal
from test_analysis import random_counts

from xbench.metrics.bootstrap import assign_folds, random_stream, resample_weights
from xbench.analysis.settings import Settings
from xbench.report import analyse
from xbench.report import main as report_main
from xbench.reporting.benchmark import Benchmark
from xbench.reporting.figures import lesion_size, recognition_vs_grounding
from xbench.results.folder import SCHEMA
from xbench.results.write import write_pairs

DATASET, CLASSES = "chestx_det10", ["nodule", "mass"]
N, SIZE, T = 12, 20, 101  # images; batch side: 400 px per image
#: region sizes: 0.5 %, 5 % and 20 % of the image -- one per default lesion-size bin
REGIONS = (2, 20, 80)
REPLICATES, FOLDS, SEED = 40, 3, 0
#: model -> (seed, skill): the share of hits and the logits' signal grow with skill
MODELS = {"alpha": (1, 0.8), "beta": (2, 0.5), "gamma": (3, 0.2)}


# -- results folders with set numbers -----------------------------------------------------------


def model_data(seed: int, skill: float) -> dict:
    """Per (image, class): label, logit; graded pairs (the positives) with |R|, hit and counts."""
    rng = np.random.default_rng(seed)
    labels = (np.random.default_rng(0).random((N, len(CLASSES))) < 0.6).astype(int)  # the same images for all
    labels[:2] = [[1, 0], [0, 1]]
    image, cls = np.nonzero(labels == 1)
    region = np.array([REGIONS[(i + c) % 3] for i, c in zip(image, cls)])
    predicted, inter = random_counts(rng, region, SIZE * SIZE)
    hit = rng.random(len(image)) < skill
    logits = rng.normal(size=labels.shape) + 3 * skill * labels
    cnr = rng.random(len(image)) * 2 * skill
    return {"labels": labels, "logits": logits, "image": image, "cls": cls, "region": region, "hit": hit,
            "predicted": predicted, "inter": inter, "dice": 2 * inter / (predicted + region[:, None]), "cnr": cnr}


def per_class_means(data: dict, values: np.ndarray, drawn: np.ndarray) -> np.ndarray:
    """[C, ...]: the mean of a per-pair value over the drawn images' pairs of each class (NaN: none)."""
    counts = np.bincount(drawn, minlength=N)[data["image"]]
    out = []
    for c in range(len(CLASSES)):
        w = counts * (data["cls"] == c)
        out.append(np.tensordot(w, values, 1) / w.sum() if w.sum() else np.full(values.shape[1:], np.nan))
    return np.array(out)


def write_folder(root: Path, model: str, data: dict, minute: int) -> Path:
    """metrics.json with the numbers computed here, and pairs.csv.gz through the real writer."""
    everything = np.arange(N)
    dice_curve = per_class_means(data, data["dice"], everything)  # [C, 101]
    iou = data["inter"] / (data["predicted"] + data["region"][:, None] - data["inter"])
    iou_curve = per_class_means(data, iou, everything)
    pointing = per_class_means(data, data["hit"].astype(float), everything)
    auroc = [roc_auc_score(data["labels"][:, c], data["logits"][:, c]) for c in range(len(CLASSES))]
    macro = {"pointing_game": pointing.mean(), "dice@0.5": dice_curve[:, 50].mean(),
             "dice@best": dice_curve.max(1).mean(), "iou@0.5": iou_curve[:, 50].mean(), "iou@best": iou_curve.max(1).mean()}
    payload = {
        "schema": SCHEMA, "model": model, "dataset": DATASET, "classes": CLASSES,
        "created": datetime(2026, 1, 1, 0, minute, tzinfo=timezone.utc).isoformat(),
        "thresholds": [k / 100 for k in range(T)],
        "grounding": {
            "macro": macro,
            "per_class": {key: {"pairs": int((data["cls"] == c).sum()), "pointing_game": pointing[c],
                                "dice@0.5": dice_curve[c, 50], "iou@0.5": iou_curve[c, 50]}
                          for c, key in enumerate(CLASSES)},
            "curves": {key: {"dice": dice_curve[c].tolist(), "iou": iou_curve[c].tolist()}
                       for c, key in enumerate(CLASSES)},
        },
        "classification": {"macro": {"auroc": float(np.mean(auroc)), "auprc": 0.5, "f1@0.5": 0.5,
                                     "accuracy@0.5": 0.5, "max_f1": 0.5, "accuracy@max_f1": 0.5}},
        "data": {"images_evaluated": N, "images_in_split": N, "image_size": SIZE, "lost_regions": {}},
        "config": {"model": {"class_path": f"synthetic.{model.title()}", "init_args": {}},
                   "data": {"class_path": "synthetic.Data", "init_args": {"augment": None}}},
        "names": names(model.title(), DATASET, CLASSES),
    }
    folder = root / f"{model}__{DATASET}__1"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(payload))
    records = {"index": torch.as_tensor(data["image"]), "class": torch.as_tensor(data["cls"]),
               "region": torch.as_tensor(data["region"]), "hit": torch.as_tensor(data["hit"]),
               "predicted": torch.as_tensor(data["predicted"]), "inter": torch.as_tensor(data["inter"]),
               "cnr": torch.as_tensor(data["cnr"])}
    labels = {"index": torch.arange(N), "logits": torch.as_tensor(data["logits"], dtype=torch.float32),
              "labels": torch.as_tensor(data["labels"], dtype=torch.int8)}
    image_ids = [f"img{i:02d}" for i in range(N)]  # sorted = index order, as the analysis orders images
    write_pairs(folder / "pairs.csv.gz", payload, records, labels, image_ids)
    return reseal(folder)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report_analysis")
    data = {model: model_data(*args) for model, args in MODELS.items()}
    for minute, (model, values) in enumerate(data.items()):
        write_folder(root / "results", model, values, minute)
    files = report_main([str(root / "results"), "--out", str(root / "report"), "--replicates", str(REPLICATES),
                         "--folds", str(FOLDS), "--seed", str(SEED)])
    return root, data, files


# -- the direct computation ---------------------------------------------------------------------


def drawn_images() -> list[np.ndarray]:
    """Row 0 every image once, then each replicate's images, copied as often as they were drawn."""
    weights = resample_weights(N, REPLICATES, random_stream(SEED, DATASET, "test")).numpy().astype(int)
    return [np.repeat(np.arange(N), row) for row in weights]


def estimate_and_interval(values: list[float]) -> tuple[float, float, float]:
    low, high = np.nanquantile(np.array(values[1:], dtype=float), [0.025, 0.975])
    return values[0], low, high


def macro_pointing_game(data: dict, drawn: np.ndarray) -> float:
    return float(np.nanmean(per_class_means(data, data["hit"].astype(float), drawn)))


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    """Rows by their label (the first column after an optional ``group``)."""
    with open(path) as handle:
        rows = list(csv.DictReader(handle))
    label = [name for name in rows[0] if name != "group"][0]
    return {row[label]: row for row in rows}


def cells(row: dict, column: str) -> tuple[float, float, float]:
    return tuple(float(row[name]) / 100 for name in (column, f"{column} low", f"{column} high"))


def shown(estimate: float, low: float, high: float) -> str:
    return f"{100 * estimate:.1f} [{100 * low:.1f}, {100 * high:.1f}]"


# -- tables ------------------------------------------------------------------------------------


def test_every_headline_number_has_its_bootstrap_interval(built):
    root, data, files = built
    grounding = read_csv(root / "report" / "tables" / "grounding.csv")
    report = (root / "report" / "report.md").read_text()
    for model in MODELS:
        expected = estimate_and_interval([macro_pointing_game(data[model], d) for d in drawn_images()])
        got = cells(grounding[model.title()], "ChestX-Det10 PG")
        np.testing.assert_allclose(got, expected, rtol=1e-9)
        assert shown(*expected) in report  # 61.6 [58.9, 64.2]
    dice = estimate_and_interval([
        float(np.nanmean(per_class_means(data["beta"], data["beta"]["dice"][:, 50], d))) for d in drawn_images()])
    fixed = read_csv(root / "report" / "tables" / "grounding_fixed_tau.csv")
    np.testing.assert_allclose(cells(fixed["Beta"], "ChestX-Det10 Dice@0.5"), dice, rtol=1e-9)
    recognition = read_csv(root / "report" / "tables" / "recognition.csv")
    assert all(recognition["Alpha"][f"{column} low"] for column in ("AUROC", "max-F1*", "Acc@max-F1*"))
    assert "95% bootstrap percentile interval (40 replicates" in report
    assert {p.name for p in files if p.parent.name == "analysis"} == {
        "intervals.csv", "differences.csv", "calibration.csv", "strata.csv", "correlation.csv", "human_gaps.csv",
        "gaze_gaps.csv", "chexlocalize_decrease.csv", "chexlocalize_not_comparable.csv", "analysis.json", "summary.md"}


def test_calibrated_tau_column_equals_a_hand_written_k_fold_loop(built):
    root, data, _ = built
    table = read_csv(root / "report" / "tables" / "threshold_calibration.csv")
    folds = assign_folds(N, FOLDS, random_stream(SEED, DATASET, "folds")).numpy()
    for model, values in data.items():
        per_class = []
        for c in range(len(CLASSES)):
            rows = np.flatnonzero(values["cls"] == c)
            fold = folds[values["image"][rows]]
            scores = []
            for f in range(FOLDS):
                train, held = rows[fold != f], rows[fold == f]
                tau = int(np.argmax(values["dice"][train].mean(0)))  # the first maximum: smallest tau
                scores += list(values["dice"][held, tau])
            per_class.append(np.mean(scores))
        row = table[model.title()]
        assert float(row["Dice@τcal"]) / 100 == pytest.approx(np.mean(per_class), rel=1e-9)
        best = per_class_means(values, values["dice"], np.arange(N)).max(1).mean()
        fixed = per_class_means(values, values["dice"][:, 50], np.arange(N)).mean()
        assert float(row["Dice@τ*"]) / 100 == pytest.approx(best, rel=1e-9)
        assert float(row["Dice@0.5"]) / 100 == pytest.approx(fixed, rel=1e-9)
        assert float(row["ΔDice τ*"]) / 100 == pytest.approx(best - fixed, rel=1e-9)
        # the paper's gap has its paired interval: tau* re-chosen and both Dice values from the same replicate
        gaps = [np.nanmean(per_class_means(values, values["dice"], d).max(1))
                - np.nanmean(per_class_means(values, values["dice"][:, 50], d)) for d in drawn_images()]
        np.testing.assert_allclose(cells(row, "ΔDice τ*"), estimate_and_interval(gaps), rtol=1e-9, atol=1e-12)
        assert float(row["ΔDice τcal"]) / 100 == pytest.approx(np.mean(per_class) - fixed, rel=1e-9)
    markdown = (root / "report" / "tables" / "threshold_calibration.md").read_text()
    assert "| Model | Dice@0.5 | Dice@τcal | Dice@τ* | ΔDice τcal | ΔDice τ* |" in markdown
    assert "cross-fitting over the test images (3 folds)" in markdown and "Chosen on the evaluated set" in markdown


def test_paired_differences_per_dataset(built):
    root, data, _ = built
    table = read_csv(root / "report" / "tables" / "differences_chestx_det10.csv")
    assert list(table) == ["Alpha − Beta", "Alpha − Gamma", "Beta − Gamma"]
    for a, b in (("alpha", "beta"), ("beta", "gamma")):
        difference = [macro_pointing_game(data[a], d) - macro_pointing_game(data[b], d) for d in drawn_images()]
        row = table[f"{a.title()} − {b.title()}"]
        np.testing.assert_allclose(cells(row, "PG A − B"), estimate_and_interval(difference), rtol=1e-9, atol=1e-12)
        ahead = np.mean(np.array(difference[1:]) > 0) + 0.5 * np.mean(np.array(difference[1:]) == 0)
        assert float(row["PG P(A>B)"]) / 100 == pytest.approx(ahead, rel=1e-12)


def strata_expected(values: dict, metric: str) -> list[tuple[float, float, float]]:
    """Per lesion-size bin, every class's pairs pooled: the mean over the drawn pairs, with its interval."""
    per_pair = values["hit"].astype(float) if metric == "PG" else values["dice"][:, 50]
    out = []
    for size in REGIONS:
        in_bin = values["region"] == size
        replicates = []
        for drawn in drawn_images():
            w = np.bincount(drawn, minlength=N)[values["image"]] * in_bin
            replicates.append(w @ per_pair / w.sum() if w.sum() else math.nan)
        out.append(estimate_and_interval(replicates))
    return out


def test_lesion_size_table_counts_and_scores_each_bin(built):
    root, data, _ = built
    path = root / "report" / "tables" / "lesion_size_chestx_det10.csv"
    table = read_csv(path)
    header = next(csv.reader(open(path)))
    counts = [int((data["alpha"]["region"] == size).sum()) for size in REGIONS]
    assert header[1:4] == [f"< 1% (n = {counts[0]}) PG", f"< 1% (n = {counts[0]}) PG low",
                           f"< 1% (n = {counts[0]}) PG high"]
    assert f"≥ 10% (n = {counts[2]}) Dice@0.5" in header
    for model, values in data.items():
        for metric in ("PG", "Dice@0.5"):
            for (estimate, low, high), label, n in zip(strata_expected(values, metric), ("< 1%", "1–10%", "≥ 10%"),
                                                       counts):
                got = cells(table[model.title()], f"{label} (n = {n}) {metric}")
                np.testing.assert_allclose(got, (estimate, low, high), rtol=1e-9, atol=1e-12)


def test_r2_of_recognition_and_grounding_with_its_interval(built):
    root, data, _ = built
    def macro_auroc(values: dict, drawn: np.ndarray) -> float:
        """The mean over the classes with both labels among the drawn images (macro over defined classes)."""
        labels, logits = values["labels"][drawn], values["logits"][drawn]
        return np.mean([roc_auc_score(labels[:, c], logits[:, c]) for c in range(len(CLASSES))
                        if len(set(labels[:, c])) == 2])

    r2 = []
    for drawn in drawn_images():
        auroc = [macro_auroc(v, drawn) for v in data.values()]
        pointing = [macro_pointing_game(v, drawn) for v in data.values()]
        r2.append(np.corrcoef(auroc, pointing)[0, 1] ** 2)
    expected = estimate_and_interval(r2)
    table = read_csv(root / "report" / "tables" / "recognition_vs_grounding.csv")
    row = table["ChestX-Det10 (n = 3)"]
    got = tuple(float(row[f"R² with AUROC PG{s}"]) for s in ("", " low", " high"))  # a ratio: not in percent
    np.testing.assert_allclose(got, expected, rtol=1e-9)
    bench = Benchmark.from_folders([root / "results"])
    analysis, _ = analyse(bench, Settings(replicates=REPLICATES, folds=FOLDS, seed=SEED), [], root / "again")
    (text,) = recognition_vs_grounding(bench, analysis).figure.axes[0].texts
    assert text.get_text() == (f"R² = {expected[0]:.2f}, 95% CI [{expected[1]:.2f}, {expected[2]:.2f}]  (n = 3)")


# -- the lesion-size figure ----------------------------------------------------------------------


def test_lesion_size_figure_draws_one_line_per_model_with_its_interval(built):
    root, data, _ = built
    bench = Benchmark.from_folders([root / "results"])
    analysis, _ = analyse(bench, Settings(replicates=REPLICATES, folds=FOLDS, seed=SEED), [], root / "again")
    plot = lesion_size(bench, analysis)
    pg, dice = plot.figure.axes[:2]
    assert pg.get_title() == "ChestX-Det10: Pointing Game" and dice.get_title() == "ChestX-Det10: Dice at τ = 0.5"
    counts = [int((data["alpha"]["region"] == size).sum()) for size in REGIONS]
    assert [t.get_text() for t in pg.get_xticklabels()] == [
        f"< 1%\n(n = {counts[0]})", f"1–10%\n(n = {counts[1]})", f"≥ 10%\n(n = {counts[2]})"]
    for ax, metric in ((pg, "PG"), (dice, "Dice@0.5")):
        assert [c.get_label() for c in ax.containers] == ["Alpha", "Beta", "Gamma"]
        for container, values in zip(ax.containers, data.values()):
            line, _, (bars,) = container.lines
            expected = np.array(strata_expected(values, metric))
            np.testing.assert_allclose(line.get_ydata(), 100 * expected[:, 0], rtol=1e-9)
            x = np.asarray(line.get_xdata())
            np.testing.assert_allclose(np.round(x), [0, 1, 2])  # one point per bin, models slightly apart
            assert isinstance(bars, LineCollection)
            segments = np.array(bars.get_segments())  # one vertical bar per bin, from the lower to the upper bound
            np.testing.assert_allclose(segments[:, :, 1], 100 * expected[:, 1:], rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(segments[:, 0, 0], x)
    offsets = [np.asarray(c.lines[0].get_xdata())[0] for c in pg.containers]
    assert offsets == sorted(offsets) and len(set(offsets)) == 3
    assert "95% bootstrap intervals (40 replicates" in plot.caption


def test_no_analysis_leaves_the_intervals_out(built, tmp_path):
    root, _, _ = built
    files = report_main([str(root / "results"), "--out", str(tmp_path / "plain"), "--no-analysis"])
    names = {p.name for p in files}
    assert "threshold_calibration.md" not in names and "lesion_size.png" not in names
    assert not any(p.parent.name == "analysis" for p in files)
    grounding = (tmp_path / "plain" / "tables" / "grounding.md").read_text()
    assert "[" not in grounding.split("\n\n")[1]  # the grid: values only
    assert "--no-analysis" in (tmp_path / "plain" / "report.md").read_text()


def test_the_analysis_step_shows_its_progress_on_a_terminal(built, tmp_path, monkeypatch):
    """The report's longest step, the bootstrap, names itself while it runs (on a terminal only:
    `test_report.py` holds the quiet case)."""
    import io

    import xbench.report
    from rich.console import Console

    root, _, _ = built
    screen = io.StringIO()
    monkeypatch.setattr(xbench.report, "Console", lambda stderr: Console(file=screen, force_terminal=True))
    report_main([str(root / "results"), "--out", str(tmp_path / "shown"), "--replicates", str(REPLICATES)])
    assert f"Analysing {len(MODELS)} runs: {REPLICATES} bootstrap replicates..." in screen.getvalue()
