"""OpenAI CLIP through open_clip, and what every open_clip dual encoder here shares.

`OpenClipDualEncoder` holds the recipe CLIP and BiomedCLIP have in common (their specs,
``specs/models/clip.md`` and ``biomedclip.md``, sections 3-5):

- **Input**: open_clip's own eval transform on the native image: the shorter side to 224 (PIL
  bicubic of the 8-bit image), centre crop 224, grey repeated to RGB, OpenAI CLIP's mean/std. On a
  non-square radiograph the crop leaves out the ends of the longer side; the maps cover the crop.
- **Recognition**: per finding a positive and a negative prompt (CheXzero's ``"{}"`` / ``"no {}"``
  pair, or a model's own template), filled with the finding's text
  ([`xbench.findings.finding_text`][xbench.findings.finding_text]). ``logit = s * (cos(image, pos) -
  cos(image, neg))`` with ``s = exp(logit_scale)``: the log-odds of the 2-way softmax over the pair,
  never a softmax across findings (they are multi-label).
- **Map** (native): ``patch_text_similarity``, the cosine between each patch token (through the
  same final norm and projection as the image embedding) and the positive prompt. A CAM explainer
  (``--model.explainer gradcam``, ...: [`xbench.models.explainers`][xbench.models.explainers]) reads
  the tokens entering the last block's attention (after its first norm) and explains each finding's
  pair logit.
- **Phrase grounding**: a report phrase takes the finding text's place in the prompt pair
  (`OpenClipDualEncoder.encode_phrases`); every explainer reads the pair as for a finding.

A subclass loads its model from local files and says where its patch tokens come from.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import ClassVar

import open_clip
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xbench.findings import finding_text
from xbench.models.base import LayerGroup, XBenchModel
from xbench.models.checkpoints import CheckpointLayout, first_present, load_checkpoint
from xbench.models.hub import checkpoint_folder
from xbench.geometry.precision import float32
from xbench.geometry.preprocess import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, Preprocess
from xbench.models.explainers import CamTarget
from xbench.models.saliency import patch_text_similarity
from xbench.models.text import PromptPairs

#: What a CAM explainer explains in an open_clip dual encoder (CLIP, BiomedCLIP).
PAIR_LOGIT = "the prompt pair's log-odds, exp(logit_scale) * (cos(image, pos) - cos(image, neg))"


class OpenClipDualEncoder(PromptPairs, XBenchModel):
    """A CLIP-style dual encoder built with open_clip (see the module docstring for the recipe).

    Args:
        checkpoint_dir: the folder holding the model's files (``checkpoints/README.md``), or a hub id
            ``hf-hub:<org>/<name>[@revision]`` in the local Hugging Face cache (`checkpoint_folder`).
        pos_template, neg_template: prompt templates; ``{}`` is replaced by the finding's text
            (or a report phrase, in phrase grounding).
    """

    query_mode = "phrase"

    def __init__(self, checkpoint_dir: str, pos_template: str, neg_template: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.set_templates(pos_template, neg_template)
        self.checkpoint_dir = checkpoint_folder(checkpoint_dir)
        self.model: nn.Module | None = None
        self.tokenizer: Callable[[list[str]], Tensor] | None = None
        #: class key -> (positive prompt, negative prompt), set by ``build``.
        self.prompts: dict[str, tuple[str, str]] = {}

    # -- what a subclass states ----------------------------------------------------------------

    @abstractmethod
    def load_model(self) -> tuple[nn.Module, Callable[[list[str]], Tensor]]:
        """The open_clip model with its weights strictly loaded from ``checkpoint_dir``, and its tokenizer."""

    @abstractmethod
    def embed_image(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Model input [B, 3, S, S] -> image embedding [B, D] and patch embeddings [B, h*w, D],
        both through the same final norm and projection (not L2-normalised)."""

    #: Set by a subclass from its model: the input side and the patch grid (h, w).
    input_size: int
    grid: tuple[int, int]

    # -- the shared recipe ---------------------------------------------------------------------

    @property
    def preprocess(self) -> Preprocess:
        """open_clip's eval transform (``image_transform``, resize mode ``shortest``, as both models'
        configs say) at the loaded model's input side. The maps are not an authors' recipe (neither
        model was built for grounding): bilinear."""
        return Preprocess(self.input_size, "shorter_side", interpolation="bicubic", library="pil",
                          mean=OPENAI_CLIP_MEAN, std=OPENAI_CLIP_STD)

    def build(self, classes: list[str]) -> None:
        if self.model is None:
            model, self.tokenizer = self.load_model()
            self.model = model.eval().requires_grad_(False)
        self.prompts = {key: self.prompt_pair(finding_text(key)) for key in classes}
        for name, value in self.embed_pairs(list(self.prompts.values())).items():
            self.register_buffer(name, value, persistent=False)

    @torch.no_grad()
    def embed_text(self, prompts: list[str]) -> Tensor:
        """L2-normalised text embeddings [len(prompts), D]."""
        tokens = self.tokenizer(prompts).to(self.model.logit_scale.device)
        return F.normalize(self.model.encode_text(tokens).float(), dim=-1)

    def pair_logits(self, image_embedding: Tensor) -> Tensor:
        """log p(pos) - log p(neg) of the 2-way softmax over each finding's prompt pair: [B, C],
        in float32 also under mixed precision (a difference of two cosines, scaled by up to 100)."""
        image = F.normalize(image_embedding.float(), dim=-1)
        with float32(image):
            return self.model.logit_scale.exp() * (image @ self.pos_text.T - image @ self.neg_text.T)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        image_embedding, patches = self.embed_image(x)
        return self.pair_logits(image_embedding), patch_text_similarity(patches.float(), self.pos_text, self.grid)


