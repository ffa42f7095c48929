"""The classic U-Net (Ronneberger, Fischer, Brox; MICCAI 2015, arXiv 1505.04597) in plain PyTorch.

Encoder: five double-convolution levels with 64, 128, 256, 512, 1024 channels (each: two 3×3 convolutions with
padding 1, no bias, BatchNorm, ReLU), 2×2 max pooling between levels. Decoder: four levels, each a 2×2 transposed
convolution with stride 2 halving the channels, concatenation with the skip feature (skip first), a double
convolution; a 1×1 convolution to C output maps. Padded convolutions (the output has the input's size) and
BatchNorm follow the common PyTorch port (milesial/Pytorch-UNet, ``bilinear=False``); the original used unpadded
convolutions and no normalisation.

One output at the input resolution (no deep supervision); test-time rule ``first``. Input: H, W multiples of 16.
No pretrained encoder exists (``encoder_weights`` must be none). Parameters: 31,037,763 at 3 output maps
(MSB paper Table 3: 31.03 M); GMACs (convolutions, :mod:`msb.profiling.flops`): 48.18 at 256², 192.70 at 512².
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.registry import register

__all__ = ["UNetClassic", "DoubleConv"]


class DoubleConv(nn.Sequential):
    """(3×3 conv, no bias → BN → ReLU) × 2. (N, C_in, H, W) -> (N, C_out, H, W)."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__(nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=False), nn.BatchNorm2d(out_ch),
                         nn.ReLU(inplace=True), nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False),
                         nn.BatchNorm2d(out_ch), nn.ReLU(inplace=True))


@register("unet_classic")
class UNetClassic(Segmentor):
    """Classic U-Net (see module docstring). ``forward(x)`` -> ``[logits]``, logits (N, C, H, W)."""

    test_time_rule = "first"
    size_divisor = 16

    def __init__(self, num_classes: int = 1, base_channels: int = 64) -> None:
        super().__init__()
        widths = [base_channels * 2 ** i for i in range(5)]  # 64, 128, 256, 512, 1024
        # the contracting path (5 levels; pooling between them) is the "backbone" (state-dict keys backbone.*)
        self.backbone = nn.ModuleList([DoubleConv(3 if i == 0 else widths[i - 1], widths[i]) for i in range(5)])
        self.up = nn.ModuleList([nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in range(3, -1, -1)])
        self.dec = nn.ModuleList([DoubleConv(2 * widths[i], widths[i]) for i in range(3, -1, -1)])
        self.head = nn.Conv2d(widths[0], num_classes, 1)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "UNetClassic":
        """Build from ``model.params`` (``base_channels``). Raises :class:`MSBError` for an encoder or weights."""
        if cfg.encoder is not None or not is_none(cfg.encoder_weights):
            raise MSBError("model.encoder / model.encoder_weights: unet_classic has no separate or pretrained "
                           "encoder; remove the keys (or use arch unet for an smp encoder)")
        return construct_adapter(cls, num_classes, cfg.params)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x`` float (N, 3, H, W), H and W multiples of 16 -> ``[logits]`` (N, C, H, W)."""
        skips = [self.backbone[0](x)]
        for level in self.backbone[1:]:
            skips.append(level(F.max_pool2d(skips[-1], 2)))
        y = skips.pop()
        for up, dec in zip(self.up, self.dec):
            y = dec(torch.cat([skips.pop(), up(y)], dim=1))
        return [self.head(y)]
