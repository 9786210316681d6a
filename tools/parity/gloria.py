"""Golden outputs of GLoRIA from its authors' own code (``marshuang80/gloria``).

Development only; the authors' package is imported from ``--authors-repo`` (a checkout of the
fetched repository), never copied. Their whole zero-shot path runs: the model built by
``builder.build_gloria_model`` from the file's ``hyper_parameters`` and loaded as ``load_gloria``
does (``gloria.`` cut from every key, strict); ``process_img`` (``cv2.imread``, ``_resize_img`` to
256, their test transform); ``process_class_prompts``/``process_text`` on one prompt per class;
``get_similarities(..., "both")``, whose ``(global + local) / 2`` is the logit; and
``zero_shot_classification`` on the same prompts, checked to be those logits standardised over the
images (so XBench's logit is theirs before a per-class standardisation that keeps the ranking).

The map: the word-region attention that ``get_local_similarities`` computes and discards, captured
from their ``attention_fn`` during that very call, the maximum over the prompt's words (the words
of their text tower's ``sents``, between ``[CLS]`` and ``[SEP]``): XBench's default map. And the
figure map (``--model.attention_map figure``): their ``get_attn_maps`` on each image with each
prompt (the training path's ``local_loss``, whose word slots are ``[CLS]`` and the words), the
maximum over those slots, as ``build_attention_images`` takes it for the first panel of their figures.

Adapted to run today, each without changing a computed value:

- ``AutoModel.from_pretrained(bert_type)`` would fetch Bio_ClinicalBERT's weights only for the
  checkpoint to overwrite every tensor; the BERT is built from the local folder's ``config.json``
  (``bert_type`` is that folder, which also gives the tokenizer), and ResNet-50's ImageNet weights
  are not downloaded (``pretrained: false``) for the same reason.
- The file's ``position_ids`` buffer, which transformers >= 4.31 no longer keeps, is dropped after
  checking it is ``arange``; the config, a plain dict in the random file, is made an OmegaConf
  ``DictConfig`` as the published file pickles it.
- The package's training-only parts are not imported: ``gloria.datasets`` and ``gloria.lightning``
  (albumentations' removed ``ToTensor``, Lightning 1.1), and stand-ins are given for
  ``segmentation_models_pytorch`` (their U-Net loader) and ``skimage`` (their figures) where absent,
  and for ``numpy.lib.function_base`` (numpy 2 moved it), from which ``vision_model`` imports
  ``extract`` without using it.

Run with nltk and omegaconf importable (the authors' dependencies XBench lacks):

    git clone /work/.mirror/marshuang80+gloria/repo /tmp/gloria-authors
    pip install --target /tmp/gloria_deps nltk omegaconf
    PYTHONPATH=$PWD:/tmp/gloria_deps .venv/bin/python tools/parity/gloria.py \\
        --authors-repo /tmp/gloria-authors --real-data /work/shared/data/real --out tests/golden

``--manifest PATH`` also writes the strict key manifest of the published file: the state dict of
the authors' ``GLoRIA`` class at Bio_ClinicalBERT's shape (BERT-base, vocabulary 28996).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image

from xbench.findings import PAPER_CLASSES, finding_text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATASET, FRAME, INPUTS, SEED, golden_inputs, save_golden  # noqa: E402

LETTERBOX = 256
CROP = 224
#: Bio_ClinicalBERT's vocabulary size (the rest of its config is BERT-base's).
BIO_CLINICAL_BERT_VOCAB = 28996


def import_authors(repo: Path):
    """The authors' package without its training-only parts; their module objects."""
    for name, parts in (("segmentation_models_pytorch", ()), ("skimage", ("transform",))):
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = types.ModuleType(name)
            for part in parts:
                sys.modules[f"{name}.{part}"] = types.ModuleType(f"{name}.{part}")
    if importlib.util.find_spec("numpy.lib.function_base") is None:  # numpy 2 moved it; vision_model imports it unused
        sys.modules["numpy.lib.function_base"] = types.SimpleNamespace(extract=np.extract)
    package = types.ModuleType("gloria")
    package.__path__ = [str(repo / "gloria")]
    sys.modules["gloria"] = package
    for part in ("datasets", "lightning"):
        sys.modules[f"gloria.{part}"] = types.ModuleType(f"gloria.{part}")
    import gloria.gloria as api
    from gloria import builder, loss
    from gloria.models import text_model

    class LocalBert:
        """``AutoModel`` whose ``from_pretrained`` builds from the folder's config (weights from the checkpoint)."""

        @staticmethod
        def from_pretrained(folder, **kwargs):
            return transformers.AutoModel.from_config(transformers.AutoConfig.from_pretrained(folder, **kwargs))

    text_model.AutoModel = LocalBert
    return api, builder, loss


