"""Checkpoint folders with random weights in each model's official file layout, for tests and benchmarks.

A model loads only through its strict checkpoint path, so a test or a benchmark that wants one
needs its files. These writers produce them with random values in the authors' layouts (keys,
sections, prefixes, the training state saved beside the weights), at full size or, where a writer
takes an architecture or a config, smaller. Text towers are as shallow as each model allows: the
text side runs once per run, not per image. Nothing here is ever a source of results.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import open_clip
import torch
from safetensors.torch import save_file
from torch import Tensor, nn
from transformers import BertConfig, BertModel

from xbench.models.carzero import (
    CHECKPOINT_FILE,
    TEXT_FOLDER,
    Architecture,
    CARZeroNetwork,
    clean_text,
    expected_hyper_parameters,
    prompt_for,
)
from xbench.models.chexzero import CHECKPOINT_FILE as CHEXZERO_FILE
from xbench.models.mavl import ASPECTS, MAVLNet
from xbench.models.medklip import COVID_ENTITY, ENTITIES, MedKLIPNet
from xbench.geometry.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

MANIFESTS = Path(__file__).resolve().parent / "manifests"

# -- CLIP -------------------------------------------------------------------------------------------


def clip_state(arch: str, seed: int) -> dict[str, Tensor]:
    """Random weights of the open_clip architecture ``arch``, logit scale 50."""
    torch.manual_seed(seed)
    state = open_clip.create_model(arch).state_dict()
    state["logit_scale"] = torch.tensor(math.log(50.0))
    return state


def write_clip(folder: Path, arch: str = "ViT-B-16-quickgelu", seed: int = 0) -> Path:
    """``checkpoints/clip/``: ``open_clip_model.safetensors``."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file(clip_state(arch, seed), folder / "open_clip_model.safetensors")
    return folder


# -- BiomedCLIP -------------------------------------------------------------------------------------

BIOMEDBERT_HUB_NAME = "microsoft/BiomedNLP-BiomedBERT-base-uncased-abstract"
#: The current official ``open_clip_config.json`` (specs/models/biomedclip.md), model_cfg first.
BIOMEDCLIP_CONFIG = {
    "model_cfg": {
        "embed_dim": 512,
        "vision_cfg": {"timm_model_name": "vit_base_patch16_224", "timm_model_pretrained": False, "timm_pool": "",
                       "timm_proj": "linear", "image_size": 224},
        "text_cfg": {"hf_model_name": BIOMEDBERT_HUB_NAME, "hf_tokenizer_name": BIOMEDBERT_HUB_NAME,
                     "hf_proj_type": "mlp", "hf_pooler_type": "cls_last_hidden_state_pooler", "context_length": 256},
    },
    "preprocess_cfg": {"mean": [0.48145466, 0.4578275, 0.40821073], "std": [0.26862954, 0.26130258, 0.27577711]},
}
BIOMEDCLIP_POSITION_IDS = "text.transformer.embeddings.position_ids"
#: The words of the default prompts of the findings the tests use, in the WordPiece vocabulary.
BIOMEDCLIP_WORDS = ["this", "is", "a", "photo", "of", "no", "pneumonia", "pleural", "effusion", "nodule", "mass",
                    "consolidation"]


def write_biomedclip_files(folder: Path, config: dict, bert: BertConfig, vocab_size: int) -> Path:
    """The official file set but the weights: CLIP config, BiomedBERT's config.json, a WordPiece vocab.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "open_clip_config.json").write_text(json.dumps(config, indent=2))
    bert.save_pretrained(folder)
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    filler = [f"tok{i}" for i in range(vocab_size - len(specials) - len(BIOMEDCLIP_WORDS) - 1)]
    (folder / "vocab.txt").write_text("\n".join([*specials, *BIOMEDCLIP_WORDS, "##s", *filler]) + "\n")
    return folder


def biomedclip_state(folder: Path, seed: int) -> dict[str, Tensor]:
    """Random weights of the folder's architecture as the authors saved them: with ``position_ids``."""
    torch.manual_seed(seed)
    model_cfg = json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]
    text_cfg = {**model_cfg["text_cfg"], "hf_model_name": str(folder), "hf_model_pretrained": False}
    state = open_clip.CustomTextCLIP(**{**model_cfg, "text_cfg": text_cfg}).state_dict()
    state["logit_scale"] = torch.tensor(math.log(50.0))
    state[BIOMEDCLIP_POSITION_IDS] = torch.arange(512).unsqueeze(0)
    return state


