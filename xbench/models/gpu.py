"""Channels-last convolutions for a GPU.

The models with a ResNet trunk (MedKLIP, MAVL, KAD) take `ChannelsLast`: on CUDA their
convolution weights are kept channels-last (NHWC), the layout cuDNN's fast kernels (tensor cores)
work in; on a CPU it gains nothing, so there it is left off.
"""

from __future__ import annotations

import torch
from torch import nn


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
