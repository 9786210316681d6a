"""RadZero (Park et al., NeurIPS 2025): XrayDINOv2 with two further Transformer blocks, all-mpnet-base-v2,
and VL-CABS, a cross-attention whose weights are cosine similarities on a fixed scale. CC BY-NC 4.0.

The published loader is ``AutoModel.from_pretrained(..., trust_remote_code=True)``: code XBench never
runs. This is a port of the authors' inference path (``deepnoid-ai/RadZero`` at 656ae5f,
``exp/cxr_pt/model`` and ``exp/cxr_pt/inference``), built from transformers' own ``Dinov2Model``,
``Dinov2Encoder`` and ``MPNetModel`` (what the authors' classes wrap) and the folder's files, offline:

- **Checkpoint** (``model.safetensors``, ``CxrAlignModel``'s state dict as ``save_pretrained`` writes it):
  ``vision_model.*`` (``Dinov2Model``), ``text_model.*`` (``MPNetModel``, its pooler unused),
  ``align_transformer.transformer_layers.*`` (a ``Dinov2Encoder`` of two blocks), and VL-CABS' own
  ``loss_fns.RadZeroLoss.{layer_norm.*, loss_temperature}``; the ViT blocks' attention under the names of
  the authors' transformers, renamed to the installed one's by declaration (`DINOV2_RENAMES`). The
  architecture is ``config.json``'s (`RadZeroNet`), its recipe checked against the published one (`RECIPE`).
- **Input** (`RadZeroPreprocess`): the evaluation's ``collate_fn`` stretches each image to 0..255 with
  OpenCV's ``normalize(NORM_MINMAX, CV_8U)``; the folder's ``BlipImageProcessor`` then squashes it to
  518 x 518 (PIL, bicubic) and applies its mean/std.
- **Vision**: the tower's last hidden state (after its final norm) through the two extra blocks; the
  position embeddings are resized to the 37 x 37 grid by the rule of the transformers the authors pin
  (4.39.3: bicubic by the scale factor ``(37 + 0.1) / side``, `pinned_position_embeddings`).
- **Text**: the folder's tokenizer (``padding=True, truncation=True``), MPNet's token states mean-pooled
  over the attention mask (sentence-transformers' pooling), no projection.
- **VL-CABS** (``RadZeroLoss``/``SimilarityLogit``, ``sim_op: cos``): text and image tokens through the
  same layer norm; ``s = cos(text, token) / tau`` over the class token and every patch, ``tau =
  exp(loss_temperature)``; the tokens averaged by ``softmax(s)``; the logit ``cos(text, average) / tau``
  (``compute_logits``), whose sigmoid is the similarity probability.
- **Map**: ``similarity_scores``, ``s`` on the 37 x 37 patches (the class token left out), whose
  sigmoid is the authors' similarity map; they upsample it bilinearly onto the image, as XBench does
  onto its window (the whole frame).
- **Prompts**: the evaluation's ``There is <finding>`` sentences, CARZero's (``prompt_for``: RadZero
  evaluates with CARZero's prompt files); a report phrase (MS-CXR) is encoded as it is written.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import AutoTokenizer, Dinov2Config, Dinov2Model, MPNetConfig, MPNetModel
from transformers.models.dinov2.modeling_dinov2 import Dinov2Encoder

from xbench.files import present, read_json_object
from xbench.geometry.image import CodedImage
from xbench.geometry.precision import float32
from xbench.geometry.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, Preprocess
from xbench.models.base import LayerGroup, XBenchModel
from xbench.models.carzero import prompt_for
from xbench.models.checkpoints import check_safetensors, damaged_safetensors, load_state_dict_strict, require_finite
from xbench.models.explainers import CamTarget
from xbench.models.hub import checkpoint_folder
from xbench.models.text import require_files

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROCESSOR_FILE = "preprocessor_config.json"
#: The tokenizer of all-mpnet-base-v2 as transformers saves it: its fast file or its WordPiece vocabulary.
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
#: The published recipe (``exp/cxr_pt/configs/radzero.yaml``), dotted keys of ``config.json``: the only
#: one this port computes. A key the file lacks takes the authors' code default (`CODE_DEFAULTS`).
RECIPE: dict[str, object] = {
    "compute_logits_type": "radzero",
    "text_config.use_text_projection": False,
    "text_config.use_cls_token": False,
    "align_transformer_config.use_layer_norm": False,
    "loss.RadZeroLoss.sim_op": "cos",
    "loss.RadZeroLoss.attn_temperature": None,
    "loss.RadZeroLoss.use_vision_cls_token": True,
    "loss.RadZeroLoss.use_layer_norm": True,
}
#: ``RadZeroLoss.__init__``'s defaults, which the published config leaves unsaid.
CODE_DEFAULTS = {"loss.RadZeroLoss.attn_temperature": None, "loss.RadZeroLoss.use_vision_cls_token": True,
                 "loss.RadZeroLoss.use_layer_norm": True}
#: The image processor class of XrayDINOv2 the authors' code expects (their ``BlipImageProcessor``
#: branch, ``# XrayDINOv2``), and its defaults where the file is silent.
PROCESSOR_CLASS = "BlipImageProcessor"
PROCESSOR_DEFAULTS = {"do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255,
                      "do_normalize": True, "image_mean": OPENAI_CLIP_MEAN, "image_std": OPENAI_CLIP_STD}
#: PIL's filter codes, as ``preprocessor_config.json`` writes ``resample``.
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "area"}
#: The ViT blocks' attention as the authors' transformers (4.39.3) names it in the file -> as the
#: installed one names it in ``Dinov2Layer`` (transformers 5 renamed the projections).
DINOV2_RENAMES = (
    (".attention.attention.query.", ".attention.q_proj."), (".attention.attention.key.", ".attention.k_proj."),
    (".attention.attention.value.", ".attention.v_proj."), (".attention.output.dense.", ".attention.o_proj."),
)
#: What the CAM explainers explain.
LOGIT = "the VL-CABS logit cos(text, softmax-weighted tokens) / tau"


def _dotted(config: dict, key: str):
    value = config
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(key)
        value = value[part]
    return value


def check_recipe(config: dict, path: Path) -> None:
    """``config`` (``config.json``) states the published recipe (`RECIPE`); else an error naming each
    setting, its value and the one XBench computes."""
    differing = []
    for key, expected in RECIPE.items():
        try:
            value = _dotted(config, key)
        except KeyError:
            if key not in CODE_DEFAULTS:
                differing.append(f"{key} is missing (the published config says {expected!r})")
                continue
            value = CODE_DEFAULTS[key]
        if value != expected or type(value) is not type(expected):
            differing.append(f"{key} = {value!r}, the published recipe's is {expected!r}")
    if differing:
        raise ValueError(f"RadZero: {path} is not the published RadZero recipe: {'; '.join(differing)}. XBench ports "
                         "only that one; use the authors' own config.json")


def architecture(folder: Path) -> tuple[Dinov2Config, MPNetConfig, Dinov2Config]:
    """The vision tower's, text tower's and extra blocks' configs from ``folder/config.json``, once it
    states the published recipe (`check_recipe`)."""
    path = folder / CONFIG_FILE
    config = read_json_object(path, "RadZero's CxrAlignConfig", "fetch the checkpoint's own config.json")
    check_recipe(config, path)
    sections = {}
    for name, fields in (("vision_config", ("hidden_size", "num_hidden_layers", "patch_size", "image_size")),
                         ("text_config", ("hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings")),
                         ("align_transformer_config", ("hidden_size", "num_hidden_layers"))):
        section = config.get(name)
        lacking = [field for field in fields if not isinstance(section, dict) or field not in section]
        if lacking:
            raise ValueError(f"RadZero: {path} has no {name} with {', '.join(lacking)}: not RadZero's config.json "
                             "(docs/models/radzero.md says what it holds)")
        sections[name] = {key: value for key, value in section.items() if key != "model_type"}
    vision, text = Dinov2Config(**sections["vision_config"]), MPNetConfig(**sections["text_config"])
    align = Dinov2Config(**sections["align_transformer_config"])
    vl_cabs = config["loss"]["RadZeroLoss"].get("hidden_dim", 768)  # RadZeroLoss' default
    widths = {vision.hidden_size, text.hidden_size, align.hidden_size, vl_cabs}
    if len(widths) != 1:
        raise ValueError(f"RadZero: {path} gives the towers, the extra blocks and VL-CABS different widths "
                         f"({sorted(widths)}): they share one space")
    return vision, text, align


def module_key(key: str) -> str:
    """A key of the published file under the installed transformers' name (`DINOV2_RENAMES`)."""
    for published, installed in DINOV2_RENAMES:
        key = key.replace(published, installed)
    return key