def write_biomedclip(folder: Path, seed: int = 0) -> Path:
    """``checkpoints/biomedclip/`` at full size: the official config, BiomedBERT's geometry, random weights."""
    write_biomedclip_files(folder, BIOMEDCLIP_CONFIG, BertConfig(), vocab_size=30522)
    torch.save(biomedclip_state(folder, seed), folder / "open_clip_pytorch_model.bin")
    return folder


# -- MedKLIP and MAVL -------------------------------------------------------------------------------


def description(entity: str) -> str:
    return f"The {entity.replace('_', ' ')} finding, seen as a Shadow on the chest radiograph."


def aspect_sentence(entity: str, aspect: str) -> str:
    return f"{aspect}: the {aspect} of {entity.replace('_', ' ')} on the radiograph."


def aspect_sentences(entity: str) -> list[str]:
    """The 8 sentences of ``entity``; three entities spell "others", as in the authors' file."""
    spelled = "others" if entity in ("sharply", "lead", "aerate") else "other"
    return [aspect_sentence(entity, spelled if aspect == "other" else aspect) for aspect in ASPECTS]


def write_descriptions(path: Path, entities, medklip_spelling: bool) -> dict[str, str]:
    """``observation explanation.json``: MedKLIP's copy keys pneumonia as ``eumonia``."""
    book = {("eumonia" if medklip_spelling and e == "pneumonia" else e): description(e) for e in entities}
    path.write_text(json.dumps(book, indent=4))
    return book


def write_aspects(path: Path, entities) -> None:
    """``gpt4_mimic.json``: entity -> 8 sentences ``"<aspect>: ..."``."""
    path.write_text(json.dumps({entity: aspect_sentences(entity) for entity in entities}, indent=4))


def write_bert(folder: Path, seed: int = 0) -> None:
    """A 1-layer BERT with hidden size 768, saved as Bio_ClinicalBERT is: ``bert.`` keys plus MLM heads;
    its vocabulary holds every word of the description and aspect files written here."""
    folder.mkdir(parents=True, exist_ok=True)
    words = set()
    for entity in (*ENTITIES, COVID_ENTITY):
        for aspect in ("", *ASPECTS, "others"):
            text = aspect_sentence(entity, aspect) + " " + description(entity)
            words.update(text.lower().replace(",", " ").replace(".", " ").replace(":", " ").replace("_", " ").split())
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", ":", "_", *sorted(words)]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = BertConfig(vocab_size=len(vocab), hidden_size=768, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(seed)
    model = BertModel(config)
    config.save_pretrained(folder)
    weights = {f"bert.{key}": value for key, value in model.state_dict().items()}
    weights["cls.predictions.bias"] = torch.zeros(len(vocab))
    torch.save(weights, folder / "pytorch_model.bin")


def training_extras() -> dict:
    """What the authors' training scripts save beside ``model``."""
    optimizer = torch.optim.AdamW([nn.Parameter(torch.zeros(3))], lr=1e-4)
    return {"optimizer": optimizer.state_dict(), "lr_scheduler": {"last_epoch": 59},
            "config": {"d_model": 256, "N": 4, "H": 4, "text_encoder": "emilyalsentzer/Bio_ClinicalBERT"}, "epoch": 59}


def write_medklip(folder: Path, bert: Path) -> dict[str, Tensor]:
    """``checkpoints/medklip/`` (full size) with a copy of the BERT folder ``bert``; returns the weights."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(1)
    state = MedKLIPNet().state_dict()
    state["cl_fc.weight"], state["cl_fc.bias"] = torch.randn(768, 256), torch.randn(768)
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, **training_extras()},
               folder / "checkpoint_final.pth")
    write_descriptions(folder / "observation explanation.json", ENTITIES, medklip_spelling=True)
    shutil.copytree(bert, folder / "Bio_ClinicalBERT")
    return state


def write_mavl(folder: Path, bert: Path) -> dict[str, Tensor]:
    """``checkpoints/mavl/`` (full size, ``checkpoint_full_40.pth``) with a copy of ``bert``; returns the weights."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(2)
    state = MAVLNet().state_dict()
    state["temp"] = torch.full((9,), math.log(1 / 0.07))
    state["location_emb.weight"], state["location_emb.bias"] = torch.randn(768, 256, 9), torch.randn(768)
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}, **training_extras()},
               folder / "checkpoint_full_40.pth")
    write_descriptions(folder / "observation explanation.json", (*ENTITIES, COVID_ENTITY), medklip_spelling=False)
    write_aspects(folder / "gpt4_mimic.json", (*ENTITIES, COVID_ENTITY))
    shutil.copytree(bert, folder / "Bio_ClinicalBERT")
    return state


# -- KAD and DeViDe: written from the key manifests, not from XBench's modules ------------------------

