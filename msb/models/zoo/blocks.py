"""Small building blocks shared by the polyp-segmentation adapters (PraNet family, CASCADE family).

All blocks take and return float tensors (N, C, H, W); shapes are in feature-map pixels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ConvBN", "ChannelAttention", "SpatialAttention", "PartialDecoder", "up2_align"]


def up2_align(x: torch.Tensor) -> torch.Tensor:
    """×2 bilinear upsampling with ``align_corners=True`` (the ``nn.Upsample`` used by PraNet's partial decoder
    and Polyp-PVT's CFM). (N, C, H, W) -> (N, C, 2H, 2W)."""
    return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)


class ConvBN(nn.Sequential):
    """Convolution (no bias) + BatchNorm, **without** activation.

    This is PraNet's/Polyp-PVT's ``BasicConv2d``: the reference class builds a ReLU but its ``forward`` never
    applies it (Fan et al., PraNet, MICCAI 2020, ``lib/PraNet_Res2Net.py``), so the block is linear + BN.
    """

    def __init__(self, cin: int, cout: int, kernel_size: int | tuple[int, int], padding: int | tuple[int, int] = 0,
                 dilation: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, kernel_size, padding=padding, dilation=dilation, bias=False),
                         nn.BatchNorm2d(cout))


class ChannelAttention(nn.Module):
    """CBAM channel attention (Woo et al., ECCV 2018): ``sigmoid(MLP(avgpool x) + MLP(maxpool x))``.

    The shared MLP is two bias-free 1×1 convs ``C -> C // 16 -> C`` with ReLU (fixed ratio 16, as the Polyp-PVT
    and CASCADE code). Returns the attention weights (N, C, 1, 1), not the product.
    """

    def __init__(self, channels: int, ratio: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, channels // ratio, 1, bias=False)
        self.fc2 = nn.Conv2d(channels // ratio, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        avg = self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1))))
        mx = self.fc2(F.relu(self.fc1(F.adaptive_max_pool2d(x, 1))))
        return torch.sigmoid(avg + mx)


class SpatialAttention(nn.Module):
    """CBAM spatial attention: ``sigmoid(conv7x7([mean_c x, max_c x]))`` (bias-free 2 -> 1 conv).

    Returns the weights (N, 1, H, W)."""

    def __init__(self, kernel_size: int = 7) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 1, kernel_size, padding=kernel_size // 2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1)
        return torch.sigmoid(self.conv(s))


class PartialDecoder(nn.Module):
    """Parallel partial decoder (Wu et al., CPD, CVPR 2019) as used by PraNet (``aggregation``) and
    Polyp-PVT (``CFM``).

    Inputs ``(f5, f4, f3)``: ``channel``-channel features at strides 32, 16, 8 (deepest first). With
    ``u = up2_align``::

        f4' = conv_u1(u f5) · f4
        f3' = conv_u2(u u f5) · conv_u3(u f4) · f3
        g4  = conv_cat2([f4', conv_u4(u f5)])                (2c channels, stride 16)
        g3  = conv_cat3([f3', conv_u5(u g4)])                (3c channels, stride 8)
        out = conv4(g3)

    ``conv4`` is 3c -> 3c followed by a 1×1 conv with bias to ``final_channels`` maps (PraNet,
    ``out_channels=None``; 1 in the paper), or 3c -> ``out_channels`` (Polyp-PVT's CFM, ``out_channels=c``).
    All 3×3 convs are :class:`ConvBN`. Returns (N, final_channels or out_channels, H8, W8).
    """

    def __init__(self, channel: int, out_channels: int | None = None, final_channels: int = 1) -> None:
        super().__init__()
        c = channel
        self.conv_upsample1 = ConvBN(c, c, 3, padding=1)
        self.conv_upsample2 = ConvBN(c, c, 3, padding=1)
        self.conv_upsample3 = ConvBN(c, c, 3, padding=1)
        self.conv_upsample4 = ConvBN(c, c, 3, padding=1)
        self.conv_upsample5 = ConvBN(2 * c, 2 * c, 3, padding=1)
        self.conv_concat2 = ConvBN(2 * c, 2 * c, 3, padding=1)
        self.conv_concat3 = ConvBN(3 * c, 3 * c, 3, padding=1)
        if out_channels is None:
            self.conv4 = ConvBN(3 * c, 3 * c, 3, padding=1)
            self.conv5: nn.Module | None = nn.Conv2d(3 * c, final_channels, 1)
        else:
            self.conv4 = ConvBN(3 * c, out_channels, 3, padding=1)
            self.conv5 = None

    def forward(self, f5: torch.Tensor, f4: torch.Tensor, f3: torch.Tensor) -> torch.Tensor:
        u = up2_align
        f4_1 = self.conv_upsample1(u(f5)) * f4
        f3_1 = self.conv_upsample2(u(u(f5))) * self.conv_upsample3(u(f4)) * f3
        g4 = self.conv_concat2(torch.cat([f4_1, self.conv_upsample4(u(f5))], dim=1))
        g3 = self.conv_concat3(torch.cat([f3_1, self.conv_upsample5(u(g4))], dim=1))
        out = self.conv4(g3)
        return self.conv5(out) if self.conv5 is not None else out
