"""Swin-UMamba (Liu, Yang, Zhou, Xi, Yu, Wang, Zhang, Chen, Zhou; MICCAI 2024), from the paper and the official code
(JiarunLiu/Swin-UMamba, ``swin_umamba/nnunetv2/nets/SwinUMamba.py``; its MONAI UNETR blocks written out here).

- Stem: 7×7 stride-2 conv 3→48 + InstanceNorm (affine).
- Encoder (``backbone``): VMamba-T (VSSM) fed by the stem: 2×2 patch embedding 48→96 + LayerNorm, four stages of
  visual state-space blocks (widths 96/192/384/768, depths 2/2/9/2, stochastic depth 0.2) with patch merging
  between them. A block: x + SS2D(LN x), where SS2D = linear to 2·d_inner (d_inner = 2·width; x and gate z),
  depth-wise 3×3 conv + SiLU on x, the 2-D selective scan along four directions (row-major, column-major and both
  reversed; state size 16, Δ rank ⌈width/16⌉), their sum, LayerNorm, × SiLU(z), linear back to the width.
- Decoder (MONAI ``UnetrBasicBlock``/``UnetrUpBlock``/``UnetOutBlock`` with residual blocks, InstanceNorm without
  affine, LeakyReLU 0.01): skip blocks on the input (3→48), the stem output (48→96) and the VSSM stages 1-3
  (96→192, 192→384, 384→768); the stage-4 output (768, stride 32) is upsampled by 2×2 transposed convs and
  fused with the skips up to full resolution; a residual block 48→48; 1×1 classifiers. The official model builds
  four classifiers (48, 96, 192, 384 channels) for nnU-Net's deep supervision; all are built here (they are in the
  paper's parameter count, 59.89 M at 3 classes) and the side outputs are returned when ``deep_supervision``.

The selective scan is :func:`msb.models.ops.selective_scan.selective_scan`: the ``mamba_ssm`` CUDA kernel when
installed and on CUDA, else pure PyTorch. ``encoder_weights``: a local VMamba-T ImageNet state dict (official
``vmamba_tiny_e292.pth`` names); as the official ``load_pretrained_ckpt``, its patch embedding (3 input channels,
not 48), final norm and head are dropped and ``layers.i.downsample`` becomes ``downsamples.i``; the rest loads
strictly into ``backbone``. One output (or four with ``deep_supervision``) at strides 1, 2, 4, 8; test-time rule
``first``. Input H, W multiples of 32.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from timm.layers import DropPath, trunc_normal_
from timm.models.swin_transformer import PatchMerging
from torch import nn

from msb.config.schema import ModelConfig
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.ops.selective_scan import selective_scan
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["SwinUMamba", "SS2D", "VSSMEncoder"]


class SS2D(nn.Module):
    """2-D selective scan block of VMamba on (B, H, W, C) channels-last maps (official parameter names)."""

    def __init__(self, d_model: int, d_state: int = 16, expand: int = 2, dt_min: float = 1e-3, dt_max: float = 0.1,
                 dt_floor: float = 1e-4) -> None:
        super().__init__()
        di = expand * d_model
        self.d_inner, self.d_state, self.dt_rank = di, d_state, math.ceil(d_model / 16)
        self.in_proj = nn.Linear(d_model, 2 * di, bias=False)
        self.conv2d = nn.Conv2d(di, di, 3, padding=1, groups=di)
        self.x_proj_weight = nn.Parameter(torch.empty(4, self.dt_rank + 2 * d_state, di))
        for w in self.x_proj_weight:  # nn.Linear's default initialisation of the four projections
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))
        std = self.dt_rank ** -0.5
        self.dt_projs_weight = nn.Parameter(torch.empty(4, di, self.dt_rank).uniform_(-std, std))
        dt = torch.exp(torch.rand(4, di) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).clamp(min=dt_floor)
        self.dt_projs_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)
        self.A_logs = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(4 * di, 1))
        self.Ds = nn.Parameter(torch.ones(4 * di))
        self.out_norm = nn.LayerNorm(di)
        self.out_proj = nn.Linear(di, d_model, bias=False)

    def _scan(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, d, H, W) -> sum of the four directional scans (B, d, H·W) in row-major order."""
        b, d, h, w = x.shape
        n = h * w
        hw = torch.stack([x.reshape(b, d, n), x.transpose(2, 3).reshape(b, d, n)], 1)
        xs = torch.cat([hw, hw.flip(-1)], 1)                                       # (b, 4, d, L)
        x_dbl = torch.einsum("bkdl,kcd->bkcl", xs, self.x_proj_weight)
        dts, bs, cs = x_dbl.split([self.dt_rank, self.d_state, self.d_state], dim=2)
        dts = torch.einsum("bkrl,kdr->bkdl", dts, self.dt_projs_weight)
        y = selective_scan(xs.reshape(b, -1, n), dts.reshape(b, -1, n), -torch.exp(self.A_logs.float()),
                           bs.float(), cs.float(), self.Ds.float(), delta_bias=self.dt_projs_bias.reshape(-1).float(),
                           delta_softplus=True).reshape(b, 4, d, n)
        inv = y[:, 2:4].flip(-1)
        col = lambda t: t.reshape(b, d, w, h).transpose(2, 3).reshape(b, d, n)  # noqa: E731
        return y[:, 0] + inv[:, 0] + col(y[:, 1]) + col(inv[:, 1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, _ = x.shape
        x, z = self.in_proj(x).chunk(2, dim=-1)
        x = F.silu(self.conv2d(x.permute(0, 3, 1, 2).contiguous()))
        y = self._scan(x).transpose(1, 2).reshape(b, h, w, -1)
        return self.out_proj(self.out_norm(y) * F.silu(z))


class _VSSBlock(nn.Module):
    def __init__(self, dim: int, drop_path: float) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.self_attention = SS2D(dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop_path(self.self_attention(self.ln_1(x)))


class VSSMEncoder(nn.Module):
    """VMamba-T on the 48-channel stem output: ``forward(x)`` (B, 48, H/2, W/2) -> 4 maps (B, C_i, H/s, W/s),
    C_i = 96, 192, 384, 768 at s = 4, 8, 16, 32."""

    def __init__(self, in_chans: int = 48, dims=(96, 192, 384, 768), depths=(2, 2, 9, 2),
                 drop_path_rate: float = 0.2) -> None:
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(in_chans, dims[0], 2, 2)
        self.patch_embed.norm = nn.LayerNorm(dims[0])
        dpr = [drop_path_rate * i / max(sum(depths) - 1, 1) for i in range(sum(depths))]
        self.layers = nn.ModuleList()
        for i, depth in enumerate(depths):
            stage = nn.Module()
            stage.blocks = nn.ModuleList(_VSSBlock(dims[i], dpr[sum(depths[:i]) + j]) for j in range(depth))
            self.layers.append(stage)
        self.downsamples = nn.ModuleList(PatchMerging(dims[i], dims[i + 1]) for i in range(len(dims) - 1))
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=0.02)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.patch_embed.norm(self.patch_embed.proj(x).permute(0, 2, 3, 1))
        outs = []
        for i, stage in enumerate(self.layers):
            for blk in stage.blocks:
                x = blk(x)
            outs.append(x.permute(0, 3, 1, 2))
            if i < len(self.downsamples):
                x = self.downsamples[i](x)
        return outs


class _ResBlock(nn.Module):
    """MONAI ``UnetResBlock`` (2-D, 3×3, InstanceNorm without affine, LeakyReLU 0.01, 1×1 projection when the
    width changes)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.norm1, self.norm2 = nn.InstanceNorm2d(cout), nn.InstanceNorm2d(cout)
        self.conv3 = nn.Conv2d(cin, cout, 1, bias=False) if cin != cout else None
        self.norm3 = nn.InstanceNorm2d(cout) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.norm2(self.conv2(F.leaky_relu(self.norm1(self.conv1(x)), 0.01)))
        res = self.norm3(self.conv3(x)) if self.conv3 is not None else x
        return F.leaky_relu(out + res, 0.01)


class _UpBlock(nn.Module):
    """MONAI ``UnetrUpBlock``: 2×2 transposed conv (no bias), concatenation with the skip, residual block."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.transp_conv = nn.ConvTranspose2d(cin, cout, 2, 2, bias=False)
        self.conv_block = _ResBlock(2 * cout, cout)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.conv_block(torch.cat([self.transp_conv(x), skip], 1))


@register("swin_umamba")
class SwinUMamba(Segmentor):
    """Swin-UMamba as a :class:`Segmentor`: ``forward(x)`` (N, 3, H, W), H and W multiples of 32 -> ``[logits]``
    (N, C, H, W), plus the stride-2/4/8 side outputs with ``deep_supervision``."""

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None, deep_supervision: bool = False
                 ) -> None:
        super().__init__()
        f = (48, 96, 192, 384, 768)
        self.deep_supervision = deep_supervision
        self.stem = nn.Sequential(nn.Conv2d(3, f[0], 7, 2, 3), nn.InstanceNorm2d(f[0], affine=True))
        self.backbone = VSSMEncoder(in_chans=f[0])
        self.encoders = nn.ModuleList(_ResBlock(a, b) for a, b in zip((3, *f[:4]), f))
        self.decoders = nn.ModuleList(_UpBlock(a, b) for a, b in zip((768, 768, 384, 192, 96), (768, 384, 192, 96, 48)))
        self.decoder1 = _ResBlock(f[0], f[0])
        self.out_layers = nn.ModuleList(nn.Conv2d(c, num_classes, 1) for c in f[:4])
        if not is_none(encoder_weights):
            self._load_vmamba(encoder_weights)

    def _load_vmamba(self, path: str) -> None:
        def transform(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            out = {}
            for k, v in sd.items():
                if k.startswith(("patch_embed.", "norm.", "head.")):
                    continue
                parts = k.split(".")
                if len(parts) > 2 and parts[0] == "layers" and parts[2] == "downsample":
                    k = ".".join(["downsamples", parts[1], *parts[3:]])
                out[k] = v
            return out

        view = nn.Module()
        view.layers, view.downsamples = self.backbone.layers, self.backbone.downsamples
        load_local_weights(view, path, strip_prefixes=("module.", "vssm_encoder."), transform=transform)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "SwinUMamba":
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x1 = self.stem(x)
        feats = self.backbone(x1)                      # strides 4, 8, 16, 32
        skips = [enc(t) for enc, t in zip(self.encoders, [x, x1, *feats[:3]])]  # strides 1, 2, 4, 8, 16
        y = feats[3]
        dec = []
        for up, skip in zip(self.decoders, reversed(skips)):
            y = up(y, skip)
            dec.append(y)                              # strides 16, 8, 4, 2, 1
        out = [self.out_layers[0](self.decoder1(y))]
        if self.deep_supervision:
            out += [self.out_layers[i](dec[4 - i]) for i in (1, 2, 3)]
        return out
