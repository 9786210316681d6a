"""The pre-norm query-decoder layer that MedKLIP/MAVL, KAD/DeViDe and CARZero share.

All three authors build DETR's ``TransformerDecoderLayer`` with ``normalize_before=True`` and no
positional encodings, under the same module names, so one class serves every checkpoint layout:
query self-attention (CARZero's authors switch it off; its weights stay in their file),
cross-attention to the image tokens, a ReLU feed-forward, each behind its own LayerNorm and a
residual. Dropout has no weights and is inactive in eval mode.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class PreNormQueryLayer(nn.Module):
    """One layer, sequence-first: queries [Q, B, D] attend to memory [M, B, D].

    Returns the queries and the cross-attention averaged over heads [B, Q, M] (``None`` when
    ``need_weights`` is False).
    """

    def __init__(self, width: int, heads: int, feedforward: int, self_attention: bool = True, dropout: float = 0.1):
        super().__init__()
        self.self_attention = self_attention
        self.self_attn = nn.MultiheadAttention(width, heads, dropout=dropout)
        self.multihead_attn = nn.MultiheadAttention(width, heads, dropout=dropout)
        self.linear1 = nn.Linear(width, feedforward)
        self.linear2 = nn.Linear(feedforward, width)
        self.norm1 = nn.LayerNorm(width)
        self.norm2 = nn.LayerNorm(width)
        self.norm3 = nn.LayerNorm(width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries: Tensor, memory: Tensor, need_weights: bool = True) -> tuple[Tensor, Tensor | None]:
        if self.self_attention:
            x = self.norm1(queries)
            queries = queries + self.dropout(self.self_attn(x, x, x, need_weights=False)[0])
        attended, attention = self.multihead_attn(self.norm2(queries), memory, memory, need_weights=need_weights)
        queries = queries + self.dropout(attended)
        queries = queries + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(self.norm3(queries))))))
        return queries, attention