#: KAD's ModelRes / ModelRes512 register resnet50's children again as res_features.<index>.
RESNET_CHILDREN = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}
MED_KEBERT_WORDS = ("lung mass nodule consolidation atelectasis cardiomegaly pleural effusion infiltration pneumonia "
                    "pneumothorax edema emphysema fibrosis thicken hernia calcification fracture").split()


def write_med_kebert(folder: Path, **sizes) -> BertConfig:
    """Med-KEBERT's tokenizer and config files (BertConfig with ``sizes``; the defaults are Med-KEBERT's)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *MED_KEBERT_WORDS, "-"]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    config = BertConfig(**sizes)
    config.save_pretrained(folder)
    return config


def random_tensor(key: str, shape: list[int], generator: torch.Generator) -> Tensor:
    """Random values at scales that keep the image's signal alive through the ResNet or ViT, so
    scores and maps depend on the image (weights ~ 1/sqrt(fan-in), norm gains ~ 1)."""
    noise = torch.randn(shape, generator=generator)
    if key.endswith("num_batches_tracked"):
        return torch.tensor(7)
    if key.endswith("running_var"):
        return torch.rand(shape, generator=generator) + 0.5
    if len(shape) >= 2:
        return noise / math.prod(shape[1:]) ** 0.5
    if len(shape) == 1 and key.endswith("weight"):
        return 1 + 0.1 * noise
    return 0.1 * noise


def section_from_manifest(manifest: dict, section: str, generator: torch.Generator) -> dict[str, Tensor]:
    state = {
        name.split("/", 1)[1]: random_tensor(name, shape, generator)
        for name, shape in manifest.items()
        if name.startswith(section + "/")
    }
    for key in state:  # the authors' modules hold these tensors under two names
        index, _, rest = key.removeprefix("res_features.").partition(".")
        if key.startswith("res_features."):
            state[key] = state[f"resnet.{RESNET_CHILDREN[index]}.{rest}"]
        if key.startswith("decoder.norm."):
            state[key] = state["decoder_norm." + key.removeprefix("decoder.norm.")]
    return state


def text_section(config: BertConfig, generator: torch.Generator) -> dict[str, Tensor]:
    state = {f"bert_model.{key}": value for key, value in BertModel(config).state_dict().items()}
    state["bert_model.embeddings.position_ids"] = torch.arange(config.max_position_embeddings).unsqueeze(0)
    for key, shape in {"mlp_embed.0.weight": [768, 768], "mlp_embed.0.bias": [768],
                       "mlp_embed.2.weight": [768, 768], "mlp_embed.2.bias": [768], "logit_scale": []}.items():
        state[key] = random_tensor(key, shape, generator)
    return state


def authors_file(manifest: dict, config: BertConfig, seed: int, img_res: int | None) -> dict:
    """``best_valid.pt`` as KAD's ``A3_CLIP/main.py`` writes it: three state dicts and training state."""
    generator = torch.Generator().manual_seed(seed)
    parameter = nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([parameter])
    parameter.sum().backward()
    optimizer.step()
    saved = {
        "model": section_from_manifest(manifest, "model", generator),
        "image_encoder": section_from_manifest(manifest, "image_encoder", generator),
        "text_encoder": text_section(config, generator),
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": {"t_initial": 100, "base_values": [5e-5]},
        "epoch": 42,
    }
    if img_res is not None:
        saved["config"] = {"img_res": img_res, "batch_size": 64, "optimizer": {"opt": "adamW", "lr": 5e-5}}
    return saved


def key_manifest(name: str, file: str) -> dict[str, list[int]]:
    """The key manifest of ``file`` in ``xbench/models/manifests/<name>.keys.json``."""
    return json.loads((MANIFESTS / f"{name}.keys.json").read_text())[file]


def write_kad(folder: Path, variant: int = 224, seed: int = 0) -> Path:
    """``checkpoints/kad/``: ``KAD_<variant>/best_valid.pt`` (a one-layer Med-KEBERT) and ``Med-KEBERT/``."""
    config = write_med_kebert(folder / "Med-KEBERT", num_hidden_layers=1, intermediate_size=64)
    (folder / f"KAD_{variant}").mkdir(parents=True)
    saved = authors_file(key_manifest("kad", f"KAD_{variant}/best_valid.pt"), config, seed, img_res=variant)
    torch.save(saved, folder / f"KAD_{variant}" / "best_valid.pt")
    return folder


def write_devide(folder: Path, seed: int = 0) -> Path:
    """``checkpoints/devide/`` in XBench's provisional layout (a one-layer Med-KEBERT)."""
    config = write_med_kebert(folder / "Med-KEBERT", num_hidden_layers=1, intermediate_size=64)
    saved = authors_file(key_manifest("devide", "best_valid.pt"), config, seed, img_res=224)
    torch.save(saved, folder / "best_valid.pt")
    return folder


