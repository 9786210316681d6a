"""What the models do for a GPU: mixed precision stays in the towers; channels-last convolutions.

Under ``--trainer.precision bf16-mixed`` Lightning runs ``test_step`` inside ``torch.autocast``,
which sends every matrix product to bfloat16 (8 significant bits). That is what a user asks for in
the towers. XBench's own arithmetic around them -- the resize weights of the batch image, placing a
map back into the frame, the cosine heads of the CLIP models -- would otherwise be rounded too, and
rounding a map to 8 bits creates tied maxima the model never made (the Pointing Game counts ties).
Those helpers run inside :func:`float32` instead; ``test_step`` upsamples and normalises in float32
and the metrics cast to float32 themselves.

The models with a ResNet trunk (MedKLIP, MAVL, KAD) take :class:`ChannelsLast`: on CUDA their
convolution weights are kept channels-last (NHWC), the layout cuDNN's fast kernels (tensor cores)
work in; on a CPU it gains nothing, so there it is left off.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def float32(tensor: Tensor) -> torch.autocast:
    """A context in which autocast is off on ``tensor``'s device: products run in their inputs' dtype."""
    return torch.autocast(tensor.device.type, enabled=False)


class ChannelsLast:
    """Mixin of an ``XBenchModel`` with a convolutional trunk; ``self.channels_last`` is its init
    argument (default true). Before the first batch of a run on CUDA, the trunk's weights become
    channels-last, and with them every activation of the trunk; outputs equal the NCHW ones to
    float rounding."""

    channels_last: bool

    def convolutional_trunk(self) -> nn.Module:
        """The module whose 4-d weights are converted."""
        raise NotImplementedError

    def use_channels_last(self) -> None:
        self.convolutional_trunk().to(memory_format=torch.channels_last)

    def on_test_start(self) -> None:
        super().on_test_start()
        if self.channels_last and self.device.type == "cuda":
            self.use_channels_last()
