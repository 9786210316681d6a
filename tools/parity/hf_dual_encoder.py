"""Golden outputs of the transformers dual encoders (MedSigLIP, XrayCLIP, XraySigLIP) from transformers itself.

Development only. Runs in XBench's environment: transformers is these models' authors' code (the
checkpoints are published as its folders) and a dependency of XBench. For each model the folder is
written from the published checkpoint's ``config.json`` and ``preprocessor_config.json``
(``random_weights.HF_DUAL_ENCODERS``) with 1 vision block and 1 text block and seeded random weights
(``random_weights.write_hf_dual_encoder``), unless ``--checkpoint-dir`` names real ones. Then, all
transformers' own: ``AutoProcessor`` and ``AutoModel`` from the folder; the processor on each PIL image
and on the prompts (CLIP: ``padding=True``; SigLIP: ``padding="max_length"``, and the model gets the
``input_ids`` alone, as SigLIP was trained and Google's serving feeds it); the model's forward, whose
``logits_per_image`` give the score (CLIP: the positive minus the negative prompt's, the log-odds of
the pair's softmax; SigLIP: the positive prompt's own logit, bias included).

transformers defines no map; the map is XBench's rule (docs/models/hf_dual_encoder.md), computed here
from transformers' modules: CLIP, the vision tower's last hidden state through its ``post_layernorm``
and ``visual_projection``, patch tokens only; SigLIP, each patch token of the last hidden state put
through the model's own attention-pooling head alone (the head called on that one token, so its probe
attends to nothing else). Cosine with the positive prompt's ``text_embeds``; ``upsampled`` is bilinear
(``align_corners=False``) onto the input.

The inputs: the three radiographs of ``common.IMAGES`` and two extreme-aspect crops of the larger
CheXpert JPEG (:data:`CROPS`, cut by Pillow and written as PNG; named, and their pixels' digest
recorded, since a PNG's bytes depend on its encoder).

    python tools/parity/hf_dual_encoder.py --model medsiglip --out tests/golden/
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import PIL
import torch
import torch.nn.functional as F
import torchvision
import transformers
from PIL import Image
from transformers import AutoModel, AutoProcessor

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

MODELS = ("medsiglip", "xray_clip", "xray_siglip")
#: Extreme-aspect crops of the 2828 x 2320 CheXpert JPEG: name -> (source, (left, top, width, height)).
CROPS = {
    "wide1600x600": (common.IMAGES[1], (614, 1000, 1600, 600)),
    "tall600x1600": (common.IMAGES[1], (900, 360, 600, 1600)),
}
VISION_LAYERS, TEXT_LAYERS = 1, 1


def pixel_digest(path: Path) -> str:
    """The first 12 hex digits of the sha256 of the image's decoded pixels (Pillow), with their shape."""
    with Image.open(path) as image:
        pixels = np.asarray(image)
    return hashlib.sha256(f"{pixels.dtype}{pixels.shape}".encode() + pixels.tobytes()).hexdigest()[:12]


def write_crop(root: Path, name: str, folder: Path) -> Path:
    """The crop ``name`` of :data:`CROPS`, cut from its source as Pillow decodes it, as a PNG in ``folder``."""
    source, (left, top, width, height) = CROPS[name]
    folder.mkdir(parents=True, exist_ok=True)
    with Image.open(root / source) as image:
        image.crop((left, top, left + width, top + height)).save(folder / f"{name}.png", format="PNG")
    return folder / f"{name}.png"


def prompts(model_type: str) -> list[list[str]]:
    """XBench's prompts per class: the (positive, negative) pair of a CLIP, the positive alone of a SigLIP."""
    from xbench.findings import finding_text
    from xbench.models.hf_dual_encoder import CLIP_NEGATIVE

    return [[finding_text(key), CLIP_NEGATIVE.format(finding_text(key))][: 2 if model_type == "clip" else 1]
            for key in common.classes()]


def window(path: Path, processor) -> np.ndarray:
    """(top, left, height, width) of the processor's input in the metric frame: the whole frame after a
    squash; after a shorter-side resize (the longer side truncated, as transformers does) the centre
    crop at the floor of half the margin."""
    width, height = Image.open(path).size
    size = processor.size
    if getattr(size, "shortest_edge", None) is None:
        return np.array([0.0, 0.0, common.FRAME, common.FRAME], dtype=np.float32)
    side, crop = size.shortest_edge, processor.crop_size.height
    long = int(side * max(height, width) / min(height, width))
    offset = (long - crop) // 2
    scale = common.FRAME / long
    along_long, whole = (offset * scale, crop * scale), (0.0, float(common.FRAME))
    rows, columns = (along_long, whole) if height > width else (whole, along_long)
    return np.array([rows[0], columns[0], rows[1], columns[1]], dtype=np.float32)


def patch_embeddings(model, pixel_values: torch.Tensor) -> torch.Tensor:
    """[1, h*w, D]: the patch tokens of the last block taken to the joint space (module docstring)."""
    vision = model.vision_model
    hidden = vision(pixel_values=pixel_values).last_hidden_state
    if model.config.model_type == "clip":
        return model.visual_projection(vision.post_layernorm(hidden))[:, 1:]
    batch, tokens, width = hidden.shape
    return vision.head(hidden.reshape(batch * tokens, 1, width)).reshape(batch, tokens, width)


