"""CARZero: Cross-Attention Alignment for Radiology Zero-Shot Classification (Lai et al., CVPR 2024).

A ViT-B/16 image encoder and a BERT text encoder (BioClinicalMPBERT) meet in one cross-attention
module, used in both directions: the class prompt's sentence vector attends over the image's
global token and 14x14 patch tokens (image-to-text), and the image's global token attends over
the prompt's sentence vector and 97 word slots (text-to-image). Each pass ends in an MLP that
outputs one number; the score is their mean. The saliency map is the image-to-text attention
over the patches, averaged over heads and layers.

Facts (sizes, key names, preprocessing, prompts) follow the authors' code at ``laihaoran/CARZero``
``fa4e09c``; ``specs/models/carzero.md`` in the project's shared specs records each with its source.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import Tensor, nn
from transformers import BertModel, PreTrainedTokenizerBase

from xbench.findings import FINDINGS, display_name
from xbench.models.base import LayerGroup, XBenchModel
from xbench.models.checkpoints import CheckpointLayout, DeclaredDrop, is_arange, load_checkpoint, read_hyper_parameters
from xbench.models.hub import checkpoint_folder
from xbench.models.decoder import PreNormQueryLayer
from xbench.models.explainers import CamTarget
from xbench.geometry.preprocess import CXR_MAE_MEAN, CXR_MAE_STD, Preprocess
from xbench.models.text import bert_from_config, load_tokenizer, require_files

CHECKPOINT_FILE = "CARZero_best_model.ckpt"
TEXT_FOLDER = "BioClinicalMPBERT"
#: The authors' ``_resize_img``: longer side to 256, zero-padded square; then CenterCrop(224).
LETTERBOX_SIZE = 256
INPUT_SIZE = 224
PATCH_SIZE = 16
GRID = INPUT_SIZE // PATCH_SIZE
#: ``data.text.word_num``: prompts are padded to this many tokens, and words fill this many slots.
TEXT_SLOTS = 97
#: Word vectors are the sum of BERT's last four hidden states.
TEXT_LAYERS = 4

CHECKPOINT_LAYOUT = CheckpointLayout(
    section="state_dict",
    strip_prefix="CARZero.",
    drops=(
        DeclaredDrop(
            "text_encoder.model.embeddings.position_ids",
            "a buffer transformers < 4.31 saved; newer versions rebuild it",
            is_arange,
        ),
    ),
)

#: CARZero's own prompt strings (its ``Dataset/*_text.json`` files), by finding key.
#: ChestX-ray14: atelectasis ... pneumothorax, fibrosis, hernia; ChestX-Det10: calcification,
#: fracture; CheXpert 5: consolidation, edema; Open-I: lung_opacity, lung_lesion ("Lesion");
#: PadChest: clavicle_fracture, enlarged_pa, lung_cavity, lung_cyst, mediastinal_shift,
#: pulmonary_fibrosis, rib_fracture. Where two files differ, the file of the dataset that has the
#: class wins (fibrosis: ChestX-ray14/Det10; infiltration: ChestX-ray14).
OFFICIAL_PROMPTS: dict[str, str] = {
    "atelectasis": "There is Atelectasis",
    "calcification": "There is Tissue Calcification",
    "cardiomegaly": "There is Cardiomegaly",
    "clavicle_fracture": "There is Clavicle Fracture",
    "consolidation": "There is Pulmonary Consolidation",
    "edema": "There is Pulmonary Edema",
    "emphysema": "There is Pulmonary Emphysema",
    "enlarged_pa": "There is Pulmonary Artery Enlargement",
    "fibrosis": "There is Fibrosis",
    "fracture": "There is Bone Fracture",
    "hernia": "There is Hernia",
    "infiltration": "There is Pulmonary Infiltration",
    "lung_cavity": "There is Cavitation",
    "lung_cyst": "There is Cyst",
    "lung_lesion": "There is Abnormal Lesion",
    "lung_opacity": "There is Lung Opacity",
    "mass": "There is Pulmonary Mass",
    "mediastinal_shift": "There is Mediastinal Shift",
    "nodule": "There is Lung Nodule",
    "pleural_effusion": "There is Pleural Effusion",
    "pleural_thickening": "There is Pleural Thickening",
    "pneumonia": "There is Pneumonia",
    "pneumothorax": "There is Pneumothorax",
    "pulmonary_fibrosis": "There is Pulmonary Fibrosis",
    "rib_fracture": "There is Rib Fracture",
}
#: Findings CARZero has no string for. Ours: the authors' phrasing with our display name
#: (`template_prompt`), e.g. ``There is Interstitial Lung Disease``.
TEMPLATE_CLASSES: tuple[str, ...] = (
    "aortic_enlargement",
    "covid19",
    "enlarged_cardiomediastinum",
    "interstitial_lung_disease",
    "nodule_mass",
    "other_lesion",
    "pleural_other",
    "support_devices",
)


def template_prompt(key: str) -> str:
    """``There is <display name>``; underscores become spaces (the cleaning would keep them)."""
    name = display_name(key) if key in FINDINGS else key
    return f"There is {name}".replace("_", " ")


def prompt_for(key: str) -> str:
    """CARZero's prompt for a finding key: official, ours, or the template with a warning."""
    if key in OFFICIAL_PROMPTS:
        return OFFICIAL_PROMPTS[key]
    if key not in TEMPLATE_CLASSES:
        warnings.warn(
            f"CARZero has no prompt for class {key!r}; using {template_prompt(key)!r}. "
            "Add it to xbench/models/carzero.py if another wording is wanted.",
            stacklevel=2,
        )
    return template_prompt(key)