def authors_config(hyper_parameters: dict, bert_folder: Path):
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(hyper_parameters)
    cfg.model.text.bert_type = str(bert_folder)
    cfg.model.vision.pretrained = False
    return cfg


def load_authors_model(builder, weights: Path, bert_folder: Path):
    """``load_gloria``'s steps on a local file (see the module docstring for what is adapted)."""
    ckpt = torch.load(weights, map_location="cpu", weights_only=True)
    model = builder.build_gloria_model(authors_config(ckpt["hyper_parameters"], bert_folder))
    fixed = {key.split("gloria.")[-1]: value for key, value in ckpt["state_dict"].items()}
    buffer = "text_encoder.model.embeddings.position_ids"
    if buffer in fixed and buffer not in model.state_dict():
        ids = fixed.pop(buffer)
        if not torch.equal(ids.reshape(-1), torch.arange(ids.numel())):
            raise ValueError(f"{weights}: {buffer} is not arange")
    model.load_state_dict(fixed)
    return model.eval()


def write_manifest(builder, hyper_parameters: dict, path: Path, scratch: Path) -> None:
    """``{key: shape}`` of the authors' GLoRIA at Bio_ClinicalBERT's shape."""
    folder = scratch / "bio_clinical_bert_shape"
    folder.mkdir(parents=True)
    transformers.BertConfig(vocab_size=BIO_CLINICAL_BERT_VOCAB).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]) + "\n")
    network = builder.build_gloria_model(authors_config(hyper_parameters, folder))
    shapes = {key: list(value.shape) for key, value in network.state_dict().items()}
    path.write_text(json.dumps(shapes, indent=1) + "\n")


