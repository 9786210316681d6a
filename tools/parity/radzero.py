"""Golden outputs of RadZero from the authors' own code (``deepnoid-ai/RadZero``).

Development only. Runs in XBench's environment with the transformers the authors pin (4.39.3, with its
tokenizers 0.15.2 and huggingface-hub 0.28.1) in a folder put first on ``PYTHONPATH``; XBench's own
environment writes the weights and states the prompts (``common.xbench_command``).

The authors' classes and functions, imported from ``--authors-repo``, never copied:
``exp.cxr_pt.model``'s ``CxrAlignConfig`` and ``CxrAlignModel`` (built from the folder's
``config.json``; the towers it loads by name from a local folder of the folder's own sub-configs,
then the folder's ``model.safetensors`` loaded strictly over them, as ``from_pretrained`` does);
``AutoImageProcessor``/``AutoTokenizer`` on the folder (as the README loads them) and
``processing.adapt_img_size`` at the experiment's 518, as ``load_processor`` makes them;
``inference.utils.process_class_prompts`` and ``calculate_similarities`` (their classification path:
``InferDataset`` + ``collate_fn``'s ``cv2.normalize`` + ``compute_logits``) for the logits;
``inference.grounding_utils.get_similarity_scores`` for the maps;
``inference.segmentation_utils.interpolate_similarity_scores`` for ``upsampled``, onto the 224 frame.
One attribute is set that their code reads but never sets (``RadZeroLoss.compute_i2t_loss``:
``False``, the class having no image-to-text path; ``build``). Modules their package imports for
training, logging and other models (``peft``, ``common.trainer``, ``common.utils``, CARZero's ViT and
evaluation tables, ``omegaconf``) are stood in by empty modules: nothing on the inference path uses
them.

``--manifest`` also writes ``xbench/models/manifests/radzero.keys.json``: ``CxrAlignModel``'s state dict
at the published sizes (XrayDINOv2 ViT-B/14, all-mpnet-base-v2), built with random weights.

    PYTHONPATH=/tmp/tf439 .venv/bin/python tools/parity/radzero.py --authors-repo /tmp/radzero --manifest
"""

from __future__ import annotations

import importlib.machinery
import json
import logging
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import PIL
import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

class _Unused:
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("not on RadZero's inference path")


def stand_in(name: str, **attributes) -> None:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__dict__.update(attributes)
    sys.modules[name] = module


def import_authors(repo: Path) -> dict:
    """The authors' classes and functions, with the modules beside their inference path stood in."""
    stand_in("peft", LoraConfig=_Unused, PeftModel=_Unused, get_peft_model=_Unused)
    stand_in("common.trainer", logger=logging.getLogger("radzero"))
    stand_in("common.utils", load_json=lambda path: json.loads(Path(path).read_text()))
    stand_in("omegaconf", OmegaConf=_Unused)
    stand_in("external.CARZero.CARZero.models.transformer_backbones", MRM=_Unused, load_weight=_Unused)
    stand_in("external.CARZero.inference", **dict.fromkeys(
        ("triple_ChestXDet10_result", "triple_Chexpert5_result", "triple_chexpert5x200_result",
         "triple_Chexpert14_result", "tripple_openi_rusult_merge", "tripple_padchest_rusult_merge"), _Unused))
    sys.path.insert(0, str(repo))
    from exp.cxr_pt.inference.grounding_utils import get_similarity_scores
    from exp.cxr_pt.inference.segmentation_utils import interpolate_similarity_scores
    from exp.cxr_pt.inference.utils import calculate_similarities, process_class_prompts
    from exp.cxr_pt.model.configuration import CxrAlignConfig
    from exp.cxr_pt.model.modeling import CxrAlignModel
    from exp.cxr_pt.model.processing import adapt_img_size

    return dict(locals())


def model_config(config: dict, scratch: Path) -> dict:
    """``load_model``'s ``model_config`` for the folder's ``config.json``: the experiment's keys, the
    towers named by local folders (``scratch``) that hold the folder's own sub-configs."""
    from transformers import Dinov2Config, Dinov2Model, MPNetConfig, MPNetModel

    drop = ("model_type", "pretrained_name_or_path", "pretrained_tokenizer_name_or_path", "img_size",
            "use_text_projection", "use_cls_token")
    vision = {k: v for k, v in config["vision_config"].items() if k not in drop}
    text = {k: v for k, v in config["text_config"].items() if k not in drop}
    Dinov2Model(Dinov2Config(**vision)).save_pretrained(scratch / "vision")
    MPNetModel(MPNetConfig(**text)).save_pretrained(scratch / "text")
    align = config["align_transformer_config"]
    return {
        "vision_config": {"model_type": "dinov2", "pretrained_name_or_path": str(scratch / "vision"),
                          "img_size": config["vision_config"]["img_size"]},
        "text_config": {"model_type": "mpnet", "pretrained_name_or_path": str(scratch / "text"),
                        "pretrained_tokenizer_name_or_path": str(scratch / "text"),
                        "use_text_projection": config["text_config"]["use_text_projection"],
                        "use_cls_token": config["text_config"]["use_cls_token"]},
        "align_transformer_config": {"model_type": "align_transformer", "hidden_size": align["hidden_size"],
                                     "num_hidden_layers": align["num_hidden_layers"], "projector_config": None,
                                     "use_layer_norm": align["use_layer_norm"]},
        "loss": json.loads(json.dumps(config["loss"])),
        "compute_logits_type": config["compute_logits_type"],
    }