def clean_text(text: str) -> str:
    """The authors' ``process_text`` cleaning: split into sentences at ``<digits>.`` and ``.``,
    lower-case, keep ``\\w+`` runs, drop sentences of at most one word and non-ASCII characters."""
    sentences = [part for chunk in re.split(r"[0-9]+\.", text.replace("\n", " ")) for part in chunk.split(".")]
    kept = []
    for sentence in sentences:
        words = re.findall(r"\w+", sentence.replace("\ufffd\ufffd", " ").lower())
        if len(words) <= 1:
            continue
        ascii_words = (word.encode("ascii", "ignore").decode("ascii") for word in words)
        kept.append(" ".join(word for word in ascii_words if word))
    return " ".join(kept)


def word_merge_matrix(tokens: list[list[str]], slots: int = TEXT_SLOTS) -> Tensor:
    """Float32 [N, slots, T]: which token of each prompt sums into which word slot.

    The authors' ``aggregate_tokens``: a ``##`` piece joins the word before it, ``[CLS]`` is the
    first word and ``[SEP]`` the last; every slot after ``[SEP]`` stays empty (a zero vector).
    """
    merge = torch.zeros(len(tokens), slots, len(tokens[0]))
    for prompt, pieces in enumerate(tokens):
        if "[SEP]" not in pieces:
            raise ValueError(f"prompt tokens {pieces} have no [SEP]: the tokenizer is not a BERT WordPiece tokenizer")
        slot = -1
        for position, piece in enumerate(pieces):
            if position == 0 or not piece.startswith("##"):
                slot += 1
            merge[prompt, slot, position] = 1.0
            if piece == "[SEP]":
                break
    return merge


def tokenize_prompts(tokenizer: PreTrainedTokenizerBase, prompts: list[str], model: str,
                     vocabulary: str) -> tuple[dict[str, Tensor], Tensor]:
    """The authors' cleaning, then BERT tokens padded to the word slots, and the word-merge matrix
    (CARZero and GLoRIA alike). A prompt the cleaning empties is an error; a word the tokenizer
    does not know is a warning that names ``vocabulary``, the file that is probably wrong."""
    texts = [clean_text(prompt) for prompt in prompts]
    for prompt, text in zip(prompts, texts):
        if not text:
            raise ValueError(f"prompt {prompt!r} is empty after {model}'s cleaning (it needs two or more words)")
    tokens = tokenizer(texts, truncation=True, padding="max_length", max_length=TEXT_SLOTS, return_tensors="pt")
    pieces = [tokenizer.convert_ids_to_tokens(ids) for ids in tokens["input_ids"].tolist()]
    unknown = [prompt for prompt, split in zip(prompts, pieces) if tokenizer.unk_token in split]
    if unknown:
        warnings.warn(
            f"{model}'s tokenizer maps words of {unknown} to {tokenizer.unk_token}: is {vocabulary}?",
            stacklevel=3,
        )
    return tokens, word_merge_matrix(pieces)