def crop_window(model, path: Path) -> np.ndarray:
    """(top, left, height, width) in the metric frame of the 224 crop, from the authors' own
    ``_resize_img`` (a white image: the content is where it is not zero padding) and ``CenterCrop``."""
    width, height = Image.open(path).size
    content = model._resize_img(np.full((height, width), 255, dtype=np.uint8), LETTERBOX) > 0
    rows, columns = np.flatnonzero(content.any(axis=1)), np.flatnonzero(content.any(axis=0))
    top, left = rows[0], columns[0]
    new_height, new_width = len(rows), len(columns)
    offset = int(round((LETTERBOX - CROP) / 2.0))
    return np.array(
        [(offset - top) * FRAME / new_height, (offset - left) * FRAME / new_width, CROP * FRAME / new_height,
         CROP * FRAME / new_width], dtype=np.float32,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--authors-repo", type=Path, required=True)
    parser.add_argument("--real-data", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("tests/golden"))
    parser.add_argument("--images", nargs="+", default=list(INPUTS),
                        help="radiographs under --real-data or CROPS names (default: INPUTS)")
    parser.add_argument("--checkpoint-dir", type=Path, help="real weights in XBench's layout; default: seeded random")
    parser.add_argument("--manifest", type=Path, help="also write the key manifest here")
    args = parser.parse_args(argv)
    from xbench.models import random_weights
    from xbench.models.gloria import CHECKPOINT_FILE, TEMPLATE, TEXT_FOLDER

    api, builder, loss = import_authors(args.authors_repo)
    scratch = Path(tempfile.mkdtemp())
    folder = args.checkpoint_dir or random_weights.write_gloria(scratch / "weights", seed=SEED)
    if args.manifest is not None:
        write_manifest(builder, random_weights.gloria_hyper_parameters(), args.manifest, scratch)
    model = load_authors_model(builder, folder / CHECKPOINT_FILE, folder / TEXT_FOLDER)
    inputs = golden_inputs(args.real_data, args.images, scratch / "inputs")
    paths = [item.path for item in inputs]
    classes = list(PAPER_CLASSES[DATASET])
    prompts = {key: [TEMPLATE.format(finding_text(key))] for key in classes}
    with torch.no_grad():
        images = model.process_img([str(p) for p in paths], "cpu")
        processed = model.process_class_prompts(prompts, "cpu")
        captured = []
        attention_fn = loss.gloria_loss.attention_fn

        def recording(word, context, temp1):
            weighted, attention = attention_fn(word, context, temp1)
            captured.append(attention)
            return weighted, attention

        loss.gloria_loss.attention_fn = recording
        logits, maps, figure_maps = [], [], []
        regions, _ = model.image_encoder_forward(images)
        for key in classes:
            captured.clear()
            logits.append(api.get_similarities(model, images, processed[key], similarity_type="both")[:, 0])
            (attention,) = captured
            _, _, sents = model.text_encoder_forward(
                processed[key]["caption_ids"], processed[key]["attention_mask"], processed[key]["token_type_ids"]
            )
            words = sents[0].index("[SEP]") - 1
            maps.append(attention[:, :words].amax(dim=1).numpy())
            text_words, _, sents = model.text_encoder_forward(
                processed[key]["caption_ids"], processed[key]["attention_mask"], processed[key]["token_type_ids"]
            )
            figure_maps.append(np.stack([  # build_attention_images: attn.max(dim=1) of one image's attn_maps
                model.get_attn_maps(regions[i : i + 1], text_words, sents)[0].max(dim=1).values[0].numpy()
                for i in range(len(paths))
            ]))
        loss.gloria_loss.attention_fn = attention_fn
        logits = np.stack(logits, axis=1)
        maps = np.stack(maps, axis=1)
        figure_maps = np.stack(figure_maps, axis=1)
        standardised = api.zero_shot_classification(model, images, processed).to_numpy()
    expected = (logits - logits.mean(axis=0)) / logits.std(axis=0)
    if not np.allclose(standardised, expected, atol=1e-4):
        off = np.abs(standardised - expected).max()
        raise RuntimeError(f"zero_shot_classification is not get_similarities standardised (off by {off:.2e})")
    per_image = {}
    for index, (item, path) in enumerate(zip(inputs, paths)):
        per_image[item.key] = {"logits": logits[index].astype(np.float32), "maps": maps[index].astype(np.float32),
                               "window": crop_window(model, path), "figure": figure_maps[index].astype(np.float32)}
    commit = subprocess.run(
        ["git", "-C", str(args.authors_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    bert = json.loads((folder / TEXT_FOLDER / "config.json").read_text())
    meta = {
        "model": "gloria",
        "authors_repo": "marshuang80/gloria",
        "commit": commit,
        "weights": "seeded random (random_weights.write_gloria)" if args.checkpoint_dir is None else str(folder),
        "seed": SEED,
        "text_config": {k: bert[k] for k in ("vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size")},
        "dataset": DATASET,
        "prompts": [p for (p,) in prompts.values()],
        "images": [item.record() for item in inputs],
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__,
                     "numpy": np.__version__, "transformers": transformers.__version__},
        "adaptations": "BERT built from the local config (weights from the checkpoint); no ImageNet download; "
                       "position_ids dropped after an arange check; training-only modules not imported",
        "map": "attention_fn's word-region attention inside get_local_similarities, max over the prompt's words",
        "figure": "get_attn_maps (local_loss: [CLS] and the words) per image and prompt, max over those slots",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    save_golden(args.out / "gloria.npz", per_image, classes, meta)
    print(f"wrote {args.out / 'gloria.npz'}: logits {logits.round(5).tolist()}")


if __name__ == "__main__":
    main()
