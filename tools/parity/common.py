"""What the golden parity scripts and tests share: the seed, the five inputs (three radiographs and
two extreme-aspect crops), the seeded random checkpoint folders, the prompts XBench sends, the
golden file format, and what XBench's side needs of a model: its class, its tolerances and the
differences of a run's outputs from a golden file. The run itself, and its comparison with a
golden file, are ``run_path.py``'s, which imports this module (never the other way round).

Runs in XBench's environment. The authors' side of a model may need another one (old library
pins), so it reaches these through the command line:

    python tools/parity/common.py weights MODEL FOLDER   # the seeded random checkpoint folder
    python tools/parity/common.py prompts MODEL          # {"classes": [...], "prompts": [...]} as JSON
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

SEED = 0
#: The square NIH PNG (512 px) and the two CheXpert JPEGs of CheXlocalize (2828 x 2320, 2021 x 2022:
#: shorter sides above 1024), relative to the real-data folder; keyed by their file's sha256.
IMAGES = (
    "nih/00000001_000.png",
    "chexlocalize/valid/patient64541/study1/view1_frontal.jpg",
    "chexlocalize/valid/patient64542/study1/view1_frontal.jpg",
)
#: Extreme-aspect inputs: crops of the larger CheXpert JPEG as Pillow decodes it, written losslessly
#: as PNG (``golden_inputs``): name -> (source, (left, top, width, height)). Keyed by name, since a
#: PNG's bytes depend on its encoder; the golden file records the sha256 of their pixels instead.
CROPS = {
    "wide1600x600": (IMAGES[1], (614, 1000, 1600, 600)),
    "tall600x1600": (IMAGES[1], (900, 360, 600, 1600)),
}
#: Every golden input: the radiographs, then the crops.
INPUTS = (*IMAGES, *CROPS)
DATASET = "chexlocalize"
#: The metric frame's side the windows and upsampled maps are stated in.
FRAME = 224
#: Classes whose upsampled map the golden file keeps (positions in the class list): one pins the rule.
UPSAMPLED_CLASSES = (0,)
#: The transformers dual encoders (MedSigLIP, XrayCLIP, XraySigLIP): their published configs with
#: `HF_LAYERS` vision and text blocks and seeded random weights.
HF_MODELS = ("medsiglip", "xray_clip", "xray_siglip")
HF_LAYERS = 1
#: RadZero's parity weights: its published config with this many vision blocks (the two extra blocks as
#: published) and one text block.
RADZERO_VISION_LAYERS = 2
MODELS = ("medklip", "mavl", "kad-224", "kad-512", "carzero", "clip", "biomedclip", "chexzero", "biovil", "biovil_t",
          "gloria", *HF_MODELS, "radzero")


def classes() -> list[str]:
    from xbench.findings import PAPER_CLASSES

    return list(PAPER_CLASSES[DATASET])


def image_key(path: Path) -> str:
    """The first 12 hex digits of the file's sha256: the golden file names its inputs by content."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def pixel_digest(path: Path) -> str:
    """The first 12 hex digits of the sha256 of the image's decoded pixels (Pillow), with its size."""
    from PIL import Image

    with Image.open(path) as image:
        pixels = np.asarray(image)
    return hashlib.sha256(f"{pixels.dtype}{pixels.shape}".encode() + pixels.tobytes()).hexdigest()[:12]


@dataclass(frozen=True)
class GoldenInput:
    """One input of the golden files: ``name`` (a file relative to the real-data folder, or a
    `CROPS` name), ``key`` (its entries' prefix in a golden file), ``path`` (the file read) and,
    for a crop, ``pixels`` (`pixel_digest`)."""

    name: str
    key: str
    path: Path
    pixels: str | None = None

    def record(self) -> dict:
        """Its entry in a golden file's ``meta["images"]``; a crop's says how it was cut and its pixels' digest."""
        if self.name not in CROPS:
            return {"file": self.name, "key": self.key}
        source, box = CROPS[self.name]
        return {"file": self.name, "key": self.key, "crop_of": source, "left_top_width_height": list(box),
                "pixels": self.pixels}


