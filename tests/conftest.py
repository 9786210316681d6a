"""Shared fixtures: the real-data folder, a small phantom, writers of official formats."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import math
import os
import socket
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import (
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    JPEGBaseline8Bit,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from xbench.data.phantom import generate_phantom
from xbench.findings import FINDINGS, dataset_name
from xbench.geometry.maps import normalise, place_in_frame, whole_frame
from xbench.results.folder import MANIFEST, find_result_folders, manifest_of
from xbench.test import main

REAL_DATA_ENV = "XBENCH_REAL_DATA"

CONFIGS = Path(__file__).resolve().parents[1] / "lightning_configs"


def pytest_configure(config):
    """Generated phantoms and caches go to a throw-away folder unless XBENCH_CACHE says otherwise.
    An xdist worker (``pytest -n``) computes on one thread, as workers share the machine's cores, and
    so do the processes it starts (a run in a subprocess gives the numbers of the same run in the
    worker); it keeps its caches in a folder of its own, as two workers may write the same phantom
    at once."""
    os.environ.setdefault("XBENCH_CACHE", tempfile.mkdtemp(prefix="xbench-test-cache-"))
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        torch.set_num_threads(1)
        os.environ["OMP_NUM_THREADS"] = "1"
        os.environ["XBENCH_CACHE"] = str(Path(os.environ["XBENCH_CACHE"]) / worker)


@pytest.fixture(scope="session")
def real_data() -> Path:
    """``$XBENCH_REAL_DATA`` (set by .ci/run): the real annotation files and images.

    Unset (a user's machine): tests that need it skip, saying why. Set: a missing file fails.
    """
    value = os.environ.get(REAL_DATA_ENV)
    if not value:
        pytest.skip(f"{REAL_DATA_ENV} is not set: real-data tests need the shared real files (.ci/run sets it)")
    root = Path(value)
    if not root.is_dir():
        pytest.fail(f"{REAL_DATA_ENV}={value} is not a folder")
    return root


def real_file(root: Path, relative: str) -> Path:
    path = root / relative
    if not path.is_file():
        pytest.fail(f"real-data file missing: {path} ({REAL_DATA_ENV} is set, so it must exist)")
    return path


@pytest.fixture(scope="session", autouse=True)
def offline_wandb(tmp_path_factory):
    """Nothing is ever sent to W&B from a test: runs are offline, and every W&B folder (runs,
    staged table media, caches, settings) is a temporary one."""
    patch = pytest.MonkeyPatch()
    patch.setenv("WANDB_MODE", "offline")
    root = tmp_path_factory.mktemp("wandb")
    for name in ("DIR", "DATA_DIR", "CACHE_DIR", "CONFIG_DIR", "ARTIFACT_DIR"):
        (root / name.lower()).mkdir()  # as a user's are: W&B warns of a missing WANDB_DIR as a missing git root
        patch.setenv(f"WANDB_{name}", str(root / name.lower()))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def phantom_root(tmp_path_factory) -> Path:
    """A small phantom (9 images, odd on purpose) shared by the end-to-end tests."""
    root = tmp_path_factory.mktemp("phantom") / "set"
    generate_phantom(root, num_images=9, size=96, seed=3)
    return root


@pytest.fixture(scope="session")
def gloria_folder(tmp_path_factory) -> Path:
    """``checkpoints/gloria/`` with full-size random weights (``write_gloria``, seed 0), written once
    for every test that only reads it (a test that edits a file edits a copy)."""
    from xbench.models.random_weights import write_gloria

    return write_gloria(tmp_path_factory.mktemp("gloria"), seed=0)


@pytest.fixture(scope="session")
def biovil_folder(tmp_path_factory) -> Path:
    """``checkpoints/biovil/`` with full-size random weights (``write_biovil``, seed 0), written once
    for every test that only reads it."""
    from xbench.models.random_weights import write_biovil

    return write_biovil(tmp_path_factory.mktemp("biovil"), seed=0)


def write_chestx_det10(root: Path, entries: list[dict], size: int = 64, split: str = "test") -> Path:
    """Write ``<split>.json`` and grey PNGs in ChestX-Det10's layout."""
    (root / f"{split}_data").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for entry in entries:
        pixels = rng.integers(0, 256, size=(size, size), dtype=np.uint8)
        Image.fromarray(pixels).save(root / f"{split}_data" / entry["file_name"])
    (root / f"{split}.json").write_text(json.dumps(entries))
    return root


def write_ms_cxr(
    root: Path, rows: list[dict], *, version: str = "v1.1.0", size: tuple[int, int] = (64, 48),
    images_root: Path | None = None, images: bool = True,
) -> Path:
    """Write MS-CXR's release file ``MS_CXR_Local_Alignment_<version>.csv`` in ``root`` (v1.0.0:
    without the ``split`` column) and, unless ``images`` is false, a grey JPEG of ``size`` (width,
    height) for each distinct ``path`` under ``images_root`` (default ``root``), where
    MIMIC-CXR-JPG keeps it (``files/pXX/pXXXXXXXX/sXXXXXXXX/<dicom_id>.jpg``).

    ``rows``: one dict per box with the CSV's columns (``dicom_id, category_name, label_text, path,
    x, y, w, h``); ``image_width``/``image_height`` default to ``size``, ``split`` to ``test``. A
    value is written as given (a string stays a string), so a test can write a bad one. Returns the
    CSV's path."""
    import csv

    columns = ["dicom_id", "category_name", "label_text", "path", "x", "y", "w", "h", "image_width", "image_height"]
    if version != "v1.0.0":
        columns.append("split")
    defaults = {"image_width": size[0], "image_height": size[1], "split": "test"}
    root.mkdir(parents=True, exist_ok=True)
    csv_path = root / f"MS_CXR_Local_Alignment_{version}.csv"
    with open(csv_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows([{**defaults, **row}.get(name, "") for name in columns] for row in rows)
    if images:
        images_root = root if images_root is None else images_root
        rng = np.random.default_rng(0)
        for relative in dict.fromkeys(row["path"] for row in rows):
            (images_root / relative).parent.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, size=(size[1], size[0]), dtype=np.uint8)
            Image.fromarray(pixels).save(images_root / relative, format="JPEG", quality=95)
    return csv_path


def tiny_clip_state(folder: Path, name: str, vision_layers: int) -> dict:
    """A tiny open_clip architecture ``name`` (32 px images in 8 px patches, width 32, a one-block
    text tower) registered from its config written to ``folder``, and its seeded random weights
    (CLIP's state dict, ``random_weights.clip_state``)."""
    import open_clip

    from xbench.models.random_weights import clip_state

    config = {
        "embed_dim": 16,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 32, "layers": vision_layers, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
    }
    (folder / f"{name}.json").write_text(json.dumps(config))
    open_clip.add_model_config(folder / f"{name}.json")
    return clip_state(name, 0)


#: The datasets a model's end-to-end CLI test runs on (``model_cli_dataset``): the phantom and the
#: phrase fixture. The other formats reach a model as the same decoded batch (each dataset's tests,
#: and ``tests/test_cache_exact.py`` for every model's transform on every format).
CLI_DATASETS = ("phantom", "ms_cxr")

#: The MS-CXR fixture of the models' CLI tests: three images, five phrases (two findings on one
#: image, a phrase drawn as two boxes, two phrases of one finding on one image).
MS_CXR_CLI_ROWS = [
    {"dicom_id": "d1", "category_name": "Pneumothorax", "label_text": "small left apical pneumothorax",
     "path": "files/p10/p10000001/s50000001/d1.jpg", "x": 6, "y": 4, "w": 20, "h": 14},
    {"dicom_id": "d1", "category_name": "Pleural Effusion", "label_text": "right pleural effusion",
     "path": "files/p10/p10000001/s50000001/d1.jpg", "x": 36, "y": 26, "w": 22, "h": 16},
    {"dicom_id": "d2", "category_name": "Pneumonia", "label_text": "bilateral patchy opacities",
     "path": "files/p10/p10000002/s50000002/d2.jpg", "x": 4, "y": 10, "w": 16, "h": 20},
    {"dicom_id": "d2", "category_name": "Pneumonia", "label_text": "bilateral patchy opacities",
     "path": "files/p10/p10000002/s50000002/d2.jpg", "x": 40, "y": 10, "w": 16, "h": 20},
    {"dicom_id": "d3", "category_name": "Pneumonia", "label_text": "left lower lobe pneumonia",
     "path": "files/p10/p10000003/s50000003/d3.jpg", "x": 8, "y": 24, "w": 18, "h": 16},
    {"dicom_id": "d3", "category_name": "Pneumonia", "label_text": "opacity at the right base",
     "path": "files/p10/p10000003/s50000003/d3.jpg", "x": 38, "y": 26, "w": 18, "h": 14},
]


def model_cli_dataset(data: str, folder: Path, phantom_root: Path) -> tuple[Path, list[str], int]:
    """A small dataset for a model's ``python -m xbench.test`` test, in its real format: the phantom
    (9 images), a ChestX-Det10 fixture (PNGs, boxes, a negative), an RSNA fixture (DICOMs,
    uncompressed and JPEG Baseline, 80 x 64, boxes, a negative) or an MS-CXR fixture (JPEGs in
    MIMIC-CXR-JPG's tree, report phrases). Returns its root, the extra arguments it needs and its
    number of images."""
    if data == "phantom":
        return phantom_root, [], 9
    if data == "chestx_det10":
        entries = [{"file_name": f"{i}.png", "syms": ["Mass"], "boxes": [[8, 4, 40, 30]]} for i in range(3)]
        entries.append({"file_name": "3.png", "syms": [], "boxes": []})
        return write_chestx_det10(folder / "det10", entries, size=72), [], 4
    if data == "rsna":
        root = folder / "rsna"
        rows = [("p-pos", "10.0", "12.0", "30.0", "24.0", "1"), ("p-neg", "", "", "", "", "0"),
                ("p-jpeg", "20.0", "8.0", "16.0", "40.0", "1")]
        (root / "stage_2_train_images").mkdir(parents=True)
        (root / "stage_2_train_labels.csv").write_text(
            "patientId,x,y,width,height,Target\n" + "".join(",".join(row) + "\n" for row in rows))
        pixels = np.random.default_rng(0).integers(0, 256, size=(64, 80), dtype=np.uint8)
        for patient, *_ in rows:
            compression = "jpeg" if patient == "p-jpeg" else None
            write_dicom(root / "stage_2_train_images" / f"{patient}.dcm", pixels, compression=compression)
        return root, ["--data.split_file", "null"], 3
    if data == "ms_cxr":
        return write_ms_cxr(folder / "ms_cxr", MS_CXR_CLI_ROWS).parent, [], 3
    raise ValueError(f"no CLI fixture for {data!r}; one of {CLI_DATASETS}")


#: The checks of ``xbench.checks`` at their smallest settings (each costs a forward per cascade step, 8
#: inputs per pair and 2 noisy inputs per image): the cascade on one image, deletion and insertion in two
#: steps, ROAD at one percentile (the 90th: a tenth of the input imputed, the cheapest solve) and one
#: noisy copy of each kind for robustness. Every model with a network
#: runs them in one CLI test with its CAM explainer (:func:`explainer_args`); on native maps of MS-CXR's
#: query slots, the cheapest model of each query mode runs them (BiomedCLIP and CARZero, tiny: a phrase's
#: own map; MedKLIP: its finding's map), since the checks call the same ``model.explain`` whatever the
#: model (a full-size model's checks on MS-CXR took 10-30 s each).
CHECK_ARGS = ("--sanity.images", "1", "--faithfulness.images", "1", "--faithfulness.steps", "2",
              "--faithfulness.road_percentiles", "[90]", "--robustness.images", "1", "--robustness.samples", "1")

#: The CAM explainer a model runs with :data:`CHECK_ARGS` in its phantom CLI test (:func:`explainer_args`;
#: BioViL-T's one CLI test, on ChestX-Det10). Every method of ``CAM_METHODS`` goes through
#: ``python -m xbench.test`` on a shipped model (``tests/test_explainers.py`` holds the table to that):
#: Score-CAM, a forward pass per channel of the layer, per image and class, on the tiny CLIP (32
#: channels); the others on the authors' architectures at full size too (CheXzero: two ViT-B/32 blocks).
CLI_EXPLAINERS = {"medklip": "gradcam++", "mavl": "hirescam", "kad": "xgradcam", "devide": "layercam",
                  "gloria": "eigencam", "biovil": "gradcam", "biovil_t": "gradcam++", "chexzero": "xgradcam",
                  "clip": "scorecam", "biomedclip": "gradcam", "carzero": "hirescam", "radzero": "gradcam"}


def explainer_args(model: str) -> tuple[str, ...]:
    """``model``'s CAM explainer of :data:`CLI_EXPLAINERS` and both checks at their smallest settings."""
    return ("--model.explainer", CLI_EXPLAINERS[model], *CHECK_ARGS)


def check_explanation_sections(results: dict, folder: Path) -> None:
    """A run with :data:`CHECK_ARGS` scored one image's graded pairs for sanity (every cascade step,
    similarities in range, the original map equal to itself), faithfulness (curves of 3 points,
    one ROAD percentile) and robustness (one noisy copy of each kind: finite, non-negative values,
    a constant map's too), with the per-pair tables beside ``metrics.json``."""
    import pandas as pd

    sanity, faithfulness = results["sanity"], results["faithfulness"]
    assert sanity["applicable"] and faithfulness["applicable"], (sanity, faithfulness)
    assert sanity["images"] == faithfulness["images"] == 1 and sanity["pairs"] == faithfulness["pairs"] >= 1
    first, *cascade = sanity["steps"]
    assert first["layers"] == "original" and cascade and all(step["parameters"] > 0 for step in cascade)
    assert first["ssim"] == pytest.approx(1.0) and first["spearman"] in (None, pytest.approx(1.0))
    for step in sanity["steps"]:
        assert all(step[k] is None or -1 - 1e-9 <= step[k] <= 1 + 1e-9 for k in ("spearman", "spearman_abs", "ssim"))
    assert len(faithfulness["curves"]["deletion"]) == 3 and len(faithfulness["curves"]["road_morf"]) == 1
    table = pd.read_csv(folder / "faithfulness.csv.gz")
    assert len(table) == faithfulness["pairs"] and {"deletion_auc", "insertion_auc", "road"} <= set(table.columns)
    steps = pd.read_csv(folder / "sanity.csv.gz")
    assert len(steps) == sanity["pairs"] * len(sanity["steps"])
    with np.load(folder / "sanity_maps.npz") as saved:
        assert saved["maps"].shape[0] == len(sanity["steps"]) and saved["maps"].dtype == np.uint8
    robustness = results["robustness"]
    assert robustness["applicable"] and robustness["images"] == 1 and robustness["pairs"] == sanity["pairs"]
    assert robustness["samples"] == 1
    for values in [robustness["macro"], *(v for v in robustness["per_class"].values() if v["pairs"])]:
        assert all(math.isfinite(values[k]) and values[k] >= 0 for k in ("max_sensitivity", "local_lipschitz"))
    assert all(v["max_sensitivity"] is None for v in robustness["per_class"].values() if not v["pairs"])
    pairs = pd.read_csv(folder / "robustness.csv.gz")
    assert len(pairs) == robustness["pairs"] and int(pairs["constant_map"].sum()) == robustness["constant_maps"]


def check_layer_groups(model, groups=None) -> list:
    """The model-specific half of the sanity check, without a forward: ``model``'s declared layer
    groups (or ``groups``) fit its parameters (``cascade_steps`` refuses a parameter in no group and a
    group matching none), every step's re-initialisation runs on its modules and changes the weights
    (a norm layer still at its default init may stay so), and the snapshot puts every parameter and
    buffer back exactly. The cascade's steps."""
    from xbench.checks.sanity import cascade_steps, randomise, restore

    steps = cascade_steps(model, groups if groups is not None else model.layer_groups)
    snapshot = {name: value.detach().clone() for name, value in [*model.named_parameters(), *model.named_buffers()]}
    for step in steps:
        randomise(model, step.parameters, seed=0)
    changed = sum(value.numel() for name, value in model.named_parameters() if not torch.equal(value, snapshot[name]))
    assert changed > 0.9 * sum(value.numel() for value in model.parameters()), "the cascade left weights as they were"
    restore(model, snapshot)
    assert all(torch.equal(value, snapshot[name]) for name, value in [*model.named_parameters(),
                                                                       *model.named_buffers()])
    return steps


def check_map_quality_sections(results: dict, folder: Path) -> None:
    """Every run scores Quantus' localisation, complexity and (with two classes or more) random-logit
    values on each graded pair: the sections count the grounding's pairs, the values lie in their
    ranges, and each table holds a row per pair."""
    import pandas as pd

    from xbench.metrics.map_quality import SECTIONS

    pairs = sum(v["pairs"] for v in results["grounding"]["per_class"].values())
    ranges = {"relevance_mass": (0, 1), "relevance_rank": (0, 1), "top_k_intersection": (0, 1), "pixel_auc": (0, 1),
              "sparseness": (0, 1), "complexity": (0, math.log(results["data"]["image_size"] ** 2) + 1e-9),
              "random_logit": (-1, 1)}
    for section, names in SECTIONS.items():
        body = results[section]
        if section == "randomisation" and len(results["classes"]) == 1:
            assert not body["applicable"] and not (folder / f"{section}.csv.gz").exists()
            continue
        assert body["applicable"] and body["pairs"] == pairs > 0, (section, body)
        for values in [body["macro"], *body["per_class"].values()]:
            for name in names:
                low, high = ranges[name]
                assert values[name] is None or low - 1e-9 <= values[name] <= high + 1e-9, (section, name, values)
        assert len(pd.read_csv(folder / f"{section}.csv.gz")) == pairs


def run_model_cli(model: str, data: str, folder: Path, phantom_root: Path, *extra: str,
                  query_mode: str = "phrase") -> dict:
    """``python -m xbench.test`` with ``model`` on ``data``'s :func:`model_cli_dataset` under ``folder``:
    every image evaluated, Pointing Game and AUROC in range, Quantus' families on every graded pair
    (:func:`check_map_quality_sections`), the checks' sections where ``extra`` holds
    :data:`CHECK_ARGS` (:func:`check_explanation_sections`), and on MS-CXR the phrases grounded as
    ``query_mode`` says (:func:`check_phrase_results`). The metrics.json payload."""
    root, data_extra, images = model_cli_dataset(data, folder, phantom_root)
    results = main(run_args(model, data, root, folder / "results", *extra, *data_extra))
    explainer = extra[extra.index("--model.explainer") + 1] if "--model.explainer" in extra else "native"
    assert results["explainer"]["name"] == explainer
    assert results["model"] == (model if explainer == "native" else f"{model}+{explainer}")
    assert results["data"]["images_evaluated"] == images
    graded = [v for v in results["grounding"]["per_class"].values() if v["pairs"]]
    assert graded and all(0 <= v["pointing_game"] <= 1 for v in graded)
    assert all(v["auroc"] is None or 0 <= v["auroc"] <= 1 for v in results["classification"]["per_class"].values())
    check_map_quality_sections(results, only_folder(folder / "results"))
    if CHECK_ARGS[0] in extra:
        check_explanation_sections(results, only_folder(folder / "results"))
    if data == "ms_cxr":
        check_phrase_results(results, only_folder(folder / "results"), query_mode)
    return results


def run_on_ms_cxr(model: str, folder: Path, query_mode: str, *extra: str) -> dict:
    """:func:`run_model_cli` on the MS-CXR fixture (:data:`MS_CXR_CLI_ROWS`), two images a batch."""
    return run_model_cli(model, "ms_cxr", folder, folder, "--data.batch_size", "2", *extra, query_mode=query_mode)


def check_phrase_results(results: dict, folder: Path, query_mode: str) -> None:
    """A run on :data:`MS_CXR_CLI_ROWS` scored every query (5, each under its finding) the way the
    model grounds phrases, with the finding-name view and the paired difference for a phrase-mode
    model; ``queries.csv.gz`` holds one row per query and view."""
    import pandas as pd

    phrases = results["phrase_grounding"]
    assert phrases["query_mode"] == query_mode and phrases["phrases"] == 5
    pairs = {key: v["pairs"] for key, v in phrases["by_query"]["per_class"].items() if v["pairs"]}
    assert pairs == {"pneumothorax": 1, "pleural_effusion": 1, "pneumonia": 3}
    for values in phrases["by_query"]["per_class"].values():
        assert values["pointing_game"] is None or 0 <= values["pointing_game"] <= 1
        assert values["cnr"] is None or values["cnr"] >= 0
    intervals = phrases["intervals"]
    macro = intervals["by_query"]["pointing_game"]["macro"]
    assert macro["lower"] <= macro["estimate"] <= macro["upper"]
    table = pd.read_csv(folder / "queries.csv.gz")
    views = ["query", "finding_name"] if query_mode == "phrase" else ["query"]
    assert sorted(set(table["view"])) == sorted(views) and len(table) == 5 * len(views)
    assert set(table["phrase"]) == {row["label_text"] for row in MS_CXR_CLI_ROWS}
    if query_mode == "phrase":
        assert phrases["by_finding_name"]["per_class"]["pneumonia"]["pairs"] == 3
        assert set(intervals["phrase_minus_name"]) == {"pointing_game", "dice@0.5", "iou@0.5", "cnr"}
    else:
        assert phrases["by_finding_name"] is None and "phrase_minus_name" not in intervals


@pytest.fixture
def no_network(monkeypatch):
    """Fail any attempt to open a socket to a non-local address (Unix sockets and loopback are local)."""
    real_connect = socket.socket.connect

    def guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        local_host = isinstance(host, str) and (host.startswith("127.") or host in ("localhost", "::1"))
        if self.family == socket.AF_UNIX or local_host:
            return real_connect(self, address)
        raise AssertionError(f"network access attempted: {address}")

    monkeypatch.setattr(socket.socket, "connect", guarded)


def write_dicom(path: Path, pixels: np.ndarray, *, compression: str | None = None, **elements) -> np.ndarray:
    """Write a one-frame grey DICOM with pydicom; return the stored values a reader must decode.

    ``compression``: None (Explicit VR Little Endian), ``"jpeg"`` (JPEG Baseline: the JPEG bytes
    encoded by Pillow and encapsulated; the returned values are Pillow's decode of those bytes) or
    ``"j2k"`` (JPEG 2000 lossless through pylibjpeg-openjpeg; sides of at least 32 pixels).
    ``elements`` set further attributes (BitsStored, WindowCenter, PhotometricInterpretation, ...).
    """
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    dataset = Dataset()
    dataset.file_meta = meta
    dataset.SOPClassUID, dataset.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    dataset.Modality = "CR"
    dataset.Rows, dataset.Columns = pixels.shape
    dataset.SamplesPerPixel = 1
    dataset.PhotometricInterpretation = "MONOCHROME2"
    dataset.BitsAllocated = 8 * pixels.itemsize
    dataset.BitsStored = 8 * pixels.itemsize
    dataset.PixelRepresentation = 0
    for keyword, value in elements.items():
        setattr(dataset, keyword, value)
    dataset.HighBit = dataset.BitsStored - 1
    stored = pixels
    if compression == "jpeg":
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
        stored = np.asarray(Image.open(io.BytesIO(buffer.getvalue())))
        meta.TransferSyntaxUID = JPEGBaseline8Bit
        dataset.PixelData = encapsulate([buffer.getvalue()])
        dataset["PixelData"].VR = "OB"
        dataset.LossyImageCompression = "01"
    else:
        dataset.PixelData = pixels.tobytes()
        if compression == "j2k":
            dataset.compress(JPEG2000Lossless, encoding_plugin="pylibjpeg")
        elif compression is not None:
            raise ValueError(f"unknown compression {compression!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.save_as(path, enforce_file_format=True)
    return stored


def run_args(model: str, data: str, root: Path, results: Path, *extra: str, image_size: int | None = 64) -> list[str]:
    """Arguments of a small ``python -m xbench.test`` run: ``lightning_configs/models/<model>.yaml`` on
    ``lightning_configs/data/<data>.yaml`` at ``root``, loaded in the test's process, no progress bar;
    ``extra`` last, so it overrides (``image_size=None`` keeps the config's size)."""
    size = ["--data.image_size", str(image_size)] if image_size is not None else []
    return [
        "--config", str(CONFIGS / "models" / f"{model}.yaml"),
        "--config", str(CONFIGS / "data" / f"{data}.yaml"),
        "--data.root", str(root), *size, "--data.num_workers", "0",
        "--results.folder", str(results), "--trainer.enable_progress_bar", "false",
        *extra,
    ]


def only_folder(results: Path) -> Path:
    """The one results folder a run wrote under ``results`` (a run in progress is staged under a hidden name)."""
    (folder,) = [p for p in results.iterdir() if not p.name.startswith(".")]
    return folder


def results_contents(results: Path) -> dict[str, dict]:
    """Every results folder under ``results`` with its files' contents, keyed by the run's model and
    data settings: what two ways of running the same pairs must write alike. Not compared: when
    each ran (the folder's name, ``metrics.json``'s ``created``, ``summary.md``'s "Run ..." line) and
    what is not a results folder (a suite's hidden ``.suite`` folder of job logs), nor the manifest
    (it hashes ``metrics.json``, so its ``created`` too)."""
    found = {}
    for folder in find_result_folders([results]):
        files = {}
        for path in folder.iterdir():
            if path.name == MANIFEST:
                continue
            if path.name == "metrics.json":
                payload = json.loads(path.read_text())
                assert payload.pop("created")
                files[path.name] = payload
            elif path.suffix == ".npz":
                with np.load(path) as arrays:
                    files[path.name] = {name: arrays[name].tolist() for name in arrays.files}
            elif path.suffix == ".gz":
                files[path.name] = gzip.decompress(path.read_bytes())
            elif path.name == "summary.md":
                files[path.name] = [line for line in path.read_text().splitlines() if not line.startswith("Run ")]
            else:
                files[path.name] = path.read_bytes()
        config = files["metrics.json"]["config"]
        key = json.dumps({name: config[name] for name in ("model", "data")}, sort_keys=True)
        assert key not in found, f"two results folders of one run's settings under {results}"
        found[key] = files
    return found


def names(model: str, dataset: str, classes: list[str]) -> dict:
    """A fabricated ``metrics.json``'s ``names``: the model shown as ``model``, the dataset and each
    class by XBench's table where it has them, else by the key itself (short name upper-cased)."""
    return {"model": model, "dataset": dataset_name(dataset),
            "findings": {key: {"display": FINDINGS[key].display, "short": FINDINGS[key].short} if key in FINDINGS
                         else {"display": key, "short": key.upper()} for key in classes}}


def reseal(folder: Path) -> Path:
    """Rewrite a results folder's manifest from its files as they now are: an edit the manifest no
    longer catches, so that a test reaches the checks behind it (ranges, pairs, estimates)."""
    (Path(folder) / MANIFEST).write_text(json.dumps(manifest_of(folder)))
    return Path(folder)


def run_oracle(data_config: str, root: Path, results: Path, image_size: int) -> dict:
    """``python -m xbench.test`` with the oracle on ``lightning_configs/data/<data_config>.yaml``;
    the metrics.json payload, read back from the results folder."""
    main(run_args("oracle", data_config, root, results, image_size=image_size))
    return json.loads((only_folder(results) / "metrics.json").read_text())


#: How far ``--trainer.precision bf16-mixed`` may move a model's outputs from fp32 (random weights,
#: CPU autocast; bf16 keeps 8 significant bits): the logits (absolute + relative; measured at most
#: 0.04 on logits up to 15), and the min-max normalised maps the metrics see, per pixel (measured at
#: most 0.07, and 0.020 on average, for MedKLIP and MAVL over several random trunks; the other models
#: within 0.02 and 0.003).
BF16_LOGITS = {"atol": 0.05, "rtol": 0.02}
BF16_SALIENCY_MAX, BF16_SALIENCY_MEAN = 0.1, 0.03


def assert_bf16_mixed_close_to_fp32(model, image: torch.Tensor) -> None:
    """The model's forward in fp32 and inside Lightning's bf16-mixed autocast (what ``test_step`` runs
    in) agree within the tolerances above; the bf16 pass really ran in bf16 (its outputs differ)."""
    with torch.inference_mode():
        logits, maps = model(image)
        with MixedPrecision("bf16-mixed", "cpu").forward_context():
            low_logits, low_maps = model(image)
    assert not torch.equal(low_logits.float(), logits), "autocast changed nothing: did the network run in bf16?"
    torch.testing.assert_close(low_logits.float(), logits, **BF16_LOGITS)
    size = tuple(image.shape[-2:])
    windows = whole_frame(image.shape[0], size, image.device)
    difference = (normalise(place_in_frame(low_maps, windows, size)) - normalise(place_in_frame(maps, windows, size))).abs()
    assert difference.max() <= BF16_SALIENCY_MAX and difference.mean() <= BF16_SALIENCY_MEAN, (
        float(difference.max()), float(difference.mean()))



def assert_cam_declaration(model, model_input: torch.Tensor, native: tuple | None = None) -> None:
    """The model's declared CAM layer (``cam_target``) is on the path of its scores and covers its
    input: Grad-CAM there, run as Lightning's test loop runs it (under no_grad), gives the model's
    own logits (to float rounding: a forward with gradients may take other kernels) and maps on the
    native maps' grid, finite, not all zero. ``native``: the model's (logits, maps) of
    ``model_input`` where a fixture has them. (Equality with the library: tests/test_explainers.py.)"""
    saved = model.explainer
    try:
        with torch.no_grad():
            logits, native = native or model(model_input)
            model.explainer = "gradcam"
            cam_logits, maps = model.explain(model_input)
    finally:
        model.explainer = saved
    torch.testing.assert_close(cam_logits, logits, rtol=1e-5, atol=1e-5)
    assert maps.shape == native.shape, (tuple(maps.shape), tuple(native.shape))
    assert torch.isfinite(maps).all() and (maps >= 0).all() and maps.amax() > 0


#: A subprocess that has not finished by then has hung: the test fails with its output instead of
#: running into CI's limit. A safety net, never a budget: a loaded machine takes minutes.
SUBPROCESS_SAFETY_TIMEOUT = 3600


# -- the Hugging Face cache, as hf download writes it ----------------------------------------------

#: The commit of a snapshot :func:`write_snapshot` writes unless told another.
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_snapshot(cache: Path, repo: str, files: dict[str, bytes], commit: str = COMMIT,
                   refs: tuple[str, ...] = ("main",)) -> Path:
    """``repo``'s snapshot ``commit`` in ``cache`` as ``hf download`` writes it: ``refs/<ref>`` files
    holding the commit, ``files`` ({name: bytes}) as links into ``blobs/``; the snapshot folder."""
    repo_folder = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_folder / "snapshots" / commit
    for name, content in files.items():
        blob = repo_folder / "blobs" / hashlib.sha256(content).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(content)
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(blob)
    snapshot.mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo_folder / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (repo_folder / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache that huggingface_hub reads in this process (``HF_HUB_CACHE`` is
    read when it is imported, so its constant is set too)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


# -- PadChest-GR (issue 49.4) ----------------------------------------------------------------------

PADCHEST_GR_REPORTS = "grounded_reports_20240819.json"


def write_padchest_gr(root: Path, studies: list[dict], *, sizes: dict[str, tuple[int, int]] | None = None,
                      size: tuple[int, int] = (64, 48), splits: dict[str, str] | None = None,
                      missing_images: tuple[str, ...] = ()) -> Path:
    """Write PadChest-GR's release in ``root``: ``grounded_reports_20240819.json`` (``studies`` as
    given, so a test can write a bad value), ``master_table.csv`` (one row per study and sentence, as
    the release has it: ``StudyID, ImageID, label, sentence_en, split``; ``split`` from ``splits`` by
    study, default ``test``; a study without sentences still gets its row) and a 16-bit grey PNG of
    ``sizes.get(image, size)`` (width, height) under ``Padchest_GR_files/`` for each ``ImageID``
    except ``missing_images``. Returns ``root``."""
    import csv

    splits, sizes = splits or {}, sizes or {}
    (root / "Padchest_GR_files").mkdir(parents=True, exist_ok=True)
    (root / PADCHEST_GR_REPORTS).write_text(json.dumps(studies))
    with open(root / "master_table.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["StudyID", "ImageID", "label", "sentence_en", "split"])
        for study in studies:
            for finding in study.get("findings") or [{"labels": ["normal"], "sentence_en": ""}]:
                writer.writerow([study["StudyID"], study["ImageID"], ";".join(finding.get("labels", [])),
                                 finding.get("sentence_en", ""), splits.get(study["StudyID"], "test")])
    rng = np.random.default_rng(0)
    for study in studies:
        if study["ImageID"] in missing_images:
            continue
        width, height = sizes.get(study["ImageID"], size)
        pixels = rng.integers(0, 2**16, size=(height, width), dtype=np.uint16)
        Image.fromarray(pixels).save(root / "Padchest_GR_files" / study["ImageID"], format="PNG")
    return root
