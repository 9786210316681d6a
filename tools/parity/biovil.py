"""Golden outputs of BioViL from its authors' own code (``microsoft/hi-ml``, ``hi-ml-multimodal``).

Development only; the authors' package is imported from ``--authors-repo`` (as fetched), never
copied. Their whole inference path runs: ``ImageModel`` (ResNet-50 + projector) loading the image
file as ``get_biovil_image_encoder`` does, ``create_chest_xray_transform_for_inference(512, 480)``
as ``get_image_inference`` builds it, ``ImageInferenceEngine`` (``load_image``: their stretch to
8 bits), ``CXRBertTokenizer``/``CXRBertModel.from_pretrained`` on the local folder as
``get_cxr_bert`` does, ``TextInferenceEngine`` and ``ImageTextInferenceEngine``:

- score: ``get_similarity_score_from_raw_data(image, "{}") - get_similarity_score_from_raw_data(image, "no {}")``
  (the authors' library has no classification prompts; XBench's pair, the authors' cosine);
- map: ``get_projected_patch_embeddings`` and ``get_embeddings_from_prompt("{}")`` through
  ``_get_similarity_map_from_embeddings`` (cosine, Gaussian sigma 1.5), on the 15x15 grid.

Adapted to run today, without changing a value: the files are read from a local folder
(``get_biovil_image_encoder`` and ``get_cxr_bert`` fetch the same files from the Hugging Face Hub),
and the tokenizer's ``batch_encode_plus`` (removed in transformers 5) is its call on the list,
which it was.

    PYTHONPATH=$PWD /work/venvs/newmodels/bin/python tools/parity/biovil.py \\
        --authors-repo /work/ext/hi-ml --real-data /work/shared/data/real --out tests/golden

``--variant biovil_t``: BioViL-T on single images, as ``get_image_inference(BIOVIL_T)`` builds it
(``ImageModel`` with the multi-image ResNet-50 encoder, the 448 crop), its random weights from
``random_weights.write_biovil_t``.

``--manifest PATH`` also writes the strict key manifest of the variant's published files: the
state dicts of the authors' ``ImageModel`` (ResNet-50 or its multi-image encoder, 128) and
``CXRBertModel`` at CXR-BERT's published shape (BERT-base, vocabulary 30522, projection 128).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image

from xbench.findings import PAPER_CLASSES, finding_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATASET, FRAME, INPUTS, SEED, golden_inputs, prompts, save_golden  # noqa: E402

#: Per variant: the image model's file, the authors' encoder type, the centre crop.
VARIANTS = {
    "biovil": ("biovil_image_resnet50_proj_size_128.pt", "resnet50", 480),
    "biovil_t": ("biovil_t_image_model_proj_size_128.pt", "resnet50_multi_image", 448),
}

RESIZE = 512
TEMPLATES = ("{}", "no {}")


def crop_window(path: Path, crop: int) -> np.ndarray:
    """(top, left, height, width) in the metric frame of the 480 centre crop of torchvision's
    ``Resize(512)`` (shorter side 512, the longer ``int(512 * long / short)``) and ``CenterCrop(crop)``."""
    width, height = Image.open(path).size
    short, long = min(width, height), max(width, height)
    resized = (int(RESIZE * long / short), RESIZE) if height > width else (RESIZE, int(RESIZE * long / short))
    rows, columns = resized
    top, left = int(round((rows - crop) / 2.0)), int(round((columns - crop) / 2.0))
    return np.array(
        [top * FRAME / rows, left * FRAME / columns, crop * FRAME / rows, crop * FRAME / columns], dtype=np.float32
    )


def write_manifest(variant: str, path: Path) -> None:
    from health_multimodal.image.model.model import ImageModel
    from health_multimodal.text.model import CXRBertConfig, CXRBertModel

    image_file, encoder_type, _ = VARIANTS[variant]
    image = ImageModel(img_encoder_type=encoder_type, joint_feature_size=128)
    text = CXRBertModel(CXRBertConfig(vocab_size=30522, projection_size=128))
    shapes = {
        image_file: {key: list(value.shape) for key, value in image.state_dict().items()},
        "pytorch_model.bin": {key: list(value.shape) for key, value in text.state_dict().items()},
    }
    path.write_text(json.dumps(shapes, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors-repo", type=Path, required=True)
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="biovil")
    parser.add_argument("--real-data", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--images", nargs="+", default=list(INPUTS),
                        help="radiographs under --real-data or CROPS names (default: INPUTS)")
    parser.add_argument("--checkpoint-dir", type=Path, help="real weights; default: seeded random")
    parser.add_argument("--manifest", type=Path, help="also write the key manifest here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.authors_repo / "hi-ml-multimodal" / "src"))
    from health_multimodal.image import ImageInferenceEngine
    from health_multimodal.image.data.transforms import create_chest_xray_transform_for_inference
    from health_multimodal.image.model.model import ImageModel
    from health_multimodal.text import TextInferenceEngine
    from health_multimodal.text.model import CXRBertModel, CXRBertTokenizer
    from health_multimodal.vlp import ImageTextInferenceEngine

    if not hasattr(CXRBertTokenizer, "batch_encode_plus"):
        CXRBertTokenizer.batch_encode_plus = lambda self, batch_text_or_text_pairs, **kwargs: self(
            batch_text_or_text_pairs, **kwargs
        )
    if args.manifest is not None:
        write_manifest(args.variant, args.manifest)
    from xbench.models import random_weights  # after the manifest: BioViL-T's layout reads it

    image_file, encoder_type, crop = VARIANTS[args.variant]
    writer = random_weights.write_biovil if args.variant == "biovil" else random_weights.write_biovil_t
    folder = args.checkpoint_dir or writer(Path(tempfile.mkdtemp()) / "weights", seed=SEED)
    image_model = ImageModel(
        img_encoder_type=encoder_type, joint_feature_size=128, pretrained_model_path=folder / image_file
    )
    transform = create_chest_xray_transform_for_inference(resize=RESIZE, center_crop_size=crop)
    image_engine = ImageInferenceEngine(image_model=image_model, transform=transform)
    text_engine = TextInferenceEngine(
        tokenizer=CXRBertTokenizer.from_pretrained(str(folder)), text_model=CXRBertModel.from_pretrained(str(folder))
    )
    engine = ImageTextInferenceEngine(image_inference_engine=image_engine, text_inference_engine=text_engine)
    classes = list(PAPER_CLASSES[DATASET])
    positive = [TEMPLATES[0].format(finding_text(key)) for key in classes]
    negative = [TEMPLATES[1].format(finding_text(key)) for key in classes]
    inputs = golden_inputs(args.real_data, args.images, Path(tempfile.mkdtemp(prefix="golden-inputs-")))
    per_image = {}
    for item in inputs:
        key, path = item.key, item.path
        logits = [
            engine.get_similarity_score_from_raw_data(path, pos) - engine.get_similarity_score_from_raw_data(path, neg)
            for pos, neg in zip(positive, negative)
        ]
        patches, _ = image_engine.get_projected_patch_embeddings(path)
        maps = [
            engine._get_similarity_map_from_embeddings(patches, text_engine.get_embeddings_from_prompt(prompt))
            for prompt in positive
        ]
        per_image[key] = {"logits": np.array(logits, dtype=np.float32),
                          "maps": torch.stack(maps).numpy().astype(np.float32), "window": crop_window(path, crop)}
    commit = subprocess.run(
        ["git", "-C", str(args.authors_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    meta = {
        "model": args.variant,
        "authors_repo": "microsoft/hi-ml (hi-ml-multimodal)",
        "commit": commit,
        "weights": "seeded random" if args.checkpoint_dir is None else str(folder),
        "seed": SEED,
        "text": "1-layer BERT, hidden 64, letter vocabulary (random_weights.write_biovil)",
        "dataset": DATASET,
        "templates": TEMPLATES,
        "prompts": prompts(args.variant),
        "images": [item.record() for item in inputs],
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__},
        "map": "the authors' smoothed patch-text cosine (_get_similarity_map_from_embeddings) on the 15x15 grid",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    save_golden(args.out / f"{args.variant}.npz", per_image, classes, meta)
    print(f"wrote {args.out / args.variant}.npz")


if __name__ == "__main__":
    main()