def published_key(key: str) -> str:
    """A key of the module under the published file's name: `module_key`'s inverse."""
    for published, installed in DINOV2_RENAMES:
        key = key.replace(installed, published)
    return key


def pinned_position_embeddings(self, embeddings: Tensor, height: int, width: int) -> Tensor:
    """``Dinov2Embeddings.interpolate_pos_encoding`` as transformers 4.39.3 (the authors' pin) computes
    it: bicubic by the scale factor ``(grid + 0.1) / side`` in float32, where newer versions resize to
    the grid's size (another sampling of the same embeddings)."""
    patches, positions = embeddings.shape[1] - 1, self.position_embeddings.shape[1] - 1
    if patches == positions and height == width:
        return self.position_embeddings
    side, dim = math.sqrt(positions), embeddings.shape[-1]
    rows, columns = height // self.config.patch_size + 0.1, width // self.config.patch_size + 0.1
    grid = self.position_embeddings[:, 1:].reshape(1, int(side), int(side), dim).permute(0, 3, 1, 2)
    grid = F.interpolate(grid.to(torch.float32), scale_factor=(float(rows / side), float(columns / side)),
                         mode="bicubic", align_corners=False).to(self.position_embeddings.dtype)
    return torch.cat((self.position_embeddings[:, :1], grid.permute(0, 2, 3, 1).reshape(1, -1, dim)), dim=1)


