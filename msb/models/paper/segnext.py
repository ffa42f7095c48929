"""SegNeXt-L (Guo, Lu, Hou, Liu, Cheng, Hu; NeurIPS 2022): the MSCAN-L encoder and the light Hamburger decoder,
from the paper and the official code (Visual-Attention-Network/SegNeXt: ``mmseg/models/backbones/mscan.py``,
``mmseg/models/decode_heads/ham_head.py``, ``local_configs/segnext/large/*.py``).

- MSCAN-L: widths 64/128/320/512, depths 3/5/27/3, MLP ratios 8/8/4/4, stochastic depth 0.3, BatchNorm. Stem:
  two 3×3 stride-2 convs (C/2 then C, BN, GELU between); stages 2-4 start with a 3×3 stride-2 conv + BN. Each
  block: BN → multi-scale convolutional attention (1×1, GELU, a 5×5 depth-wise conv followed by three branches
  of 1×k + k×1 depth-wise strip convs, k = 7, 11, 21, summed with their input, 1×1, times its input, 1×1, plus
  the block input) with layer scale 1e-2, then BN → conv-MLP (1×1, depth-wise 3×3, GELU, 1×1) with layer scale.
  Each stage ends with a LayerNorm.
- LightHamHead: stages 2-4 resized to stride 8 and concatenated (960 ch), 1×1 squeeze to 1024 + GroupNorm(32) +
  ReLU, Hamburger (1×1 conv, ReLU, NMF with R = 64 bases, 7 multiplicative-update steps in evaluation and 6 in
  training, 1×1 conv + GN, residual, ReLU), 1×1 align to 1024 + GN + ReLU, dropout 0.1, 1×1 classifier, then
  bilinear ×8 to the input size.

The NMF bases start random at every forward pass (official: ``torch.rand`` then L2-normalised columns). In
training they come from the global generator, as official; in evaluation from a generator with a fixed seed, so
that the same input gives the same logits (the official evaluation redraws them; the mean effect is the same).
Parameters at 3 classes: 48.78 M (the MSB paper's Table 3). ``encoder_weights``: a local MSCAN-L state dict in the
official key names (``patch_embed1.proj.0.weight``, ``block1.0.attn.spatial_gating_unit.conv0.weight`` …; a
``head.*`` classifier is ignored), loaded strictly into ``backbone``.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from timm.layers import DropPath
from torch import nn

from msb.config.schema import ModelConfig
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["SegNeXt", "MSCAN", "NMF2D"]


class _MSCA(nn.Module):
    """Multi-scale convolutional attention (official ``AttentionModule``): returns attn(x) * x."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(dim, dim, 5, padding=2, groups=dim)
        for i, k in enumerate((7, 11, 21)):
            setattr(self, f"conv{i}_1", nn.Conv2d(dim, dim, (1, k), padding=(0, k // 2), groups=dim))
            setattr(self, f"conv{i}_2", nn.Conv2d(dim, dim, (k, 1), padding=(k // 2, 0), groups=dim))
        self.conv3 = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.conv0(x)
        s = a + sum(getattr(self, f"conv{i}_2")(getattr(self, f"conv{i}_1")(a)) for i in range(3))
        return self.conv3(s) * x


class _SpatialAttention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj_1 = nn.Conv2d(dim, dim, 1)
        self.activation = nn.GELU()
        self.spatial_gating_unit = _MSCA(dim)
        self.proj_2 = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_2(self.spatial_gating_unit(self.activation(self.proj_1(x)))) + x


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(dim, hidden, 1)
        self.dwconv = nn.Module()
        self.dwconv.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.dwconv.dwconv(self.fc1(x))))


class _Block(nn.Module):
    def __init__(self, dim: int, mlp_ratio: float, drop_path: float) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(dim)
        self.attn = _SpatialAttention(dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.BatchNorm2d(dim)
        self.mlp = _Mlp(dim, int(dim * mlp_ratio))
        self.layer_scale_1 = nn.Parameter(torch.full((dim,), 1e-2))
        self.layer_scale_2 = nn.Parameter(torch.full((dim,), 1e-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.layer_scale_1[:, None, None] * self.attn(self.norm1(x)))
        return x + self.drop_path(self.layer_scale_2[:, None, None] * self.mlp(self.norm2(x)))


class _Embed(nn.Module):
    """Stem (two 3×3 stride-2 convs) for stage 1, a 3×3 stride-2 conv + BN for the others (``proj``/``norm``)."""

    def __init__(self, cin: int, dim: int, stem: bool) -> None:
        super().__init__()
        if stem:
            self.proj = nn.Sequential(nn.Conv2d(cin, dim // 2, 3, 2, 1), nn.BatchNorm2d(dim // 2), nn.GELU(),
                                      nn.Conv2d(dim // 2, dim, 3, 2, 1), nn.BatchNorm2d(dim))
            self.norm = nn.Identity()
        else:
            self.proj = nn.Conv2d(cin, dim, 3, 2, 1)
            self.norm = nn.BatchNorm2d(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x))


class MSCAN(nn.Module):
    """MSCAN encoder: ``forward(x)`` (B, 3, H, W) -> 4 maps (B, C_i, H/s, W/s), s = 4, 8, 16, 32 (each after its
    stage LayerNorm). Defaults: MSCAN-L."""

    def __init__(self, dims=(64, 128, 320, 512), depths=(3, 5, 27, 3), mlp_ratios=(8, 8, 4, 4),
                 drop_path_rate: float = 0.3) -> None:
        super().__init__()
        dpr = [drop_path_rate * i / max(sum(depths) - 1, 1) for i in range(sum(depths))]
        cur = 0
        for i in range(4):
            setattr(self, f"patch_embed{i + 1}", _Embed(3 if i == 0 else dims[i - 1], dims[i], stem=i == 0))
            setattr(self, f"block{i + 1}", nn.ModuleList(_Block(dims[i], mlp_ratios[i], dpr[cur + j])
                                                         for j in range(depths[i])))
            setattr(self, f"norm{i + 1}", nn.LayerNorm(dims[i]))
            cur += depths[i]
        self.channels = tuple(dims)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for i in range(1, 5):
            x = getattr(self, f"patch_embed{i}")(x)
            for blk in getattr(self, f"block{i}"):
                x = blk(x)
            x = getattr(self, f"norm{i}")(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2).contiguous()
            outs.append(x)
        return outs


class NMF2D(nn.Module):
    """Non-negative matrix factorisation of a (B, C, H, W) map as C×HW ≈ bases (C×R) · coef^T (R×HW), by
    multiplicative updates (Lee & Seung 2001; Geng et al., ICLR 2021, "Is attention better than matrix
    decomposition?"); returns bases · coef^T reshaped to (B, C, H, W). ``steps`` = (training, evaluation)."""

    def __init__(self, rank: int = 64, steps: tuple[int, int] = (6, 7), eval_seed: int = 0) -> None:
        super().__init__()
        self.rank, self.steps, self.eval_seed = rank, steps, eval_seed

    @staticmethod
    def _update_coef(x: torch.Tensor, bases: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
        num = torch.bmm(x.transpose(1, 2), bases)
        den = coef.bmm(bases.transpose(1, 2).bmm(bases))
        return coef * num / (den + 1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        x = x.reshape(b, c, h * w)
        gen = None if self.training else torch.Generator().manual_seed(self.eval_seed)
        bases = torch.rand((b, c, self.rank), generator=gen).to(device=x.device, dtype=x.dtype)
        bases = F.normalize(bases, dim=1)
        coef = torch.softmax(torch.bmm(x.transpose(1, 2), bases), dim=-1)  # inv_t = 1 for NMF
        for _ in range(self.steps[0] if self.training else self.steps[1]):
            coef = self._update_coef(x, bases, coef)
            num = torch.bmm(x, coef)
            den = bases.bmm(coef.transpose(1, 2).bmm(coef))
            bases = bases * num / (den + 1e-6)
        coef = self._update_coef(x, bases, coef)
        return torch.bmm(bases, coef.transpose(1, 2)).reshape(b, c, h, w)


def _conv_gn_relu(cin: int, cout: int, relu: bool = True) -> nn.Sequential:
    """mmcv ConvModule(1×1, norm GN(32), act ReLU): conv without bias (a norm follows), ``conv``/``gn`` keys."""
    layers = [("conv", nn.Conv2d(cin, cout, 1, bias=False)), ("gn", nn.GroupNorm(32, cout))]
    if relu:
        layers.append(("activate", nn.ReLU(inplace=True)))
    return nn.Sequential(OrderedDict(layers))


class LightHamHead(nn.Module):
    """SegNeXt's decoder over the stride-8/16/32 maps -> logits (B, num_classes, H/8, W/8)."""

    def __init__(self, in_channels=(128, 320, 512), ham_channels: int = 1024, channels: int = 1024,
                 num_classes: int = 1, rank: int = 64) -> None:
        super().__init__()
        self.squeeze = _conv_gn_relu(sum(in_channels), ham_channels)
        self.ham_in = nn.Conv2d(ham_channels, ham_channels, 1)
        self.ham = NMF2D(rank)
        self.ham_out = _conv_gn_relu(ham_channels, ham_channels, relu=False)
        self.align = _conv_gn_relu(ham_channels, channels)
        self.dropout = nn.Dropout2d(0.1)
        self.conv_seg = nn.Conv2d(channels, num_classes, 1)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        size = feats[0].shape[-2:]
        x = torch.cat([feats[0]] + [F.interpolate(f, size=size, mode="bilinear", align_corners=False)
                                    for f in feats[1:]], 1)
        x = self.squeeze(x)
        y = self.ham_out(self.ham(F.relu(self.ham_in(x))))
        x = F.relu(x + y)
        return self.conv_seg(self.dropout(self.align(x)))


@register("segnext_l")
class SegNeXt(Segmentor):
    """SegNeXt-L as a :class:`Segmentor`: ``forward(x)`` (N, 3, H, W), H and W multiples of 32 -> ``[logits]``,
    logits (N, C, H, W) (the stride-8 head output upsampled bilinearly)."""

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None, drop_path_rate: float = 0.3
                 ) -> None:
        super().__init__()
        self.backbone = MSCAN(drop_path_rate=drop_path_rate)
        self.decode_head = LightHamHead(self.backbone.channels[1:], num_classes=num_classes)
        if not is_none(encoder_weights):
            load_local_weights(self.backbone, encoder_weights, strip_prefixes=("module.", "backbone."),
                               transform=lambda sd: {k: v for k, v in sd.items() if not k.startswith("head.")})

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "SegNeXt":
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        y = self.decode_head(self.backbone(x)[1:])
        return [F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)]
