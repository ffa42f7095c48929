"""InternImage-T (Wang et al., CVPR 2023) + UPerNet head: ``internimage_t_uper``, a model of the MSB case study
(paper section 4.1, Table 3: 58.37 M parameters, 58.57 / 234.25 GMACs at 256² / 512², 3 classes).

Backbone, as the official ``InternImage`` segmentation backbone with the ``upernet_internimage_t_512_160k_ade20k``
settings (parameter names kept, so official checkpoints load): stem of two 3×3 stride-2 convolutions (3 -> 32
-> 64, LayerNorm, GELU between), four levels of widths 64/128/256/512, depths 4/4/18/4 and DCNv3 groups
4/8/16/32; each layer is pre-norm ``x + γ1·DCNv3(LN(x))``, ``x + γ2·MLP(LN(x))`` (MLP ratio 4, GELU, layer
scale γ initialised to 1.0, stochastic depth 0.2 linear); each level ends with a LayerNorm (its output is the
feature map) followed by a 3×3 stride-2 bias-free convolution + LayerNorm to the next level.

DCNv3 block (``dcn``): input_proj (linear) gives the values; a 3×3 depthwise conv + LN + GELU on the block input
feeds the offset (2·G·9) and modulation (G·9, softmax over the 9 points of a group) linear layers; the core
(:mod:`msb.models.ops.dcnv3`, compiled ``DCNv3`` kernel when installed) samples and aggregates; output_proj.
Offsets and modulation start at zero (uniform weights over the 3×3 grid), as the official initialisation.

Head: :class:`~msb.models.generic.uper.UPerHead`, 512 channels (official ``upernet_r50`` base config); the
auxiliary FCN head (stage 3, loss weight 0.4) is not built and not counted. Output: ``[logits]`` at the input
resolution. Inputs: multiples of 32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.generic.uper import UPerHead
from msb.models.ops.dcnv3 import dcnv3
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["InternImage", "InternImageUPer", "DCNv3Block"]


class _ToLast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1)


def _ln_from_first(dim: int) -> nn.Sequential:
    """NCHW -> NHWC LayerNorm(eps 1e-6); the LN is item 1 (official key layout ``<name>.1.weight``)."""
    return nn.Sequential(_ToLast(), nn.LayerNorm(dim, eps=1e-6))


def _ln_last(dim: int) -> nn.Sequential:
    """NHWC LayerNorm(eps 1e-6) as item 0 (official key layout ``<name>.0.weight``)."""
    return nn.Sequential(nn.LayerNorm(dim, eps=1e-6))


class DCNv3Block(nn.Module):
    """The DCNv3 operator with its projections: (N, H, W, C) -> (N, H, W, C), 3×3 kernel, stride 1, pad 1."""

    def __init__(self, channels: int, group: int, offset_scale: float = 1.0, kernel: int = 3) -> None:
        super().__init__()
        if channels % group:
            raise ValueError(f"DCNv3: channels {channels} not divisible by group {group}")
        self.group, self.kernel, self.offset_scale = group, kernel, offset_scale
        self.dw_conv = nn.Sequential(nn.Conv2d(channels, channels, kernel, padding=(kernel - 1) // 2,
                                               groups=channels), _ln_from_first(channels), nn.GELU())
        self.offset = nn.Linear(channels, group * kernel * kernel * 2)
        self.mask = nn.Linear(channels, group * kernel * kernel)
        self.input_proj = nn.Linear(channels, channels)
        self.output_proj = nn.Linear(channels, channels)
        for lin in (self.offset, self.mask):
            nn.init.zeros_(lin.weight)
            nn.init.zeros_(lin.bias)
        for lin in (self.input_proj, self.output_proj):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, h, w, _ = x.shape
        value = self.input_proj(x)
        ctx = self.dw_conv(x.permute(0, 3, 1, 2))
        offset = self.offset(ctx)
        mask = self.mask(ctx).reshape(n, h, w, self.group, -1).softmax(-1).reshape(n, h, w, -1)
        out = dcnv3(value, offset, mask.to(value.dtype), self.kernel, 1, (self.kernel - 1) // 2, 1, self.group,
                    self.offset_scale)
        return self.output_proj(out)


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class _Layer(nn.Module):
    def __init__(self, dim: int, group: int, mlp_ratio: float, drop_path: float, layer_scale: float) -> None:
        super().__init__()
        self.norm1 = _ln_last(dim)
        self.dcn = DCNv3Block(dim, group)
        self.norm2 = _ln_last(dim)
        self.mlp = _Mlp(dim, int(dim * mlp_ratio))
        self.gamma1 = nn.Parameter(torch.full((dim,), float(layer_scale)))
        self.gamma2 = nn.Parameter(torch.full((dim,), float(layer_scale)))
        self.drop_path = drop_path

    def _dp(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_path == 0.0:
            return x
        keep = x.new_empty(x.shape[0], 1, 1, 1).bernoulli_(1 - self.drop_path)
        return x * keep / (1 - self.drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self._dp(self.gamma1 * self.dcn(self.norm1(x)))
        return x + self._dp(self.gamma2 * self.mlp(self.norm2(x)))


class _Downsample(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, 2 * dim, 3, 2, 1, bias=False)
        self.norm = _ln_from_first(2 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv(x.permute(0, 3, 1, 2)))


class _Level(nn.Module):
    def __init__(self, dim: int, depth: int, group: int, dprs: list[float], downsample: bool,
                 mlp_ratio: float, layer_scale: float) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Layer(dim, group, mlp_ratio, d, layer_scale) for d in dprs[:depth])
        self.norm = _ln_last(dim)
        self.downsample = _Downsample(dim) if downsample else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for blk in self.blocks:
            x = blk(x)
        feat = self.norm(x)
        return (self.downsample(feat) if self.downsample is not None else feat), feat


class _Stem(nn.Module):
    def __init__(self, out: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, out // 2, 3, 2, 1)
        self.norm1 = nn.Sequential(_ToLast(), nn.LayerNorm(out // 2, eps=1e-6), _ToFirst())
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(out // 2, out, 3, 2, 1)
        self.norm2 = _ln_from_first(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(self.conv2(self.act(self.norm1(self.conv1(x)))))


class _ToFirst(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 3, 1, 2)


class InternImage(nn.Module):
    """InternImage backbone: (N, 3, H, W) -> 4 maps (N, C·2^i, H/2^(i+2), W/2^(i+2)), C = ``channels``."""

    def __init__(self, channels: int = 64, depths=(4, 4, 18, 4), groups=(4, 8, 16, 32), mlp_ratio: float = 4.0,
                 drop_path_rate: float = 0.2, layer_scale: float = 1.0) -> None:
        super().__init__()
        self.channels = tuple(channels * 2 ** i for i in range(len(depths)))
        self.patch_embed = _Stem(channels)
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        self.levels = nn.ModuleList(
            _Level(self.channels[i], depths[i], groups[i], dpr[sum(depths[:i]):], i < len(depths) - 1, mlp_ratio,
                   layer_scale) for i in range(len(depths)))
        self.apply(self._init)
        for m in self.modules():  # the DCNv3 projections keep their own initialisation (zero offsets and masks)
            if isinstance(m, DCNv3Block):
                for lin in (m.offset, m.mask):
                    nn.init.zeros_(lin.weight)
                    nn.init.zeros_(lin.bias)
                for lin in (m.input_proj, m.output_proj):
                    nn.init.xavier_uniform_(lin.weight)
                    nn.init.zeros_(lin.bias)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.patch_embed(x)
        outs = []
        for level in self.levels:
            x, feat = level(x)
            outs.append(feat.permute(0, 3, 1, 2).contiguous())
        return outs


@register("internimage_t_uper")
class InternImageUPer(Segmentor):
    """InternImage-T (``self.backbone``) + UPerHead (``self.head``): ``forward(x)`` -> ``[logits]`` (N, C, H, W).

    ``encoder_weights``: none, or a local state dict of the official ImageNet InternImage-T
    (``internimage_t_1k_224.pth``: ``model`` entry; classifier keys ``head``, ``conv_head``, ``fc_norm`` ignored),
    loaded strictly.
    """

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None, drop_path_rate: float = 0.2,
                 head_channels: int = 512) -> None:
        super().__init__()
        self.backbone = InternImage(drop_path_rate=drop_path_rate)
        self.head = UPerHead(self.backbone.channels, num_classes, channels=head_channels)
        if not is_none(encoder_weights):
            load_local_weights(self.backbone, encoder_weights, strip_prefixes=("module.", "backbone."),
                               ignore_prefixes=("head.", "conv_head.", "fc_norm.", "pooling."))

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "InternImageUPer":
        if cfg.encoder not in (None, "internimage_t"):
            raise MSBError(f"model.encoder: internimage_t_uper uses InternImage-T (internimage_t), got '{cfg.encoder}'")
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        logits = self.head(self.backbone(x))
        return [F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)]