# -- CARZero --------------------------------------------------------------------------------------

BERT_VOCAB_SIZE = 28996  # cased BERT/BioBERT vocabulary, as BioClinicalMPBERT's


def write_carzero(folder: Path, classes: list[str]) -> Path:
    """``checkpoints/carzero/`` at full size as the authors publish it: a Lightning ``state_dict`` under
    ``CARZero.``, its training config, and a vocabulary that knows the prompts' words of ``classes``."""
    text = folder / TEXT_FOLDER
    text.mkdir(parents=True)
    config = BertConfig(vocab_size=BERT_VOCAB_SIZE)
    config.save_pretrained(text)
    words = sorted({word for key in classes for word in clean_text(prompt_for(key)).split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    vocab += [f"[unused{i}]" for i in range(BERT_VOCAB_SIZE - len(vocab))]
    (text / "vocab.txt").write_text("\n".join(vocab) + "\n")
    network = CARZeroNetwork(BertModel(config), Architecture())
    hyper_parameters: dict = {}
    for dotted, value in expected_hyper_parameters(Architecture()).items():
        *parents, leaf = dotted.split(".")
        node = hyper_parameters
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    state = {f"CARZero.{key}": value for key, value in network.state_dict().items()}
    torch.save({"state_dict": state, "hyper_parameters": hyper_parameters}, folder / CHECKPOINT_FILE)
    return folder


# -- CheXzero ---------------------------------------------------------------------------------------


#: CheXzero's ViT-B/32 with 2 vision blocks and 1 text block (the authors' ``build_model`` reads
#: the depths from the file): what the parity tests run. Registered with open_clip by
#: `register_small_chexzero`.
SMALL_CHEXZERO = "xbench-chexzero-small"
SMALL_CHEXZERO_CONFIG = {
    "embed_dim": 512,
    "quick_gelu": True,
    "vision_cfg": {"image_size": 224, "layers": 2, "width": 768, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 512, "heads": 8, "layers": 1},
}


def register_small_chexzero(folder: Path) -> str:
    """Register `SMALL_CHEXZERO` with open_clip (its config written to ``folder``); its name."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{SMALL_CHEXZERO}.json").write_text(json.dumps(SMALL_CHEXZERO_CONFIG))
    open_clip.add_model_config(folder / f"{SMALL_CHEXZERO}.json")
    return SMALL_CHEXZERO


def write_chexzero(folder: Path, arch: str = "ViT-B-32-quickgelu", seed: int = 0) -> Path:
    """``checkpoints/chexzero/``: the authors' ``torch.save(model.state_dict())`` of OpenAI's CLIP
    class, whose keys are open_clip's ``CLIP``'s; under the default file name."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(clip_state(arch, seed), folder / CHEXZERO_FILE)
    return folder


# -- BioViL -----------------------------------------------------------------------------------------

#: WordPiece vocabulary of single letters, so every prompt tokenises to known, distinct pieces.
LETTER_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz",
                *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz")]


def randomise_batch_norms(module: nn.Module) -> None:
    """Draw batch-norm statistics and scales, so that a test sees them used (eval mode)."""
    for layer in module.modules():
        if isinstance(layer, nn.BatchNorm2d):
            layer.running_mean.normal_(0, 0.1)
            layer.running_var.uniform_(0.5, 1.5)
            layer.weight.data.uniform_(0.5, 1.5)


def write_cxr_bert(folder: Path, text_layers: int = 1, hidden_size: int = 64) -> None:
    """CXR-BERT's ``config.json``, ``vocab.txt``, ``tokenizer_config.json`` and ``pytorch_model.bin``
    (BERT, masked-language-model head, projection head) with a small BERT initialised wide (std
    0.2) so that prompts embed apart; drawn from the global generator."""
    from transformers import BertForMaskedLM

    from xbench.models.biovil import CXRBertProjectionHead

    config = BertConfig(
        vocab_size=len(LETTER_VOCAB), hidden_size=hidden_size, num_hidden_layers=text_layers, num_attention_heads=2,
        intermediate_size=2 * hidden_size, max_position_embeddings=512, initializer_range=0.2,
    )
    state = BertForMaskedLM(config).state_dict()
    head = CXRBertProjectionHead(hidden_size, 128).state_dict()
    state.update({f"cls_projection_head.{key}": value for key, value in head.items()})
    torch.save(state, folder / "pytorch_model.bin")
    (folder / "config.json").write_text(json.dumps(
        {**config.to_dict(), "model_type": "cxr-bert", "architectures": ["CXRBertModel"], "projection_size": 128},
        indent=2,
    ))
    (folder / "vocab.txt").write_text("\n".join(LETTER_VOCAB) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"do_lower_case": True, "model_max_length": 512, "tokenizer_class": "CXRBertTokenizer"}
    ))


