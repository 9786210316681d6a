"""Analyses from results folders: bootstrap intervals, paired differences, re-chosen and
calibrated thresholds, lesion-size strata, recognition in replicates, and the CLI end to end."""

from __future__ import annotations

import gzip
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import average_precision_score, f1_score, precision_recall_curve, roc_auc_score

from conftest import names, reseal, run_args
from xbench.analysis import Settings, analyze, difference_table, strata_table
from xbench.metrics.bootstrap import assign_folds, percentile_interval, random_stream, resample_weights
from xbench.analysis.correlation import r_squared
from xbench.analysis.grounding import CrossFitting, ValidationChoice, grounding_statistics, size_strata
from xbench.metrics.recognition import recognition_statistics
from xbench.analysis.runs import GradedPairs, load_run
from xbench.analyze import main as analyze_main
from xbench.data.phantom import generate_phantom
from xbench.results.folder import SCHEMA
from xbench.results.write import pair_table, write_pairs
from xbench.test import main as run_model

T = 101


# -- synthetic pairs and results folders with known numbers -----------------------------------

def random_counts(rng: np.random.Generator, regions: np.ndarray, area: int) -> tuple[np.ndarray, np.ndarray]:
    """Consistent 101-point counts for pairs of the given |R|: |B_k & R| and |B_k|, non-increasing."""
    inside = -np.sort(-rng.integers(0, regions[:, None] + 1, size=(len(regions), T)), axis=1)
    inside[:, 0] = regions
    outside = -np.sort(-rng.integers(0, (area - regions)[:, None] + 1, size=(len(regions), T)), axis=1)
    outside[:, 0] = area - regions
    return inside + outside, inside


def make_pairs(image, cls, region, hit, predicted, inter, cnr=None) -> GradedPairs:
    """Graded pairs; ``cnr`` default: a value per pair from the counts, NaN (undefined) for every fifth."""
    if cnr is None:
        cnr = np.asarray(inter, dtype=float)[:, 50] / np.asarray(region, dtype=float)
        cnr[::5] = np.nan
    return GradedPairs(*(torch.as_tensor(np.asarray(v)) for v in (image, cls, region, hit)),
                       torch.as_tensor(predicted).long(), torch.as_tensor(inter).long(),
                       torch.as_tensor(np.asarray(cnr, dtype=np.float64)))