def build(authors: dict, config: dict, scratch: Path):
    settings = authors["CxrAlignConfig"](module_to_update=config["module_to_update"], **model_config(config, scratch))
    settings.pretrained_dir = None
    model = authors["CxrAlignModel"](settings).float().eval()
    # compute_logits reads RadZeroLoss.compute_i2t_loss, which RadZeroLoss at this commit never sets (an
    # AttributeError): the class has no image-to-text path, so the only value it can mean is False.
    model.loss_fns["RadZeroLoss"].compute_i2t_loss = False
    return model


def write_manifest(authors: dict, python: Path, scratch: Path) -> Path:
    """``CxrAlignModel``'s state dict at the published sizes (``random_weights.radzero_config()``, from
    XBench's environment ``python``), as a key manifest."""
    import subprocess

    published = json.loads(subprocess.run(
        [str(python), "-c", "import json; from xbench.models.random_weights import radzero_config; "
                            "print(json.dumps(radzero_config()))"],
        check=True, capture_output=True, text=True, cwd=common.REPO, env={"PYTHONPATH": str(common.REPO)},
    ).stdout)
    model = build(authors, published, scratch / "published")
    path = common.REPO / "xbench" / "models" / "manifests" / "radzero.keys.json"
    path.write_text(json.dumps({key: list(value.shape) for key, value in model.state_dict().items()}, indent=1) + "\n")
    return path


def run(authors: dict, folder: Path, prompts: list[str], paths: list[Path], scratch: Path) -> dict:
    config = json.loads((folder / "config.json").read_text())
    model = build(authors, config, scratch / "towers")
    state = load_file(str(folder / "model.safetensors"))
    model.load_state_dict(state, strict=True)
    processor = transformers.AutoImageProcessor.from_pretrained(str(folder))
    processor = authors["adapt_img_size"](processor, config["vision_config"]["img_size"],
                                          {"vision_config": {"model_type": "dinov2"}})
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    text_batch = authors["process_class_prompts"]({str(i): [p] for i, p in enumerate(prompts)}, tokenizer, model)
    images = [str(path) for path in paths]
    with torch.no_grad():
        logits = authors["calculate_similarities"](images, text_batch, model, processor, len(images), 0, "")
        scores = authors["get_similarity_scores"](images, text_batch, model, processor, len(images), 0, "")
    side = int(round(scores.shape[-1] ** 0.5))
    per_image = {}
    for row, path in enumerate(paths):
        upsampled = torch.stack([authors["interpolate_similarity_scores"](scores[row, c], (common.FRAME, common.FRAME),
                                                                          processor)[0]
                                 for c in common.UPSAMPLED_CLASSES])
        per_image[path] = {
            "logits": np.asarray(logits[row], dtype=np.float32),
            "maps": scores[row].reshape(len(prompts), side, side).numpy().astype(np.float32),
            "window": np.array([0.0, 0.0, common.FRAME, common.FRAME], dtype=np.float32),
        }
        if row == 0:  # one input pins the rule; five would make the file 0.75 MB
            per_image[path]["upsampled"] = upsampled.numpy().astype(np.float16)
    return per_image, type(processor).__name__, processor.to_dict(), tokenizer(prompts)["input_ids"]


def main() -> None:
    parser = common.parity_arguments(__doc__.splitlines()[0])
    parser.add_argument("--manifest", action="store_true", help="also write xbench/models/manifests/radzero.keys.json")
    args = parser.parse_args()
    authors = import_authors(args.authors_repo)
    if transformers.__version__ != "4.39.3":
        raise SystemExit(f"transformers {transformers.__version__} is first on the path; the authors pin 4.39.3")
    prompts = json.loads(common.xbench_command(args.xbench_python, "prompts", "radzero"))["prompts"]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        if args.manifest:
            print("wrote", write_manifest(authors, args.xbench_python, scratch))
        folder = common.checkpoint_folder("radzero", args.checkpoint_dir, args.xbench_python, scratch)
        inputs = common.golden_inputs(args.real_data, args.images, scratch / "inputs")
        per_path, processor_class, processor, ids = run(authors, folder, prompts, [item.path for item in inputs],
                                                        scratch)
        per_image = {item.key: per_path[item.path] for item in inputs}
        config = json.loads((folder / "config.json").read_text())
    meta = {
        "model": "radzero",
        "authors_repo": "deepnoid-ai/RadZero",
        "authors_commit": common.git_commit(args.authors_repo),
        "authors_path": "CxrAlignModel.compute_logits through inference.utils.calculate_similarities (logits) and "
                        "grounding_utils.get_similarity_scores (maps), InferDataset + collate_fn; "
                        "segmentation_utils.interpolate_similarity_scores (upsampled)",
        "weights": common.weights_source("radzero", args.checkpoint_dir),
        "seed": common.SEED,
        "config": config,
        "image_processor": str(processor),
        "image_processor_class": processor_class,
        "prompts": prompts,
        "token_ids": ids,
        "images": [item.record() for item in inputs],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "pillow": PIL.__version__},
        "upsampled": f"interpolate_similarity_scores onto the 224 frame (bilinear, align_corners=False), classes "
                     f"{list(common.UPSAMPLED_CLASSES)}, for the first input only",
        "window": "the whole 224 frame: the image is squashed to 518 x 518",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    common.save_golden(common.golden_path(args.out, "radzero"), per_image, common.classes(), meta)


if __name__ == "__main__":
    main()
