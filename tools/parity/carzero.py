"""Golden outputs of CARZero from the authors' own code (``laihaoran/CARZero``).

Development only: the authors' package is imported from ``--authors-repo``, never copied into
XBench. Their whole inference path: ``load_CARZero``'s model build and key loop, ``process_img``
(``cv2.imread(path, 0)``, letterbox to 256 with ``INTER_AREA``, ``CenterCrop(224)``, CXR_MAE
statistics), ``process_class_prompts`` (their cleaning and tokenizer), ``dqn_shot_classification``
for the scores and ``grounding_shot_classification`` for the maps (the 14x14 layer mean, and its
nearest-repeat x16 onto the 224 crop).

    python tools/parity/carzero.py --authors-repo /path/to/CARZero --out tests/golden/

Needs the authors' pins where they matter (transformers 4.35.2, timm 0.9.2) and opencv, omegaconf,
nltk, scikit-learn, scikit-image, pandas, ipdb; see tests/golden/README.md.
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
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

CONFIG = "configs/mimic_pretrain_llm_dqn_wo_self_atten_mlp_gl.yaml"  # the config train.sh trains with
LETTERBOX, CROP = 256, 224


def import_authors(repo: Path):
    """The authors' package from ``repo``. Modules it imports for training only (Lightning modules,
    datasets, segmentation models) are empty stand-ins: none is reached at inference. Its ViT
    always starts from the M3AE file, which the checkpoint overwrites: that read is skipped."""
    for name in ("segmentation_models_pytorch", "CARZero.lightning", "CARZero.datasets"):
        sys.modules[name] = types.ModuleType(name)
    sys.path.insert(0, str(repo))
    import CARZero

    CARZero.models.transformer_backbones.load_weight = lambda model, path: model
    return CARZero


def bert_folder(text_folder: Path, scratch: Path) -> Path:
    """BioClinicalMPBERT's folder as ``AutoModel.from_pretrained`` wants it: vocabulary, config and
    weights (random; the checkpoint's ``text_encoder`` keys replace every one)."""
    from transformers import BertConfig, BertModel

    folder = scratch / "BioClinicalMPBERT"
    shutil.copytree(text_folder, folder)
    BertModel(BertConfig.from_pretrained(folder)).save_pretrained(folder)
    return folder


def build(package, repo: Path, folder: Path, bert: Path, trust_checkpoint: bool):
    """``load_CARZero`` without its hard-coded paths: the config is train.sh's, overlaid with the
    file's ``hyper_parameters``; BERT comes from ``bert``; no M3AE initialisation (overwritten)."""
    from omegaconf import OmegaConf

    checkpoint = torch.load(folder / "CARZero_best_model.ckpt", map_location="cpu", weights_only=not trust_checkpoint)
    cfg = OmegaConf.merge(OmegaConf.load(repo / CONFIG), OmegaConf.create(dict(checkpoint["hyper_parameters"])))
    cfg.model.text.bert_type = str(bert)
    cfg.model.vision.pretrained = False
    model = package.builder.build_CARZero_dqn_wo_self_atten_mlp_gl_model(cfg)
    model_weights = model.state_dict()
    fixed = {}
    for key, value in checkpoint["state_dict"].items():  # load_CARZero's key loop, as written there
        new_key = key.split("CARZero.")[-1]
        if new_key in model_weights:
            fixed[new_key] = value
    model.load_state_dict(fixed, strict=True)
    return model.eval(), cfg


def window(path: Path) -> np.ndarray:
    """(top, left, height, width) of the 224 crop in the metric frame (the whole image squashed to
    FRAME): ``_resize_img``'s sizes and padding, torchvision's CenterCrop offset."""
    height, width = cv2.imread(str(path), 0).shape
    if height >= width:
        resized = (LETTERBOX, int(float(width) * (LETTERBOX / float(height))))
    else:
        resized = (int(float(height) * (LETTERBOX / float(width))), LETTERBOX)
    pad = (int(np.floor((LETTERBOX - resized[0]) / 2)), int(np.floor((LETTERBOX - resized[1]) / 2)))
    offset = int(round((LETTERBOX - CROP) / 2.0))
    scale = (common.FRAME / resized[0], common.FRAME / resized[1])
    return np.array([(offset - pad[0]) * scale[0], (offset - pad[1]) * scale[1], CROP * scale[0], CROP * scale[1]],
                    dtype=np.float32)


def main() -> None:
    parser = common.parity_arguments(__doc__.splitlines()[0])
    parser.add_argument("--trust-checkpoint", action="store_true",
                        help="unpickle a real Lightning file in full (it holds an OmegaConf config); only for a file "
                             "whose sha256 you checked")
    args = parser.parse_args()
    torch.manual_seed(common.SEED)
    repo = args.authors_repo.resolve()
    package = import_authors(repo)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        folder = common.checkpoint_folder("carzero", args.checkpoint_dir, args.xbench_python, scratch)
        sent = json.loads(common.xbench_command(args.xbench_python, "prompts", "carzero"))
        bert = bert_folder(folder / "BioClinicalMPBERT", scratch)
        model, cfg = build(package, repo, folder, bert, args.trust_checkpoint)
        text_config = json.loads((bert / "config.json").read_text())
        prompts = dict(zip(sent["classes"], sent["prompts"]))
        inputs = common.golden_inputs(args.real_data, args.images, scratch / "inputs")
        paths = [str(item.path) for item in inputs]
        with torch.no_grad():
            processed_txt = model.process_class_prompts(prompts, "cpu")
            images = model.process_img(paths, "cpu")
            scores = package.dqn_shot_classification(model, images, processed_txt)
            expanded, maps = package.grounding_shot_classification(model, images, processed_txt)
        per_image = {}
        for index, item in enumerate(inputs):
            per_image[item.key] = {
                "logits": scores[sent["classes"]].to_numpy()[index].astype(np.float32),
                "maps": maps[index].astype(np.float32),
                "window": window(item.path),
                "upsampled": expanded[index, list(common.UPSAMPLED_CLASSES)].numpy().astype(np.float16),
            }
        records = [item.record() for item in inputs]

    import timm
    import transformers

    meta = {
        "model": "carzero",
        "authors_repo": "laihaoran/CARZero",
        "authors_commit": common.git_commit(repo),
        "authors_path": "CARZero/CARZero.py (load_CARZero key loop, dqn_shot_classification, "
                        "grounding_shot_classification), CARZeroDQNWOSAGLMLP.process_img / process_class_prompts, "
                        f"{CONFIG} overlaid with the file's hyper_parameters",
        "weights": common.weights_source("carzero", args.checkpoint_dir),
        "seed": common.SEED,
        "text_encoder_config": text_config,
        "prompts": sent["prompts"],
        "images": records,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "timm": timm.__version__,
                     "pillow": Image.__version__, "opencv": cv2.__version__},
        "upsampled": "the authors' pred_map (nearest repeat x16) on their 224 input crop, classes "
                     f"{list(common.UPSAMPLED_CLASSES)}",
        "window": "the 224 crop of the 256 letterbox in metric-frame pixels (frame 224 = the whole image squashed)",
        "tolerance": "the authors resize in 8 bits (cv2 INTER_AREA on the uint8 image, then uint8 again)",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    common.save_golden(common.golden_path(args.out, "carzero"), per_image, sent["classes"], meta)


if __name__ == "__main__":
    main()