def random_pairs(rng, num_images: int, num_classes: int, area: int = 400, share: float = 0.6) -> GradedPairs:
    graded = rng.random((num_images, num_classes)) < share
    image, cls = np.nonzero(graded)
    region = rng.integers(1, area // 2, size=len(image))
    predicted, inter = random_counts(rng, region, area)
    return make_pairs(image, cls, region, inter[:, -1] > 0, predicted, inter)


def pair_dice(pairs: GradedPairs) -> np.ndarray:
    p, i = pairs.predicted.numpy().astype(float), pairs.inter.numpy().astype(float)
    return 2 * i / (p + i[:, :1])


def write_run(folder: Path, model: str, dataset: str, classes: list[str], image_ids: list[str], labels, logits,
              pairs: GradedPairs, image_size: int, model_args: dict | None = None) -> Path:
    """A results folder with a minimal metrics.json (its grounding estimates computed here from the
    pairs) and the real writer's pairs table, sealed by its manifest."""
    folder.mkdir(parents=True)
    payload = {
        "schema": SCHEMA, "model": model, "dataset": dataset, "classes": classes,
        "data": {"image_size": image_size}, "grounding": grounding_estimates(pairs, classes),
        "config": {"model": {"class_path": f"synthetic.{model}", "init_args": model_args or {}}},
        "names": names(model, dataset, classes),
    }
    (folder / "metrics.json").write_text(json.dumps(payload))
    index = torch.arange(len(image_ids))
    write_pairs(
        folder / "pairs.csv.gz",
        payload,
        {"index": pairs.image, "class": pairs.cls, "region": pairs.region, "hit": pairs.hit,
         "predicted": pairs.predicted, "inter": pairs.inter, "cnr": pairs.cnr},
        {"index": index, "logits": torch.as_tensor(logits, dtype=torch.float32),
         "labels": torch.as_tensor(labels, dtype=torch.int8)},
        image_ids,
        chunk_images=4,  # every analysis test reads a table written across chunk boundaries
    )
    return reseal(folder)


def grounding_estimates(pairs: GradedPairs, classes: list[str]) -> dict:
    """``metrics.json``'s Pointing Game, Dice and IoU at 0.5 of ``pairs``, per class and macro (the
    mean over classes with pairs), by the definitions: what the analysis checks its row 0 against."""
    inter, predicted = pairs.inter[:, 50].numpy().astype(float), pairs.predicted[:, 50].numpy().astype(float)
    region, cls = pairs.region.numpy().astype(float), pairs.cls.numpy()
    values = {"pointing_game": pairs.hit.numpy().astype(float), "dice@0.5": 2 * inter / (predicted + region),
              "iou@0.5": inter / (predicted + region - inter)}
    per_class = {key: {name: float(value[cls == c].mean()) if (cls == c).any() else None
                       for name, value in values.items()} for c, key in enumerate(classes)}
    macro = {name: float(np.mean([v[name] for v in per_class.values() if v[name] is not None] or [np.nan]))
             for name in values}
    return {"macro": {name: None if math.isnan(v) else v for name, v in macro.items()}, "per_class": per_class}


def write_random_run(folder, model, image_ids, seed, pairs=None, dataset="synthetic", classes=("nodule", "mass"),
                     model_args=None):
    rng = np.random.default_rng(seed)
    n, c = len(image_ids), len(classes)
    pairs = pairs if pairs is not None else random_pairs(rng, n, c)
    labels = rng.integers(-1, 2, size=(n, c))
    return write_run(folder, model, dataset, list(classes), image_ids, labels, rng.normal(size=(n, c)), pairs, 20,
                     model_args)


# -- bootstrap ------------------------------------------------------------------------------------

def test_resample_weights_are_multiplicities_and_folds_a_partition():
    weights = resample_weights(50, 200, np.random.default_rng(0))
    assert weights.shape == (201, 50) and (weights[0] == 1).all()
    assert (weights.sum(1) == 50).all() and (weights == weights.round()).all()
    # each image drawn with probability 1/N per draw: mean multiplicity 1
    assert abs(weights[1:].mean().item() - 1) < 1e-12
    folds = assign_folds(23, 5, np.random.default_rng(0))
    assert sorted(torch.bincount(folds).tolist()) == [4, 4, 5, 5, 5]


@pytest.mark.parametrize("block", [1, 3, 7, 64])
def test_resample_weights_drawn_in_blocks_equal_all_draws_at_once(block):
    """Blocks of replicates (one that divides R, ones that do not, one larger than R) take the same
    draws from the stream as one R x N draw, counted row by row here."""
    draws = np.random.default_rng(9).integers(0, 13, size=(20, 13))
    expected = np.vstack([np.ones(13), [np.bincount(row, minlength=13) for row in draws]])
    weights = resample_weights(13, 20, np.random.default_rng(9), block=block)
    assert weights.dtype == torch.float64
    np.testing.assert_array_equal(weights.numpy(), expected)


def test_bootstrap_interval_of_a_mean_covers_the_normal_theory_interval():
    """Pointing Game (Bernoulli) and Dice at 0.5 (a known spread) over 1,000 images, one pair each."""
    rng = np.random.default_rng(7)
    n = 1000
    hit = rng.random(n) < 0.3
    matched = rng.integers(0, 101, size=n)  # |B_50 & R| with |B_50| = |R| = 100: Dice = matched / 100
    region = np.full(n, 100)
    predicted = np.full((n, T), 100)
    predicted[:, 0] = 400
    inter = np.repeat(matched[:, None], T, 1)
    inter[:, 0] = 100
    pairs = make_pairs(np.arange(n), np.zeros(n, dtype=int), region, hit, predicted, inter)
    weights = resample_weights(n, 2000, np.random.default_rng(1))
    stats = grounding_statistics(pairs, 1, weights)
    for name, values in (("pointing_game", hit.astype(float)), ("dice@0.5", matched / 100)):
        interval = percentile_interval(stats.per_class[name], 0.95)
        half = 1.959964 * values.std(ddof=1) / math.sqrt(n)
        assert interval["estimate"].item() == pytest.approx(values.mean(), abs=1e-12)
        assert interval["lower"].item() == pytest.approx(values.mean() - half, abs=0.08 * half), name
        assert interval["upper"].item() == pytest.approx(values.mean() + half, abs=0.08 * half), name


def test_best_tau_is_rechosen_inside_each_replicate_as_a_direct_loop_does():
    rng = np.random.default_rng(3)
    num_images, num_classes = 14, 2
    pairs = random_pairs(rng, num_images, num_classes)
    weights = resample_weights(num_images, 40, np.random.default_rng(4))
    stats = grounding_statistics(pairs, num_classes, weights)
    dice = pair_dice(pairs)
    image, cls, hit = pairs.image.numpy(), pairs.cls.numpy(), pairs.hit.numpy()
    chosen = set()
    for r in range(weights.shape[0]):
        drawn = np.repeat(np.arange(num_images), weights[r].numpy().astype(int))  # the replicate's images, copied
        for c in range(num_classes):
            rows = [p for i in drawn for p in np.flatnonzero((image == i) & (cls == c))]
            if not rows:
                assert math.isnan(stats.per_class["dice@best"][r, c])
                continue
            curve = dice[rows].mean(0)
            k = int(np.argmax(curve))  # first maximum: the smallest tau among equals
            chosen.add(k)
            assert stats.per_class["dice@best"][r, c].item() == pytest.approx(curve[k], rel=1e-12)
            assert stats.per_class["dice@best_tau"][r, c].item() == pytest.approx(k / 100, abs=1e-7)
            assert stats.per_class["dice@0.5"][r, c].item() == pytest.approx(curve[50], rel=1e-12)
            assert stats.per_class["pointing_game"][r, c].item() == pytest.approx(hit[rows].mean(), rel=1e-12)
            assert stats.per_class["pairs"][r, c].item() == len(rows)
    assert len(chosen) > 3, "the case must make replicates choose different thresholds"


def test_cross_fitting_equals_a_hand_written_k_fold_loop():
    rng = np.random.default_rng(5)
    num_images, num_classes, k_folds = 30, 3, 5
    pairs = random_pairs(rng, num_images, num_classes)
    # class 2 has a single pair: its fold has nothing to choose on, so it is undefined
    keep = (pairs.cls != 2) | (torch.arange(len(pairs.cls)) == int(torch.nonzero(pairs.cls == 2)[0]))
    pairs = GradedPairs(*(getattr(pairs, f)[keep] for f in ("image", "cls", "region", "hit", "predicted", "inter",
                                                             "cnr")))
    folds = assign_folds(num_images, k_folds, np.random.default_rng(6))
    weights = resample_weights(num_images, 3, np.random.default_rng(8))
    stats = grounding_statistics(pairs, num_classes, weights, CrossFitting(folds, k_folds))
    dice = pair_dice(pairs)
    image, cls = pairs.image.numpy(), pairs.cls.numpy()
    for r in range(weights.shape[0]):
        drawn = np.repeat(np.arange(num_images), weights[r].numpy().astype(int))
        for c in range(num_classes):
            rows = np.array([p for i in drawn for p in np.flatnonzero((image == i) & (cls == c))], dtype=int)
            fold_of_row = folds.numpy()[image[rows]]
            scored, taus = [], []
            for f in range(k_folds):
                held, train = rows[fold_of_row == f], rows[fold_of_row != f]
                if len(train):
                    taus.append(int(np.argmax(dice[train].mean(0))))
                if len(held):
                    scored.extend(dice[held, taus[-1]] if len(train) else [math.nan] * len(held))
            value = stats.per_class["dice@calibrated"][r, c].item()
            if not scored or np.isnan(scored).any():
                assert math.isnan(value)
            else:
                assert value == pytest.approx(np.mean(scored), rel=1e-12), (r, c)
                got = stats.calibrated_tau["dice"][r, c]
                assert sorted(round(100 * t) for t in got[~got.isnan()].tolist()) == sorted(taus)


def test_validation_choice_scores_the_test_set_at_the_validation_tau():
    rng = np.random.default_rng(9)
    test, validation = random_pairs(rng, 20, 2), random_pairs(rng, 16, 2)
    chosen = grounding_statistics(validation, 2, resample_weights(16, 5, np.random.default_rng(1)))
    stats = grounding_statistics(test, 2, resample_weights(20, 5, np.random.default_rng(2)),
                                 ValidationChoice(chosen.best_index))
    test_dice, validation_dice = pair_dice(test), pair_dice(validation)
    for c in range(2):
        k = int(np.argmax(validation_dice[validation.cls.numpy() == c].mean(0)))
        assert stats.calibrated_tau["dice"][0, c, 0].item() == pytest.approx(k / 100, abs=1e-7)
        expected = test_dice[test.cls.numpy() == c, k].mean()
        assert stats.per_class["dice@calibrated"][0, c].item() == pytest.approx(expected, rel=1e-12)


def test_size_strata_put_pairs_of_known_area_in_the_right_bin():
    regions = torch.tensor([1, 99, 100, 101, 499, 500, 999, 1000, 1001, 10000])  # image 100 x 100 = 10,000 px
    assert size_strata(regions, 100, (0.01, 0.1)).tolist() == [0, 0, 1, 1, 1, 1, 1, 2, 2, 2]
    assert size_strata(regions, 100, (0.05,)).tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]


