"""Worked example: save a model's outputs to disk, then score the files with PrecomputedSaliency.

    python examples/precomputed_phantom.py OUT_FOLDER [--image-size 96]

On a small phantom (generated into OUT_FOLDER/phantom) it saves CentrePrior's maps and logits in
the ``per_image`` layout (one ``.npz`` per image) and the ``per_pair`` layout (``.safetensors``),
and the phantom's own lesion boxes in the ``boxes`` layout (JSON Lines, a stand-in for a
box-predicting model); then it runs ``python -m xbench.test`` on each and on the live models they
stand for (CentrePrior for the maps, the Oracle for the boxes), and prints the macro numbers side
by side. The saved runs equal the live ones: the maps are saved on the metric frame, which the
reader's resize leaves unchanged, and at ``--image-size`` equal to the native size a box's
frame pixels are exactly the mask's.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from xbench.data.phantom import Phantom, generate_phantom
from xbench.models.baselines import CentrePrior
from xbench.test import main as xbench_test

CONFIGS = Path(__file__).resolve().parents[1] / "lightning_configs"
NATIVE_SIZE = 96


def save_centre_prior(root: Path, image_size: int, out: Path) -> None:
    """CentrePrior's maps [C, S, S] and logits [C] per image, in both map layouts."""
    data = Phantom(root=str(root), num_images=9, native_size=NATIVE_SIZE, image_size=image_size, num_workers=0)
    data.prepare_data()
    data.setup("test")
    model = CentrePrior()
    model.classes = list(data.classes)
    for batch in data.test_dataloader():
        logits, maps = model(batch["image"])
        for image_id, image_logits, image_maps in zip(batch["image_id"], logits, maps):
            np.savez(out / "per_image" / f"{image_id}.npz", maps=image_maps.numpy(), logits=image_logits.numpy())
            folder = out / "per_pair" / image_id
            folder.mkdir(parents=True, exist_ok=True)
            for key, logit, saliency in zip(data.classes, image_logits, image_maps):
                save_file({"map": saliency.contiguous(), "logit": logit.reshape(())}, folder / f"{key}.safetensors")


def save_phantom_boxes(root: Path, out: Path) -> None:
    """The phantom's lesion boxes as predicted boxes, one line per (image, finding), logit +/-10."""
    entries = json.loads((root / "test.json").read_text())
    keys = {"Nodule": "nodule", "Mass": "mass", "Consolidation": "consolidation"}
    with open(out / "boxes.jsonl", "w") as handle:
        for entry in entries:
            for raw, key in keys.items():
                boxes = [box for sym, box in zip(entry["syms"], entry["boxes"]) if sym == raw]
                line = {"image_id": entry["file_name"], "finding": key, "image_size": [NATIVE_SIZE, NATIVE_SIZE],
                        "boxes": boxes, "logit": 10.0 if boxes else -10.0}
                handle.write(json.dumps(line) + "\n")


def run(model_config: str, root: Path, results: Path, image_size: int, *extra: str) -> dict:
    """One ``python -m xbench.test`` run; its metrics.json."""
    xbench_test([
        "--config", str(CONFIGS / "models" / f"{model_config}.yaml"), "--config", str(CONFIGS / "data" / "phantom.yaml"),
        "--data.root", str(root), "--data.num_images", "9", "--data.native_size", str(NATIVE_SIZE),
        "--data.image_size", str(image_size), "--data.num_workers", "0", "--results.folder", str(results),
        "--trainer.enable_progress_bar", "false", *extra,
    ])
    (folder,) = [p for p in results.iterdir() if not p.name.startswith(".")]
    return json.loads((folder / "metrics.json").read_text())


def saved_and_live(out: Path, image_size: int = NATIVE_SIZE) -> dict[str, dict]:
    """Save the outputs, score them and the live models; metrics.json of each run by name."""
    root = out / "phantom"
    generate_phantom(root, num_images=9, size=NATIVE_SIZE, seed=3)
    (out / "per_image").mkdir(parents=True, exist_ok=True)
    save_centre_prior(root, image_size, out)
    save_phantom_boxes(root, out)
    return {
        "centre_prior": run("centre_prior", root, out / "runs" / "live", image_size),
        "per_image": run("precomputed_per_image", root, out / "runs" / "per_image", image_size,
                         "--model.path", str(out / "per_image")),
        "per_pair": run("precomputed_per_pair", root, out / "runs" / "per_pair", image_size,
                        "--model.path", str(out / "per_pair")),
        "oracle": run("oracle", root, out / "runs" / "oracle", image_size),
        "boxes": run("precomputed_boxes", root, out / "runs" / "boxes", image_size,
                     "--model.path", str(out / "boxes.jsonl")),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--image-size", type=int, default=NATIVE_SIZE)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    runs = saved_and_live(args.out, args.image_size)
    names = ("pointing_game", "dice@0.5", "dice@best", "iou@best")
    print(f"{'run':14s}" + "".join(f"{n:>12s}" for n in names) + f"{'auroc':>12s}")
    for name, metrics in runs.items():
        grounding = metrics["grounding"]["macro"]
        auroc = metrics["classification"]["macro"].get("auroc")
        print(f"{name:14s}" + "".join(f"{grounding[n]:12.4f}" for n in names) + f"{auroc!s:>12.6}")