def write_biovil(folder: Path, seed: int = 0) -> Path:
    """``checkpoints/biovil/``: the image model file (ResNet-50 + projector, batch-norm statistics
    drawn too) and CXR-BERT's files (`write_cxr_bert`)."""
    from xbench.models.biovil import IMAGE_FILE, BioViLImageModel

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    image = BioViLImageModel()
    randomise_batch_norms(image)
    torch.save(image.state_dict(), folder / IMAGE_FILE)
    write_cxr_bert(folder)
    return folder


def write_biovil_t(folder: Path, seed: int = 0) -> Path:
    """``checkpoints/biovil_t/``: BioViL-T's image model file (the single-image path drawn as a
    module, the prior-image ViT pooler's tensors from the key manifest, std 0.02) and CXR-BERT's
    files (`write_cxr_bert`)."""
    from xbench.models.biovil import BIOVIL_T_IMAGE_FILE, BioViLTImageModel

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    image = BioViLTImageModel()
    randomise_batch_norms(image)
    image.encoder.missing_previous_emb.data.normal_(0, 0.5)
    state = image.state_dict()
    shapes = json.loads((MANIFESTS / "biovil_t.keys.json").read_text())[BIOVIL_T_IMAGE_FILE]
    for key, shape in shapes.items():
        if key.startswith("encoder.vit_pooler."):
            state[key] = torch.randn(shape) * 0.02
    torch.save(state, folder / BIOVIL_T_IMAGE_FILE)
    write_cxr_bert(folder)
    return folder


# -- GLoRIA -----------------------------------------------------------------------------------------


def gloria_hyper_parameters() -> dict:
    """What the authors' Lightning file holds under ``hyper_parameters``: their
    ``configs/chexpert_pretrain_config.yaml``, the parts their model and transform builders read."""
    return {
        "phase": "pretrain",
        "model": {
            "norm": False,
            "gloria": {"local_loss_weight": 1.0, "global_loss_weight": 1.0, "temp1": 4.0, "temp2": 5.0, "temp3": 10.0},
            "vision": {"model_name": "resnet_50", "freeze_cnn": False, "pretrained": True},
            "text": {"bert_type": "emilyalsentzer/Bio_ClinicalBERT", "last_n_layers": 4, "aggregate_method": "sum",
                     "norm": False, "embedding_dim": 768, "freeze_bert": False, "agg_tokens": True},
        },
        "data": {"dataset": "chexpert", "text": {"word_num": 97, "captions_per_image": 5, "full_report": False},
                 "image": {"imsize": 256}},
        "transforms": {"norm": "half", "random_crop": {"crop_size": 224}},
        "train": {"batch_size": 48, "nvis": 8, "rand_vis": False},
    }


def write_gloria(folder: Path, seed: int = 0, text_layers: int = 4) -> Path:
    """``checkpoints/gloria/``: ``chexpert_resnet50.ckpt`` as the authors' Lightning run saves it (the
    weights under ``state_dict`` with the prefix ``gloria.`` and the ``position_ids`` buffer the
    transformers of 2021 kept; ``hyper_parameters``), the full ResNet-50 with batch-norm statistics
    drawn, and a BERT 768 wide (the joint width) but ``text_layers`` deep with a single-letter
    vocabulary, the local embedder drawn small (std 1e-6); ``Bio_ClinicalBERT/`` holds its
    ``config.json`` and ``vocab.txt``."""
    from xbench.models.gloria import CHECKPOINT_FILE, TEXT_FOLDER, WIDTH, GLoRIANetwork

    text = folder / TEXT_FOLDER
    text.mkdir(parents=True, exist_ok=True)
    config = BertConfig(vocab_size=len(LETTER_VOCAB), hidden_size=WIDTH, num_hidden_layers=text_layers,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128)
    config.save_pretrained(text)
    (text / "vocab.txt").write_text("\n".join(LETTER_VOCAB) + "\n")
    torch.manual_seed(seed)
    network = GLoRIANetwork(BertModel(config))
    randomise_batch_norms(network.img_encoder)
    # the random trunk's layer-3 activations are large (norms ~3e3): a small local embedder makes the
    # word-region products of order one, so the attention maps have contrast
    network.img_encoder.local_embedder.weight.data.normal_(0, 1e-6)
    state = {f"gloria.{key}": value for key, value in network.state_dict().items()}
    state["gloria.text_encoder.model.embeddings.position_ids"] = torch.arange(config.max_position_embeddings)[None]
    saved = {"epoch": 9, "global_step": 12345, "pytorch-lightning_version": "1.1.4", "state_dict": state,
             "hyper_parameters": gloria_hyper_parameters()}
    torch.save(saved, folder / CHECKPOINT_FILE)
    return folder