def golden_inputs(root: Path, names: list[str] | tuple[str, ...], scratch: Path) -> list[GoldenInput]:
    """``names`` (`INPUTS` by default) as files: a radiograph is read where it is under
    ``root``; a crop is cut from its source (Pillow's decode) and written as PNG into ``scratch``."""
    from PIL import Image

    found = []
    for name in names:
        if name not in CROPS:
            found.append(GoldenInput(name, image_key(Path(root) / name), Path(root) / name))
            continue
        source, (left, top, width, height) = CROPS[name]
        with Image.open(Path(root) / source) as image:
            crop = image.crop((left, top, left + width, top + height))
        Path(scratch).mkdir(parents=True, exist_ok=True)
        path = Path(scratch) / f"{name}.png"
        crop.save(path, format="PNG")
        found.append(GoldenInput(name, name, path, pixel_digest(path)))
    return found


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
    if model == "chexzero":  # ViT-B/32 at 2 vision blocks and 1 text block, its open_clip config in the folder
        random_weights.register_small_chexzero(folder / CHEXZERO_ARCH)
        return random_weights.write_chexzero(folder, arch=random_weights.SMALL_CHEXZERO, seed=SEED)
    if model in ("biovil", "biovil_t"):
        writer = random_weights.write_biovil if model == "biovil" else random_weights.write_biovil_t
        return writer(folder, seed=SEED)
    if model == "gloria":
        return random_weights.write_gloria(folder, seed=SEED)
    if model in HF_MODELS:
        config, preprocessor = random_weights.published_hf_dual_encoder(model, HF_LAYERS, HF_LAYERS)
        return random_weights.write_hf_dual_encoder(folder, config, preprocessor, seed=SEED)
    if model == "radzero":
        return random_weights.write_radzero(folder, vision_layers=RADZERO_VISION_LAYERS, text_layers=1, seed=SEED)
    raise ValueError(f"unknown model {model!r}; one of {MODELS}")


def prompts(model: str) -> list | dict:
    """The prompts XBench sends for `classes`: MedKLIP's and MAVL's query book (entities, whose
    texts both sides read from the checkpoint folder), KAD's query set, CARZero's and GLoRIA's one
    prompt per class, the (positive, negative) pair per class of the CLIPs and BioViLs."""
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
    if model in ("carzero", "radzero"):  # RadZero evaluates with CARZero's prompt files
        from xbench.models.carzero import prompt_for

        return [prompt_for(key) for key in keys]
    from xbench.findings import finding_text

    if model == "gloria":
        from xbench.models.gloria import TEMPLATE

        return [TEMPLATE.format(finding_text(key)) for key in keys]
    if model in ("clip", "biomedclip", "chexzero", "biovil", "biovil_t"):
        built = xbench_class(model)()
        return [[built.pos_template.format(finding_text(k)), built.neg_template.format(finding_text(k))] for k in keys]
    if model in HF_MODELS:  # a CLIP folder's (positive, negative) pair; a SigLIP's positive prompt alone
        from xbench.models.hf_dual_encoder import CLIP_NEGATIVE
        from xbench.models.random_weights import HF_DUAL_ENCODERS

        pair = HF_DUAL_ENCODERS[model]["config"]["model_type"] == "clip"
        return [[finding_text(k), CLIP_NEGATIVE.format(finding_text(k))][: 2 if pair else 1] for k in keys]
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

#: Where a chexzero weights folder keeps the open_clip config of its small architecture.
CHEXZERO_ARCH = "arch"


@dataclass(frozen=True)
class Tolerance:
    """How far XBench's run may be from a golden file: logits (absolute), raw maps (``map_atol`` plus
    ``map_rtol_of_spread`` times each golden map's spread, max - min: the scale of the normalised map
    the metrics see), windows (frame pixels). The golden's ``upsampled`` map is float16: its rounding
    (`FLOAT16_RTOL` of the value) is allowed on top of the raw maps' allowance."""

    logits: float = 1e-4
    map_atol: float = 0.0
    map_rtol_of_spread: float = 1e-4
    window: float = 1e-3


#: Per model (measured within 2e-6 when each golden file was made; room for another machine's float
#: order and batch size only): the spread rule for the attention maps (~1/196 in absolute terms) and
#: the transformers dual encoders, absolute bounds for the other beyond-the-paper models, whose maps are cosines.
TOLERANCES = {
    **{model: Tolerance()
       for model in ("medklip", "mavl", "kad-224", "kad-512", "carzero", "clip", "biomedclip", *HF_MODELS, "radzero")},
    **{model: Tolerance(logits=1e-5, map_atol=1e-5, map_rtol_of_spread=0.0, window=1e-4)
       for model in ("chexzero", "biovil", "biovil_t", "gloria")},
}
FLOAT16_RTOL = 2.0**-11
#: The (cache, DataLoader workers) settings a run is compared under, each giving the golden numbers:
#: the decoded-image cache read in two workers (a user's default run) and the file decoded in the
#: main process. A run costs the text side and every image's forward (seconds a model on two cores).
SETTINGS = ((True, 2), (False, 0))
#: The models the tests also run under the second setting: one per input transform family (library,
#: resize rule, processor). For the others, the cache-off batch is the cache-on batch bit for bit
#: (``tests/test_cache_exact.py``: every shipped model's transform on these very inputs, workers 0
#: and 2), so their second run could not differ; ``run_path.compare`` runs every model under both.
BOTH_SETTINGS = ("medklip", "carzero", "clip", "chexzero", "biovil", "medsiglip", "radzero")


def settings(model: str) -> tuple[tuple[bool, int], ...]:
    """The settings ``tests/test_parity.py`` runs ``model`` under."""
    return SETTINGS if model in BOTH_SETTINGS else SETTINGS[:1]