@dataclass(frozen=True)
class Architecture:
    """CARZero's sizes (the authors' defaults). BERT's come from its ``config.json``."""

    #: One width for the ViT, the BERT and the fusion module (no projections between them).
    width: int = 768
    vision_depth: int = 12
    vision_heads: int = 12
    fusion_layers: int = 4
    fusion_heads: int = 4
    fusion_ffn: int = 1024
    head_widths: tuple[int, ...] = (1024, 512, 256)


def expected_hyper_parameters(architecture: Architecture) -> dict[str, Any]:
    """The training-config values this implementation hard-codes, as dotted keys."""
    return {
        "model.text.bert_type": "Laihaoran/BioClinicalMPBERT",
        "model.text.last_n_layers": TEXT_LAYERS,
        "model.text.aggregate_method": "sum",
        "model.text.agg_tokens": True,
        "model.text.norm": False,
        "model.text.embedding_dim": architecture.width,
        "model.vision.model_name": "vit_b_16",
        "model.fusion.d_model": architecture.width,
        "model.fusion.class_num": 1,
        "model.fusion.decoder_number_layer": architecture.fusion_layers,
        "data.text.word_num": TEXT_SLOTS,
        "data.image.imsize": LETTERBOX_SIZE,
        "transforms.norm": "CXR_MAE",
        "transforms.random_crop.crop_size": INPUT_SIZE,
    }