# -- transformers dual encoders (MedSigLIP, XrayCLIP, XraySigLIP, any CLIP/SigLIP folder) ------------

#: The published checkpoints' ``config.json`` and ``preprocessor_config.json`` (the values that differ
#: from transformers' defaults), as far as they could be read; docs/models/<name>.md says where each
#: comes from. XBench itself reads the folder's own files: these only shape the parity weights.
HF_DUAL_ENCODERS: dict[str, dict] = {
    # google/medsiglip-448: SigLIP-400M (So400m/14) at 448 px, 64 text tokens.
    "medsiglip": {
        "config": {
            "architectures": ["SiglipModel"], "model_type": "siglip",
            "text_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16,
                            "num_hidden_layers": 27, "max_position_embeddings": 64, "projection_size": 1152,
                            "vocab_size": 32000, "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6},
            "vision_config": {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16,
                              "num_hidden_layers": 27, "image_size": 448, "patch_size": 14,
                              "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6},
        },
        "preprocessor": {"image_processor_type": "SiglipImageProcessor", "processor_class": "SiglipProcessor",
                         "do_resize": True, "size": {"height": 448, "width": 448}, "resample": 3,
                         "do_rescale": True, "rescale_factor": 0.00392156862, "do_normalize": True,
                         "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    },
    # StanfordAIMI/XrayCLIP__vit-b-16__laion2b-s34b-b88k: open_clip's ViT-B/16 (GELU) as CLIPModel.
    "xray_clip": {
        "config": {
            "architectures": ["CLIPModel"], "model_type": "clip", "projection_dim": 512,
            "text_config": {"hidden_size": 512, "intermediate_size": 2048, "num_attention_heads": 8,
                            "num_hidden_layers": 12, "max_position_embeddings": 77, "vocab_size": 49408,
                            "hidden_act": "gelu", "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1},
            "vision_config": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                              "num_hidden_layers": 12, "image_size": 224, "patch_size": 16, "hidden_act": "gelu"},
        },
        "preprocessor": {"image_processor_type": "CLIPImageProcessor", "processor_class": "CLIPProcessor",
                         "do_resize": True, "size": {"shortest_edge": 224}, "resample": 3,
                         "do_center_crop": True, "crop_size": {"height": 224, "width": 224},
                         "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                         "image_mean": list(OPENAI_CLIP_MEAN), "image_std": list(OPENAI_CLIP_STD),
                         "do_convert_rgb": True},
    },
    # StanfordAIMI/XraySigLIP__vit-l-16-siglip-384__webli: SigLIP ViT-L/16 at 384 px.
    "xray_siglip": {
        "config": {
            "architectures": ["SiglipModel"], "model_type": "siglip",
            "text_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
                            "num_hidden_layers": 24, "max_position_embeddings": 64, "vocab_size": 32000},
            "vision_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
                              "num_hidden_layers": 24, "image_size": 384, "patch_size": 16},
        },
        "preprocessor": {"image_processor_type": "SiglipImageProcessor", "processor_class": "SiglipProcessor",
                         "do_resize": True, "size": {"height": 384, "width": 384}, "resample": 3,
                         "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
                         "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
    },
}
#: Words the SigLIP test vocabulary holds whole (the rest is spelled letter by letter).
SIGLIP_WORDS = ("no", "a", "the", "of", "photo", "chest", "left", "right", "small", "lower", "lobe", "base",
                "at", "bilateral", "patchy", "apical")


def write_clip_tokenizer(folder: Path) -> None:
    """OpenAI CLIP's BPE tokenizer (49,408 tokens) in transformers' format, made from the vocabulary file
    open_clip ships, in OpenAI's order: the 256 byte symbols, the same with ``</w>``, the merges, then
    ``<|startoftext|>`` and ``<|endoftext|>`` (49406, 49407: the highest ids, which CLIP's legacy
    end-of-text pooling looks for)."""
    import gzip
    import tempfile

    from open_clip.tokenizer import bytes_to_unicode, default_bpe
    from transformers import CLIPTokenizer

    merges = gzip.open(default_bpe()).read().decode("utf-8").split("\n")[1 : 49152 - 256 - 2 + 1]
    symbols = list(bytes_to_unicode().values())
    vocab = [*symbols, *(s + "</w>" for s in symbols), *("".join(m.split()) for m in merges),
             "<|startoftext|>", "<|endoftext|>"]
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}))
        (Path(scratch) / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        tokenizer = CLIPTokenizer(str(Path(scratch) / "vocab.json"), str(Path(scratch) / "merges.txt"),
                                  pad_token="<|endoftext|>", model_max_length=77)
        tokenizer.save_pretrained(folder)


def write_siglip_tokenizer(folder: Path) -> int:
    """A SentencePiece unigram model in SigLIP's layout (``<pad>`` 0, ``</s>`` 1 (end and padding),
    ``<unk>`` 2), of the letters, digits and `SIGLIP_WORDS`, saved as SigLIP's tokenizer
    (``spiece.model``). Written piece by piece, so the ids never depend on a trainer. Its size."""
    import tempfile

    from sentencepiece import sentencepiece_model_pb2 as spm
    from transformers import SiglipTokenizer

    proto = spm.ModelProto()
    proto.trainer_spec.model_type = spm.TrainerSpec.UNIGRAM
    proto.trainer_spec.pad_id, proto.trainer_spec.eos_id, proto.trainer_spec.unk_id = 0, 1, 2
    proto.trainer_spec.bos_id = -1
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = True
    proto.normalizer_spec.remove_extra_whitespaces = True
    kinds = spm.ModelProto.SentencePiece
    pieces = [("<pad>", 0.0, kinds.CONTROL), ("</s>", 0.0, kinds.CONTROL), ("<unk>", 0.0, kinds.UNKNOWN),
              ("\u2581", -5.0, kinds.NORMAL)]
    pieces += [(character, -8.0, kinds.NORMAL) for character in "abcdefghijklmnopqrstuvwxyz0123456789"]
    pieces += [("\u2581" + word, -2.0, kinds.NORMAL) for word in SIGLIP_WORDS]
    for text, score, kind in pieces:
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = text, score, kind
    proto.trainer_spec.vocab_size = len(pieces)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "spiece.model").write_bytes(proto.SerializeToString())
        SiglipTokenizer(str(Path(scratch) / "spiece.model")).save_pretrained(folder)
    return len(pieces)


