"""What the golden parity scripts and tests share: the seed, the three radiographs, the seeded
random checkpoint folders, the prompts XBench sends, and the golden file format.

Runs in XBench's environment. The authors' side of a model may need another one (old library
pins), so it reaches these through the command line:

    python tools/parity/common.py weights MODEL FOLDER   # the seeded random checkpoint folder
    python tools/parity/common.py prompts MODEL          # {"classes": [...], "prompts": [...]} as JSON

and compares XBench with a golden file made from any weights and radiographs:

    python tools/parity/common.py compare MODEL GOLDEN.npz --checkpoint-dir DIR --real-data ROOT
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
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
MODELS = ("medklip", "mavl", "kad-224", "kad-512", "carzero", "clip", "biomedclip")


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
    if model in ("medklip", "mavl"):
        random_weights.write_bert(folder.parent / f"{folder.name}-bert", seed=SEED)
        writer = random_weights.write_medklip if model == "medklip" else random_weights.write_mavl
        writer(folder, folder.parent / f"{folder.name}-bert")
        return folder
    if model.startswith("kad-"):
        return random_weights.write_kad(folder, variant=int(model.removeprefix("kad-")), seed=SEED)
    if model == "carzero":
        return random_weights.write_carzero(folder, classes())
    if model == "clip":
        return random_weights.write_clip(folder, seed=SEED)
    if model == "biomedclip":
        return random_weights.write_biomedclip(folder, seed=SEED)
    raise ValueError(f"unknown model {model!r}; one of {MODELS}")


def prompts(model: str) -> list | dict:
    """The prompts XBench sends for :func:`classes`: MedKLIP's and MAVL's query book (entities, whose
    texts both sides read from the checkpoint folder), KAD's query set, CARZero's one prompt per
    class, the open_clip models' (positive, negative) pair per class."""
    keys = classes()
    if model in ("medklip", "mavl"):  # the query texts are the checkpoint folder's files; the book is ours
        from xbench.models.medklip import entity_book

        book, rows = entity_book(keys)
        return {"book": book, "class_rows": rows}
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


# -- XBench's side ------------------------------------------------------------------------------------

LOGIT_ATOL = 1e-4
#: Raw maps: 1e-4 of each golden map's spread (max - min), the scale of the normalised map the
#: metrics see (attention maps are ~1/196 in absolute terms).
MAP_RTOL_OF_SPREAD = 1e-4
WINDOW_ATOL = 1e-3
#: The golden's upsampled map is float16: its rounding (2^-11 of the value) is allowed on top.
FLOAT16_RTOL = 2.0**-11


def build_xbench(model: str, folder: Path):
    """XBench's model of ``model`` on the checkpoint folder, built for :func:`classes`, in eval mode."""
    if model in ("medklip", "mavl"):
        from xbench.models.mavl import MAVL
        from xbench.models.medklip import MedKLIP

        built = {"medklip": MedKLIP, "mavl": MAVL}[model](checkpoint_dir=str(folder), channels_last=False)
    elif model.startswith("kad-"):
        from xbench.models.kad import KAD

        built = KAD(checkpoint_dir=str(folder), variant=int(model.removeprefix("kad-")), channels_last=False)
        built.dataset_name = DATASET
    else:
        from xbench.models.biomedclip import BiomedCLIP
        from xbench.models.carzero import CARZero
        from xbench.models.clip import CLIP

        built = {"carzero": CARZero, "clip": CLIP, "biomedclip": BiomedCLIP}[model](checkpoint_dir=str(folder))
    built.build(classes())
    return built.eval()


