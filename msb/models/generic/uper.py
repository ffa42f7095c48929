"""UPerNet decoder head (Xiao, Liu, Zhou, Jiang, Sun; ECCV 2018), laid out as MMSegmentation's ``UPerHead``.

Inputs: four feature maps ``[f1, f2, f3, f4]`` (N, C_i, H_i, W_i), finest first (strides 4, 8, 16, 32 for the
usual backbones). With ``ch`` = ``channels`` (512 in MMSegmentation and in the TransNeXt/InternImage UPerNet
configs) and every "conv" = bias-free convolution + BatchNorm + ReLU:

1. pyramid pooling on f4: for each scale s of ``pool_scales`` (1, 2, 3, 6), adaptive average pooling to s×s,
   1×1 conv C_4 -> ch, bilinear upsampling back to f4's size; concatenated with f4 and fused by a 3×3 conv
   (C_4 + 4·ch) -> ch;
2. lateral 1×1 convs C_i -> ch for f1..f3; top-down path: each lateral += the bilinear upsampling of the
   coarser one;
3. a 3×3 conv ch -> ch on each of the three finer levels (the PPM output is kept as it is), all four upsampled
   to f1's size, concatenated, fused by a 3×3 conv 4·ch -> ch;
4. dropout (p = ``dropout``, 0.1 in MMSegmentation) and a 1×1 conv with bias ch -> ``num_classes``.

Output: logits (N, num_classes, H_1, W_1), at f1's resolution (stride 4). Bilinear resizing uses
``align_corners=False`` as the MMSegmentation configs. The auxiliary FCN head of the official training configs
is a training-only loss branch, not built here (Table 3 of the MSB paper counts the model without it: see
:mod:`msb.models.paper.transnext`).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["ConvBNReLU", "UPerHead"]


class ConvBNReLU(nn.Sequential):
    """``Conv2d(bias=False)`` -> ``BatchNorm2d`` -> ``ReLU``, 'same' padding for odd kernels (MMCV's ConvModule
    with a BN norm_cfg)."""

    def __init__(self, cin: int, cout: int, kernel: int = 1) -> None:
        super().__init__(nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False), nn.BatchNorm2d(cout),
                         nn.ReLU(inplace=True))


def _resize(x: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)


class UPerHead(nn.Module):
    """UPerNet head: ``forward([f1, f2, f3, f4])`` -> logits (N, num_classes, H_1, W_1) (module docstring).

    Args:
        in_channels: channels of the input maps, finest first (any number >= 2).
        num_classes: output channels.
        channels: the head's width ``ch`` (512 in MMSegmentation).
        pool_scales: output sizes of the pyramid pooling branches.
        dropout: dropout probability before the classifier.

    Raises:
        ValueError: fewer than two inputs, or a non-positive width or pool scale.
    """

    def __init__(self, in_channels: Sequence[int], num_classes: int, channels: int = 512,
                 pool_scales: Sequence[int] = (1, 2, 3, 6), dropout: float = 0.1) -> None:
        super().__init__()
        in_channels = [int(c) for c in in_channels]
        if len(in_channels) < 2 or channels < 1 or any(s < 1 for s in pool_scales):
            raise ValueError(f"UPerHead needs >= 2 inputs and positive widths/scales, got in_channels={in_channels}"
                             f", channels={channels}, pool_scales={tuple(pool_scales)}")
        top = in_channels[-1]
        self.pool_scales = tuple(int(s) for s in pool_scales)
        self.psp = nn.ModuleList(nn.Sequential(nn.AdaptiveAvgPool2d(s), ConvBNReLU(top, channels, 1))
                                 for s in self.pool_scales)
        self.bottleneck = ConvBNReLU(top + len(self.pool_scales) * channels, channels, 3)
        self.lateral_convs = nn.ModuleList(ConvBNReLU(c, channels, 1) for c in in_channels[:-1])
        self.fpn_convs = nn.ModuleList(ConvBNReLU(channels, channels, 3) for _ in in_channels[:-1])
        self.fpn_bottleneck = ConvBNReLU(len(in_channels) * channels, channels, 3)
        self.dropout = nn.Dropout2d(dropout) if dropout > 0 else nn.Identity()
        self.conv_seg = nn.Conv2d(channels, num_classes, 1)

    def _ppm(self, x: torch.Tensor) -> torch.Tensor:
        branches = [x] + [_resize(branch(x), x.shape[-2:]) for branch in self.psp]
        return self.bottleneck(torch.cat(branches, dim=1))

    def forward(self, feats: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(feats) != len(self.lateral_convs) + 1:
            raise ValueError(f"UPerHead was built for {len(self.lateral_convs) + 1} feature maps, got {len(feats)}")
        laterals = [conv(f) for conv, f in zip(self.lateral_convs, feats[:-1])] + [self._ppm(feats[-1])]
        for i in range(len(laterals) - 1, 0, -1):  # top-down: coarse to fine
            laterals[i - 1] = laterals[i - 1] + _resize(laterals[i], laterals[i - 1].shape[-2:])
        outs = [conv(lat) for conv, lat in zip(self.fpn_convs, laterals[:-1])] + [laterals[-1]]
        size = outs[0].shape[-2:]
        fused = self.fpn_bottleneck(torch.cat([outs[0]] + [_resize(o, size) for o in outs[1:]], dim=1))
        return self.conv_seg(self.dropout(fused))