def write_hf_dual_encoder(folder: Path, config: dict, preprocessor: dict, seed: int = 0) -> Path:
    """A transformers dual-encoder folder as the hub holds one: ``config.json``,
    ``preprocessor_config.json``, the tokenizer's files (OpenAI's BPE for CLIP, a small SentencePiece
    for SigLIP, whose text ``vocab_size`` is set to it) and ``model.safetensors`` with seeded random
    weights of ``config``; a SigLIP's logit bias is -2.5 (transformers initialises it to 0, which would
    hide it). The tokenizer's end-of-text id is the one the config's text tower pools at."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads(json.dumps(config))  # a copy
    if config["model_type"] == "siglip":
        config["text_config"]["vocab_size"] = write_siglip_tokenizer(folder)
    else:
        write_clip_tokenizer(folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor, indent=2))
    verbosity, progress_bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()  # SigLIP's text config keeps CLIP's unused bos/eos ids, which it warns about
    hf_logging.disable_progress_bar()
    try:
        torch.manual_seed(seed)
        model = AutoModel.from_config(AutoConfig.from_pretrained(str(folder), local_files_only=True))
        if config["model_type"] == "siglip":
            with torch.no_grad():
                model.logit_scale.fill_(math.log(10.0))
                model.logit_bias.fill_(-2.5)
        model.save_pretrained(folder)
    finally:
        hf_logging.set_verbosity(verbosity)
        if progress_bar:
            hf_logging.enable_progress_bar()
    return folder


def published_hf_dual_encoder(name: str, vision_layers: int = 2, text_layers: int = 1) -> tuple[dict, dict]:
    """``config.json`` and ``preprocessor_config.json`` of the published checkpoint ``name``
    (`HF_DUAL_ENCODERS`) with fewer layers: the parity weights' shape."""
    entry = json.loads(json.dumps(HF_DUAL_ENCODERS[name]))
    entry["config"]["vision_config"]["num_hidden_layers"] = vision_layers
    entry["config"]["text_config"]["num_hidden_layers"] = text_layers
    return entry["config"], entry["preprocessor"]


# -- RadZero ----------------------------------------------------------------------------------------

