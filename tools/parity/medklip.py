"""Golden outputs of MedKLIP and MAVL from their authors' own code.

Development only: the authors' modules are imported from ``--authors-repo``, never copied into
XBench. MedKLIP (``MediaBrain-SJTU/MedKLIP``) as ``Sample_Zero-Shot_Grounding_RSNA/test.py`` runs
it; MAVL (``HieuPhan33/CVPR2024_MAVL``) as ``Zero-shot_grounding/test.py`` does:

- their ``models/tokenization_bert.py`` (``[CLS]`` + pieces, no ``[SEP]``), padded to 64, and the
  query book embedded inside their model's constructor (MedKLIP: the description file in file order;
  MAVL: descriptions in entity order, then each entity's 8 aspect sentences from ``gpt4_mimic.json``);
- PIL ``open().convert('RGB')``, ``Resize([224, 224])`` (bilinear, squashed), ``ToTensor``, ImageNet
  statistics (their PNG/JPEG datasets; the DICOM-only histogram equalisation is not on this path);
- the forward; the 2-way classifier's l1 - l0 as XBench's logit (softmax index 1 is theirs);
- the cross-attention averaged over the last 4 layers (MAVL: over slots 0, 6, 7, 8 of each disease),
  row-major 14x14, upsampled to 224 as they do: MedKLIP repeats each cell 16x, MAVL
  ``F.interpolate(bilinear, align_corners=True)``.

    python tools/parity/medklip.py --model medklip --authors-repo /path/to/MedKLIP --out tests/golden/
    python tools/parity/medklip.py --model mavl --authors-repo /path/to/CVPR2024_MAVL --out tests/golden/

Needs the authors' libraries (torch, torchvision, transformers 4.x for their tokenizer file, einops,
timm, scikit-learn); see tests/golden/README.md.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from PIL import Image
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

#: Where each authors' repository keeps the inference code this script runs.
CODE = {"medklip": "Sample_Zero-Shot_Grounding_RSNA", "mavl": "Zero-shot_grounding"}
#: The architecture the released checkpoints were trained with (the authors' configs).
CONFIG = {"d_model": 256, "H": 4, "N": 4, "dropout": 0.1, "attribute_set_size": 2, "num_queries": 75,
          "res_base_model": "resnet50", "base_model": "resnet50", "pretrained": False, "decoder": "cross",
          "self_attention": True}
MAVL_GROUNDING_SLOTS = [0, 6, 7, 8]


def import_authors(model: str, repo: Path):
    """The authors' model class and tokenizer from ``repo``. MAVL's backbone table also builds two
    torchvision ViTs with ImageNet weights it never uses for a ResNet model: stand-ins, so nothing
    is downloaded."""
    torchvision.models.vit_b_16 = torchvision.models.vit_l_16 = lambda *args, **kwargs: None
    sys.path.insert(0, str(repo / CODE[model]))
    from models.tokenization_bert import BertTokenizer

    if model == "medklip":
        from models.model_MedKLIP import MedKLIP as network
    else:
        from models.model_MAVL import MAVL as network
    return network, BertTokenizer


def main() -> None:
    parser = common.parity_arguments(__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("medklip", "mavl"), required=True)
    args = parser.parse_args()
    torch.manual_seed(common.SEED)
    network, tokenizer_class = import_authors(args.model, args.authors_repo.resolve())
    sent = json.loads(common.xbench_command(args.xbench_python, "prompts", args.model))
    classes, queries = sent["classes"], sent["prompts"]
    entities, class_rows = queries["book"], queries["class_rows"]
    with tempfile.TemporaryDirectory() as scratch:
        folder = common.checkpoint_folder(args.model, args.checkpoint_dir, args.xbench_python, Path(scratch))
        bert = folder / "Bio_ClinicalBERT"
        tokenizer = tokenizer_class.from_pretrained(str(bert))

        def tokens(texts: list[str]) -> dict:
            return tokenizer(list(texts), padding="max_length", truncation=True, max_length=64, return_tensors="pt")

        descriptions = json.loads((folder / "observation explanation.json").read_text())
        config = {**CONFIG, "text_encoder": str(bert)}
        if args.model == "medklip":
            # their book is the file in file order, which must be the entity order XBench picks rows by
            if len(descriptions) != len(entities):
                raise ValueError(f"{folder}: {len(descriptions)} descriptions for a book of {len(entities)} entities")
            anatomy = tokens(["It is located at trachea"])  # their anatomy book feeds pre-training only
            model = network(config, anatomy, tokens(list(descriptions.values())), mode="train")
            checkpoint = folder / "checkpoint_final.pth"
        else:
            aspects = json.loads((folder / "gpt4_mimic.json").read_text())
            concept_book = sum((aspects[entity] for entity in entities), [])
            model = network(config, tokens([descriptions[e] for e in entities]), tokens(concept_book))
            checkpoint = folder / "checkpoint_full_40.pth"
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
        state = {k.replace("module.", ""): v for k, v in state.items()}
        if args.model == "mavl":
            state = {k: v for k, v in state.items() if "temp" not in k}  # as their test.py
        model.load_state_dict(state)
        model.eval()
        text_config = json.loads((bert / "config.json").read_text())

    normalize = transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    transform = transforms.Compose([transforms.Resize([224, 224]), transforms.ToTensor(), normalize])
    per_image = {}
    inputs = common.golden_inputs(args.real_data, args.images, Path(tempfile.mkdtemp(prefix="golden-inputs-")))
    with torch.no_grad():
        for item in inputs:
            image = transform(Image.open(item.path).convert("RGB")).unsqueeze(0)
            if args.model == "medklip":
                out, ws = model(image, None, is_train=False)
            else:
                out, ws = model(image)
            attention = (ws[-4] + ws[-3] + ws[-2] + ws[-1]) / 4
            if args.model == "mavl":
                attention = attention.view(1, len(entities), -1, attention.shape[-1])[:, :, MAVL_GROUNDING_SLOTS].mean(2)
            side = int(round(attention.shape[-1] ** 0.5))
            entity_maps = attention.reshape(len(entities), side, side)
            entity_logits = out[0, :, 1] - out[0, :, 0]
            # a class of several entities: the highest score, the mean map (XBench's table, e.g. nodule_mass)
            logits = torch.stack([entity_logits[rows].amax() for rows in class_rows])
            maps = torch.stack([entity_maps[rows].mean(0) for rows in class_rows])
            chosen = maps[list(common.UPSAMPLED_CLASSES)]
            if args.model == "medklip":  # their heatmap: np.repeat(16) on both axes
                upsampled = chosen.numpy().repeat(16, axis=1).repeat(16, axis=2)
            else:
                upsampled = F.interpolate(chosen[None], (224, 224), mode="bilinear", align_corners=True)[0].numpy()
            per_image[item.key] = {
                "logits": logits.numpy().astype(np.float32),
                "maps": maps.numpy().astype(np.float32),
                "window": np.array([0, 0, common.FRAME, common.FRAME], dtype=np.float32),
                "upsampled": upsampled.astype(np.float16),
            }

    import transformers

    meta = {
        "model": args.model,
        "authors_repo": {"medklip": "MediaBrain-SJTU/MedKLIP", "mavl": "HieuPhan33/CVPR2024_MAVL"}[args.model],
        "authors_commit": common.git_commit(args.authors_repo),
        "authors_path": f"{CODE[args.model]}/models (model, tokenization_bert), {CODE[args.model]}/test.py (map)",
        "weights": common.weights_source(args.model, args.checkpoint_dir),
        "seed": common.SEED,
        "text_encoder_config": text_config,
        "prompts": queries,
        "images": [item.record() for item in inputs],
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                     "transformers": transformers.__version__, "pillow": Image.__version__},
        "upsampled": f"classes {list(common.UPSAMPLED_CLASSES)} at 224 as the authors upsample: "
                     + ("np.repeat x16" if args.model == "medklip" else "F.interpolate(bilinear, align_corners=True)"),
        "window": "the authors squash the whole radiograph: the window is the whole frame",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    common.save_golden(common.golden_path(args.out, args.model), per_image, classes, meta)


if __name__ == "__main__":
    main()
