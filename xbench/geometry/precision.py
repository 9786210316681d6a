"""Arithmetic that mixed precision leaves in float32.

Under ``--trainer.precision bf16-mixed`` Lightning runs ``test_step`` inside ``torch.autocast``,
which sends every matrix product to bfloat16 (8 significant bits). That is what a user asks for in
the towers. XBench's own arithmetic around them -- the resize weights of a model's input, placing a
map back into the frame, the cosine heads of the CLIP models -- would otherwise be rounded too, and
rounding a map to 8 bits creates tied maxima the model never made (the Pointing Game counts ties).
Those helpers run inside `float32` instead; ``test_step`` places and normalises maps in
float32 and the metrics cast to float32 themselves.
"""

from __future__ import annotations

import torch
from torch import Tensor


def float32(tensor: Tensor) -> torch.autocast:
    """A context in which autocast is off on ``tensor``'s device: products run in their inputs' dtype."""
    return torch.autocast(tensor.device.type, enabled=False)
