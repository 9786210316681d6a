"""BioViL (Boecking et al., ECCV 2022): a ResNet-50 image encoder and CXR-BERT, aligned by
contrastive pre-training on MIMIC-CXR; and BioViL-T (Bannur et al., CVPR 2023) on single images
(`BioViLT`). MIT licence.

What the authors' code does (``microsoft/hi-ml``, ``hi-ml-multimodal`` at b67c1d2), and XBench with it:

- **Checkpoint**: the image model, ``biovil_image_resnet50_proj_size_128.pt`` (their ``ImageModel``:
  torchvision's ResNet-50 under ``encoder.encoder.*`` and a 1x1-conv MLP to 128 dimensions under
  ``projector.model.*``), and CXR-BERT-specialized (``pytorch_model.bin``, ``config.json``,
  ``vocab.txt``: ``CXRBertModel``, BERT under ``bert.*``, the masked-language-model head under
  ``cls.predictions.*``, which embeddings do not use, and the projection head under
  ``cls_projection_head.*``). XBench builds the same modules itself (`CXRBertText`,
  `BioViLImageModel`): the Hub's code for CXR-BERT is never run.
- **Input** (`BioViLPreprocess`): ``load_image`` stretches the image's own range to 0..255
  and truncates to 8 bits; torchvision resizes the shorter side to 512 (PIL bilinear) and crops the
  centre 480; no mean/std.
- **Text**: the prompt without trailing ``!?.``, WordPiece with ``[CLS]``/``[SEP]``, the projected
  ``[CLS]`` token, L2-normalised.
- **Score**: ``get_similarity_score_from_raw_data``, the cosine of the image's global embedding (the
  mean of the projected patch embeddings) with the prompt's. The authors' library has no
  classification prompts; XBench's logit is ``cos(image, pos) - cos(image, neg)`` with the
  ``"{}"``/``"no {}"`` pair, no temperature.
- **Map**: ``get_similarity_map_from_raw_data``: the cosine of each projected patch (15x15 on the
  480 crop) with the positive prompt, smoothed by a Gaussian of sigma 1.5 patches (SciPy's
  ``gaussian_filter``: mirrored edges, radius 6), upsampled nearest onto the crop.
- **Phrase grounding**: a report phrase takes the finding text's place in the prompt pair; with the
  default ``"{}"`` the positive prompt is the raw phrase, as in the authors' phrase-grounding code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from torch import Tensor, nn
from transformers import BertConfig, BertModel, BertTokenizer

from xbench.geometry.image import CodedImage
from xbench.findings import finding_text
from xbench.models.base import LayerGroup, XBenchModel, resnet_stages
from xbench.models.checkpoints import CheckpointLayout, DeclaredDrop, has_shape, is_arange, load_checkpoint
from xbench.models.hub import checkpoint_folder
from xbench.models.explainers import CamTarget
from xbench.geometry.precision import float32
from xbench.geometry.preprocess import Preprocess
from xbench.models.text import PromptPairs, require_files

MANIFESTS = Path(__file__).resolve().parent / "manifests"
IMAGE_FILE = "biovil_image_resnet50_proj_size_128.pt"
BIOVIL_T_IMAGE_FILE = "biovil_t_image_model_proj_size_128.pt"
TEXT_FILES = ("config.json", "vocab.txt", "pytorch_model.bin")
#: The masked-language-model head ``CXRBertModel`` saves beside BERT; text embeddings do not use it.
MLM_HEAD_KEYS = (
    "cls.predictions.bias", "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
    "cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
)
TEXT_LAYOUT = CheckpointLayout(
    drops=(
        *(DeclaredDrop(key, "CXR-BERT's masked-language-model head, unused for embeddings") for key in MLM_HEAD_KEYS),
        DeclaredDrop("bert.embeddings.position_ids", "buffer older transformers saved", is_arange),
    )
)
#: BioViL-T's ViT pooler, which only runs with a prior image: each tensor dropped with its shape checked.
VIT_POOLER_DROPS = tuple(
    DeclaredDrop(key, "BioViL-T's prior-image pooler, not run on a single image", has_shape(*shape))
    for key, shape in json.loads((MANIFESTS / "biovil_t.keys.json").read_text())[BIOVIL_T_IMAGE_FILE].items()
    if key.startswith("encoder.vit_pooler.")
)
#: ``_get_similarity_map_from_embeddings``: the Gaussian's sigma in patches; SciPy's radius for it.
MAP_SIGMA = 1.5
MAP_RADIUS = int(4.0 * MAP_SIGMA + 0.5)


@dataclass(frozen=True)
class BioViLPreprocess(Preprocess):
    """``load_image``'s stretch of the image's own range to 0..255, truncated to 8 bits, then the
    fields' resize and crop. The stretch runs on the file's integer values, recovered exactly from
    the decoded image of an 8- or 16-bit PNG/JPEG (both sit on the 16-bit grid). It is pointwise
    once the range is known, so a coded image is stretched through its levels."""

    def __call__(self, image: np.ndarray | CodedImage, frame: int) -> tuple[Tensor, Tensor]:
        pixels = image.to_float() if isinstance(image, CodedImage) else image
        # the range of the integer values: rint(x * 65535) is monotonic, so it is that of the extremes
        low, high = (int(np.rint(np.float64(value) * 65535)) for value in (pixels.min(), pixels.max()))
        if high == low:
            raise ValueError("BioViL: a constant image cannot be stretched to 0..255 (the authors divide by zero)")
        if isinstance(image, CodedImage):
            return super().__call__(CodedImage(image.codes, self._stretch(image.levels, low, high)), frame)
        return super().__call__(self._stretch(image, low, high), frame)

    @staticmethod
    def _stretch(values: np.ndarray, low: int, high: int) -> np.ndarray:
        levels = np.rint(values.astype(np.float64) * 65535).astype(np.int64)
        return (((levels - low) * 255 // (high - low)) / 255).astype(np.float32)


class CXRBertProjectionHead(nn.Module):
    """CXR-BERT's projection of the ``[CLS]`` state into the joint space (the names of the authors' keys)."""

    def __init__(self, hidden_size: int, projection_size: int) -> None:
        super().__init__()
        self.dense_to_hidden = nn.Linear(hidden_size, projection_size)
        self.LayerNorm = nn.LayerNorm(projection_size, eps=1e-12)
        self.dense_to_output = nn.Linear(projection_size, projection_size)

    def forward(self, cls_state: Tensor) -> Tensor:
        return self.dense_to_output(self.LayerNorm(F.gelu(self.dense_to_hidden(cls_state))))


class CXRBertText(nn.Module):
    """CXR-BERT's text tower in its checkpoint's layout: ``bert`` (no pooler) and the projection head."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=False)
        self.cls_projection_head = CXRBertProjectionHead(config.hidden_size, config.projection_size)

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Normalised projected ``[CLS]`` embeddings [N, projection_size]."""
        state = self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return F.normalize(self.cls_projection_head(state[:, 0]), dim=1)


class BioViLImageModel(nn.Module):
    """BioViL's image model in its checkpoint's layout: ResNet-50 (``encoder.encoder``) and the
    1x1-conv projector (``projector.model``: conv, batch norm, ReLU, conv)."""

    def __init__(self, joint_size: int = 128) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.encoder = torchvision.models.resnet50()
        self.projector = nn.Module()
        self.projector.model = nn.Sequential(
            nn.Conv2d(2048, joint_size, 1, bias=False), nn.BatchNorm2d(joint_size), nn.ReLU(inplace=True),
            nn.Conv2d(joint_size, joint_size, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Input [B, 3, S, S] -> projected patch embeddings [B, joint, S/32, S/32] (not normalised)."""
        return self.projector.model(resnet_features(self.encoder.encoder, x))