def test_strata_table_counts_and_scores_each_bin(tmp_path):
    # regions of 50, 150, 2000 px in a 100 x 100 image; hits only on the large lesions
    regions = np.array([50, 50, 50, 150, 150, 2000, 2000, 2000])
    hits = np.array([0, 0, 0, 0, 0, 1, 1, 0], dtype=bool)
    predicted, inter = random_counts(np.random.default_rng(0), regions, 10000)
    pairs = make_pairs(np.arange(8), np.zeros(8, dtype=int), regions, hits, predicted, inter)
    ids = [f"img{i}" for i in range(8)]
    write_run(tmp_path / "run", "m", "d", ["nodule"], ids, np.ones((8, 1)), np.zeros((8, 1)), pairs, 100)
    analysis = analyze([tmp_path / "run"], settings=Settings(replicates=20, folds=2))
    table = strata_table(analysis).set_index(["class", "metric", "stratum"]).sort_index()
    pg = table.loc[("nodule", "pointing_game")]
    assert [pg.loc[s, "pairs"] for s in ("< 1%", "1–10%", "≥ 10%")] == [3, 2, 3]
    assert pg.loc["< 1%", "estimate"] == 0 and pg.loc["1–10%", "estimate"] == 0
    assert pg.loc["≥ 10%", "estimate"] == pytest.approx(2 / 3)

    # by hand: Dice at 0.5, at the class's best tau and at each pair's cross-fitted tau
    dice = pair_dice(pairs)
    best = int(np.argmax(dice.mean(0)))
    folds = assign_folds(8, 2, random_stream(0, "d", "folds")).numpy()
    held = np.array([dice[i, int(np.argmax(dice[folds != folds[i]].mean(0)))] for i in range(8)])
    for name, per_pair in (("dice@0.5", dice[:, 50]), ("dice@best", dice[:, best]), ("dice@calibrated", held)):
        for stratum, rows in (("< 1%", slice(0, 3)), ("1–10%", slice(3, 5)), ("≥ 10%", slice(5, 8))):
            expected = per_pair[rows].mean()
            assert table.loc[("all", name, stratum), "estimate"] == pytest.approx(expected, rel=1e-12), name
            assert table.loc[("nodule", name, stratum), "estimate"] == pytest.approx(expected, rel=1e-12), name