class CLIP(OpenClipDualEncoder):
    """OpenAI CLIP (ViT-B/16 by default, ViT-B/32 as ``arch``), the paper's general-domain floor.

    The architecture is open_clip's built-in config ``arch``, always with QuickGELU: OpenAI
    trained with it, and a plain-GELU build loads the same tensors without complaint but computes
    different features. The weights are the open_clip files of ``timm/vit_base_patch16_clip_224.openai``
    (or ``…patch32…``), loaded strictly: every tensor must match, nothing is dropped.

    Args:
        arch: open_clip architecture, ``ViT-B-16-quickgelu`` (14x14 maps) or ``ViT-B-32-quickgelu`` (7x7).
    """

    display_name = "CLIP"
    #: The authors' file names, in open_clip's order of preference (same tensors, two formats).
    weight_files: ClassVar[tuple[str, ...]] = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
    layout: ClassVar[CheckpointLayout] = CheckpointLayout()
    #: The tokens entering the last block's attention (after its first norm), class token first.
    cam_target: ClassVar[CamTarget] = CamTarget("model.visual.transformer.resblocks.-1.ln_1", PAIR_LOGIT,
                                                 prefix_tokens=1)
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("projections", ("model.visual.proj", "model.visual.ln_post.*", "model.text_projection",
                                   "model.ln_final.*"), text=True),
        LayerGroup("image tower", ("model.visual.*",), blocks="model.visual.transformer.resblocks"),
        LayerGroup("text tower", ("model.*",), blocks="model.transformer.resblocks", text=True),
    )

    def __init__(
        self,
        checkpoint_dir: str = "checkpoints/clip",
        arch: str = "ViT-B-16-quickgelu",
        pos_template: str = "{}",
        neg_template: str = "no {}",
        **kwargs,
    ) -> None:
        super().__init__(checkpoint_dir, pos_template, neg_template, **kwargs)
        self.arch = arch

    def load_model(self) -> tuple[nn.Module, Callable[[list[str]], Tensor]]:
        weights = first_present(self.checkpoint_dir, self.weight_files, "CLIP")
        config = open_clip.get_model_config(self.arch)
        if config is None:
            raise ValueError(
                f"CLIP: unknown open_clip architecture {self.arch!r}; use ViT-B-16-quickgelu or ViT-B-32-quickgelu"
            )
        model = open_clip.CLIP(**{**config, "quick_gelu": True})
        load_checkpoint(model, weights, self.layout)
        model.visual.output_tokens = True
        return model, open_clip.get_tokenizer(self.arch)

    @property
    def input_size(self) -> int:
        return self.model.visual.image_size[0]

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.model.visual.grid_size)

    def embed_image(self, x: Tensor) -> tuple[Tensor, Tensor]:
        visual = self.model.visual
        pooled, tokens = visual(x)  # tokens: the last block's patch tokens through ln_post
        return pooled, tokens @ visual.proj
