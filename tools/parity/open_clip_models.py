"""Golden outputs of CLIP and BiomedCLIP from open_clip itself, their authors' code.

Development only. Runs in XBench's environment (open_clip is a dependency). The whole path is
open_clip's: ``create_model_and_transforms`` from the checkpoint folder (random weights unless
``--checkpoint-dir``), its ``preprocess`` on the PIL image (shorter side to 224, bicubic; centre
crop; RGB; OpenAI statistics), its tokenizer and ``encode_text``/``encode_image``. The score is
XBench's log-odds of each finding's prompt pair, ``exp(logit_scale) * (cos(image, pos) -
cos(image, neg))``. open_clip has no saliency map: the map is the spec's patch-text similarity,
taken through open_clip's ``forward_intermediates`` (last block, final norm), projected as the
pooled token is, against the positive prompt; it is upsampled bilinearly (``align_corners=False``)
onto the 224 crop, the rule the specs give.

    python tools/parity/open_clip_models.py --model clip --out tests/golden/
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import open_clip
import PIL
import timm
import torch
import torch.nn.functional as F
import transformers
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def load(model_name: str, folder: Path):
    """The model, its preprocess and its tokenizer, as open_clip builds them from local files."""
    if model_name == "clip":
        weights = next(folder / name for name in ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
                       if (folder / name).is_file())
        model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-16-quickgelu", pretrained=str(weights))
        tokenizer = open_clip.get_tokenizer("ViT-B-16-quickgelu")
        return model, preprocess, tokenizer, lambda tokens: tokens @ model.visual.proj
    # The official config names BiomedBERT's hub repository; offline, the text tower is pointed at the folder
    # (specs/models/biomedclip.md section 1), and transformers must not look for BERT weights there.
    text_cfg = json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]["text_cfg"]
    text_cfg = {**text_cfg, "hf_model_name": str(folder), "hf_tokenizer_name": str(folder),
                "hf_model_pretrained": False}
    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{folder}", text_cfg=text_cfg)
    return model, preprocess, open_clip.get_tokenizer(f"local-dir:{folder}"), model.visual.head


def window(path: Path) -> np.ndarray:
    """(top, left, height, width) of the 224 crop in the metric frame: torchvision's Resize(224)
    (shorter side to 224, the longer truncated to an int) and CenterCrop offset."""
    width, height = Image.open(path).size
    short, long = min(height, width), max(height, width)
    resized_long = int(224 * long / short)
    offset = int(round((resized_long - 224) / 2.0))
    scale = common.FRAME / resized_long
    along_long = (offset * scale, 224 * scale)
    whole = (0.0, float(common.FRAME))
    rows, columns = (along_long, whole) if height > width else (whole, along_long)
    return np.array([rows[0], columns[0], rows[1], columns[1]], dtype=np.float32)


def main() -> None:
    parser = common.parity_arguments(__doc__.splitlines()[0], authors_repo=False)
    parser.add_argument("--model", choices=("clip", "biomedclip"), required=True)
    args = parser.parse_args()
    sent = json.loads(common.xbench_command(args.xbench_python, "prompts", args.model))
    positive, negative = (list(side) for side in zip(*sent["prompts"]))
    with tempfile.TemporaryDirectory() as scratch:
        folder = common.checkpoint_folder(args.model, args.checkpoint_dir, args.xbench_python, Path(scratch))
        model, preprocess, tokenizer, project = load(args.model, folder.resolve())
        model.eval()
        with torch.no_grad():
            pos_tokens, neg_tokens = tokenizer(positive), tokenizer(negative)
            pos = F.normalize(model.encode_text(pos_tokens), dim=-1)
            neg = F.normalize(model.encode_text(neg_tokens), dim=-1)
            per_image = {}
            inputs = common.golden_inputs(args.real_data, args.images, Path(scratch) / "inputs")
            for item in inputs:
                x = preprocess(Image.open(item.path))[None]
                image = F.normalize(model.encode_image(x), dim=-1)
                logits = model.logit_scale.exp() * (image @ pos.T - image @ neg.T)
                grid = model.visual.forward_intermediates(x, indices=1, normalize_intermediates=True,
                                                          intermediates_only=True)["image_intermediates"][-1]
                patches = F.normalize(project(grid.flatten(2).transpose(1, 2)), dim=-1)  # [1, h*w, D]
                maps = (patches @ pos.T).transpose(1, 2).unflatten(-1, grid.shape[-2:])  # [1, C, h, w]
                upsampled = F.interpolate(maps[:, list(common.UPSAMPLED_CLASSES)], size=(224, 224), mode="bilinear",
                                          align_corners=False)
                per_image[item.key] = {
                    "logits": logits[0].numpy().astype(np.float32),
                    "maps": maps[0].numpy().astype(np.float32),
                    "window": window(item.path),
                    "upsampled": upsampled[0].numpy().astype(np.float16),
                }
        text_config = (json.loads((folder / "config.json").read_text()) if args.model == "biomedclip"
                       else open_clip.get_model_config("ViT-B-16-quickgelu")["text_cfg"])
    meta = {
        "model": args.model,
        "authors_repo": "mlfoundations/open_clip (installed package)",
        "authors_commit": f"open_clip_torch {open_clip.__version__}",
        "authors_path": "create_model_and_transforms, its preprocess, get_tokenizer, encode_text/encode_image, "
                        "visual.forward_intermediates",
        "weights": common.weights_source(args.model, args.checkpoint_dir),
        "seed": common.SEED,
        "text_encoder_config": text_config,
        "prompts": sent["prompts"],
        "token_ids": {"positive": pos_tokens.tolist(), "negative": neg_tokens.tolist()},
        "images": [item.record() for item in inputs],
        "versions": {"torch": torch.__version__, "open_clip": open_clip.__version__, "timm": timm.__version__,
                     "transformers": transformers.__version__, "pillow": PIL.__version__},
        "preprocess": str(preprocess),
        "upsampled": f"bilinear, align_corners=False, onto the 224 crop, classes {list(common.UPSAMPLED_CLASSES)} "
                     "(open_clip defines no map; the specs' rule)",
        "window": "the 224 centre crop of the shorter-side resize, in metric-frame pixels "
                  "(frame 224 = the whole image squashed)",
        "tolerance": "open_clip resizes the 8-bit PIL image (bicubic, Pillow's antialiasing) and rounds to 8 bits",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    common.save_golden(common.golden_path(args.out, args.model), per_image, sent["classes"], meta)


if __name__ == "__main__":
    main()
