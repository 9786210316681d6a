"""DeViDe (Luo et al., arXiv 2404.03618): KAD's query-decoder family with a ViT-B/16 image tower.

DeViDe's code and weights are not public. What the paper states -- a ViT-B image encoder, the
Med-KEBERT text encoder, a transformer fusion -- and the evidence that its authors worked in a
KAD code base with a ViT-B/16 option (KAD's ``ModelViT224``: Hugging Face ``ViTModel``, patch
16 at 224, the patch tokens without CLS as image tokens) give this model. Everything the
paper does not fix is ours and provisional, and says so when it runs:

- the checkpoint layout: KAD's three sections in one ``best_valid.pt``, the ViT under ``vit.*``
  with transformers-4.x names (``xbench/models/manifests/devide.keys.json``);
- prompts and query sets: KAD's (``xbench.models.kad``);
- preprocessing: KAD's (bicubic resize to 224, ImageNet mean/std);
- saliency: the last decoder layer's cross-attention, head-averaged, 14x14.

A file that differs fails with the exact difference (missing, unexpected and reshaped keys,
grouped by prefix) and points to ``python -m xbench.inspect_checkpoint``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xbench.models.base import LayerGroup
from xbench.models.explainers import CamTarget
from xbench.models.kad import EMBED_DIM, QUERY_LOGIT, QueryDecoderModel


def _named(**modules: nn.Module) -> nn.ModuleDict:
    """A container that only adds a level to the key names (``attention.output.dense``)."""
    return nn.ModuleDict(modules)


class ViTLayer(nn.Module):
    """A pre-norm ViT block, its submodules named as transformers 4.x ``ViTLayer`` names them
    (``attention.attention.{query,key,value}``, ``attention.output.dense``,
    ``intermediate.dense``, ``output.dense``, ``layernorm_before``, ``layernorm_after``)."""

    def __init__(self, heads: int, mlp_width: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.attention = _named(
            attention=_named(**{name: nn.Linear(EMBED_DIM, EMBED_DIM) for name in ("query", "key", "value")}),
            output=_named(dense=nn.Linear(EMBED_DIM, EMBED_DIM)),
        )
        self.intermediate = _named(dense=nn.Linear(EMBED_DIM, mlp_width))
        self.output = _named(dense=nn.Linear(mlp_width, EMBED_DIM))
        self.layernorm_before = nn.LayerNorm(EMBED_DIM, eps=eps)
        self.layernorm_after = nn.LayerNorm(EMBED_DIM, eps=eps)

    def forward(self, x: Tensor) -> Tensor:
        h = self.layernorm_before(x)
        projections = self.attention["attention"]
        q, k, v = (
            projections[name](h).unflatten(-1, (self.heads, -1)).transpose(1, 2) for name in ("query", "key", "value")
        )
        attended = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2)
        x = x + self.attention["output"]["dense"](attended)
        return x + self.output["dense"](F.gelu(self.intermediate["dense"](self.layernorm_after(x))))


class ViTEmbeddings(nn.Module):
    """CLS token, learned positions (197 at 224/16) and the patch projection, 4.x names."""

    def __init__(self, grid: int, patch: int) -> None:
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, EMBED_DIM))
        self.position_embeddings = nn.Parameter(torch.zeros(1, grid**2 + 1, EMBED_DIM))
        self.patch_embeddings = _named(projection=nn.Conv2d(3, EMBED_DIM, kernel_size=patch, stride=patch))

    def forward(self, image: Tensor) -> Tensor:
        patches = self.patch_embeddings["projection"](image).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(patches.shape[0], -1, -1)
        return torch.cat([cls, patches], dim=1) + self.position_embeddings


class ViTTokens(nn.Module):
    """ViT-B/16 at 224 (``google/vit-base-patch16-224-in21k`` shape) under ``vit.*``: returns the
    196 patch tokens of the last hidden state (after the final LayerNorm), CLS dropped.
    ``vit.pooler`` is kept because a saved ``ViTModel`` carries it; it is unused."""

    def __init__(self, image_size: int = 224, patch: int = 16, depth: int = 12, heads: int = 12) -> None:
        super().__init__()
        eps = 1e-12
        self.grid = image_size // patch
        self.vit = _named(
            embeddings=ViTEmbeddings(self.grid, patch),
            encoder=_named(layer=nn.ModuleList(ViTLayer(heads, 4 * EMBED_DIM, eps) for _ in range(depth))),
            layernorm=nn.LayerNorm(EMBED_DIM, eps=eps),
            pooler=_named(dense=nn.Linear(EMBED_DIM, EMBED_DIM)),
        )

    def forward(self, image: Tensor) -> tuple[Tensor, tuple[int, int]]:
        """[B, 3, 224, 224] -> patch tokens [B, 196, 768] in row-major order, and (14, 14)."""
        x = self.vit["embeddings"](image)
        for layer in self.vit["encoder"]["layer"]:
            x = layer(x)
        return self.vit["layernorm"](x)[:, 1:], (self.grid, self.grid)


class DeViDe(QueryDecoderModel):
    """DeViDe with XBench's provisional layout (the module docstring says what is ours).

    Args:
        checkpoint_dir: folder with ``best_valid.pt`` (the user's DeViDe file) and
            ``Med-KEBERT/`` (``checkpoints/README.md``).
    """

    display_name = "DeViDe"
    layer_groups: ClassVar[tuple[LayerGroup, ...]] = (
        *QueryDecoderModel.HEAD_GROUPS,
        LayerGroup("image tower", ("image_encoder.*",), blocks="image_encoder.vit.encoder.layer"),
        *QueryDecoderModel.TEXT_GROUPS,
    )
    MISMATCH_HINT: ClassVar[str] = (
        "DeViDe's weights are not public, so the layout XBench expects is provisional "
        "(xbench/models/manifests/devide.keys.json). Run `python -m xbench.inspect_checkpoint FILE "
        "--json devide.keys.json` and report the file's layout so the model can follow it."
    )
    #: The tokens entering the ViT's last attention (after its first norm), class token first.
    cam_target: ClassVar[CamTarget] = CamTarget("image_encoder.vit.encoder.layer.-1.layernorm_before", QUERY_LOGIT,
                                                prefix_tokens=1)

    def __init__(self, checkpoint_dir: str = "checkpoints/devide", **kwargs) -> None:
        super().__init__(checkpoint_dir, **kwargs)
        self.preprocess = self.authors_transform(224)
        self.image_encoder = ViTTokens(self.preprocess.size)

    def checkpoint_file(self) -> Path:
        return self.checkpoint_dir / "best_valid.pt"

    def load_weights(self) -> None:
        warnings.warn(
            "DeViDe: the checkpoint layout, prompts and preprocessing are XBench's provisional choices "
            "(KAD's), not confirmed by its authors; see docs/models/devide.md",
            stacklevel=2,
        )
        super().load_weights()