def test_r_squared_is_the_squared_correlation_of_the_defined_points():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(4, 9)), rng.normal(size=(4, 9))
    x[1, 3] = np.nan
    y[2, :7] = np.nan  # two points left: undefined
    got = r_squared(torch.as_tensor(x), torch.as_tensor(y))
    assert got[0].item() == pytest.approx(np.corrcoef(x[0], y[0])[0, 1] ** 2, rel=1e-12)
    keep = ~np.isnan(x[1])
    assert got[1].item() == pytest.approx(np.corrcoef(x[1, keep], y[1, keep])[0, 1] ** 2, rel=1e-12)
    assert math.isnan(got[2].item())


# -- recognition ----------------------------------------------------------------------------------

def test_recognition_in_a_replicate_equals_scikit_learn_on_the_copied_sample():
    rng = np.random.default_rng(11)
    n = 60
    labels = rng.integers(-1, 2, size=(n, 3))
    labels[:, 2] = np.where(labels[:, 2] == -1, -1, 1)  # one label value only: no AUROC/AUPRC
    logits = np.round(rng.normal(size=(n, 3)), 1)  # ties
    weights = resample_weights(n, 6, np.random.default_rng(12))
    stats = recognition_statistics(torch.as_tensor(labels), torch.as_tensor(logits), weights)
    for r in range(weights.shape[0]):
        drawn = np.repeat(np.arange(n), weights[r].numpy().astype(int))
        for c in range(3):
            y, s = labels[drawn, c], logits[drawn, c]
            y, s = y[y >= 0], s[y >= 0]
            got = {name: stats[name][r, c].item() for name in stats}
            assert got["f1@0.5"] == pytest.approx(f1_score(y, s >= 0, zero_division=0), rel=1e-12)
            assert got["accuracy@0.5"] == pytest.approx(np.mean((s >= 0) == y), rel=1e-12)
            precision, recall, _ = precision_recall_curve(y, s)
            with np.errstate(invalid="ignore"):
                f1 = np.nan_to_num(2 * precision * recall / (precision + recall))[:-1]
            assert got["max_f1"] == pytest.approx(f1.max(), rel=1e-12)
            if c == 2:
                assert math.isnan(got["auroc"]) and math.isnan(got["auprc"])
            else:
                assert got["auroc"] == pytest.approx(roc_auc_score(y, s), rel=1e-12)
                assert got["auprc"] == pytest.approx(average_precision_score(y, s), rel=1e-12)


