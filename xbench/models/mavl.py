"""MAVL (Phan et al., CVPR 2024): MedKLIP with each disease split into a description and 8 aspects.

Every entity of MedKLIP's vocabulary gets 9 query slots: slot 0 its description, slots 1-8 the
aspect sentences of ``gpt4_mimic.json`` (border, fluid, location, opacity, other, patterns,
shape, texture). All 675 queries (684 with ``covid19``) run through MedKLIP's decoder; the
classifier reads a disease's 9 slot outputs concatenated. A global branch (CLIP-style attention
pooling of the 14x14 layer3 grid) gives the authors' second, "text" scoring mode.
Facts: ``specs/models/mavl.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xbench.models.base import LayerGroup, resnet_stages
from xbench.models.checkpoints import CheckpointLayout, DeclaredDrop, has_shape
from xbench.models.explainers import CamTarget
from xbench.models.medklip import DESCRIPTIONS_FILE, MedKLIP, QueryDecoder, read_descriptions, read_json_object, resnet50_trunk
from xbench.geometry.preprocess import MapUpsample

#: The aspect of each sentence of a disease in the concept file, in file order (slots 1-8).
ASPECTS = ("border", "fluid", "location", "opacity", "other", "patterns", "shape", "texture")
#: Three diseases of the authors' file spell the fifth aspect "others".
ASPECT_SPELLINGS = {"others": "other"}
SLOTS = 1 + len(ASPECTS)
#: The slots whose attention the authors' grounding averages: description, patterns, shape, texture.
GROUNDING_SLOTS = (0, 6, 7, 8)

Scoring = Literal["feature", "text"]


def read_aspects(path: Path, book: list[str]) -> list[list[str]]:
    """The 8 aspect sentences of each entity of ``book``, checked against `ASPECTS`."""
    data = read_json_object(path)
    sentences = []
    for entity in book:
        if entity not in data:
            raise ValueError(f"{path}: no aspect sentences for entity {entity!r} (the query book needs all of them)")
        found = data[entity]
        if not isinstance(found, list) or not all(isinstance(text, str) for text in found):
            raise ValueError(f"{path}: the entry of {entity!r} is not a list of sentences")
        aspects = [text.split(":", 1)[0].strip().lower() for text in found]
        aspects = [ASPECT_SPELLINGS.get(aspect, aspect) for aspect in aspects]
        if tuple(aspects) != ASPECTS:
            raise ValueError(
                f"{path}: the sentences of {entity!r} start with aspects {aspects}; MAVL's slots need "
                f"exactly {list(ASPECTS)} in this order"
            )
        sentences.append(found)
    return sentences


class AttentionPool2d(nn.Module):
    """CLIP's attention pooling: the mean token queries [mean; grid tokens] + a learned positional
    table, 8 heads; the table fixes the grid to 14x14 (a 224x224 input)."""

    def __init__(self, grid: int = 14, width: int = 1024, heads: int = 8, output: int = 256) -> None:
        super().__init__()
        self.positional_embedding = nn.Parameter(torch.randn(grid * grid + 1, width) / width**0.5)
        self.k_proj = nn.Linear(width, width)
        self.q_proj = nn.Linear(width, width)
        self.v_proj = nn.Linear(width, width)
        self.c_proj = nn.Linear(width, output)
        self.heads = heads

    def forward(self, features: Tensor) -> Tensor:
        """[B, C, h, w] -> [B, output]."""
        tokens = features.flatten(2).permute(2, 0, 1)  # [hw, B, C]
        if tokens.shape[0] + 1 != self.positional_embedding.shape[0]:
            raise ValueError(
                f"MAVL's attention pooling needs a {self.positional_embedding.shape[0] - 1}-token grid (224x224 input); "
                f"got {tokens.shape[0]}"
            )
        tokens = torch.cat([tokens.mean(0, keepdim=True), tokens]) + self.positional_embedding[:, None].to(tokens.dtype)
        pooled, _ = F.multi_head_attention_forward(
            query=tokens[:1], key=tokens, value=tokens, embed_dim_to_check=tokens.shape[-1], num_heads=self.heads,
            in_proj_weight=None, in_proj_bias=torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias]),
            bias_k=None, bias_v=None, add_zero_attn=False, dropout_p=0.0,
            out_proj_weight=self.c_proj.weight, out_proj_bias=self.c_proj.bias, training=False, need_weights=False,
            use_separate_proj_weight=True, q_proj_weight=self.q_proj.weight, k_proj_weight=self.k_proj.weight,
            v_proj_weight=self.v_proj.weight,
        )
        return pooled[0]


class MAVLNet(nn.Module):
    """The tensors of ``checkpoint_full_*.pth`` (``mavl.keys.json`` less the declared drops)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = resnet50_trunk()
        self.pool = AttentionPool2d()
        self.res_l1 = nn.Sequential(nn.Conv2d(1024, 1024, kernel_size=1), nn.PReLU())
        self.res_l2 = nn.Conv2d(1024, 256, kernel_size=1)
        self.disease_embedding_layer = nn.Linear(768, 256)
        self.decoder = QueryDecoder()
        self.classifier = nn.Linear(SLOTS * 256, 2)

    def forward(self, pixels: Tensor, text: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Pixels [B, 3, 224, 224] and query text [D*9, 768] (row d*9 + slot) -> classifier logits
        [B, D, 2], cross-attention [L, B, D*9, h, w] and the global image-query cosines [B, D, 9]."""
        batch = pixels.shape[0]
        features = self.backbone(pixels)
        grid = features.shape[-2:]
        memory = self.res_l2(self.res_l1(features)).flatten(2).transpose(1, 2)
        queries = self.disease_embedding_layer(text)
        output, attention = self.decoder(queries.expand(batch, -1, -1), memory)
        logits = self.classifier(output.reshape(batch, -1, SLOTS * output.shape[-1]))  # a disease's slots, slot-major
        cosines = F.normalize(self.pool(features), dim=-1) @ F.normalize(queries, dim=-1).T
        return logits, attention.unflatten(-1, grid), cosines.view(batch, -1, SLOTS)


class MAVL(MedKLIP):
    """MAVL zero-shot on MedKLIP's query machinery, with 9 slots per disease.

    ``maps`` = cross-attention averaged over the 4 layers, then over slots [0, 6, 7, 8] of the
    disease (the authors' grounding recipe). ``logits`` by ``scoring``:
    ``feature`` (default; the authors' mode for CheXpert, ChestX-ray14, RSNA, SIIM) = l1 - l0 of the
    classifier; ``text`` (theirs for COVIDx) = log-odds of p = mean over the 9 slots and the two
    reference entities r in {normal, clear} of sigmoid(cos(g, q_d) - cos(g, q_r)), g the pooled image.

    Args:
        checkpoint_dir: folder with the checkpoint, ``observation explanation.json`` and the aspect file.
        checkpoint: ``checkpoint_full_40.pth`` (default: the authors use it for every grounding run and
            for RSNA/SIIM/COVID classification) or ``checkpoint_full_46.pth`` (their choice for CheXpert
            and ChestX-ray14 classification).
        aspects_file: ``gpt4_mimic.json``; the authors use ``gpt4_mimic_covidr.json`` for COVID-Rural.
        scoring: ``feature`` or ``text`` (above).
        bert_dir, equalize_histogram: as `MedKLIP`.
    """

    display_name = "MAVL"
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        LayerGroup("classifier", ("net.classifier.*",)),
        LayerGroup("query decoder", ("net.decoder.*",), blocks="net.decoder.layers"),
        LayerGroup("text projection", ("net.disease_embedding_layer.*",)),
        LayerGroup("image projection", ("net.res_l1.*", "net.res_l2.*", "net.pool.*")),
        *resnet_stages("net.backbone", stages={"6": "layer3", "5": "layer2", "4": "layer1"}),
    )

    #: The authors' map rule: bilinear with ``align_corners=True`` onto the 224 image.
    map_rule: ClassVar[MapUpsample] = "bilinear_align_corners"
    #: The ResNet-50's layer3, which the decoder attends over and the attention pooling reads.
    cam_target: ClassVar[CamTarget] = CamTarget(
        "net.backbone", "the class's logit by `scoring`: the classifier's l1 - l0 (feature) or the log-odds of the "
        "slot-averaged text score (text)")
    checkpoint_layout: ClassVar[CheckpointLayout] = CheckpointLayout(
        section="model",
        strip_prefix="module.",  # trained under Accelerate/DDP
        drops=(
            DeclaredDrop("temp", "pre-training contrastive temperatures; the authors drop it", has_shape(SLOTS)),
            DeclaredDrop("location_emb.weight", "pre-training anatomy-location head, unused at inference",
                         has_shape(768, 256, SLOTS)),
            DeclaredDrop("location_emb.bias", "pre-training anatomy-location head, unused at inference", has_shape(768)),
        ),
    )

    def __init__(
        self,
        checkpoint_dir: str = "checkpoints/mavl",
        checkpoint: str = "checkpoint_full_40.pth",
        aspects_file: str = "gpt4_mimic.json",
        scoring: Scoring = "feature",
        bert_dir: str | None = None,
        equalize_histogram: bool = False,
        **kwargs,
    ) -> None:
        if scoring not in ("feature", "text"):
            raise ValueError(f"scoring must be 'feature' or 'text'; got {scoring!r}")
        super().__init__(checkpoint_dir=checkpoint_dir, bert_dir=bert_dir, equalize_histogram=equalize_histogram, **kwargs)
        self.checkpoint_file = checkpoint
        self.aspects_file = aspects_file
        self.scoring = scoring
        self.register_buffer("grounding_slots", torch.tensor(GROUNDING_SLOTS), persistent=False)

    def make_network(self) -> nn.Module:
        return MAVLNet()

    def text_files(self) -> tuple[str, ...]:
        return (DESCRIPTIONS_FILE, self.aspects_file)

    def query_texts(self, book: list[str]) -> list[str]:
        descriptions = read_descriptions(self.checkpoint_dir / DESCRIPTIONS_FILE, book)
        aspects = read_aspects(self.checkpoint_dir / self.aspects_file, book)
        return [text for description, sentences in zip(descriptions, aspects) for text in (description, *sentences)]

    def entity_outputs(self, pixels: Tensor) -> tuple[Tensor, Tensor]:
        logits, attention, cosines = self.net(pixels, self.query_text)
        maps = attention.mean(0).unflatten(1, (-1, SLOTS))[:, :, self.grounding_slots].mean(2)
        if self.scoring == "feature":
            return logits[..., 1] - logits[..., 0], maps
        normal, clear = cosines[:, :1], cosines[:, 1:2]  # the book's first two entities
        probability = (torch.sigmoid(cosines - normal) + torch.sigmoid(cosines - clear)).mean(-1) / 2
        return torch.logit(probability), maps
