"""Any transformers CLIP or SigLIP checkpoint folder as a model: MedSigLIP, the CheXagent team's
XrayCLIP and XraySigLIP encoders, and the next one a researcher has.

Such a folder is what ``save_pretrained`` writes: ``config.json``, the image processor's settings
(``processor_config.json`` since transformers 5, ``preprocessor_config.json`` before), the
tokenizer's files and ``model.safetensors``. XBench reads every fact from it, offline (nothing is
looked up on a hub), only when every file it needs is there and they agree (the tokenizer is the
text tower's), and runs the model as transformers defines it:

- **Architecture**: ``config.json``'s ``model_type``, ``clip`` (``CLIPModel``) or ``siglip``
  (``SiglipModel``), loaded by transformers from the folder in float32 and checked against its
  loading report (nothing missing, reshaped or left over but the ``position_ids`` buffers older
  versions saved).
- **Input**: the image processor the folder's settings make
  ([`image_processor_file`][xbench.models.hf_dual_encoder.image_processor_file]), translated into a
  [`Preprocess`][xbench.geometry.preprocess.Preprocess]
  ([`processor_preprocess`][xbench.models.hf_dual_encoder.processor_preprocess]): resize rule and
  size, centre crop (offset floored, as transformers crops), filter, the processor's own 8-bit resize
  (torchvision's antialiased one for transformers' default processors since version 5, PIL for the
  PIL ones), mean/std. A setting a ``Preprocess`` cannot state is an error, never approximated.
- **Text**: the folder's own tokenizer, whose ids must be the text tower's and whose prompts must
  keep some words ([`check_tokenizer`][xbench.models.hf_dual_encoder.HFDualEncoder.check_tokenizer]).
  CLIP pads to the longest prompt with its attention mask (its causal text tower pools the
  end-of-text token, so padding changes nothing); SigLIP pads to its 64 positions and gets
  ``input_ids`` alone, as it was trained and as Google's MedSigLIP serving feeds it (the padding is
  part of what its last-token pooling reads).
- **Score**, by each model's own rule: CLIP, the log-odds of the 2-way softmax over the prompt pair,
  ``exp(logit_scale) * (cos(image, pos) - cos(image, neg))``, as XBench's other CLIPs; SigLIP, its own
  logit of the positive prompt, ``exp(logit_scale) * cos(image, pos) + logit_bias``, whose sigmoid is
  the model's probability that the prompt describes the image (SigLIP scores each text on its own;
  a negative prompt has no place in its rule and is refused).
- **Map** (``patch_text_similarity``): the cosine of each patch token of the last block with the
  positive prompt, the token taken to the joint space the way the image embedding is. CLIP: through
  ``post_layernorm`` and ``visual_projection``, as the class token. SigLIP has no class token: its
  image embedding is an attention-pooling head (a learnt probe attends over the patches, then an MLP
  with a residual); each patch goes through that head as if the probe attended to it alone (the
  attention's value and output projections, then the head's norm, MLP and residual). A CAM
  explainer reads the last block's first-norm output (as CLIP's) and explains each finding's logit.
- **Phrases** (MS-CXR): the phrase in the positive prompt (and CLIP's negative), as a finding's text.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import AutoImageProcessor, AutoTokenizer, CLIPModel, SiglipModel

from xbench.files import present, read_json_object
from xbench.models.base import LayerGroup
from xbench.models.hub import snapshot_hub_id
from xbench.models.clip import PAIR_LOGIT, OpenClipDualEncoder
from xbench.models.explainers import CamTarget
from xbench.geometry.precision import float32
from xbench.geometry.preprocess import Preprocess
from xbench.models.text import load_pretrained, require_files

#: ``config.json``'s ``model_type`` -> the transformers class and how it scores a finding.
ARCHITECTURES = {"clip": CLIPModel, "siglip": SiglipModel}
#: What a CAM explainer explains in a SigLIP folder: its logit of the positive prompt.
SIGLIP_LOGIT = "the positive prompt's logit, exp(logit_scale) * cos(image, pos) + logit_bias"
#: The negative prompt of a CLIP folder's pair unless one is given (CheXzero's, as XBench's other CLIPs).
CLIP_NEGATIVE = "no {}"
#: PIL's filter codes, as ``preprocessor_config.json`` writes ``resample``, in ``Preprocess``'s names.
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "area"}
#: Weights a folder may hold beyond the model's: the ``position_ids`` buffers transformers < 4.31 saved.
EXTRA_KEYS = ("embeddings.position_ids",)
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
#: Where transformers reads the image processor's settings, first found first: nested under
#: ``image_processor`` in ``processor_config.json`` (what ``save_pretrained`` writes since transformers 5),
#: else ``preprocessor_config.json`` (older versions, and the hub's folders).
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
#: The tokenizer files each ``model_type`` needs, as alternatives: CLIP's BPE as transformers 5 saves it
#: (``tokenizer.json``) or as older versions did (``vocab.json`` and ``merges.txt``); SigLIP's
#: SentencePiece model. Without them transformers builds an empty tokenizer and says nothing.
TOKENIZER_FILES = {"clip": (("tokenizer.json",), ("vocab.json", "merges.txt")), "siglip": (("spiece.model",),)}
#: The tokenizer's JSON files, read first so that a damaged one is named.
TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                  "vocab.json")


def json_object(path: Path) -> dict:
    """The JSON object in ``path``; an error naming the file if it is damaged or not an object."""
    return read_json_object(path, "an object of settings", "fetch the checkpoint's own file")


def image_processor_file(folder: Path, what: str) -> Path:
    """The file transformers reads ``folder``'s image processor from
    ([`PROCESSOR_FILES`][xbench.models.hf_dual_encoder.PROCESSOR_FILES], in its order); an error
    naming the folder and both files when neither holds the settings."""
    nested, legacy = (folder / name for name in PROCESSOR_FILES)
    if present(nested):
        settings = json_object(nested).get("image_processor")
        if isinstance(settings, dict):
            return nested
        if settings is not None:
            raise ValueError(f"{what}: {nested} has an image_processor that is not an object of settings; fetch "
                             "the checkpoint's own file")
    if present(legacy):
        json_object(legacy)
        return legacy
    raise FileNotFoundError(f"{what}: no image processor settings in {folder}: neither processor_config.json with "
                            "an image_processor entry nor preprocessor_config.json; save the checkpoint's processor "
                            "there (its save_pretrained writes processor_config.json) or copy the hub's file")


def _size(value) -> dict[str, int]:
    """A processor's ``size``/``crop_size`` (a dict, or transformers 5's ``SizeDict``) without its empty entries."""
    items = value.items() if hasattr(value, "items") else vars(value).items()
    return {key: int(number) for key, number in items if number is not None}


def check_tokenizer_files(folder: Path, model_type: str, what: str) -> None:
    """``folder`` holds the tokenizer files ``model_type`` needs
    ([`TOKENIZER_FILES`][xbench.models.hf_dual_encoder.TOKENIZER_FILES]), and its JSON ones read;
    else an error naming the folder, the files and the fix."""
    alternatives = TOKENIZER_FILES[model_type]
    if not any(all(present(folder / name) for name in names) for names in alternatives):
        needed = " or ".join(" and ".join(names) for names in alternatives)
        raise FileNotFoundError(f"{what}: no {model_type} tokenizer in {folder}: it needs {needed}; copy the "
                                "checkpoint's tokenizer files there (its tokenizer's save_pretrained writes them)")
    for name in TOKENIZER_JSON:
        if present(folder / name):
            json_object(folder / name)


def processor_preprocess(folder: str | Path, what: str = "HFDualEncoder") -> Preprocess:
    """The image processor of ``folder`` (its settings' file:
    [`image_processor_file`][xbench.models.hf_dual_encoder.image_processor_file]; built as
    transformers' ``AutoImageProcessor`` makes it, its class defaults filled in) as a
    [`Preprocess`][xbench.geometry.preprocess.Preprocess] that gives its output from the native
    image; an error naming the file for any setting it cannot state."""
    folder = require_files(folder, (), what)
    where = f"{what}: {image_processor_file(folder, what)}"
    try:
        processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"{where}: transformers cannot build its image processor ({type(error).__name__}: "
                         f"{' '.join(str(error).split())}); fetch the checkpoint's own file") from error
    try:
        return _as_preprocess(processor)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from error


def _as_preprocess(processor) -> Preprocess:
    """The [`Preprocess`][xbench.geometry.preprocess.Preprocess] that states ``processor``; an error
    for a setting it cannot state."""
    backend = getattr(processor, "backend", "torchvision" if type(processor).__name__.endswith("Fast") else "pil")
    if backend not in ("torchvision", "pil"):
        raise ValueError(f"{type(processor).__name__} resizes with {backend!r}; XBench states torchvision's "
                         "and PIL's 8-bit resizes")
    if not processor.do_resize:
        raise ValueError("do_resize is false; the model needs its input size from any radiograph")
    crops = getattr(processor, "do_center_crop", False)
    try:
        rescale_factor, resample, size = float(processor.rescale_factor), int(processor.resample), _size(processor.size)
        crop = _size(processor.crop_size) if crops else {}
        mean, std = ((tuple(map(float, processor.image_mean)), tuple(map(float, processor.image_std)))
                     if processor.do_normalize else ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)))
    except (TypeError, ValueError) as error:
        raise ValueError(f"a setting that is not a number or a list of numbers ({error}); write it as the "
                         "checkpoint's own file does") from error
    if not processor.do_rescale or not math.isclose(rescale_factor, 1 / 255, rel_tol=1e-6):
        raise ValueError(f"do_rescale {processor.do_rescale}, rescale_factor {rescale_factor}; "
                         "XBench scales 8-bit values by 1/255 before mean/std")
    if getattr(processor, "do_pad", False):
        raise ValueError("do_pad is true; XBench's inputs are not padded")
    if resample not in RESAMPLE:
        raise ValueError(f"resample {resample} has no counterpart; XBench has {RESAMPLE}")
    if set(size) == {"shortest_edge"}:
        resize, resize_to = "shorter_side", size["shortest_edge"]
    elif set(size) == {"height", "width"} and size["height"] == size["width"]:
        resize, resize_to = "squash", size["height"]
    else:
        raise ValueError(f"size {size}; XBench resizes the shorter side or both sides to one square size")
    side = resize_to
    if crops:
        if set(crop) != {"height", "width"} or crop["height"] != crop["width"] or not 0 < crop["height"] <= resize_to:
            raise ValueError(f"crop_size {crop} after a resize to {resize_to}; XBench crops a positive square "
                             "no larger than the resized image")
        side = crop["height"]
    elif resize == "shorter_side":
        raise ValueError("a shorter-side resize without a centre crop gives non-square inputs")
    return Preprocess(side, resize, resize_to=resize_to, interpolation=RESAMPLE[resample], library=backend,
                      crop_rounding="floor", mean=mean, std=std, map_upsample="bilinear")


def pooling_head_tokens(head: nn.Module, tokens: Tensor) -> Tensor:
    """SigLIP's attention-pooling head applied to each token [B, N, D] on its own: the output it would
    give if its probe attended to that token alone (value and output projections of the attention,
    then ``h + MLP(LayerNorm(h))``) -> [B, N, D]."""
    attention = head.attention
    width = tokens.shape[-1]
    values = F.linear(tokens, attention.in_proj_weight[2 * width:], attention.in_proj_bias[2 * width:])
    pooled = attention.out_proj(values)
    return pooled + head.mlp(head.layernorm(pooled))


def folder_name(folder: Path) -> str:
    """A folder's name for a run: a hub snapshot's is its repository's, not its commit hash."""
    found = snapshot_hub_id(folder.resolve())
    return found[0].repo.rpartition("/")[2] if found else folder.resolve().name


class HFDualEncoder(OpenClipDualEncoder):
    """A transformers ``CLIPModel`` or ``SiglipModel`` folder (see the module docstring for the recipe).

    Args:
        checkpoint_dir: the folder as ``save_pretrained`` wrote it, or a hub id ``hf-hub:<org>/<name>[@revision]``
            in the local Hugging Face cache.
        name: the model's name in results folders, tables and reports; default: the folder's name (a hub
            snapshot's: the repository's name).
        pos_template: the positive prompt; ``{}`` is replaced by the finding's text (or a phrase).
        neg_template: a CLIP folder's negative prompt (default ``"no {}"``); a SigLIP folder refuses one.
    """

    query_mode = "phrase"
    #: CLIP folders project with ``visual_projection``/``text_projection``, SigLIP folders with their heads.
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("projections", ("model.visual_projection.*", "model.text_projection.*", "model.vision_model.head.*",
                                   "model.text_model.head.*", "model.vision_model.post_layernorm.*",
                                   "model.text_model.final_layer_norm.*"), text=True),
        LayerGroup("image tower", ("model.vision_model.*",), blocks="model.vision_model.encoder.layers"),
        LayerGroup("text tower", ("model.text_model.*",), blocks="model.text_model.encoder.layers", text=True),
    )
    #: Where a CAM explainer reads a folder of each ``model_type``: the tokens entering the last
    #: block's attention (after its first norm), as CLIP's; a CLIP folder's class token first
    #: (SigLIP has none); the score is the model's own logit.
    cam_targets: ClassVar[dict[str, CamTarget]] = {
        "clip": CamTarget("model.vision_model.encoder.layers.-1.layer_norm1", PAIR_LOGIT, prefix_tokens=1),
        "siglip": CamTarget("model.vision_model.encoder.layers.-1.layer_norm1", SIGLIP_LOGIT, prefix_tokens=0),
    }

    def __init__(
        self,
        checkpoint_dir: str,
        name: str | None = None,
        pos_template: str = "{}",
        neg_template: str | None = None,
        **kwargs,
    ) -> None:
        super().__init__(checkpoint_dir, pos_template, neg_template or CLIP_NEGATIVE, **kwargs)
        self.negative_given = neg_template is not None
        self.label = name or folder_name(self.checkpoint_dir)
        self.model_type: str | None = None
        self._preprocess: Preprocess | None = None

    def model_name(self) -> str:
        """The run's name (``name``, else the folder's): one class serves many checkpoints."""
        return self.label

    @property
    def preprocess(self) -> Preprocess:
        if self._preprocess is None:
            self._preprocess = processor_preprocess(self.checkpoint_dir, self.label)
        return self._preprocess

    # -- loading -------------------------------------------------------------------------------

    def load_model(self) -> tuple[nn.Module, Callable]:
        """The model and its tokenizer, once every file the folder needs is there and readable (the
        image processor's is read by [`preprocess`][xbench.models.hf_dual_encoder.HFDualEncoder.preprocess]) and they
        agree."""
        folder = require_files(self.checkpoint_dir, ("config.json",), self.label)
        model_type = json_object(folder / "config.json").get("model_type")
        if not any(present(folder / name) for name in WEIGHT_FILES):
            raise FileNotFoundError(f"{self.label}: no {' or '.join(WEIGHT_FILES)} in {folder}; place the "
                                    "checkpoint's safetensors there (docs/models/hf_dual_encoder.md)")
        if model_type not in ARCHITECTURES:
            raise ValueError(f"{self.label}: {folder / 'config.json'} has model_type {model_type!r}; "
                             f"XBench runs {' and '.join(ARCHITECTURES)} dual encoders")
        if model_type == "siglip" and self.negative_given:
            raise ValueError(f"{self.label}: a SigLIP folder scores each prompt on its own (the sigmoid of its "
                             "logit with its learnt bias); drop --model.neg_template, which only a CLIP pair uses")
        preprocess = self.preprocess  # the image processor's file read and checked before the weights
        check_tokenizer_files(folder, model_type, self.label)
        model = load_pretrained(ARCHITECTURES[model_type], folder, self.label, EXTRA_KEYS)
        config = model.config
        if model_type == "siglip" and not config.vision_config.vision_use_head:
            raise ValueError(f"{self.label}: {folder / 'config.json'} sets vision_use_head false: the model "
                             "has no image embedding to score with")
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as error:  # noqa: BLE001 -- a damaged file fails inside tokenizers or sentencepiece
            raise ValueError(f"{self.label}: transformers cannot read the tokenizer in {folder} "
                             f"({type(error).__name__}: {' '.join(str(error).split())}); fetch the checkpoint's "
                             "tokenizer files again") from error
        self.model_type = model_type
        self.check_tokenizer(tokenizer, config, folder)
        side = config.vision_config.image_size
        if preprocess.size != side:
            raise ValueError(f"{self.label}: the processor in {folder} makes {preprocess.size}-pixel inputs "
                             f"but the vision tower takes {side}")
        return model, tokenizer

    def check_tokenizer(self, tokenizer, config, folder: Path) -> None:
        """The tokenizer is the text tower's: its ids are exactly the rows of the tower's embedding
        (``text_config.vocab_size``), so its special ids are too; it has an end-of-text and a padding
        token (both families pad); and a CLIP's end-of-text is the token the tower pools, the
        config's ``eos_token_id`` (or, for configs older than transformers 4.31, which say 2, the
        highest id). SigLIP pools the last position, so its config's special ids are read by nothing."""
        size, ids = config.text_config.vocab_size, set(tokenizer.get_vocab().values())
        if ids != set(range(size)):
            raise ValueError(
                f"{self.label}: the tokenizer in {folder} has {len(ids)} ids, {min(ids, default=None)} to "
                f"{max(ids, default=None)}, but the text tower embeds ids 0 to {size - 1} (config.json text_config "
                "vocab_size): it is another model's tokenizer; use the checkpoint's own tokenizer files")
        unnamed = [name for name in ("eos_token", "pad_token") if getattr(tokenizer, f"{name}_id") is None]
        if unnamed:
            raise ValueError(f"{self.label}: the tokenizer in {folder} has no {' or '.join(unnamed)}; use the "
                             "checkpoint's own tokenizer_config.json, which names them")
        if self.model_type != "clip":
            return
        eos, expected = tokenizer.eos_token_id, config.text_config.eos_token_id
        legacy = expected == 2
        if (legacy and eos != size - 1) or (not legacy and eos != expected):  # ids are 0 to size - 1 (above)
            raise ValueError(
                f"{self.label}: the tokenizer in {folder} ends prompts with id {eos} but the text tower pools "
                + ("the highest id of each prompt" if legacy else f"id {expected} (config.json eos_token_id)")
                + ": it would read another token; use the checkpoint's own tokenizer files")

    # -- what the recipe reads -----------------------------------------------------------------

    @property
    def input_size(self) -> int:
        return self.model.config.vision_config.image_size

    @property
    def grid(self) -> tuple[int, int]:
        side = self.input_size // self.model.config.vision_config.patch_size
        return side, side

    @property
    def cam_target(self) -> CamTarget:
        """The declaration for the folder's ``model_type``
        ([`cam_targets`][xbench.models.hf_dual_encoder.HFDualEncoder.cam_targets])."""
        return self.cam_targets[self.model_type]

    def prompt_pair(self, text: str) -> tuple[str, ...]:
        """(positive, negative) for CLIP; (positive,) for SigLIP, which scores one prompt."""
        pair = super().prompt_pair(text)
        return pair if self.model_type == "clip" else pair[:1]

    def embed_pairs(self, pairs: list[tuple[str, ...]]) -> dict[str, Tensor]:
        rows = {"pos_text": self.embed_text([pair[0] for pair in pairs])}
        if self.model_type == "clip":
            rows["neg_text"] = self.embed_text([pair[1] for pair in pairs])
        return rows

    @torch.no_grad()
    def embed_text(self, prompts: list[str]) -> Tensor:
        """L2-normalised text embeddings [len(prompts), D], by the folder's tokenizer and the model's
        padding rule (module docstring), once each prompt is known to keep some words
        ([`check_words`][xbench.models.hf_dual_encoder.HFDualEncoder.check_words])."""
        positions = self.model.config.text_config.max_position_embeddings
        device = self.model.logit_scale.device
        tokens = self.tokenizer(prompts, padding="max_length" if self.model_type == "siglip" else "longest",
                                truncation=True, max_length=positions, return_tensors="pt")
        self.check_words(prompts, tokens["input_ids"])
        if self.model_type == "siglip":
            features = self.model.text_model(input_ids=tokens["input_ids"].to(device)).pooler_output
        else:
            output = self.model.text_model(input_ids=tokens["input_ids"].to(device),
                                           attention_mask=tokens["attention_mask"].to(device))
            features = self.model.text_projection(output.pooler_output)
        return F.normalize(features.float(), dim=-1)

    def check_words(self, prompts: list[str], ids: Tensor) -> None:
        """Each prompt's ids decode to some text besides special and unknown tokens: a tokenizer that
        reads a prompt as nothing (another model's vocabulary, or the empty one transformers builds
        without the files) gives every finding the same text, and numbers that mean nothing."""
        for prompt, row in zip(prompts, ids.tolist()):
            if not self.tokenizer.decode(row, skip_special_tokens=True).strip():
                raise ValueError(
                    f"{self.label}: the tokenizer in {self.checkpoint_dir} reads the prompt {prompt!r} as special "
                    f"or unknown tokens only (ids {sorted(set(row))}): no word of it is in the vocabulary; use the "
                    "checkpoint's own tokenizer files, or a prompt in words (--model.pos_template)")

    def pair_logits(self, image_embedding: Tensor) -> Tensor:
        """CLIP: the recipe's pair log-odds; SigLIP: ``exp(logit_scale) * cos(image, pos) + logit_bias``
        [B, C], in float32 also under mixed precision."""
        if self.model_type == "clip":
            return super().pair_logits(image_embedding)
        image = F.normalize(image_embedding.float(), dim=-1)
        with float32(image):
            return self.model.logit_scale.exp() * (image @ self.pos_text.T) + self.model.logit_bias

    def embed_image(self, x: Tensor) -> tuple[Tensor, Tensor]:
        vision = self.model.vision_model
        output = vision(pixel_values=x)
        if self.model_type == "clip":  # last_hidden_state is before the final norm; the class token first
            tokens = self.model.visual_projection(vision.post_layernorm(output.last_hidden_state))
            return tokens[:, 0], tokens[:, 1:]
        return output.pooler_output, pooling_head_tokens(vision.head, output.last_hidden_state)