def run(model, processor, texts: list[list[str]], path: Path) -> dict[str, np.ndarray]:
    model_type = model.config.model_type
    flat = [text for pair in texts for text in pair]
    if model_type == "clip":
        inputs = processor(text=flat, images=Image.open(path), padding=True, return_tensors="pt")
        output = model(**inputs)
        per_text = output.logits_per_image[0].view(len(texts), 2)
        logits = per_text[:, 0] - per_text[:, 1]
        positive = output.text_embeds.view(len(texts), 2, -1)[:, 0]
    else:
        inputs = processor(text=flat, images=Image.open(path), padding="max_length", return_tensors="pt")
        output = model(input_ids=inputs["input_ids"], pixel_values=inputs["pixel_values"])
        logits, positive = output.logits_per_image[0], output.text_embeds
    patches = F.normalize(patch_embeddings(model, inputs["pixel_values"]), dim=-1)
    side = model.config.vision_config.image_size // model.config.vision_config.patch_size
    maps = (patches @ positive.T).transpose(1, 2).unflatten(-1, (side, side))
    upsampled = F.interpolate(maps[:, list(common.UPSAMPLED_CLASSES)], size=(common.FRAME, common.FRAME),
                              mode="bilinear", align_corners=False)
    return {"logits": logits.numpy().astype(np.float32), "maps": maps[0].numpy().astype(np.float32),
            "window": window(path, processor.image_processor), "upsampled": upsampled[0].numpy().astype(np.float16)}


def attention_mask_effect(model, processor, texts: list[list[str]]) -> float | None:
    """SigLIP: the largest change of a normalised text embedding when the processor's attention mask
    (which transformers 5's tokenizer returns) is passed too: what following the mask would change."""
    if model.config.model_type != "siglip":
        return None
    inputs = processor(text=[pair[0] for pair in texts], padding="max_length", return_tensors="pt")
    plain = F.normalize(model.get_text_features(input_ids=inputs["input_ids"]).pooler_output, dim=-1)
    masked = F.normalize(model.get_text_features(**inputs).pooler_output, dim=-1)
    return float((plain - masked).abs().max())


def main() -> None:
    parser = common.parity_arguments(__doc__.splitlines()[0], authors_repo=False)
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--crops", nargs="*", default=list(CROPS), help="crops of CROPS to add (default: both)")
    args = parser.parse_args()
    from xbench.models import random_weights

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.checkpoint_dir
        if folder is None:
            config, preprocessor = random_weights.published_hf_dual_encoder(args.model, VISION_LAYERS, TEXT_LAYERS)
            folder = random_weights.write_hf_dual_encoder(Path(scratch) / "weights", config, preprocessor,
                                                          seed=common.SEED)
        processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True).float().eval()
        texts = prompts(model.config.model_type)
        inputs = {record["key"]: args.real_data / record["file"]
                  for record in common.image_records(args.real_data, args.images)}
        crops = {name: write_crop(args.real_data, name, Path(scratch) / "crops") for name in args.crops}
        with torch.no_grad():
            per_image = {key: run(model, processor, texts, path) for key, path in {**inputs, **crops}.items()}
            mask_effect = attention_mask_effect(model, processor, texts)
        config = json.loads((Path(folder) / "config.json").read_text())
        crop_records = {name: {"crop_of": CROPS[name][0], "left_top_width_height": list(CROPS[name][1]),
                               "pixels": pixel_digest(path)} for name, path in crops.items()}
    meta = {
        "model": args.model,
        "authors_repo": "huggingface/transformers (installed package)",
        "authors_commit": f"transformers {transformers.__version__}",
        "authors_path": "AutoProcessor, AutoModel (CLIPModel/SiglipModel) forward's logits_per_image and "
                        "text_embeds; vision_model, post_layernorm + visual_projection (CLIP) or head (SigLIP)",
        "weights": common.weights_source(args.model, args.checkpoint_dir)
        if args.checkpoint_dir else f"random_weights.write_hf_dual_encoder of the published config with "
                                    f"{VISION_LAYERS} vision and {TEXT_LAYERS} text blocks (seed {common.SEED})",
        "seed": common.SEED,
        "config": config,
        "image_processor": str(processor.image_processor.to_dict()),
        "image_processor_class": type(processor.image_processor).__name__,
        "prompts": texts,
        "images": {key: str(path.relative_to(args.real_data)) for key, path in inputs.items()},
        "crops": crop_records,
        "siglip_attention_mask_effect": mask_effect,
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                     "transformers": transformers.__version__, "pillow": PIL.__version__},
        "upsampled": f"bilinear, align_corners=False, onto the input, classes {list(common.UPSAMPLED_CLASSES)}",
        "window": "the input's window in the 224 metric frame: the whole frame after a squash; the floored "
                  "centre crop of the shorter-side resize",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    common.save_golden(common.golden_path(args.out, args.model), per_image, common.classes(), meta)


if __name__ == "__main__":
    main()