class TextEncoder(nn.Module):
    """BERT; word vectors = pieces merged into words over the sum of the last 4 hidden states;
    the sentence vector is their mean over all 97 slots, empty ones included."""

    def __init__(self, bert: BertModel) -> None:
        super().__init__()
        self.model = bert

    def forward(self, input_ids: Tensor, attention_mask: Tensor, merge: Tensor) -> tuple[Tensor, Tensor]:
        """-> words [N, 97, D], sentences [N, D]."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=torch.zeros_like(input_ids),
            output_hidden_states=True,
        )
        hidden = torch.stack(outputs.hidden_states[-TEXT_LAYERS:]).sum(0)
        words = merge.to(hidden) @ hidden
        return words, words.mean(1)


class ImageEncoder(nn.Module):
    """ViT-B/16 (timm keys); the global token and the 196 patch tokens after the final norm."""

    def __init__(self, architecture: Architecture) -> None:
        super().__init__()
        self.model = VisionTransformer(
            img_size=INPUT_SIZE,
            patch_size=PATCH_SIZE,
            embed_dim=architecture.width,
            depth=architecture.vision_depth,
            num_heads=architecture.vision_heads,
            mlp_ratio=4,
            qkv_bias=True,
            num_classes=0,
            global_pool="token",
            norm_layer=partial(nn.LayerNorm, eps=1e-6),
        )

    def forward(self, image: Tensor) -> tuple[Tensor, Tensor]:
        """[B, 3, 224, 224] -> global [B, D], patches [B, 196, D] (row-major)."""
        tokens = self.model.forward_features(image)
        return tokens[:, 0], tokens[:, 1:]


class Decoder(nn.Module):
    def __init__(self, layers: list[PreNormQueryLayer], norm: nn.LayerNorm) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class FusionModule(nn.Module):
    """The authors' ``TQN_Model``: one set of weights for both directions.

    ``decoder_norm`` normalises memory and queries on entry and is also the decoder's final norm
    (one module under two names, so the file holds it twice). ``logit_scale`` is in the file but
    unused. Dropout sits where the authors have it; runs are in eval mode, where it is inactive.
    """

    def __init__(self, architecture: Architecture) -> None:
        super().__init__()
        width = architecture.width
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.decoder_norm = nn.LayerNorm(width)
        layers = [
            # the authors' self-attention is off; its weights and norm1 are in their file all the same
            PreNormQueryLayer(width, architecture.fusion_heads, architecture.fusion_ffn, self_attention=False)
            for _ in range(architecture.fusion_layers)
        ]
        self.decoder = Decoder(layers, self.decoder_norm)
        self.dropout_feas = nn.Dropout(0.1)
        head: list[nn.Module] = []
        for width_in, width_out in zip((width, *architecture.head_widths), architecture.head_widths):
            head += [nn.Linear(width_in, width_out), nn.ReLU(), nn.Dropout(0.1)]
        self.mlp_head = nn.Sequential(*head, nn.Linear(architecture.head_widths[-1], 1))

    def forward(self, memory: Tensor, queries: Tensor) -> tuple[Tensor, Tensor]:
        """Memory [M, N, D], queries [Q, N, D] -> scores [N, Q], attention of every layer [L, N, Q, M]."""
        memory = self.decoder_norm(memory)
        queries = self.decoder_norm(queries)
        attention = []
        for layer in self.decoder.layers:
            queries, weights = layer(queries, memory)
            attention.append(weights)
        scores = self.mlp_head(self.dropout_feas(self.decoder.norm(queries))).squeeze(-1)
        return scores.T, torch.stack(attention)


class CARZeroNetwork(nn.Module):
    """The three towers under the authors' names, so the state dict matches their file."""

    def __init__(self, bert: BertModel, architecture: Architecture) -> None:
        super().__init__()
        self.text_encoder = TextEncoder(bert)
        self.img_encoder = ImageEncoder(architecture)
        self.fusion_module = FusionModule(architecture)

    def align(self, image_global: Tensor, patches: Tensor, sentences: Tensor, words: Tensor) -> tuple[Tensor, Tensor]:
        """Scores [B, C] = (image-to-text + text-to-image) / 2 and maps [B, C, 196], every pair at once.

        Image-to-text: per image, the C sentence vectors are queries over [global; patches]. The
        map is that pass's attention averaged over layers, the global column dropped.
        Text-to-image: per class, the B global image vectors are queries over [sentence; words].
        Queries never attend to each other, so each pair is independent of the rest of the batch.
        """
        batch, classes, width = image_global.shape[0], sentences.shape[0], image_global.shape[1]
        image_memory = torch.cat([image_global[:, None], patches], dim=1).transpose(0, 1)
        image_to_text, attention = self.fusion_module(image_memory, sentences[:, None].expand(classes, batch, width))
        text_memory = torch.cat([sentences[:, None], words], dim=1).transpose(0, 1)
        text_to_image, _ = self.fusion_module(text_memory, image_global[:, None].expand(batch, classes, width))
        return (image_to_text + text_to_image.T) / 2, attention.mean(0)[..., 1:]


