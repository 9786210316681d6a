"""Phrase grounding through the whole run: the base's query axis, the phrase and finding-name views,
their intervals and paired difference, the analysis of queries as pairs, and DDP with queries."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from torch import Tensor

from conftest import CONFIGS, MS_CXR_CLI_ROWS, SUBPROCESS_SAFETY_TIMEOUT, model_cli_dataset, only_folder, run_args
from xbench.analysis import analyze
from xbench.analysis.settings import Settings
from xbench.analyze import main as analyze_main
from xbench.data.ms_cxr import MSCXR
from xbench.data.regions import Boxes
from xbench.geometry.preprocess import Preprocess
from xbench.metrics import grounding_records
from xbench.metrics.native import himl_native_saliency
from xbench.models.base import XBenchModel
from xbench.reporting.writer import ResultsWriter
from xbench.test import main

GRID = 8  # the toy model's map grid; the fixture's images are 64 x 48


class PointsAtText(XBenchModel):
    """A phrase-mode toy whose map peaks at a place its text names: a phrase points at the centre of
    its own first box, a finding's name at the top-left corner (where no region of the fixture is).
    It tells whether the base grounds each query by its own phrase, in any batch composition."""

    name = "points_at_text"
    query_mode = "phrase"

    def build(self, classes: list[str]) -> None:
        self.register_buffer("anchor", torch.zeros(len(classes), 2, dtype=torch.long), persistent=False)

    def encode_phrases(self, phrases: list[str]) -> dict[str, Tensor]:
        first_box = {}
        for row in MS_CXR_CLI_ROWS:
            first_box.setdefault(row["label_text"], row)
        cells = [((first_box[p]["y"] + first_box[p]["h"] / 2) * GRID // 48,
                  (first_box[p]["x"] + first_box[p]["w"] / 2) * GRID // 64) for p in phrases]
        return {"anchor": torch.tensor(cells, dtype=torch.long)}

    def forward(self, image: Tensor) -> tuple[Tensor, Tensor]:
        texts = len(self.anchor)
        maps = torch.zeros(len(image), texts, GRID, GRID)
        maps[:, torch.arange(texts), self.anchor[:, 0], self.anchor[:, 1]] = 1.0
        return torch.zeros(len(image), texts), maps


def ms_cxr(tmp_path, **kwargs) -> MSCXR:
    root, _, _ = model_cli_dataset("ms_cxr", tmp_path, tmp_path)
    return MSCXR(root=str(root), image_size=64, num_workers=0, cache=False, **kwargs)


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_each_query_is_grounded_by_its_own_phrase(tmp_path, batch_size):
    """Every query's phrase map hits its region and every finding-name map misses, whatever the batch
    holds; the paired difference says so with its interval (all replicates +1)."""
    model = PointsAtText()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False, callbacks=[ResultsWriter(str(tmp_path / "results"), overlay_pairs=0)])
    trainer.test(model, datamodule=ms_cxr(tmp_path, batch_size=batch_size), verbose=False)
    phrases = model.results["phrase_grounding"]
    assert phrases["query_mode"] == "phrase"
    by_query, by_name = phrases["by_query"]["per_class"], phrases["by_finding_name"]["per_class"]
    for key in ("pneumothorax", "pleural_effusion", "pneumonia"):
        assert by_query[key]["pointing_game"] == 1.0 and by_name[key]["pointing_game"] == 0.0
    difference = phrases["intervals"]["phrase_minus_name"]["pointing_game"]["macro"]
    assert difference == {"estimate": 1.0, "lower": 1.0, "upper": 1.0, "p_phrase_better": 1.0}
    table = pd.read_csv(only_folder(tmp_path / "results") / "queries.csv.gz")
    assert table.groupby("view")["hit"].sum().to_dict() == {"finding_name": 0, "query": 5}
    logged = trainer.callback_metrics  # what loggers (W&B) receive
    assert logged["phrase_grounding/by_query/pointing_game/macro"].item() == 1.0
    assert logged["phrase_grounding/by_finding_name/pointing_game/pneumonia"].item() == 0.0


def test_interval_estimates_are_the_run_values(tmp_path):
    """The intervals' estimates (from the per-query records) equal the run's per-finding values and
    macro means (from the metric's sum states): one definition, two computations."""
    results = main(run_args("random", "ms_cxr", model_cli_dataset("ms_cxr", tmp_path, tmp_path)[0],
                            tmp_path / "results", "--data.batch_size", "2"))
    phrases = results["phrase_grounding"]
    intervals = phrases["intervals"]["by_query"]
    for metric in ("pointing_game", "dice@0.5", "iou@0.5", "cnr"):
        for key, values in phrases["by_query"]["per_class"].items():
            estimate = intervals[metric]["per_finding"][key]["estimate"]
            assert (estimate is None) == (values[metric] is None), (metric, key)
            assert estimate is None or math.isclose(estimate, values[metric], abs_tol=1e-12), (metric, key)
        assert math.isclose(intervals[metric]["macro"]["estimate"], phrases["by_query"]["macro"][metric],
                            abs_tol=1e-12)


def test_analysis_reads_queries_as_pairs(tmp_path):
    """``xbench.analyze --queries query``: a phrase run's (image, query) pairs analysed per finding,
    with the run's values as estimates; a fixed-vocabulary run has no finding-name view to read."""
    root, _, _ = model_cli_dataset("ms_cxr", tmp_path, tmp_path)
    runs = {}
    for config in ("oracle", "random"):
        results = main(run_args(config, "ms_cxr", root, tmp_path / "results"))
        runs[results["model"]] = results
    analysis = analyze([tmp_path / "results"], settings=Settings(replicates=20, folds=3, queries="query"))
    (dataset,) = analysis.datasets
    for run in dataset.runs:
        values = runs[run.run.model]["phrase_grounding"]["by_query"]["per_class"]
        for c, key in enumerate(dataset.classes):
            assert run.values["pairs"][0, c].item() == values[key]["pairs"]
            if values[key]["pairs"]:
                assert math.isclose(run.values["pointing_game"][0, c].item(), values[key]["pointing_game"])
    with pytest.raises(ValueError, match="no rows of view 'finding_name'"):
        analyze([tmp_path / "results"], settings=Settings(replicates=20, folds=3, queries="finding_name"))
    # the command line's option, and its CNR intervals
    out = analyze_main([str(tmp_path / "results"), "--out", str(tmp_path / "analysis"), "--replicates", "20",
                        "--folds", "3", "--queries", "query"])
    intervals = pd.read_csv(out / "intervals.csv")
    cnr = intervals[(intervals["model"] == "random") & (intervals["metric"] == "cnr")].set_index("class")
    expected = runs["random"]["phrase_grounding"]["by_query"]["per_class"]["pneumonia"]["cnr"]
    assert math.isclose(cnr.loc["pneumonia", "estimate"], expected, abs_tol=1e-12)


@pytest.mark.slow  # a DDP launch: two processes of their own
def test_ddp_two_processes_count_every_image_and_query_once(tmp_path):
    """MS-CXR's 3 images over 2 processes (trainer/ddp.yaml on CPUs: gloo), the decoded-image cache on,
    a seeded augmentation (every process draws the same perturbation for the same image): the same
    pairs, query pairs, metrics, intervals and overlays as one process. (One DDP launch serves both
    the image and the query axis: each launch costs its processes an import of the stack.)"""
    root, _, _ = model_cli_dataset("ms_cxr", tmp_path, tmp_path)
    arguments = ("--data.batch_size", "1", "--config", str(CONFIGS / "augment" / "rotate10.yaml"))
    one = main(run_args("random", "ms_cxr", root, tmp_path / "one", *arguments))
    command = [sys.executable, "-m", "xbench.test", "--config", str(CONFIGS / "trainer" / "ddp.yaml"),
               *run_args("random", "ms_cxr", root, tmp_path / "two", *arguments),
               "--trainer.accelerator", "cpu", "--trainer.devices", "2"]
    done = subprocess.run(command, cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True,
                          text=True, timeout=SUBPROCESS_SAFETY_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    folders = {run: only_folder(tmp_path / run) for run in ("one", "two")}
    two = json.loads((folders["two"] / "metrics.json").read_text())
    assert two["data"]["images_evaluated"] == one["data"]["images_evaluated"] == 3
    sections = [(one[name]["per_class"], two[name]["per_class"]) for name in ("grounding", "classification")]
    sections.append((one["phrase_grounding"]["by_query"]["per_class"], two["phrase_grounding"]["by_query"]["per_class"]))
    for single, split in sections:
        assert single.keys() == split.keys()
        for key, values in single.items():
            for name, value in values.items():
                other = split[key][name]
                if isinstance(value, int) or value is None:
                    assert other == value, (key, name)
                else:
                    assert math.isclose(other, value, rel_tol=0, abs_tol=1e-12), (key, name)
    assert two["phrase_grounding"]["intervals"] == one["phrase_grounding"]["intervals"]
    tables = [pd.read_csv(folders[run] / "queries.csv.gz") for run in ("one", "two")]
    pd.testing.assert_frame_equal(*tables)
    assert len(tables[0]) == 5 and np.array_equal(tables[0]["image_index"], [0, 0, 1, 2, 2])
    pairs = pd.read_csv(folders["two"] / "pairs.csv.gz")
    assert sorted(pairs["image_index"].unique()) == list(range(3))
    # the overlay pairs, recorded on both processes, all reach rank 0 in the same order
    with np.load(folders["one"] / "overlays.npz") as single, np.load(folders["two"] / "overlays.npz") as split:
        assert len(single["image_id"]) > 0 and sorted(single.files) == sorted(split.files)
        for name in single.files:
            np.testing.assert_array_equal(single[name], split[name])


def test_finding_means_equal_a_loop_over_resampled_pairs():
    """Each replicate's per-finding mean: the pairs of the drawn images, each as often as its image
    was drawn, NaN values (an undefined CNR) left out; a finding without a defined value is NaN."""
    from xbench.metrics.phrases import finding_means

    rng = np.random.default_rng(4)
    values = torch.from_numpy(rng.random((9, 4)))
    values[::4, 3] = float("nan")
    image_row = torch.from_numpy(rng.integers(0, 5, size=9))
    finding = torch.tensor([0, 0, 1, 1, 1, 2, 0, 1, 2])
    weights = torch.from_numpy(rng.integers(0, 3, size=(6, 5)).astype(np.float64))
    means = finding_means(values, image_row, finding, weights, num_findings=4)
    for r in range(6):
        for f in range(4):
            for m in range(4):
                drawn = [values[p, m].item() for p in range(9) if finding[p] == f
                         for _ in range(int(weights[r, image_row[p]]))]
                drawn = [v for v in drawn if not math.isnan(v)]
                expected = sum(drawn) / len(drawn) if drawn else math.nan
                got = means[r, f, m].item()
                assert (math.isnan(got) and math.isnan(expected)) or math.isclose(got, expected, abs_tol=1e-12)


HIML = np.load(Path(__file__).parent / "golden" / "himl_phrase_grounding.npz")


def test_himl_placement_and_cnr_equal_their_code():
    """``--model.phrase_protocol hi-ml``'s native map is hi-ml's ``convert_similarity_to_image_size``
    (tests/golden/himl_phrase_grounding.npz, made by tools/parity/himl_phrase_grounding.py): the same
    pixels unseen (their NaN), the same values on the rest once min-max normalised, and CNR over
    the seen pixels equal to the plain float64 one on their map, on every transform and aspect."""
    meta = json.loads(str(HIML["meta"]))
    for i, case in enumerate(meta["cases"]):
        width, height = case["image_width_height"]
        rule = case["interpolation"]
        preprocess = None if case["crop_size"] is None else Preprocess(
            case["crop_size"], "shorter_side", resize_to=case["resize_size"], map_upsample=rule)
        saliency, seen = himl_native_saliency(torch.from_numpy(HIML[f"{i}_map"])[None, None], preprocess, None,
                                              (64, 64), (height, width), rule)
        theirs = HIML[f"{i}_native"]
        assert np.array_equal(seen[0].numpy(), ~np.isnan(theirs)), case["name"]
        low, high = np.nanmin(theirs), np.nanmax(theirs)
        np.testing.assert_allclose(saliency[0, 0].numpy()[seen[0]], ((theirs - low) / (high - low))[seen[0]],
                                   rtol=0, atol=1e-7, err_msg=case["name"])
        box, _ = Boxes((tuple(HIML[f"{i}_box"].tolist()),)).to_mask(height, width)
        records = grounding_records(saliency, torch.from_numpy(box)[None, None], torch.ones(1, 1, dtype=torch.bool),
                                    seen)
        assert records["cnr"].item() == pytest.approx(float(HIML[f"{i}_cnr"]), rel=1e-6), case["name"]
    # hi-ml has no rule for a letterbox: the model's window at native size, here the whole image
    letterbox = Preprocess(16, "longer_side")
    _, window = letterbox(np.zeros((30, 20), dtype=np.float32), 64)
    _, seen = himl_native_saliency(torch.rand(1, 2, 4, 4), letterbox, window, (64, 64), (30, 20), "bilinear")
    assert seen.all()


class CroppedPointsAtText(PointsAtText):
    """:class:`PointsAtText` through a centre crop of the shorter side (the fixture's 64 x 48
    images: the 48 x 48 centre, columns 8..55), its maps on the crop placed by ``nearest``."""

    name = "cropped_points_at_text"
    preprocess = Preprocess(32, "shorter_side", resize_to=32, map_upsample="nearest")


class FrameOutputs(L.Callback):
    def __init__(self) -> None:
        self.batches = []

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self.batches.append((outputs["saliency"], batch["masks"], batch["has_mask"]))


def plain_cnr(saliency: np.ndarray, region: np.ndarray, seen: np.ndarray) -> float:
    inside, outside = saliency[region & seen].astype(np.float64), saliency[~region & seen].astype(np.float64)
    return abs(inside.mean() - outside.mean()) / np.sqrt(inside.var() + outside.var())


def test_both_protocols_through_a_run(tmp_path):
    """A cropping model on the MS-CXR fixture. XBench's protocol: CNR of every class pair is the
    plain one over the frame pixels the crop covers (columns 8..55 of the 64 x 64 frame). hi-ml's:
    each query is scored at the image's native 48 x 64 against its boxes drawn there (their areas),
    the map a 6 x 6 block per cell on columns 8..55 and the rest unseen; Pointing Game, Dice at 0.5
    and CNR equal those computed by hand on that map; the results say which protocol scored them."""
    def run(protocol: str, *callbacks) -> XBenchModel:
        model = CroppedPointsAtText(phrase_protocol=protocol)
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                            use_distributed_sampler=False, callbacks=list(callbacks))
        trainer.test(model, datamodule=ms_cxr(tmp_path, batch_size=2), verbose=False)
        return model

    frame = FrameOutputs()
    xbench_run = run("xbench", frame)
    seen = np.zeros((64, 64), dtype=bool)
    seen[:, 8:56] = True
    expected = [plain_cnr(s.numpy(), m.numpy(), seen) for saliency, masks, has in frame.batches
                for s, m, h in zip(saliency.flatten(0, 1), masks.flatten(0, 1), has.flatten()) if h and m.any()]
    np.testing.assert_allclose(xbench_run.records["grounding"]["cnr"].numpy(), expected, rtol=1e-9)
    assert xbench_run.results["phrase_grounding"]["protocol"] == "xbench"

    himl_run = run("hi-ml")
    assert himl_run.results["phrase_grounding"]["protocol"] == "hi-ml"
    records = himl_run.records["queries"]["query"]
    boxes_of = {}
    for row in MS_CXR_CLI_ROWS:
        boxes_of.setdefault((row["dicom_id"], row["label_text"]), []).append(row)
    phrases = list(dict.fromkeys(row["label_text"] for row in MS_CXR_CLI_ROWS))
    anchors = himl_run.encode_phrases(phrases)["anchor"].numpy()
    native_seen = np.zeros((48, 64), dtype=bool)
    native_seen[:, 8:56] = True
    for i, (dicom_id, phrase) in enumerate(boxes_of):
        region = np.zeros((48, 64), dtype=bool)
        for row in boxes_of[dicom_id, phrase]:
            region[row["y"] : row["y"] + row["h"], row["x"] : row["x"] + row["w"]] = True
        row, column = anchors[phrases.index(phrase)]
        peak = np.zeros((48, 64), dtype=bool)
        peak[6 * row : 6 * row + 6, 8 + 6 * column : 8 + 6 * column + 6] = True
        assert records["region"][i].item() == region.sum()
        assert records["hit"][i].item() == bool((peak & region).any())
        assert records["inter"][i, 50].item() == (peak & region).sum()
        assert records["cnr"][i].item() == pytest.approx(plain_cnr(peak.astype(float), region, native_seen), rel=1e-9)
