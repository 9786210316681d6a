"""What a run leaves beside its metrics: the overlay pairs, and the offline W&B run (read back from its files)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from conftest import only_folder, run_args
from xbench.data.transforms import resize_image
from xbench.test import main

PHANTOM_SPELLINGS = {"Nodule": "nodule", "Mass": "mass", "Consolidation": "consolidation"}


def expected_overlay_pairs(phantom_root: Path, per_class: int) -> set[tuple[str, str]]:
    """Per class, the first ``per_class`` images (by file name) whose boxes include it."""
    entries = sorted(json.loads((phantom_root / "test.json").read_text()), key=lambda e: e["file_name"])
    chosen = set()
    for raw, key in PHANTOM_SPELLINGS.items():
        names = [e["file_name"] for e in entries if raw in e["syms"]][:per_class]
        chosen |= {(key, name) for name in names}
    return chosen


def test_every_model_saves_the_same_overlay_pairs(phantom_root, tmp_path):
    main(run_args("oracle", "phantom", phantom_root, tmp_path / "o", "--data.batch_size", "4",
                  "--trainer.logger", "false", "--results.overlay_pairs", "2"))
    main(run_args("random", "phantom", phantom_root, tmp_path / "r", "--data.batch_size", "4",
                  "--trainer.logger", "false", "--results.overlay_pairs", "2"))
    oracle = np.load(only_folder(tmp_path / "o") / "overlays.npz")
    random = np.load(only_folder(tmp_path / "r") / "overlays.npz")
    pairs = set(zip(oracle["finding"], oracle["image_id"]))
    assert pairs == expected_overlay_pairs(phantom_root, 2) and len(pairs) == len(oracle["finding"])
    for name in ("finding", "image_id", "image", "mask"):
        np.testing.assert_array_equal(oracle[name], random[name])
    # the image, in the batch geometry (64), as uint8
    i = 0
    pixels = np.asarray(Image.open(phantom_root / "test_data" / str(oracle["image_id"][i])), dtype=np.float32) / 255
    resized = resize_image(pixels, 64)
    np.testing.assert_array_equal(oracle["image"][i], (resized.clamp(0, 1) * 255).round().to(torch.uint8).numpy()[0])
    # the oracle's map is its mask: normalised, 255 inside the region and 0 outside
    np.testing.assert_array_equal(oracle["saliency"], np.where(oracle["mask"], 255, 0))
    assert oracle["mask"].any(axis=(1, 2)).all()
    assert not np.array_equal(random["saliency"], oracle["saliency"])


def read_wandb_records(run_dir: Path) -> list:
    """The records of an offline run's ``.wandb`` file (a LevelDB-style log of wandb protobufs)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = run_dir.glob("run-*.wandb")
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0)
    block, position, pending, records = 32768, 7, b"", []
    while position < len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_offline_wandb_run_holds_summary_table_curves_and_overlays(phantom_root, tmp_path, no_network):
    results = main(run_args("oracle", "phantom", phantom_root, tmp_path / "results", "--data.batch_size", "4",
                            "--trainer.logger.init_args.save_dir", str(tmp_path)))
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    records = read_wandb_records(run_dir)
    summary = {}
    for record in records:
        if record.WhichOneof("record_type") == "summary":
            summary.update({item.key: json.loads(item.value_json) for item in record.summary.update if item.key})
    graded = [k for k, v in results["grounding"]["per_class"].items() if v["pairs"] > 0]
    assert summary["grounding/pointing_game/macro"] == 1.0
    for key in graded:
        assert summary[f"grounding/dice@best/{key}"] == 1.0
    config_keys = {item.key for r in records if r.WhichOneof("record_type") == "config" for item in r.config.update}
    assert {"xbench", "results_folder", "chosen_on_evaluated_set"} <= config_keys
    run_names = [r.run.display_name for r in records if r.WhichOneof("record_type") == "run"]
    assert "oracle__phantom" in run_names

    tables = run_dir / "files" / "media" / "table"
    (per_class_file,) = tables.glob("per_class_*.table.json")
    table = json.loads(per_class_file.read_text())
    rows = {row[0]: dict(zip(table["columns"], row)) for row in table["data"]}
    assert list(rows) == results["classes"]
    for key in graded:
        assert rows[key]["grounding/pointing_game"] == 1.0
        assert rows[key]["grounding/pairs"] == results["grounding"]["per_class"][key]["pairs"]
    assert "grounding/dice@best (chosen on evaluated set)" in table["columns"]
    assert len(list(tables.glob("curves/dice_table_*.table.json"))) == 1
    (overlay_file,) = tables.glob("overlays_*.table.json")
    overlays = np.load(only_folder(tmp_path / "results") / "overlays.npz")
    assert len(json.loads(overlay_file.read_text())["data"]) == len(overlays["image_id"]) > 0
    # a table with media is logged as an artifact whose files W&B stages until `wandb sync`
    (staged,) = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"
                 and r.artifact.name.endswith("-overlays")]
    images = [entry.local_path for entry in staged.manifest.contents if entry.path.startswith("media/images/")]
    assert len(images) == len(overlays["image_id"])
    assert all(Path(path).is_relative_to(os.environ["WANDB_DATA_DIR"]) for path in images)
    with Image.open(images[0]) as image:
        assert image.format == "PNG" and image.size == (64, 64) and image.mode == "RGB"


def test_logger_false_writes_no_wandb_run(phantom_root, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "w"))
    main(run_args("centre_prior", "phantom", phantom_root, tmp_path / "results", "--data.batch_size", "4",
                  "--trainer.logger", "false"))
    assert not (tmp_path / "w").exists()
    assert only_folder(tmp_path / "results").name.startswith("centre_prior__phantom__")


def test_wandb_is_offline_unless_asked(monkeypatch):
    from xbench.reporting.wandb import XBenchWandbLogger

    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert XBenchWandbLogger()._offline  # nothing set: offline
    monkeypatch.setenv("WANDB_MODE", "online")
    assert not XBenchWandbLogger()._offline
    assert XBenchWandbLogger(offline=True)._offline
    monkeypatch.setenv("WANDB_MODE", "disabled")  # left to W&B, not turned into offline
    assert not XBenchWandbLogger()._offline
