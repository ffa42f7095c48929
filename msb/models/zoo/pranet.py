"""PraNet: Parallel Reverse Attention Network (Fan, Ji, Zhou, Chen, Fu, Shen, Shao; MICCAI 2020).

Re-implemented from the paper and the structure of ``DengPingFan/PraNet lib/PraNet_Res2Net.py``:

- backbone Res2Net-50 v1b 26w×4s (timm ``res2net50d``), features x1..x4 (256/512/1024/2048 ch, strides 4..32);
- receptive field blocks ``RFB_modified(in, 32)`` on x2, x3, x4;
- parallel partial decoder on (x4, x3, x2) -> global map S_g (1 channel, stride 8);
- three reverse-attention stages, deep to shallow: the previous map is rescaled to x_k (×0.25 for x4, then ×2),
  ``a = 1 − sigmoid(map)`` multiplies x_k, a conv stack predicts a residual that is added back to the map.
  x4 branch: 1×1 2048->256, three 5×5 256->256 (ReLU), 1×1 256->1; x3/x2: 1×1 ->64, two 3×3 (ReLU), 3×3 64->1.

Outputs (final first): ``[S_2, S_g, S_4, S_3]`` at strides 8, 8, 32, 16 (the reference upsamples each to the
input size with bilinear ``align_corners=False``; the trainer and :meth:`Segmentor.combine` do exactly that).
Deep supervision: the structure loss on all four. **Test-time rule ``first``: only S_2** (the reference tests
``lateral_map_2``).

Input: H, W multiples of 32 (minimum 32×32). Multi-class (C > 1) is an extension not in the paper: the maps
have C channels and the reverse-attention weight is ``1 − max_c sigmoid(map_c)``; for C = 1 this is the paper.
Parameters: 30.50 M (the published 32.55 M also counts the unused 1000-class ``fc`` of the Res2Net
classification network, 2 049 000 parameters; see ``tests/models/test_models.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import build_backbone
from msb.models.base import Segmentor, construct_adapter
from msb.models.zoo.blocks import ConvBN, PartialDecoder
from msb.models.registry import register

__all__ = ["PraNet", "RFB"]


class RFB(nn.Module):
    """PraNet's modified receptive field block ``RFB_modified(cin, cout)``.

    Four branches: 1×1 | 1×1 -> (1×3) -> (3×1) -> 3×3 dilation 3 | the same with 5 | the same with 7
    (all :class:`ConvBN`); concatenate, 3×3 conv, add a 1×1 residual conv of the input, ReLU.
    (N, cin, H, W) -> (N, cout, H, W).
    """

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.branch0 = ConvBN(cin, cout, 1)

        def branch(k: int) -> nn.Sequential:
            return nn.Sequential(ConvBN(cin, cout, 1), ConvBN(cout, cout, (1, k), padding=(0, k // 2)),
                                 ConvBN(cout, cout, (k, 1), padding=(k // 2, 0)),
                                 ConvBN(cout, cout, 3, padding=k, dilation=k))

        self.branch1, self.branch2, self.branch3 = branch(3), branch(5), branch(7)
        self.conv_cat = ConvBN(4 * cout, cout, 3, padding=1)
        self.conv_res = ConvBN(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cat = torch.cat([self.branch0(x), self.branch1(x), self.branch2(x), self.branch3(x)], dim=1)
        return F.relu(self.conv_cat(cat) + self.conv_res(x))


class ReverseAttention(nn.Module):
    """One reverse-attention stage: ``out = conv_stack((1 − sigmoid(prev)) · x) + prev``.

    ``mid`` channels, ``n_mid`` k×k convs with ReLU between the 1×1 reduction and the last conv to
    ``num_classes`` (1×1 for the x4 stage, 3×3 otherwise, as the reference)."""

    def __init__(self, cin: int, mid: int, k: int, n_mid: int, last_k: int, num_classes: int) -> None:
        super().__init__()
        self.reduce = ConvBN(cin, mid, 1)
        self.convs = nn.ModuleList(ConvBN(mid, mid, k, padding=k // 2) for _ in range(n_mid))
        self.out = ConvBN(mid, num_classes, last_k, padding=last_k // 2)

    def forward(self, x: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        p = torch.sigmoid(prev)
        a = 1 - (p if p.shape[1] == 1 else p.amax(dim=1, keepdim=True))
        h = self.reduce(a * x)
        for conv in self.convs:
            h = F.relu(conv(h))
        return self.out(h) + prev


@register("pranet")
class PraNet(Segmentor):
    """PraNet (see module docstring). ``forward(x)`` -> ``[S_2, S_g, S_4, S_3]``, each (N, C, H/s, W/s)."""

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None, channel: int = 32) -> None:
        super().__init__()
        self.backbone = build_backbone("res2net50_v1b", encoder_weights)
        self.rfb2 = RFB(512, channel)
        self.rfb3 = RFB(1024, channel)
        self.rfb4 = RFB(2048, channel)
        self.agg = PartialDecoder(channel, final_channels=num_classes)
        self.ra4 = ReverseAttention(2048, 256, 5, 3, 1, num_classes)
        self.ra3 = ReverseAttention(1024, 64, 3, 2, 3, num_classes)
        self.ra2 = ReverseAttention(512, 64, 3, 2, 3, num_classes)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "PraNet":
        if cfg.encoder not in (None, "res2net50_v1b"):
            raise MSBError(f"model.encoder: pranet uses the Res2Net-50 v1b backbone ('res2net50_v1b'), "
                           f"got '{cfg.encoder}'; remove the key or set it to res2net50_v1b")
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        _, x2, x3, x4 = self.backbone(x)
        s_g = self.agg(self.rfb4(x4), self.rfb3(x3), self.rfb2(x2))  # stride 8
        prev = F.interpolate(s_g, scale_factor=0.25, mode="bilinear", align_corners=False)
        s4 = self.ra4(x4, prev)  # stride 32
        prev = F.interpolate(s4, scale_factor=2, mode="bilinear", align_corners=False)
        s3 = self.ra3(x3, prev)  # stride 16
        prev = F.interpolate(s3, scale_factor=2, mode="bilinear", align_corners=False)
        s2 = self.ra2(x2, prev)  # stride 8
        return [s2, s_g, s4, s3]
