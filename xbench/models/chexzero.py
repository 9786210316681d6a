"""CheXzero (Tiu et al., Nature Biomedical Engineering 2022): OpenAI CLIP ViT-B/32 fine-tuned on
MIMIC-CXR images and report impressions. MIT licence.

What the authors' code does (``rajpurkarlab/CheXzero`` at 5c341db), and XBench with it:

- **Checkpoint**: ``torch.save(model.state_dict())`` of OpenAI's CLIP class (their ``model.py``)
  at ViT-B/32, 224 px, context 77: 302 tensors under the same keys as open_clip's ``CLIP``, which
  XBench builds with QuickGELU, the activation of OpenAI's class. The authors publish ten such
  files; their headline figures average the ten models' probabilities, XBench runs one
  (``checkpoint_file``; default the one the authors' follow-up work uses).
- **Input** (`CheXzeroPreprocess`): ``data_process.preprocess`` letterboxes the 8-bit image
  to 320 (longer side, PIL's Lanczos, which ``Image.ANTIALIAS`` named; zero padding, centred) and
  stores 0..255 values; ``zero_shot.make`` normalises them with one mean/std for all three
  channels (101.48761, 83.43944) and resizes the tensor to 224 bicubic, without antialiasing in
  the torchvision they pin (0.11.3).
- **Score**: ``run_softmax_eval``: per finding the prompts ``"{}"`` and ``"no {}"``, the 2-way
  softmax of the two cosines, without the model's ``logit_scale``; its log-odds are
  ``cos(image, pos) - cos(image, neg)``.
- **Map**: the authors take none. XBench's is CLIP's patch-text similarity (``xbench.models.clip``)
  on the 7x7 patch grid, covering the 320 letterbox; a CAM explainer reads CLIP's layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import open_clip
import torch.nn.functional as F
from torch import Tensor, nn

from xbench.geometry.image import CodedImage
from xbench.models.checkpoints import first_present, load_checkpoint
from xbench.models.clip import CLIP
from xbench.models.explainers import CamTarget
from xbench.geometry.precision import float32
from xbench.geometry.preprocess import Preprocess

#: The single model XBench runs by default, one of the ten the authors publish (checkpoints/README.md).
CHECKPOINT_FILE = "best_64_5e-05_original_22000_0.864.pt"
#: ``zero_shot.make``'s statistics of 0..255 pixel values, one for all channels, here on [0, 1].
CHEXZERO_MEAN = (101.48761 / 255,) * 3
CHEXZERO_STD = (83.43944 / 255,) * 3


@dataclass(frozen=True)
class CheXzeroPreprocess(Preprocess):
    """The authors' two resizes: the 8-bit image letterboxed to ``size`` (their HDF5 step, with
    their integer rounding of both sides), normalised, then resized in float to ``model_size``
    (bicubic, not antialiased). The window is the letterbox's: the second resize keeps it."""

    model_size: int = 224

    def resized_shape(self, height: int, width: int) -> tuple[int, int]:
        """``data_process.preprocess``: both sides times ``size / longer side``, truncated."""
        ratio = float(self.target) / max(height, width)
        return int(height * ratio), int(width * ratio)

    def __call__(self, image: np.ndarray | CodedImage, frame: int) -> tuple[Tensor, Tensor]:
        letterboxed, window = super().__call__(image, frame)
        size = (self.model_size, self.model_size)
        return F.interpolate(letterboxed[None], size=size, mode="bicubic", align_corners=False)[0], window


class CheXzero(CLIP):
    """CheXzero from the authors' checkpoint file (see the module docstring for the recipe).

    Args:
        checkpoint_dir: the folder holding the authors' ``.pt`` files.
        checkpoint_file: which of the ten to run.
        arch: open_clip architecture of the file (ViT-B/32 for every published file).
    """

    display_name = "CheXzero"
    calibrated_logits: ClassVar[bool] = False  # sigmoid(cos+ - cos-) ranks; p >= 0.5 is no tuned cut
    preprocess: ClassVar[Preprocess] = CheXzeroPreprocess(
        size=320, resize="longer_side", interpolation="lanczos", library="pil", mean=CHEXZERO_MEAN,
        std=CHEXZERO_STD, map_upsample="bilinear",
    )
    #: CLIP's layer; the score is the authors' temperature-free pair margin.
    cam_target: ClassVar[CamTarget] = CamTarget(CLIP.cam_target.layer, "the prompt pair's log-odds without a "
                                                "temperature, cos(image, pos) - cos(image, neg)", prefix_tokens=1)

    def __init__(
        self,
        checkpoint_dir: str = "checkpoints/chexzero",
        checkpoint_file: str = CHECKPOINT_FILE,
        arch: str = "ViT-B-32-quickgelu",
        pos_template: str = "{}",
        neg_template: str = "no {}",
        **kwargs,
    ) -> None:
        super().__init__(checkpoint_dir, arch, pos_template, neg_template, **kwargs)
        self.checkpoint_file = checkpoint_file

    def load_model(self) -> tuple[nn.Module, Callable[[list[str]], Tensor]]:
        weights = first_present(self.checkpoint_dir, (self.checkpoint_file,), "CheXzero")
        config = open_clip.get_model_config(self.arch)
        if config is None:
            raise ValueError(
                f"CheXzero: unknown open_clip architecture {self.arch!r}; the published files are ViT-B-32-quickgelu"
            )
        model = open_clip.CLIP(**{**config, "quick_gelu": True})
        load_checkpoint(model, weights, self.layout)
        model.visual.output_tokens = True
        return model, open_clip.get_tokenizer(self.arch)

    def pair_logits(self, image_embedding: Tensor) -> Tensor:
        """``cos(image, pos) - cos(image, neg)`` [B, C] in float32: the log-odds of the authors'
        2-way softmax, which has no temperature."""
        image = F.normalize(image_embedding.float(), dim=-1)
        with float32(image):
            return image @ self.pos_text.T - image @ self.neg_text.T
