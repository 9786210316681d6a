"""Golden outputs of KAD from the authors' own code (``xiaoman-zhang/KAD``, ``A3_CLIP``).

Development only: the authors' modules are imported from ``--authors-repo``, never copied into
XBench. Their whole inference path, as ``A3_CLIP/plot_visualize_512.py`` runs it: PIL
``open().convert('RGB')``, ``Resize([res, res], BICUBIC)`` of the 8-bit image, ImageNet
statistics; their tokenizer call and ``CLP_clinical.encode_text``; ``ModelRes``/``ModelRes512``;
``TQN_Model(..., return_atten=True)``; softmax index 1 (XBench's logit: l1 - l0); the last layer's
head-averaged attention, reshaped row-major, upsampled with ``cv2.resize(..., INTER_LINEAR)``.

    python tools/parity/kad.py --authors-repo /path/to/KAD --variant 224 --out tests/golden/

Needs the authors' libraries (torch, torchvision, transformers 4.x, einops, opencv, scikit-image);
see tests/golden/README.md.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import types
from pathlib import Path

import cv2
import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision import transforms

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def import_authors(repo: Path):
    """The authors' modules from ``repo``. Their imports of a storage client (``petrel_client``) and of
    ``pytorch_pretrained_vit`` serve training and the ViT variant only: empty stand-ins. Their ResNet
    asks torchvision for ImageNet weights, which the checkpoint overwrites: built without them."""
    petrel = types.ModuleType("petrel_client")
    petrel.client = types.ModuleType("petrel_client.client")
    petrel.client.Client = lambda *args, **kwargs: None
    sys.modules.update({"petrel_client": petrel, "petrel_client.client": petrel.client})
    sys.modules.setdefault("pytorch_pretrained_vit", types.SimpleNamespace(ViT=None))
    import ruamel.yaml

    sys.modules.setdefault("ruamel_yaml", ruamel.yaml)  # the conda name plot_visualize_512 imports
    resnet50 = torchvision.models.resnet50
    torchvision.models.resnet50 = lambda pretrained=False, **kwargs: resnet50(weights=None, **kwargs)
    sys.path.insert(0, str(repo / "A3_CLIP"))
    import plot_visualize_512
    from models import clip_tqn

    return clip_tqn, plot_visualize_512


def bert_folder(text_folder: Path, scratch: Path) -> Path:
    """Med-KEBERT's folder as ``AutoModel.from_pretrained`` wants it: the tokenizer and config
    files plus weights (random; the checkpoint's ``text_encoder`` section replaces all of them)."""
    from transformers import BertConfig, BertModel

    folder = scratch / "Med-KEBERT"
    shutil.copytree(text_folder, folder)
    BertModel(BertConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def main() -> None:
    parser = common.parity_arguments(__doc__.splitlines()[0])
    parser.add_argument("--variant", type=int, choices=(224, 512), default=224)
    args = parser.parse_args()
    model_name = f"kad-{args.variant}"
    torch.manual_seed(common.SEED)
    clip_tqn, visualize = import_authors(args.authors_repo.resolve())
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        folder = common.checkpoint_folder(model_name, args.checkpoint_dir, args.xbench_python, scratch)
        sent = json.loads(common.xbench_command(args.xbench_python, "prompts", model_name))
        text_list = sent["prompts"]
        bert = bert_folder(folder / "Med-KEBERT", scratch)

        image_encoder = clip_tqn.ModelRes("resnet50") if args.variant == 224 else clip_tqn.ModelRes512("resnet50")
        text_encoder = clip_tqn.CLP_clinical(bert_model_name=str(bert))
        model = clip_tqn.TQN_Model()
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(bert), do_lower_case=True, local_files_only=True)
        checkpoint = torch.load(folder / f"KAD_{args.variant}" / "best_valid.pt", map_location="cpu", weights_only=True)
        text_state = dict(checkpoint["text_encoder"])
        # transformers >= 4.31 no longer keeps this buffer in the state dict; the file (as KAD's,
        # written with an older one) has it: check it is the arange BertModel rebuilds, then drop it.
        position_ids = text_state.pop("bert_model.embeddings.position_ids", None)
        if position_ids is not None and not torch.equal(position_ids, torch.arange(position_ids.shape[-1])[None]):
            raise ValueError("text_encoder position_ids is not arange: the file is not a KAD checkpoint")
        image_encoder.load_state_dict(checkpoint["image_encoder"])
        text_encoder.load_state_dict(text_state)
        model.load_state_dict(checkpoint["model"])
        for module in (image_encoder, text_encoder, model):
            module.eval()
        text_config = json.loads((bert / "config.json").read_text())

    normalize = transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    transform = transforms.Compose([
        transforms.Resize([args.variant, args.variant], interpolation=Image.BICUBIC),
        transforms.ToTensor(),
        normalize,
    ])
    per_image = {}
    inputs = common.golden_inputs(args.real_data, args.images, Path(tempfile.mkdtemp(prefix="golden-inputs-")))
    with torch.no_grad():
        text_features = visualize.get_text_features(text_encoder, text_list, tokenizer, "cpu", max_length=256)
        for item in inputs:
            img = Image.open(item.path).convert("RGB")
            image = transform(img).unsqueeze(0)
            image_features, _ = image_encoder(image)
            pred_class, atten_map = model(image_features, text_features, return_atten=True)
            side = int(round(atten_map.shape[-1] ** 0.5))
            maps = atten_map[0].reshape(len(text_list), side, side).numpy()  # rearrange '(w h) -> w h': row-major
            upsampled = np.stack([
                cv2.resize(maps[c], (common.FRAME, common.FRAME), interpolation=cv2.INTER_LINEAR)
                for c in common.UPSAMPLED_CLASSES
            ])
            per_image[item.key] = {
                "logits": (pred_class[0, :, 1] - pred_class[0, :, 0]).numpy().astype(np.float32),
                "maps": maps.astype(np.float32),
                "window": np.array([0, 0, common.FRAME, common.FRAME], dtype=np.float32),
                "upsampled": upsampled.astype(np.float16),
            }

    import transformers

    meta = {
        "model": model_name,
        "authors_repo": "xiaoman-zhang/KAD",
        "authors_commit": common.git_commit(args.authors_repo),
        "authors_path": "A3_CLIP/models/clip_tqn.py, A3_CLIP/plot_visualize_512.py (get_text_features, transform)",
        "weights": common.weights_source(model_name, args.checkpoint_dir),
        "seed": common.SEED,
        "text_encoder_config": text_config,
        "prompts": text_list,
        "images": [item.record() for item in inputs],
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                     "transformers": transformers.__version__, "pillow": Image.__version__, "opencv": cv2.__version__},
        "upsampled": f"cv2.resize(map, ({common.FRAME}, {common.FRAME}), INTER_LINEAR) of classes "
                     f"{list(common.UPSAMPLED_CLASSES)} on the metric frame (KAD squashes the whole image, so its "
                     "input is the frame); the authors then scale by 255/max to uint8 for display only",
        "window": "KAD's input is the whole radiograph: the window is the whole frame",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    common.save_golden(common.golden_path(args.out, model_name), per_image, sent["classes"], meta)


if __name__ == "__main__":
    main()
