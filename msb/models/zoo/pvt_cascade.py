"""PVT-CASCADE: Cascaded Attention Decoder (Rahman, Marculescu; WACV 2023, arXiv 2303.16892).

Re-implemented from the paper and the structure of ``SLDGroup/CASCADE lib/networks.py`` (``PVT_CASCADE``) and
``lib/decoders.py`` (``CASCADE_Cat``, the concatenating decoder PVT-CASCADE uses):

- encoder PVTv2-B2 (timm ``pvt_v2_b2``, stochastic depth 0.1): x1..x4 with 64/128/320/512 ch, strides 4..32;
- stride 32: 1×1 conv 512 -> 512 (bias), then CAM = channel attention · x, spatial attention · x, ConvBlock
  (two 3×3 conv + BN + ReLU);
- each up step (to 320, 128, 64 channels): ``up_conv`` (nearest ×2, 3×3 conv + BN + ReLU), attention gate
  ``AG(g = up, x = skip)`` (Oktay et al., Attention U-Net), **concatenation** ``[AG, up]``, CAM on the 2c
  channels, ConvBlock 2c -> c. One spatial-attention module is shared by all four CAMs (as the reference);
- heads: 1×1 conv (bias) on the 512/320/128/64-channel decoder features, strides 32/16/8/4.

Outputs ``[p1, p2, p3, p4]`` (strides 32, 16, 8, 4); the structure loss on each. **Test-time rule ``sum``:
sigmoid(p1 + p2 + p3 + p4)**, each map upsampled bilinearly to the input size first (reference ``test_polyp.py``).

Input: H, W multiples of 32 (minimum 32×32), 3 channels (the reference's 1 -> 3 conv for grey inputs, 12
parameters, is not built). Parameters: 35.27 M, the published figure (PVTv2 classifier head not counted).
"""

from __future__ import annotations

import torch
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import build_backbone
from msb.models.base import Segmentor, construct_adapter
from msb.models.zoo.blocks import ChannelAttention, SpatialAttention
from msb.models.registry import register

__all__ = ["PVTCascade", "CascadeDecoder", "AttentionGate", "cascade_heads"]

CHANNELS = (512, 320, 128, 64)