#: MPNet's special tokens (all-mpnet-base-v2's: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, its ``[UNK]``) and
#: single letters as WordPiece, so every prompt tokenises to known, distinct pieces.
MPNET_VOCAB = ["<s>", "<pad>", "</s>", "<unk>", "[UNK]", *"abcdefghijklmnopqrstuvwxyz",
               *(f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"), "<mask>"]
MPNET_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>", "sep_token": "</s>", "cls_token": "<s>",
                        "unk_token": "[UNK]", "pad_token": "<pad>", "mask_token": "<mask>"}
#: The published recipe's settings beside the architectures (``exp/cxr_pt/configs/radzero.yaml``).
RADZERO_LOSS = {"apply": ["RadZeroLoss"], "ratio": [1.0], "RadZeroLoss": {
    "hidden_dim": 768, "mpnce_row_sum": False, "mpnce_col_sum": False, "attn_temperature": None,
    "loss_temperature": 0.07, "text_features_l2_norm": False, "sim_op": "cos"}}


def radzero_config(vision_layers: int = 12, text_layers: int = 12, vision_image_size: int = 224,
                   vocab_size: int = 30527) -> dict:
    """RadZero's ``config.json`` in the layout of the authors' ``CxrAlignConfig.save_pretrained``:
    XrayDINOv2's architecture (ViT-B/14; its side ``vision_image_size``) with the experiment's keys,
    all-mpnet-base-v2's in ``text_config`` (docs/models/radzero.md: what XBench infers there), the two
    extra blocks and the loss settings; ``vision_layers``/``text_layers`` blocks in the towers."""
    from transformers import Dinov2Config, MPNetConfig

    vision = Dinov2Config(image_size=vision_image_size, patch_size=14, num_hidden_layers=vision_layers).to_dict()
    text = MPNetConfig(vocab_size=vocab_size, num_hidden_layers=text_layers, max_position_embeddings=514,
                       layer_norm_eps=1e-5).to_dict()
    align = Dinov2Config(hidden_size=768, num_hidden_layers=2).to_dict()
    return {
        "architectures": ["CxrAlignModel"],
        "vision_config": {**vision, "pretrained_name_or_path": "StanfordAIMI/dinov2-base-xray-224", "img_size": 518},
        "text_config": {**text, "use_text_projection": False,
                        "pretrained_name_or_path": "sentence-transformers/all-mpnet-base-v2",
                        "pretrained_tokenizer_name_or_path": "sentence-transformers/all-mpnet-base-v2",
                        "use_cls_token": False},
        "align_transformer_config": {**align, "model_type": "align_transformer", "projector_config": None,
                                     "use_layer_norm": False},
        "loss": RADZERO_LOSS,
        "compute_logits_type": "radzero",
        "module_to_update": ["align_transformer", "text_model", "loss_fns"],
    }


#: XrayDINOv2's ``BlipImageProcessor`` at the experiment's ``img_size`` 518 (``adapt_img_size``), with
#: BLIP's defaults (CLIP's mean/std, bicubic): what ``save_pretrained`` writes for it.
RADZERO_PREPROCESSOR = {
    "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
    "image_mean": list(OPENAI_CLIP_MEAN), "image_std": list(OPENAI_CLIP_STD),
    "image_processor_type": "BlipImageProcessor", "resample": 3, "rescale_factor": 1 / 255,
    "size": {"height": 518, "width": 518},
}


def write_mpnet_tokenizer(folder: Path) -> None:
    """``vocab.txt``, ``tokenizer_config.json`` and ``special_tokens_map.json`` of an MPNet WordPiece
    tokenizer over `MPNET_VOCAB`, readable by every transformers version."""
    (folder / "vocab.txt").write_text("\n".join(MPNET_VOCAB) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "MPNetTokenizer", "do_lower_case": True, "model_max_length": 512,
         **MPNET_SPECIAL_TOKENS}, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps(MPNET_SPECIAL_TOKENS, indent=2))


def write_radzero(folder: Path, vision_layers: int = 12, text_layers: int = 12, seed: int = 0) -> Path:
    """``checkpoints/radzero/``: ``config.json`` (`radzero_config`, the vocabulary `MPNET_VOCAB`'s),
    ``preprocessor_config.json``, the tokenizer's files and ``model.safetensors`` with seeded random
    weights under the published file's names (the shared layer norm and the temperature drawn too, so
    that a test sees them used)."""
    from xbench.models.radzero import RadZeroNet, architecture, published_key

    folder.mkdir(parents=True, exist_ok=True)
    config = radzero_config(vision_layers, text_layers, vocab_size=len(MPNET_VOCAB))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "preprocessor_config.json").write_text(json.dumps(RADZERO_PREPROCESSOR, indent=2))
    write_mpnet_tokenizer(folder)
    torch.manual_seed(seed)
    net = RadZeroNet(*architecture(folder))
    head = net.loss_fns["RadZeroLoss"]
    with torch.no_grad():
        head.layer_norm.weight.uniform_(0.5, 1.5)
        head.layer_norm.bias.normal_(0, 0.1)
        head.loss_temperature.fill_(math.log(0.05))
    save_file({published_key(key): value.contiguous() for key, value in net.state_dict().items()},
              str(folder / "model.safetensors"))
    return folder