def differences(model, path: Path, expected: dict[str, np.ndarray]) -> dict[str, float]:
    """XBench's whole path from the image file against one image's golden entries: the largest
    logit difference, the largest raw-map difference as a share of the map's spread, the largest
    window difference (frame pixels), and by how much the upsampled map leaves its allowance
    (<= 0: within; the map upsampled onto the model's input, window = the whole input, by the
    model's rule -- for KAD, whose input is the whole frame, its placement in the frame itself)."""
    from xbench.data.io import read_image
    from xbench.models.saliency import place_in_frame

    inputs, window = model.preprocess(read_image(path), frame=FRAME)
    with torch.no_grad():
        logits, maps = model(inputs[None])
    spread = expected["maps"].max(axis=(1, 2), keepdims=True) - expected["maps"].min(axis=(1, 2), keepdims=True)
    chosen = list(UPSAMPLED_CLASSES)
    whole_input = torch.tensor([[0.0, 0.0, FRAME, FRAME]])
    upsampled = place_in_frame(maps[:, chosen], whole_input, (FRAME, FRAME), model.preprocess.map_upsample)
    reference = expected["upsampled"].astype(np.float32)
    allowed = MAP_RTOL_OF_SPREAD * spread[chosen] + FLOAT16_RTOL * np.abs(reference)
    return {
        "logits": float(np.abs(logits[0].float().numpy() - expected["logits"]).max()),
        "maps": float((np.abs(maps[0].float().numpy() - expected["maps"]) / spread).max()),
        "window": float(np.abs(np.asarray(window, dtype=np.float32) - expected["window"]).max()),
        "upsampled_excess": float((np.abs(upsampled[0].numpy() - reference) - allowed).max()),
    }


def compare(model_name: str, golden: Path, folder: Path, root: Path) -> dict[str, dict[str, float]]:
    """:func:`differences` for every image of the golden file (its ``meta`` names them)."""
    per_image, _, meta = load_golden(golden)
    model = build_xbench(model_name, folder)
    result = {}
    for record in meta["images"]:
        path = root / record["file"]
        if image_key(path) != record["key"]:
            raise ValueError(f"{path} is not the image {golden} was made from (sha256 {record['key']}...)")
        result[record["file"]] = differences(model, path, per_image[record["key"]])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    weights = sub.add_parser("weights", help="write the seeded random checkpoint folder")
    weights.add_argument("model", choices=MODELS)
    weights.add_argument("folder", type=Path)
    prompt = sub.add_parser("prompts", help="print the classes and XBench's prompts as JSON")
    prompt.add_argument("model", choices=MODELS)
    check = sub.add_parser("compare", help="XBench's whole path against a golden file, per image")
    check.add_argument("model", choices=MODELS)
    check.add_argument("golden", type=Path)
    check.add_argument("--checkpoint-dir", type=Path, required=True)
    check.add_argument("--real-data", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "weights":
        write_weights(args.model, args.folder)
    elif args.command == "prompts":
        json.dump({"classes": classes(), "prompts": prompts(args.model)}, sys.stdout)
    else:
        for name, found in compare(args.model, args.golden, args.checkpoint_dir, args.real_data).items():
            print(name, " ".join(f"{key} {value:.2e}" for key, value in found.items()))


if __name__ == "__main__":
    main()


# -- for the authors' side, which may run in another environment -------------------------------------

REPO = Path(__file__).resolve().parents[2]


def xbench_command(python: Path, *args: str) -> str:
    """Run this file's command line in XBench's environment (``python``); its standard output."""
    return subprocess.run(
        [str(python), str(Path(__file__).resolve()), *args], check=True, capture_output=True, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
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
                        help="the folder the images are named relative to")
    parser.add_argument("--images", nargs="+", default=list(IMAGES),
                        help="radiographs under --real-data (default: IMAGES)")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "golden")
    parser.add_argument("--xbench-python", type=Path, default=REPO / ".venv" / "bin" / "python",
                        help="the Python of XBench's environment (writes the random weights, states the prompts)")
    return parser


def weights_source(model: str, given: Path | None) -> str:
    """What the golden's weights were, for its ``meta``."""
    return str(given) if given is not None else f"tools/parity/common.py weights {model} (seed {SEED})"


def git_commit(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


def image_records(root: Path, names: list[str]) -> list[dict]:
    return [{"file": name, "key": image_key(root / name)} for name in names]