def conv_bn_relu(cin: int, cout: int, k: int = 3, groups: int = 1) -> list[nn.Module]:
    """``[Conv2d(k, padding k//2, bias), BatchNorm2d, ReLU]``."""
    return [nn.Conv2d(cin, cout, k, padding=k // 2, groups=groups, bias=True), nn.BatchNorm2d(cout),
            nn.ReLU(inplace=True)]


class ConvBlock(nn.Sequential):
    """Two 3×3 conv + BN + ReLU, cin -> cout -> cout."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(*conv_bn_relu(cin, cout), *conv_bn_relu(cout, cout))


class UpConv(nn.Sequential):
    """Nearest ×2 upsampling, 3×3 conv + BN + ReLU, cin -> cout."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.Upsample(scale_factor=2, mode="nearest"), *conv_bn_relu(cin, cout))


class AttentionGate(nn.Module):
    """Additive attention gate (Oktay et al., MIDL 2018): ``x · sigmoid(BN(ψ(relu(BN(W_g g) + BN(W_x x)))))``
    with 1×1 convs (bias) W_g: F_g -> F_int, W_x: F_l -> F_int, ψ: F_int -> 1. g, x (N, ·, H, W)."""

    def __init__(self, f_g: int, f_l: int, f_int: int) -> None:
        super().__init__()
        self.w_g = nn.Sequential(nn.Conv2d(f_g, f_int, 1), nn.BatchNorm2d(f_int))
        self.w_x = nn.Sequential(nn.Conv2d(f_l, f_int, 1), nn.BatchNorm2d(f_int))
        self.psi = nn.Sequential(nn.Conv2d(f_int, 1, 1), nn.BatchNorm2d(1), nn.Sigmoid())

    def forward(self, g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x * self.psi(torch.relu(self.w_g(g) + self.w_x(x)))


class CascadeDecoder(nn.Module):
    """The CASCADE decoder with concatenating skips (see module docstring).

    ``forward(x4, [x3, x2, x1])`` -> ``(d4, d3, d2, d1)`` with 512/320/128/64 channels at strides 32/16/8/4.
    """

    def __init__(self, channels: tuple[int, int, int, int] = CHANNELS) -> None:
        super().__init__()
        c0, c1, c2, c3 = channels
        self.conv_1x1 = nn.Conv2d(c0, c0, 1)
        self.conv_block4 = ConvBlock(c0, c0)
        self.up3, self.ag3, self.conv_block3 = UpConv(c0, c1), AttentionGate(c1, c1, c2), ConvBlock(2 * c1, c1)
        self.up2, self.ag2, self.conv_block2 = UpConv(c1, c2), AttentionGate(c2, c2, c3), ConvBlock(2 * c2, c2)
        self.up1, self.ag1, self.conv_block1 = UpConv(c2, c3), AttentionGate(c3, c3, c3 // 2), ConvBlock(2 * c3, c3)
        self.ca4, self.ca3 = ChannelAttention(c0), ChannelAttention(2 * c1)
        self.ca2, self.ca1 = ChannelAttention(2 * c2), ChannelAttention(2 * c3)
        self.sa = SpatialAttention(7)

    def _cam(self, ca: ChannelAttention, x: torch.Tensor) -> torch.Tensor:
        x = ca(x) * x
        return self.sa(x) * x

    def forward(self, x: torch.Tensor, skips: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        d4 = self.conv_block4(self._cam(self.ca4, self.conv_1x1(x)))
        d3 = self.up3(d4)
        d3 = self.conv_block3(self._cam(self.ca3, torch.cat([self.ag3(d3, skips[0]), d3], dim=1)))
        d2 = self.up2(d3)
        d2 = self.conv_block2(self._cam(self.ca2, torch.cat([self.ag2(d2, skips[1]), d2], dim=1)))
        d1 = self.up1(d2)
        d1 = self.conv_block1(self._cam(self.ca1, torch.cat([self.ag1(d1, skips[2]), d1], dim=1)))
        return d4, d3, d2, d1


def cascade_heads(num_classes: int, channels: tuple[int, ...] = CHANNELS) -> nn.ModuleList:
    """The four 1×1 prediction heads (with bias) of the CASCADE family, one per decoder stage."""
    return nn.ModuleList(nn.Conv2d(c, num_classes, 1) for c in channels)


def check_pvt_encoder(arch: str, cfg: ModelConfig) -> None:
    """Raise :class:`MSBError` unless ``model.encoder`` is unset or ``pvt_v2_b2``."""
    if cfg.encoder not in (None, "pvt_v2_b2"):
        raise MSBError(f"model.encoder: {arch} uses the PVTv2-B2 encoder ('pvt_v2_b2'), got '{cfg.encoder}'; "
                       f"remove the key or set it to pvt_v2_b2")


@register("pvt_cascade")
class PVTCascade(Segmentor):
    """PVT-CASCADE (see module docstring). ``forward(x)`` -> ``[p1, p2, p3, p4]``, (N, C, H/s, W/s)."""

    test_time_rule = "sum"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None,
                 drop_path_rate: float = 0.1) -> None:
        super().__init__()
        self.backbone = build_backbone("pvt_v2_b2", encoder_weights, drop_path_rate=drop_path_rate)
        self.decoder = CascadeDecoder(CHANNELS)
        self.heads = cascade_heads(num_classes)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "PVTCascade":
        check_pvt_encoder("pvt_cascade", cfg)
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x1, x2, x3, x4 = self.backbone(x)
        feats = self.decoder(x4, [x3, x2, x1])
        return [head(f) for head, f in zip(self.heads, feats)]