#: Images per batch in those runs (more than one: a batch must not change a number).
BATCH_SIZE = 2


def xbench_class(model: str):
    """XBench's model class for ``model``."""
    from xbench.models.biomedclip import BiomedCLIP
    from xbench.models.biovil import BioViL, BioViLT
    from xbench.models.carzero import CARZero
    from xbench.models.chexzero import CheXzero
    from xbench.models.clip import CLIP
    from xbench.models.gloria import GLoRIA
    from xbench.models.hf_dual_encoder import HFDualEncoder
    from xbench.models.kad import KAD
    from xbench.models.mavl import MAVL
    from xbench.models.medklip import MedKLIP
    from xbench.models.radzero import RadZero

    return {"medklip": MedKLIP, "mavl": MAVL, "kad-224": KAD, "kad-512": KAD, "carzero": CARZero, "clip": CLIP,
            "biomedclip": BiomedCLIP, "chexzero": CheXzero, "biovil": BioViL, "biovil_t": BioViLT,
            "gloria": GLoRIA, **dict.fromkeys(HF_MODELS, HFDualEncoder), "radzero": RadZero}[model]


def build_xbench(model: str, folder: Path):
    """XBench's model of ``model`` on the checkpoint folder, as its config builds it, writing no results
    (``trainer.test`` builds its text side for the datamodule's classes)."""
    options = {"checkpoint_dir": str(folder)}
    if model.startswith("kad-"):
        options["variant"] = int(model.removeprefix("kad-"))
    if model == "chexzero" and (Path(folder) / CHEXZERO_ARCH).is_dir():
        from xbench.models import random_weights

        options["arch"] = random_weights.register_small_chexzero(Path(folder) / CHEXZERO_ARCH)
    return xbench_class(model)(**options)


def differences(model: str, found: dict[str, np.ndarray], expected: dict[str, np.ndarray], map_upsample: str
                ) -> dict[str, float]:
    """What XBench's run gave for one image (``found``: logits, raw maps, window) against the image's
    golden entries, each as a share of its tolerance (<= 1: within): the largest logit difference,
    the largest raw-map difference, the largest window difference and, where the golden keeps it,
    the upsampled map (the raw map upsampled onto the model's input by ``map_upsample``, the model's
    rule -- for KAD, whose input is the whole frame, its placement in the frame itself)."""
    from xbench.geometry.maps import place_in_frame

    tolerance = TOLERANCES[model]
    golden_maps = expected["maps"]
    spread = golden_maps.max(axis=(1, 2), keepdims=True) - golden_maps.min(axis=(1, 2), keepdims=True)
    map_allowed = tolerance.map_atol + tolerance.map_rtol_of_spread * spread
    shares = {
        "logits": float(np.abs(found["logits"] - expected["logits"]).max() / tolerance.logits),
        "maps": float((np.abs(found["maps"] - golden_maps) / map_allowed).max()),
        "window": float(np.abs(found["window"] - expected["window"]).max() / tolerance.window),
    }
    if "upsampled" in expected:
        chosen = list(UPSAMPLED_CLASSES)
        whole_input = torch.tensor([[0.0, 0.0, FRAME, FRAME]])
        maps = torch.from_numpy(found["maps"][chosen])[None]
        upsampled = place_in_frame(maps, whole_input, (FRAME, FRAME), map_upsample)[0].numpy()
        reference = expected["upsampled"].astype(np.float32)
        allowed = map_allowed[chosen] + FLOAT16_RTOL * np.abs(reference)
        shares["upsampled"] = float((np.abs(upsampled - reference) / allowed).max())
    return shares


def check_inputs(inputs: list[GoldenInput], golden: Path, meta: dict) -> None:
    """The inputs are those ``golden`` was made from: a file by its sha256, a crop by its pixels."""
    recorded = {record["file"]: record for record in meta["images"]}
    for item in inputs:
        record = recorded.get(item.name)
        if record is None or record["key"] != item.key:
            raise ValueError(f"{item.path} (key {item.key}) is not an input of {golden}: it was made from "
                             f"{[(r['file'], r['key']) for r in meta['images']]}")
        if record.get("pixels") != item.pixels:
            raise ValueError(f"{item.path}: the crop {item.name}'s pixels are not those {golden} was made from "
                             "(another JPEG decoder?)")


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
    parser.add_argument("--images", nargs="+", default=list(INPUTS),
                        help="radiographs under --real-data or CROPS names (default: INPUTS)")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "golden")
    parser.add_argument("--xbench-python", type=Path, default=REPO / ".venv" / "bin" / "python",
                        help="the Python of XBench's environment (writes the random weights, states the prompts)")
    return parser


def weights_source(model: str, given: Path | None) -> str:
    """What the golden's weights were, for its ``meta``."""
    return str(given) if given is not None else f"tools/parity/common.py weights {model} (seed {SEED})"


def git_commit(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


