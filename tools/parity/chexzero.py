"""Golden outputs of CheXzero from its authors' own code (``rajpurkarlab/CheXzero``).

Development only; the authors' code is imported from ``--authors-repo`` (as fetched), never copied.
Their whole inference path runs: ``data_process.img_to_hdf5`` (cv2 read, letterbox to 320 with
PIL's Lanczos), ``zero_shot.make`` (their Dataset, ``Normalize`` and bicubic ``Resize`` to 224),
``zero_shot.run_single_prediction`` for the ``"{}"`` and ``"no {}"`` prompts (``clip.tokenize``,
``zeroshot_classifier``, ``predict``); the log-odds of ``run_softmax_eval``'s 2-way softmax are the
difference of the two. What is adapted to run today, each without changing a computed value:

- ``zero_shot.load_clip`` would fetch OpenAI's ViT-B/32 through ``clip.load`` (network) only to
  overwrite every tensor; the model is built from the file by their ``model.build_model`` instead
  (what ``clip.load`` calls), made float32 as ``clip.load`` does on CPU, then the file loaded.
- ``Resize`` is given ``antialias=False``: the torchvision they pin (0.11.3) did not antialias
  tensors; today's default does.
- ``PIL.Image.ANTIALIAS`` (removed in Pillow 10) is set to ``Image.LANCZOS``, the filter it named;
  ``tqdm.notebook`` is replaced by plain tqdm (display only).

The authors take no map: the map is XBench's patch-text similarity (``xbench/models/clip.py``),
computed from the authors' network: the last block's tokens (hooked) through their ``ln_post``
and ``proj``, cosine against their normalised ``"{}"`` text embedding.

    PYTHONPATH=$PWD /work/venvs/newmodels/bin/python tools/parity/chexzero.py \\
        --authors-repo /work/ext/CheXzero --real-data /work/shared/data/real --out tests/golden

``--manifest PATH`` also writes the strict key manifest of the published files: the state dict of
the authors' ``CLIP`` class built at ViT-B/32 (as ``clip.load("ViT-B/32")`` builds it).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import PIL
import torch
import torch.nn.functional as F
import torchvision
import tqdm
from PIL import Image

from xbench.findings import PAPER_CLASSES, finding_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATASET, FRAME, INPUTS, SEED, golden_inputs, prompts, save_golden  # noqa: E402
from xbench.models import random_weights

LETTERBOX = 320
TEMPLATES = ("{}", "no {}")


def letterbox_window(path: Path) -> np.ndarray:
    """(top, left, height, width) in the metric frame of the authors' 320 letterbox
    (``data_process.preprocess``: both sides times 320 / longer side, truncated; pasted at the
    floor of half the margin)."""
    width, height = Image.open(path).size
    ratio = float(LETTERBOX) / max(width, height)
    new_width, new_height = int(width * ratio), int(height * ratio)
    top, left = (LETTERBOX - new_height) // 2, (LETTERBOX - new_width) // 2
    return np.array(
        [-top * FRAME / new_height, -left * FRAME / new_width, LETTERBOX * FRAME / new_height,
         LETTERBOX * FRAME / new_width], dtype=np.float32,
    )


def import_authors(repo: Path):
    sys.path.insert(0, str(repo))
    if not hasattr(Image, "ANTIALIAS"):
        Image.ANTIALIAS = Image.LANCZOS
    import data_process
    import model as authors_model
    import zero_shot

    def load_clip(model_path, pretrained=False, context_length=77):
        state = torch.load(model_path, map_location="cpu", weights_only=True)
        network = authors_model.build_model(state).float()
        network.load_state_dict(state)
        return network.eval()

    zero_shot.load_clip = load_clip
    zero_shot.Resize = functools.partial(torchvision.transforms.Resize, antialias=False)
    zero_shot.tqdm = tqdm.tqdm
    return data_process, zero_shot, authors_model


def write_manifest(authors_model, path: Path) -> None:
    """``{key: shape}`` of the authors' ViT-B/32 CLIP (OpenAI's published hyper-parameters)."""
    network = authors_model.CLIP(
        embed_dim=512, image_resolution=224, vision_layers=12, vision_width=768, vision_patch_size=32,
        context_length=77, vocab_size=49408, transformer_width=512, transformer_heads=8, transformer_layers=12,
    )
    shapes = {key: list(value.shape) for key, value in network.state_dict().items()}
    path.write_text(json.dumps(shapes, indent=1) + "\n")


@torch.no_grad()
def patch_tokens(network, images: torch.Tensor) -> torch.Tensor:
    """The authors' ViT's patch tokens [B, 49, D] through their ``ln_post`` and ``proj``; checks
    that the class token so taken is their ``encode_image``."""
    captured = {}
    handle = network.visual.transformer.register_forward_hook(lambda m, i, o: captured.update(tokens=o))
    pooled = network.encode_image(images)
    handle.remove()
    tokens = network.visual.ln_post(captured["tokens"].permute(1, 0, 2)) @ network.visual.proj
    if not torch.allclose(tokens[:, 0], pooled, atol=1e-6):
        raise RuntimeError("the hooked class token is not encode_image's: the authors' VisualTransformer changed")
    return tokens[:, 1:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors-repo", type=Path, required=True)
    parser.add_argument("--real-data", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--images", nargs="+", default=list(INPUTS),
                        help="radiographs under --real-data or CROPS names (default: INPUTS)")
    parser.add_argument("--checkpoint-dir", type=Path, help="real weights (the authors' .pt); default: seeded random")
    parser.add_argument("--manifest", type=Path, help="also write the key manifest here")
    args = parser.parse_args(argv)
    data_process, zero_shot, authors_model = import_authors(args.authors_repo)
    if args.manifest is not None:
        write_manifest(authors_model, args.manifest)
    scratch = Path(tempfile.mkdtemp())
    if args.checkpoint_dir is None:
        arch = random_weights.register_small_chexzero(scratch / "arch")
        folder = random_weights.write_chexzero(scratch / "weights", arch=arch, seed=SEED)
    else:
        arch, folder = "ViT-B-32-quickgelu", args.checkpoint_dir
    weights = folder / random_weights.CHEXZERO_FILE
    inputs = golden_inputs(args.real_data, args.images, scratch / "inputs")
    paths = [item.path for item in inputs]
    h5 = scratch / "cxr.h5"
    data_process.img_to_hdf5(paths, h5, resolution=LETTERBOX)
    network, loader = zero_shot.make(model_path=str(weights), cxr_filepath=str(h5))
    classes = list(PAPER_CLASSES[DATASET])
    labels = [finding_text(key) for key in classes]
    positive, negative = (
        zero_shot.run_single_prediction(labels, template, network, loader) for template in TEMPLATES
    )
    logits = positive.astype(np.float64) - negative.astype(np.float64)
    images = torch.cat([batch["img"] for batch in loader])
    text = zero_shot.zeroshot_classifier(labels, [TEMPLATES[0]], network)  # [D, C], normalised
    cosine = F.normalize(patch_tokens(network, images), dim=-1) @ text
    grid = int(round(cosine.shape[1] ** 0.5))
    maps = cosine.permute(0, 2, 1).reshape(len(paths), len(classes), grid, grid)
    per_image = {}
    for index, (item, path) in enumerate(zip(inputs, paths)):
        per_image[item.key] = {"logits": logits[index].astype(np.float32), "maps": maps[index].numpy().astype(np.float32),
                          "window": letterbox_window(path)}
    commit = subprocess.run(
        ["git", "-C", str(args.authors_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    meta = {
        "model": "chexzero",
        "authors_repo": "rajpurkarlab/CheXzero",
        "commit": commit,
        "weights": "seeded random" if args.checkpoint_dir is None else str(weights),
        "seed": SEED,
        "arch": random_weights.SMALL_CHEXZERO_CONFIG if args.checkpoint_dir is None else arch,
        "dataset": DATASET,
        "templates": TEMPLATES,
        "prompts": prompts("chexzero"),
        "images": [item.record() for item in inputs],
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__,
                     "numpy": np.__version__},
        "adaptations": "load_clip builds from the file (no clip.load download); Resize(antialias=False) as in "
                       "torchvision 0.11.3; Image.ANTIALIAS = LANCZOS; plain tqdm",
        "map": "XBench's patch-text similarity on the authors' network (the authors take no map)",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    save_golden(args.out / "chexzero.npz", per_image, classes, meta)
    print(f"wrote {args.out / 'chexzero.npz'}: logits {logits.round(5).tolist()}")


if __name__ == "__main__":
    main()