class CARZero(XBenchModel):
    """CARZero, zero-shot: one ``There is <finding>`` prompt per class.

    ``logits`` are the authors' raw score ``(s_i2t + s_t2i) / 2``. They are **not calibrated
    log-odds** (the model was trained with an in-batch softmax over image-text pairs), so AUROC,
    AUPRC and max-F1 are meaningful, while F1 and accuracy at p >= 0.5 use an arbitrary cut.
    ``maps`` are the image-to-text cross-attention over the 14x14 patches of the crop; the base places
    them into the frame through the crop's window (the border the crop removed takes the map's minimum).

    Args:
        checkpoint_dir: folder with ``CARZero_best_model.ckpt`` and ``BioClinicalMPBERT/``
            (``vocab.txt``, ``config.json``); see ``checkpoints/README.md``.
    """

    display_name = "CARZero"
    calibrated_logits = False
    query_mode = "phrase"
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("classifier head", ("network.fusion_module.mlp_head.*",)),
        LayerGroup("fusion decoder", ("network.fusion_module.*",), blocks="network.fusion_module.decoder.layers"),
        LayerGroup("image tower", ("network.img_encoder.*",), blocks="network.img_encoder.model.blocks"),
        LayerGroup("text tower", ("network.text_encoder.*",), blocks="network.text_encoder.model.encoder.layer",
                   text=True),
    )
    #: The authors' ``process_img`` and test transform: the longer side to 256 (OpenCV area), the
    #: shorter zero-padded to a square, CenterCrop 224, ToTensor, the CXR_MAE mean/std; maps repeat
    #: each cell 16x onto the crop.
    preprocess = Preprocess(
        INPUT_SIZE, "longer_side", resize_to=LETTERBOX_SIZE, interpolation="area", library="cv2",
        mean=CXR_MAE_MEAN, std=CXR_MAE_STD, map_upsample="nearest",
    )
    #: The tokens entering the ViT's last attention (after its first norm), class token first.
    cam_target: ClassVar[CamTarget] = CamTarget(
        "network.img_encoder.model.blocks.-1.norm1", "the authors' score (s_i2t + s_t2i) / 2 of the class's prompt",
        prefix_tokens=1)
    #: The sizes the network is built with (tests swap in a tiny one).
    architecture: ClassVar[Architecture] = Architecture()

    def __init__(self, checkpoint_dir: str = "checkpoints/carzero", **kwargs) -> None:
        super().__init__(**kwargs)
        self.checkpoint_dir = checkpoint_folder(checkpoint_dir)
        self.network: CARZeroNetwork | None = None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self.prompts: list[str] = []

    def build(self, classes: list[str]) -> None:
        if self.network is None:
            self.load_weights()
        self.tokenizer = load_tokenizer(self.checkpoint_dir / TEXT_FOLDER,
                                        "CARZero's BioClinicalMPBERT")
        self.prompts = [prompt_for(key) for key in classes]
        for name, value in self.encode_prompts(self.prompts).items():
            self.register_buffer(name, value, persistent=False)

    def load_weights(self) -> None:
        """The three towers from the checkpoint, strictly: once per model, whatever the class sets."""
        folder = self.checkpoint_dir
        file = require_files(folder, (CHECKPOINT_FILE,), "CARZero") / CHECKPOINT_FILE
        text_folder = require_files(folder / TEXT_FOLDER, ("vocab.txt", "config.json"), "CARZero's BioClinicalMPBERT")
        bert = bert_from_config(text_folder, "CARZero's BioClinicalMPBERT")
        if bert.config.hidden_size != self.architecture.width:
            raise ValueError(
                f"{text_folder / 'config.json'}: hidden_size {bert.config.hidden_size}, but CARZero's towers are "
                f"{self.architecture.width} wide; use the config.json of Laihaoran/BioClinicalMPBERT"
            )
        network = CARZeroNetwork(bert, self.architecture)
        # the strict load also checks that the file's two copies of the shared decoder norm agree
        loaded = load_checkpoint(network, file, CHECKPOINT_LAYOUT)
        read_hyper_parameters(loaded, file, expected_hyper_parameters(self.architecture))
        self.network = network.eval()

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> dict[str, Tensor]:
        """What ``forward`` reads for N prompts, as the authors' text tower: word slots ``words``
        [N, 97, D] and sentence vectors ``sentences`` [N, D], on the model's device."""
        tokens, merge = tokenize_prompts(
            self.tokenizer, prompts, "CARZero", f"{TEXT_FOLDER}/vocab.txt the authors' vocabulary")
        tokens = tokens.to(self.device)
        words, sentences = self.network.text_encoder(tokens["input_ids"], tokens["attention_mask"], merge)
        return {"words": words, "sentences": sentences}

    def encode_phrases(self, phrases: list[str]) -> dict[str, Tensor]:
        """Each phrase as its prompt, as written: a report phrase is already the kind of text CARZero's
        ``There is <finding>`` prompts are. A phrase the authors' cleaning empties (it drops a
        one-word sentence) becomes ``There is <phrase>``, the prompts' own form."""
        return self.encode_prompts([phrase if clean_text(phrase) else f"There is {phrase}" for phrase in phrases])

    def forward(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        if self.network is None:
            raise RuntimeError("CARZero is not built: call build(classes) first (trainer.test does it in setup)")
        image_global, patches = self.network.img_encoder(pixels)
        logits, attention = self.network.align(image_global, patches, self.sentences, self.words)
        return logits, attention.unflatten(-1, (GRID, GRID))