# -- pairing and matching across folders ------------------------------------------------------

def test_paired_differences_are_narrower_and_identical_models_differ_by_exactly_zero(tmp_path):
    rng = np.random.default_rng(13)
    n, area = 400, 400
    ids = [f"{i:04d}" for i in range(n)]
    region = rng.integers(20, 200, size=n)
    predicted, inter = random_counts(rng, region, area)
    a = make_pairs(np.arange(n), np.zeros(n, dtype=int), region, rng.random(n) < 0.5, predicted, inter)
    # model b: the same maps, a few pixels of the region lost at every threshold (correlated with a)
    inter_b = np.maximum(inter - rng.integers(0, 3, size=(n, 1)), 0)
    inter_b[:, 0] = region
    b = make_pairs(np.arange(n), np.zeros(n, dtype=int), region, a.hit.numpy(), predicted, inter_b)
    write_random_run(tmp_path / "a", "a", ids, 1, a, classes=("nodule",))
    write_random_run(tmp_path / "b", "b", ids, 1, b, classes=("nodule",))
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    payload = json.loads((tmp_path / "copy" / "metrics.json").read_text())
    (tmp_path / "copy" / "metrics.json").write_text(json.dumps({**payload, "model": "copy"}))
    reseal(tmp_path / "copy")
    analysis = analyze([tmp_path / "a", tmp_path / "b", tmp_path / "copy"], settings=Settings(replicates=500))
    table = difference_table(analysis)

    same = table[(table.model_a == "a") & (table.model_b == "copy")]
    assert len(same) and (same[["difference", "lower", "upper"]].fillna(0) == 0).all().all()
    assert (same["a_better"].dropna() == 0.5).all(), "a tie is neither model ahead: it counts as half"

    paired = table[(table.model_a == "a") & (table.model_b == "b") & (table["class"] == "nodule")
                   & (table.metric == "dice@0.5")].iloc[0]
    assert paired.a_better == 1.0
    runs = {run.label: run for run in analysis.datasets[0].runs}
    unpaired = percentile_interval(
        runs["a"].values["dice@0.5"] - grounding_statistics(
            runs["b"].run.pairs, 1, resample_weights(n, 500, np.random.default_rng(99))).per_class["dice@0.5"], 0.95)
    assert paired.upper - paired.lower < 0.25 * (unpaired["upper"] - unpaired["lower"]).item()