class BioViLTImageModel(nn.Module):
    """BioViL-T's image model in its checkpoint's layout, for one image: ResNet-50, its 1x1 conv to
    256 (``encoder.backbone_to_vit``), beside it the learnt embedding that stands for a missing
    prior image (``encoder.missing_previous_emb``), and the projector from the 512 together. The
    ViT pooler that compares a prior image (``encoder.vit_pooler.*``) does not run without one, in
    the authors' code as here; its tensors are dropped by declaration (`VIT_POOLER_DROPS`)."""

    def __init__(self, joint_size: int = 128, width: int = 256) -> None:
        super().__init__()
        self.encoder = nn.Module()
        self.encoder.encoder = torchvision.models.resnet50()
        self.encoder.backbone_to_vit = nn.Conv2d(2048, width, 1, bias=False)
        self.encoder.missing_previous_emb = nn.Parameter(torch.zeros(1, width, 1, 1))
        self.projector = nn.Module()
        self.projector.model = nn.Sequential(
            nn.Conv2d(2 * width, joint_size, 1, bias=False), nn.BatchNorm2d(joint_size), nn.ReLU(inplace=True),
            nn.Conv2d(joint_size, joint_size, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        """Input [B, 3, S, S] -> projected patch embeddings [B, joint, S/32, S/32] (not normalised)."""
        current = self.encoder.backbone_to_vit(resnet_features(self.encoder.encoder, x))
        missing = self.encoder.missing_previous_emb.expand_as(current)
        return self.projector.model(torch.cat([current, missing], dim=1))


def resnet_features(resnet: nn.Module, x: Tensor) -> Tensor:
    """torchvision ResNet's last feature map (before pooling), as the authors' ``ResNetHIML`` returns it."""
    x = resnet.maxpool(resnet.relu(resnet.bn1(resnet.conv1(x))))
    return resnet.layer4(resnet.layer3(resnet.layer2(resnet.layer1(x))))


def gaussian_smooth(maps: Tensor, sigma: float = MAP_SIGMA, radius: int = MAP_RADIUS) -> Tensor:
    """Maps [B, C, h, w] smoothed as SciPy's ``gaussian_filter(sigma)`` on each: separable, the
    edges mirrored with the edge sample repeated (``mode="reflect"``), weights normalised in float64."""
    offsets = torch.arange(-radius, radius + 1, dtype=torch.float64)
    weights = torch.exp(-0.5 * (offsets / sigma) ** 2)
    weights = (weights / weights.sum()).to(maps.device, maps.dtype)
    out = maps
    for dim in (-2, -1):
        size = out.shape[dim]
        index = torch.arange(-radius, size + radius, device=maps.device) % (2 * size)
        index = torch.where(index >= size, 2 * size - 1 - index, index)  # also where the radius exceeds the map
        padded = out.index_select(dim, index)
        windows = padded.unfold(dim if dim > 0 else padded.ndim + dim, 2 * radius + 1, 1)
        out = windows @ weights
    return out


class BioViL(PromptPairs, XBenchModel):
    """BioViL from the authors' files (see the module docstring for the recipe).

    Args:
        checkpoint_dir: the folder holding the image model file and CXR-BERT's files.
        pos_template, neg_template: prompt templates; ``{}`` is replaced by the finding's text
            (or a report phrase, in phrase grounding).
    """

    display_name = "BioViL"
    calibrated_logits: ClassVar[bool] = False  # a difference of two cosines, no temperature: a ranking
    query_mode = "phrase"
    #: The ResNet-50's layer4, the grid the projector maps to the joint space (BioViL-T's too).
    cam_target: ClassVar[CamTarget] = CamTarget(
        "image_model.encoder.encoder.layer4", "the prompt pair's margin cos(image, pos) - cos(image, neg)")
    #: CXR-BERT is kept outside the module (``text_tower``) and encodes the prompts once: the image
    #: model's layers are randomised.
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("projector", ("image_model.projector.*",)),
        *resnet_stages("image_model.encoder.encoder"),
    )
    preprocess: ClassVar[Preprocess] = BioViLPreprocess(
        size=480, resize="shorter_side", resize_to=512, interpolation="bilinear", library="pil",
        mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), map_upsample="nearest",
    )

    def __init__(
        self, checkpoint_dir: str = "checkpoints/biovil", pos_template: str = "{}", neg_template: str = "no {}",
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.set_templates(pos_template, neg_template)
        self.checkpoint_dir = checkpoint_folder(checkpoint_dir)
        self.image_model: nn.Module | None = None
        #: CXR-BERT's tokenizer and text tower, loaded by the first ``build`` (a tuple: not a submodule,
        #: so it stays on the CPU and out of the state dict).
        self.text_tower: tuple[BertTokenizer, CXRBertText] | None = None
        #: class key -> (positive prompt, negative prompt), set by ``build``.
        self.prompts: dict[str, tuple[str, str]] = {}

    #: The image model's file, module and layout.
    image_file: ClassVar[str] = IMAGE_FILE
    image_module: ClassVar[type[nn.Module]] = BioViLImageModel
    image_layout: ClassVar[CheckpointLayout] = CheckpointLayout()

    def load_image_model(self) -> nn.Module:
        folder = require_files(self.checkpoint_dir, (self.image_file,), type(self).__name__)
        model = self.image_module()
        load_checkpoint(model, Path(folder) / self.image_file, self.image_layout)
        return model.eval().requires_grad_(False)

    def load_text(self) -> tuple[BertTokenizer, CXRBertText]:
        folder = require_files(self.checkpoint_dir, TEXT_FILES, f"{type(self).__name__} (CXR-BERT)")
        config = BertConfig.from_json_file(str(folder / "config.json"))
        if not hasattr(config, "projection_size"):
            raise ValueError(
                f"{type(self).__name__}: {folder / 'config.json'} has no projection_size: not CXR-BERT's config"
            )
        text = CXRBertText(config)
        load_checkpoint(text, folder / "pytorch_model.bin", TEXT_LAYOUT)
        return BertTokenizer.from_pretrained(str(folder), local_files_only=True), text.eval()

    @torch.no_grad()
    def embed_text(self, prompts: list[str]) -> Tensor:
        """Normalised embeddings [len(prompts), D] on the model's device: the authors' tokenisation
        (trailing ``!?.`` cut), CXR-BERT on the CPU."""
        tokenizer, text = self.text_tower
        tokens = tokenizer([p.rstrip("!?.") for p in prompts], padding="longest", return_tensors="pt")
        return text(tokens["input_ids"], tokens["attention_mask"]).float().to(self.device)

    def build(self, classes: list[str]) -> None:
        if self.image_model is None:
            self.image_model = self.load_image_model()
        if self.text_tower is None:
            self.text_tower = self.load_text()
        self.prompts = {key: self.prompt_pair(finding_text(key)) for key in classes}
        for name, value in self.embed_pairs(list(self.prompts.values())).items():
            self.register_buffer(name, value, persistent=False)

    def forward(self, model_input: Tensor) -> tuple[Tensor, Tensor]:
        """Model input [B, 3, 480, 480] (`preprocess`) -> log-odds [B, C], maps [B, C, 15, 15]
        (BioViL-T: 448, 14x14)."""
        patches = self.image_model(model_input)
        with float32(patches):
            patches = patches.float()
            image = F.normalize(patches.mean(dim=(2, 3)), dim=-1)
            logits = image @ self.pos_text.T - image @ self.neg_text.T
            cosines = torch.einsum("bdhw,cd->bchw", F.normalize(patches, dim=1), self.pos_text)
            return logits, gaussian_smooth(cosines)


class BioViLT(BioViL):
    """BioViL-T (Bannur et al., CVPR 2023) on single images, from ``microsoft/BiomedVLP-BioViL-T``:
    BioViL's recipe with BioViL-T's image model (`BioViLTImageModel`) and CXR-BERT, and the
    authors' 448 centre crop (14x14 maps). A prior study is not used: the benchmarks have none."""

    display_name = "BioViLT"
    name: ClassVar[str] = "biovil_t"
    #: BioViL's, with the 1x1 conv to the pooler and the missing-prior embedding between the ResNet and the projector.
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("projector", ("image_model.projector.*",)),
        LayerGroup("pooler input", ("image_model.encoder.backbone_to_vit.*", "image_model.encoder.missing_previous_emb")),
        *resnet_stages("image_model.encoder.encoder"),
    )

    preprocess: ClassVar[Preprocess] = BioViLPreprocess(
        size=448, resize="shorter_side", resize_to=512, interpolation="bilinear", library="pil",
        mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), map_upsample="nearest",
    )
    image_file: ClassVar[str] = BIOVIL_T_IMAGE_FILE
    image_module: ClassVar[type[nn.Module]] = BioViLTImageModel
    image_layout: ClassVar[CheckpointLayout] = CheckpointLayout(drops=VIT_POOLER_DROPS)

    def __init__(self, checkpoint_dir: str = "checkpoints/biovil_t", **kwargs) -> None:
        super().__init__(checkpoint_dir=checkpoint_dir, **kwargs)