class AlignTransformer(nn.Module):
    """The two trainable blocks after the vision tower, in the authors' key layout."""

    def __init__(self, config: Dinov2Config) -> None:
        super().__init__()
        self.transformer_layers = Dinov2Encoder(config)

    def forward(self, tokens: Tensor) -> Tensor:
        return self.transformer_layers(tokens).last_hidden_state


class VLCABS(nn.Module):
    """``RadZeroLoss``'s weights: the layer norm text and image tokens share, and the log temperature."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(width)
        self.loss_temperature = nn.Parameter(torch.tensor([math.log(0.07)]))


class RadZeroNet(nn.Module):
    """``CxrAlignModel``'s modules under its names, built from the folder's configs."""

    def __init__(self, vision: Dinov2Config, text: MPNetConfig, align: Dinov2Config) -> None:
        super().__init__()
        self.vision_model = Dinov2Model(vision)
        self.vision_model.embeddings.interpolate_pos_encoding = types.MethodType(
            pinned_position_embeddings, self.vision_model.embeddings)
        self.text_model = MPNetModel(text)
        self.align_transformer = AlignTransformer(align)
        self.loss_fns = nn.ModuleDict({"RadZeroLoss": VLCABS(align.hidden_size)})


@dataclass(frozen=True)
class RadZeroPreprocess(Preprocess):
    """The evaluation's ``cv2.normalize(x, None, 0, 255, NORM_MINMAX, CV_8U)`` of the file's values, then
    the fields' resize. OpenCV rounds in its own arithmetic, so it runs on the integers the authors hold:
    an 8-bit file's (every value on the 8-bit grid) or a 16-bit file's."""

    def __call__(self, image: np.ndarray | CodedImage, frame: int) -> tuple[Tensor, Tensor]:
        pixels = image.to_float() if isinstance(image, CodedImage) else image
        eight = np.rint(pixels.astype(np.float64) * 255)
        if np.array_equal(eight * 257, np.rint(pixels.astype(np.float64) * 65535)):
            values = eight.astype(np.uint8)
        else:
            values = np.rint(pixels.astype(np.float64) * 65535).astype(np.uint16)
        stretched = cv2.normalize(values, None, 0, 255, norm_type=cv2.NORM_MINMAX, dtype=cv2.CV_8U)
        return super().__call__((stretched / np.float32(255)).astype(np.float32), frame)


def processor_preprocess(folder: Path) -> RadZeroPreprocess:
    """``folder``'s ``preprocessor_config.json`` (XrayDINOv2's ``BlipImageProcessor``) as the authors'
    transformers 4.39.3 applies it: the square resize by PIL, its filter, /255, mean/std. A setting
    without a counterpart is an error naming the file."""
    path = folder / PROCESSOR_FILE
    settings = {**PROCESSOR_DEFAULTS, **read_json_object(path, "an image processor's settings",
                                                          "fetch the checkpoint's own preprocessor_config.json")}
    kind = settings.get("image_processor_type")
    size = settings.get("size")
    problems = []
    if kind != PROCESSOR_CLASS:
        problems.append(f"image_processor_type {kind!r}, not XrayDINOv2's {PROCESSOR_CLASS}")
    if not settings["do_resize"] or not isinstance(size, dict) or set(size) != {"height", "width"} or (
            size["height"] != size["width"]):
        problems.append(f"size {size!r} (do_resize {settings['do_resize']}): RadZero squashes to one square side")
    if not settings["do_rescale"] or not math.isclose(float(settings["rescale_factor"]), 1 / 255, rel_tol=1e-6):
        problems.append(f"rescale_factor {settings['rescale_factor']} (do_rescale {settings['do_rescale']}), not 1/255")
    if settings["resample"] not in RESAMPLE:
        problems.append(f"resample {settings['resample']!r}, none of PIL's filters {RESAMPLE}")
    if problems:
        raise ValueError(f"RadZero: {path}: {'; '.join(problems)}; fetch the checkpoint's own file")
    mean, std = ((tuple(map(float, settings["image_mean"])), tuple(map(float, settings["image_std"])))
                 if settings["do_normalize"] else ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    return RadZeroPreprocess(int(size["height"]), "squash", interpolation=RESAMPLE[settings["resample"]],
                             library="pil", mean=mean, std=std, map_upsample="bilinear")


class RadZero(XBenchModel):
    """RadZero from the folder its authors publish (see the module docstring for the recipe).

    Args:
        checkpoint_dir: the folder (or its hub id, ``hf-hub:Deepnoid/RadZero``): ``config.json``,
            ``model.safetensors``, ``preprocessor_config.json`` and all-mpnet-base-v2's tokenizer
            files (docs/models/radzero.md).
    """

    display_name = "RadZero"
    query_mode = "phrase"
    cam_target: ClassVar[CamTarget] = CamTarget("net.align_transformer.transformer_layers.layer.-1.norm1", LOGIT,
                                                prefix_tokens=1)
    #: From the output down: VL-CABS' norm, the extra blocks, the vision tower; the text tower apart
    #: (its prompts encoded again).
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("VL-CABS", ("net.loss_fns.*",), text=True),
        LayerGroup("align transformer", ("net.align_transformer.*",),
                   blocks="net.align_transformer.transformer_layers.layer"),
        LayerGroup("vision tower", ("net.vision_model.*",), blocks="net.vision_model.encoder.layer"),
        LayerGroup("text tower", ("net.text_model.*",), blocks="net.text_model.encoder.layer", text=True),
    )

    def __init__(self, checkpoint_dir: str = "checkpoints/radzero", **kwargs) -> None:
        super().__init__(**kwargs)
        self.checkpoint_dir = checkpoint_folder(checkpoint_dir)
        self.net: RadZeroNet | None = None
        self.tokenizer = None
        self._preprocess: RadZeroPreprocess | None = None
        #: class key -> its prompt, set by ``build``.
        self.prompts: dict[str, str] = {}

    @property
    def preprocess(self) -> RadZeroPreprocess:
        if self._preprocess is None:
            folder = require_files(self.checkpoint_dir, (PROCESSOR_FILE,), "RadZero")
            self._preprocess = processor_preprocess(folder)
        return self._preprocess

    def load(self) -> tuple[RadZeroNet, object]:
        """The network with the folder's weights, strictly, and its tokenizer, once every file is there."""
        folder = require_files(self.checkpoint_dir, (CONFIG_FILE, WEIGHTS_FILE, PROCESSOR_FILE), "RadZero")
        if not any(present(folder / name) for name in TOKENIZER_FILES):
            raise FileNotFoundError(f"RadZero: no tokenizer in {folder}: it needs {' or '.join(TOKENIZER_FILES)} "
                                    "(all-mpnet-base-v2's, as the checkpoint publishes them); copy them there")
        preprocess = self.preprocess
        vision, text, align = architecture(folder)
        if preprocess.size % vision.patch_size:
            raise ValueError(f"RadZero: {folder / PROCESSOR_FILE} makes {preprocess.size}-pixel inputs, not a "
                             f"multiple of the vision tower's {vision.patch_size}-pixel patches "
                             f"({folder / CONFIG_FILE})")
        net = RadZeroNet(vision, text, align)
        path = folder / WEIGHTS_FILE
        check_safetensors(path)
        try:
            state = load_file(str(path))
        except Exception as error:  # noqa: BLE001 -- safetensors raises its own types for a damaged body
            raise damaged_safetensors(path, error) from error
        require_finite(state, f"RadZero: {path}")
        state = {module_key(key): value for key, value in state.items()}
        load_state_dict_strict(net, state, file=path,
                               hint=f"its config.json ({folder / CONFIG_FILE}) must be the one saved with these "
                                    "weights")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as error:  # noqa: BLE001 -- a damaged file fails inside tokenizers
            reason = " ".join(str(error).split())
            raise ValueError(f"RadZero: transformers cannot read the tokenizer in {folder} ({type(error).__name__}: "
                             f"{reason}); fetch the checkpoint's tokenizer files again") from error
        if tokenizer.pad_token_id != text.pad_token_id or len(tokenizer) > text.vocab_size:
            raise ValueError(f"RadZero: the tokenizer in {folder} (pad id {tokenizer.pad_token_id}, {len(tokenizer)} "
                             f"tokens) is not the text tower's (pad id {text.pad_token_id}, {text.vocab_size} "
                             f"embeddings, {folder / CONFIG_FILE}): use the checkpoint's own tokenizer files")
        return net.eval().requires_grad_(False), tokenizer

    @torch.no_grad()
    def encode(self, texts: list[str]) -> Tensor:
        """Normalised VL-CABS text features [len(texts), D]: the authors' tokenisation, MPNet's token
        states mean-pooled over the mask, the shared layer norm."""
        device = self.net.loss_fns["RadZeroLoss"].loss_temperature.device
        tokens = self.tokenizer(texts, padding=True, truncation=True, return_tensors="pt").to(device)
        states = self.net.text_model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])[0]
        mask = tokens["attention_mask"].unsqueeze(-1).to(states.dtype)
        pooled = (states * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(self.net.loss_fns["RadZeroLoss"].layer_norm(pooled).float(), dim=-1)

    def build(self, classes: list[str]) -> None:
        if self.net is None:
            self.net, self.tokenizer = self.load()
        self.prompts = {key: prompt_for(key) for key in classes}
        self.register_buffer("text_features", self.encode(list(self.prompts.values())), persistent=False)

    def encode_phrases(self, phrases: list[str]) -> dict[str, Tensor]:
        """A report phrase as it is written (the authors' MS-CXR grounding encodes ``det[0]["name"]``)."""
        return {"text_features": self.encode(phrases)}

    def forward(self, model_input: Tensor) -> tuple[Tensor, Tensor]:
        """Model input [B, 3, 518, 518] -> log-odds [B, C] and the similarity scores [B, C, 37, 37]."""
        tokens = self.net.align_transformer(self.net.vision_model(pixel_values=model_input).last_hidden_state)
        head = self.net.loss_fns["RadZeroLoss"]
        side = model_input.shape[-1] // self.net.vision_model.config.patch_size
        with float32(tokens):
            keys = F.normalize(head.layer_norm(tokens.float()), dim=-1)
            temperature = head.loss_temperature.float().exp()
            scores = torch.einsum("cd,btd->bct", self.text_features, keys) / temperature
            attended = F.normalize(torch.softmax(scores, dim=-1) @ keys, dim=-1)
            logits = (attended * self.text_features).sum(-1) / temperature
            return logits, scores[:, :, 1:].unflatten(-1, (side, side))