def test_folders_on_different_images_or_overlapping_validation_are_clear_errors(tmp_path):
    ids = [f"{i:03d}" for i in range(10)]
    write_random_run(tmp_path / "a", "a", ids, 0)
    write_random_run(tmp_path / "b", "b", ids[:9] + ["other"], 0)
    with pytest.raises(ValueError, match="not on the same images: 1 image ids only in"):
        analyze([tmp_path / "a", tmp_path / "b"])
    write_random_run(tmp_path / "val", "a", ids[5:] + ["v1", "v2"], 0)
    with pytest.raises(ValueError, match="shares 5 images with test folder"):
        analyze([tmp_path / "a"], [tmp_path / "val"])
    write_random_run(tmp_path / "val_other", "a", ["v1", "v2"], 0, model_args={"seed": 1})
    with pytest.raises(ValueError, match="no test folder runs the same model"):
        analyze([tmp_path / "a"], [tmp_path / "val_other"])


def test_damaged_counts_name_the_file_and_row(tmp_path):
    folder = write_random_run(tmp_path / "a", "a", [f"{i}" for i in range(6)], 0)
    table = pd.read_csv(folder / "pairs.csv.gz")
    row = int(np.flatnonzero(table["graded"])[0])
    table.loc[row, "inter_050"] = table.loc[row, "pred_050"] + 1
    table.to_csv(folder / "pairs.csv.gz", index=False, compression="gzip")
    reseal(folder)  # past the manifest: the counts' own check is what is tested
    with pytest.raises(ValueError, match=rf"data row\(s\) {row + 2}: counts are inconsistent"):
        load_run(folder)


# -- the pairs table --------------------------------------------------------------------------

def test_pairs_written_in_chunks_equal_the_table_built_whole(tmp_path):
    """``pairs.csv.gz`` is written a chunk of images at a time; its text is the whole table's, byte
    for byte, at every chunk size: chunks that split the images unevenly, a chunk without any graded
    pair, one image per chunk, one chunk for all, and a run that evaluated no image."""
    rng = np.random.default_rng(3)
    classes = ["nodule", "mass", "effusion"]
    image_ids = [f"img{i:02d}" for i in range(40)]
    index = np.sort(rng.choice(40, size=23, replace=False))  # evaluated images, not all of the split
    pairs = random_pairs(rng, 23, len(classes), share=0.3)
    keep = (pairs.image < 4) | (pairs.image >= 8)  # the second chunk of 4 images has no graded pair
    grounding = {"index": torch.as_tensor(index)[pairs.image[keep]], "class": pairs.cls[keep],
                 "region": pairs.region[keep], "hit": pairs.hit[keep], "predicted": pairs.predicted[keep],
                 "inter": pairs.inter[keep], "cnr": pairs.cnr[keep]}
    labels = {"index": torch.as_tensor(index), "logits": torch.randn(23, len(classes)),
              "labels": torch.as_tensor(rng.integers(-1, 2, size=(23, len(classes))), dtype=torch.int8)}
    payload = {"classes": classes}
    whole = pair_table(payload, grounding, labels, image_ids)
    assert whole["graded"].sum() == keep.sum() > 0 and len(whole) == 23 * len(classes)
    for chunk in (1, 4, 7, 23, 1000):
        write_pairs(tmp_path / f"{chunk}.csv.gz", payload, grounding, labels, image_ids, chunk_images=chunk)
        assert gzip.decompress((tmp_path / f"{chunk}.csv.gz").read_bytes()) == whole.to_csv(index=False).encode()
    none = {name: values[:0] for name, values in labels.items()}
    write_pairs(tmp_path / "none.csv.gz", payload, {k: v[:0] for k, v in grounding.items()}, none, image_ids)
    empty = pair_table(payload, {k: v[:0] for k, v in grounding.items()}, none, image_ids)
    assert gzip.decompress((tmp_path / "none.csv.gz").read_bytes()) == empty.to_csv(index=False).encode()
    assert pd.read_csv(tmp_path / "none.csv.gz").columns.tolist() == whole.columns.tolist()


