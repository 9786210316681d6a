"""What the golden parity scripts and tests share: the seed, the three radiographs, the seeded
random checkpoint folders, the prompts XBench sends, and the golden file format.

Runs in XBench's environment. The authors' side of a model may need another one (old library
pins), so it reaches these through the command line:

    python tools/parity/common.py weights MODEL FOLDER   # the seeded random checkpoint folder
    python tools/parity/common.py prompts MODEL          # {"classes": [...], "prompts": [...]} as JSON
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import torch

SEED = 0
#: The square NIH PNG and the two non-square CheXlocalize JPEGs, relative to the real-data folder.
IMAGES = (
    "nih/00000001_000.png",
    "chexlocalize/valid/patient64541/study1/view1_frontal.jpg",
    "chexlocalize/valid/patient64542/study1/view1_frontal.jpg",
)
DATASET = "chexlocalize"
#: The metric frame's side the windows and upsampled maps are stated in.
FRAME = 224
#: Classes whose upsampled map the golden file keeps (positions in the class list): one pins the rule.
UPSAMPLED_CLASSES = (0,)
MODELS = ("kad-224", "kad-512", "carzero", "clip", "biomedclip")


def classes() -> list[str]:
    from xbench.findings import PAPER_CLASSES

    return list(PAPER_CLASSES[DATASET])


def image_key(path: Path) -> str:
    """The first 12 hex digits of the file's sha256: the golden file names its inputs by content."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def write_weights(model: str, folder: Path) -> Path:
    """The seeded random checkpoint folder of ``model`` in its authors' layout."""
    from xbench.models import random_weights

    torch.manual_seed(SEED)  # the writers' BERT and ViT initialisations draw from the global generator
    if model.startswith("kad-"):
        return random_weights.write_kad(folder, variant=int(model.removeprefix("kad-")), seed=SEED)
    if model == "carzero":
        return random_weights.write_carzero(folder, classes())
    if model == "clip":
        return random_weights.write_clip(folder, seed=SEED)
    if model == "biomedclip":
        return random_weights.write_biomedclip(folder, seed=SEED)
    raise ValueError(f"unknown model {model!r}; one of {MODELS}")


def prompts(model: str) -> list:
    """The prompts XBench sends for :func:`classes`: KAD's query set, CARZero's one prompt per
    class, the open_clip models' (positive, negative) pair per class."""
    keys = classes()
    if model.startswith("kad-"):
        from xbench.models.kad import query_set

        query, index = query_set(keys, DATASET)
        if index != list(range(len(keys))):
            raise ValueError(f"KAD decodes {query} for {keys}: the golden files assume one query per class, in order")
        return query
    if model == "carzero":
        from xbench.models.carzero import prompt_for

        return [prompt_for(key) for key in keys]
    if model in ("clip", "biomedclip"):
        from xbench.findings import finding_text
        from xbench.models.biomedclip import BiomedCLIP
        from xbench.models.clip import CLIP

        built = CLIP() if model == "clip" else BiomedCLIP()
        return [[built.pos_template.format(finding_text(k)), built.neg_template.format(finding_text(k))] for k in keys]
    raise ValueError(f"unknown model {model!r}; one of {MODELS}")


def golden_path(out: Path, model: str) -> Path:
    return Path(out) / f"{model}.npz"


def save_golden(path: Path, per_image: dict[str, dict[str, np.ndarray]], class_keys: list[str], meta: dict) -> None:
    """One ``.npz``: per image key ``<key>_logits`` [C], ``<key>_maps`` [C, h, w] float32,
    ``<key>_window`` [4] (top, left, height, width in frame pixels), ``<key>_upsampled``
    [len(UPSAMPLED_CLASSES), S, S] float16; ``classes``; ``meta`` (JSON)."""
    arrays = {f"{key}_{name}": value for key, entries in per_image.items() for name, value in entries.items()}
    np.savez_compressed(path, classes=np.array(class_keys), meta=np.array(json.dumps(meta, indent=1)), **arrays)


def load_golden(path: Path) -> tuple[dict[str, dict[str, np.ndarray]], list[str], dict]:
    with np.load(path) as data:
        per_image: dict[str, dict[str, np.ndarray]] = {}
        for name in data.files:
            if name in ("classes", "meta"):
                continue
            key, _, entry = name.partition("_")
            per_image.setdefault(key, {})[entry] = data[name]
        return per_image, [str(c) for c in data["classes"]], json.loads(str(data["meta"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    weights = sub.add_parser("weights", help="write the seeded random checkpoint folder")
    weights.add_argument("model", choices=MODELS)
    weights.add_argument("folder", type=Path)
    prompt = sub.add_parser("prompts", help="print the classes and XBench's prompts as JSON")
    prompt.add_argument("model", choices=MODELS)
    args = parser.parse_args(argv)
    if args.command == "weights":
        write_weights(args.model, args.folder)
    else:
        json.dump({"classes": classes(), "prompts": prompts(args.model)}, sys.stdout)


if __name__ == "__main__":
    main()


# -- for the authors' side, which may run in another environment -------------------------------------

REPO = Path(__file__).resolve().parents[2]


def xbench_command(python: Path, *args: str) -> str:
    """Run this file's command line in XBench's environment (``python``); its standard output."""
    import subprocess

    return subprocess.run(
        [str(python), str(Path(__file__).resolve()), *args], check=True, capture_output=True, text=True, cwd=REPO,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    ).stdout


def checkpoint_folder(model: str, given: Path | None, python: Path, scratch: Path) -> Path:
    """``given`` (real weights), or the seeded random folder written by XBench's environment into ``scratch``."""
    if given is not None:
        return given
    folder = scratch / "weights"
    xbench_command(python, "weights", model, str(folder))
    return folder


def parity_arguments(description: str, authors_repo: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    if authors_repo:
        parser.add_argument("--authors-repo", type=Path, required=True, help="the authors' repository as fetched")
    parser.add_argument("--checkpoint-dir", type=Path, help="real weights in XBench's layout (default: seeded random)")
    parser.add_argument("--real-data", type=Path, default=REPO.parent / "shared" / "data" / "real",
                        help="the folder holding the three radiographs (IMAGES)")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "golden")
    parser.add_argument("--xbench-python", type=Path, default=REPO / ".venv" / "bin" / "python",
                        help="the Python of XBench's environment (writes the random weights, states the prompts)")
    return parser


def git_commit(repo: Path) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def image_records(root: Path) -> list[dict]:
    return [{"file": name, "key": image_key(root / name)} for name in IMAGES]
