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

The inputs are every model's (``common.INPUTS``: three radiographs and two extreme-aspect crops);
the weights ``common.write_weights`` writes: the published config with ``common.HF_LAYERS`` vision
and text blocks and seeded random weights.

    python tools/parity/hf_dual_encoder.py --model medsiglip --out tests/golden/
"""

from __future__ import annotations

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

def window(path: Path, processor) -> np.ndarray:
    """(top, left, height, width) of the processor's input in the metric frame: the whole frame after a
    squash; after a shorter-side resize (the longer side truncated, as transformers does) the centre
    crop, at the floor of half the margin, on each side: a crop smaller than the resize cuts the
    shorter side too."""
    width, height = Image.open(path).size
    size = processor.size
    if getattr(size, "shortest_edge", None) is None:
        return np.array([0.0, 0.0, common.FRAME, common.FRAME], dtype=np.float32)
    side, crop = size.shortest_edge, processor.crop_size.height
    long = int(side * max(height, width) / min(height, width))
    resized_rows, resized_columns = (long, side) if height > width else (side, long)
    top, left = (resized_rows - crop) // 2, (resized_columns - crop) // 2
    return np.array([top * common.FRAME / resized_rows, left * common.FRAME / resized_columns,
                     crop * common.FRAME / resized_rows, crop * common.FRAME / resized_columns], dtype=np.float32)


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
    parser.add_argument("--model", choices=common.HF_MODELS, required=True)
    args = parser.parse_args()
    texts = common.prompts(args.model)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.checkpoint_dir or common.write_weights(args.model, Path(scratch) / "weights")
        processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True).float().eval()
        inputs = common.golden_inputs(args.real_data, args.images, Path(scratch) / "inputs")
        with torch.no_grad():
            per_image = {item.key: run(model, processor, texts, item.path) for item in inputs}
            mask_effect = attention_mask_effect(model, processor, texts)
        config = json.loads((Path(folder) / "config.json").read_text())
    meta = {
        "model": args.model,
        "authors_repo": "huggingface/transformers (installed package)",
        "authors_commit": f"transformers {transformers.__version__}",
        "authors_path": "AutoProcessor, AutoModel (CLIPModel/SiglipModel) forward's logits_per_image and "
                        "text_embeds; vision_model, post_layernorm + visual_projection (CLIP) or head (SigLIP)",
        "weights": common.weights_source(args.model, args.checkpoint_dir),
        "seed": common.SEED,
        "config": config,
        "image_processor": str(processor.image_processor.to_dict()),
        "image_processor_class": type(processor.image_processor).__name__,
        "prompts": texts,
        "images": [item.record() for item in inputs],
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