# -- end to end: baselines on the phantom, test and validation splits ---------------------------

def write_split(root: Path, split: str, seed: int, prefix: str) -> None:
    """A phantom written as ChestX-Det10's ``<split>.json`` + ``<split>_data/``, ids prefixed."""
    staging = root.parent / f"{root.name}-{split}"
    generate_phantom(staging, num_images=9, size=96, seed=seed)
    (root / f"{split}_data").mkdir(parents=True)
    entries = json.loads((staging / "test.json").read_text())
    for entry in entries:
        (staging / "test_data" / entry["file_name"]).rename(root / f"{split}_data" / f"{prefix}{entry['file_name']}")
        entry["file_name"] = prefix + entry["file_name"]
    (root / f"{split}.json").write_text(json.dumps(entries))


@pytest.fixture(scope="module")
def baseline_runs(tmp_path_factory) -> dict[str, Path]:
    """Oracle and random baselines on a test split and a validation split (ChestX-Det10 layout)."""
    base = tmp_path_factory.mktemp("analysis")
    root = base / "data"
    write_split(root, "test", seed=3, prefix="")
    write_split(root, "train", seed=4, prefix="val_")
    folders = {}
    for model in ("oracle", "random"):
        for split in ("test", "train"):
            results = base / f"results-{split}"
            run_model(run_args(model, "chestx_det10", root, results, "--data.split", split,
                               "--data.classes", "[nodule, mass, consolidation]", "--data.batch_size", "4"))
            folders[f"{model}-{split}"] = max(p for p in results.iterdir() if p.name.startswith(model[:4]))
    return folders


def test_cli_on_baseline_folders_reproduces_metrics_and_calibrates_on_validation(baseline_runs, tmp_path):
    out = analyze_main([str(baseline_runs["oracle-test"]), str(baseline_runs["random-test"]), "--out",
                        str(tmp_path / "out"), "--validation", str(baseline_runs["oracle-train"]),
                        str(baseline_runs["random-train"]), "--replicates", "200"])
    for name in ("intervals.csv", "differences.csv", "calibration.csv", "strata.csv", "correlation.csv",
                 "analysis.json", "summary.md"):
        assert (out / name).is_file(), name
    payload = json.loads((out / "analysis.json").read_text())
    assert payload["settings"]["replicates"] == 200
    intervals = pd.read_csv(out / "intervals.csv")
    # every estimate equals the number the run itself wrote (computed by xbench.metrics)
    for key in ("oracle-test", "random-test"):
        metrics = json.loads((baseline_runs[key] / "metrics.json").read_text())
        rows = intervals[intervals.model == metrics["model"]].set_index(["class", "metric"])["estimate"]
        compared = 0
        for section, tolerance in (("grounding", 1e-12), ("classification", 1e-6)):  # torchmetrics: float32
            for scope, values in [*metrics[section]["per_class"].items(), ("macro", metrics[section]["macro"])]:
                for name, value in values.items():
                    if (scope, name) in rows.index:
                        compared += 1
                        if value is None:
                            assert math.isnan(rows[(scope, name)]), (key, scope, name)
                        else:
                            assert rows[(scope, name)] == pytest.approx(value, abs=tolerance), (key, scope, name)
        assert compared >= 40
    # the calibrated tau is the validation run's best tau, scored on the test run's curve
    calibration = pd.read_csv(out / "calibration.csv")
    random_test = json.loads((baseline_runs["random-test"] / "metrics.json").read_text())
    random_val = json.loads((baseline_runs["random-train"] / "metrics.json").read_text())
    rows = calibration[(calibration.model == "random") & (calibration.curve == "dice")].set_index("class")
    for key, values in random_val["grounding"]["per_class"].items():
        if values["pairs"] == 0 or random_test["grounding"]["per_class"][key]["pairs"] == 0:
            continue
        tau = values["dice@best_tau"]
        assert float(rows.loc[key, "calibrated_tau"]) == pytest.approx(tau, abs=1e-7)
        curve = random_test["grounding"]["curves"][key]["dice"]
        assert rows.loc[key, "at_calibrated"] == pytest.approx(curve[round(100 * tau)], abs=1e-12)
        assert rows.loc[key, "method"].startswith("validation (random__chestx_det10__")
    # the Oracle is an instrument: analysed (its ceiling has intervals) but never compared or fitted
    assert pd.read_csv(out / "differences.csv").empty
    assert pd.read_csv(out / "correlation.csv").points.eq(1).all()
    assert "| oracle (ceiling) | 100.0 [100.0, 100.0] |" in (out / "summary.md").read_text()


def test_cli_without_validation_cross_fits_and_accepts_a_parent_folder(baseline_runs, tmp_path):
    parent = tmp_path / "results"
    parent.mkdir()
    for key in ("oracle-test", "random-test"):
        shutil.copytree(baseline_runs[key], parent / baseline_runs[key].name)
    out = analyze_main([str(parent), "--out", str(tmp_path / "out"), "--replicates", "50", "--folds", "3",
                        "--size-bins", "0.02"])
    calibration = pd.read_csv(out / "calibration.csv")
    assert set(calibration.method) == {"cross-fitting (3 folds)"}
    oracle = calibration[calibration.model == "oracle"].set_index(["class", "curve"])
    per_class = json.loads((baseline_runs["oracle-test"] / "metrics.json").read_text())["grounding"]["per_class"]
    for key, values in per_class.items():
        for curve in ("dice", "iou"):
            if values["pairs"] >= 2:
                assert oracle.loc[(key, curve), "at_calibrated"] == 1.0
            else:  # a lone pair's fold leaves nothing to choose tau on
                assert math.isnan(oracle.loc[(key, curve), "at_calibrated"])
    strata = pd.read_csv(out / "strata.csv")
    assert set(strata.stratum) == {"< 2%", "≥ 2%"}
    # pair counts per stratum add up to the graded pairs of the run
    pairs = pd.read_csv(baseline_runs["oracle-test"] / "pairs.csv.gz")
    pooled = strata[(strata.model == "oracle") & (strata["class"] == "all") & (strata.metric == "pointing_game")]
    assert pooled.pairs.sum() == int(pairs.graded.sum())
    small = (pairs.region_px[pairs.graded] < 0.02 * 64 * 64).sum()
    assert pooled.set_index("stratum").loc["< 2%", "pairs"] == small


def test_one_model_has_an_empty_differences_table_with_its_header(tmp_path, capsys):
    write_random_run(tmp_path / "runs" / "a", "a", [f"{i:02d}" for i in range(10)], 1)
    analyze_main([str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--replicates", "5", "--folds", "2"])
    assert (tmp_path / "out" / "differences.csv").read_text().splitlines() == [
        "dataset,model_a,model_b,class,metric,difference,lower,upper,replicates,a_better"]
    assert "## synthetic (10 images, 1 models)" in capsys.readouterr().out
