"""TransNeXt-Tiny (Shi, CVPR 2024) + UPerNet head: ``transnext_t_uper``, a model of the MSB case study
(paper section 4.1, Table 3: 57.74 M parameters, 59.60 / 238.43 GMACs at 256² / 512², 3 classes).

Backbone, as the official segmentation backbone ``transnext_tiny`` (``segmentation/upernet/transnext_native.py``;
parameter names kept, so official checkpoints load): four stages of widths 72/144/288/576, depths 2/2/15/2,
heads 3/6/12/24, ConvGLU ratios 8/8/4/4, overlapping patch embeddings (7×7 stride 4, then 3×3 stride 2),
stochastic depth 0.4 (linear). Stages 1-3 use *aggregated attention*: each query's softmax runs jointly over
its 3×3 sliding window (:mod:`msb.models.ops.aggregated_attention`) and over a pooled key set (1×1 conv, GELU,
average pooling by the stage's ratio 8/4/2, LayerNorm), with L2-normalised queries/keys, a learned temperature,
a length-scaled query embedding, learnable window tokens and a continuous relative position bias (CPB, a
2-512-heads MLP on log-spaced relative coordinates). Stage 4 uses full attention with the same CPB.

The CPB table is built, as the official non-extrapolation mode, for the grid of ``model.params.img_size`` (an
int or [H, W]; the official configs set it to the training crop; ``pretrain_size`` = 224 scales the coordinates)
and the bias is resized bilinearly when the feature size differs, so any multiple of 32 runs. ``msb profile``
rebuilds the model with ``img_size`` = the profiled size (:func:`msb.profiling.measure.takes_img_size`). The CPB
MLP runs on the unique relative offsets only (a few thousand rows: < 0.01 GMACs).

Head: :class:`~msb.models.generic.uper.UPerHead` with 512 channels and pool scales 1/2/3/6 (official
``upernet_transnext`` config); its auxiliary FCN head (on stage 3, training loss weight 0.4) is not built: Table 3
counts the model without it (backbone 28.2 M incl. the ImageNet classifier, 27.6 M without, + head 30.1 M).
Output: ``[logits]`` at the input resolution. Inputs: multiples of 32.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.generic.uper import UPerHead
from msb.models.ops.aggregated_attention import window_av, window_qk
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["TransNeXt", "TransNeXtUPer", "cpb_table"]

_TINY = {"embed_dims": (72, 144, 288, 576), "num_heads": (3, 6, 12, 24), "mlp_ratios": (8, 8, 4, 4),
         "depths": (2, 2, 15, 2), "sr_ratios": (8, 4, 2, 1)}


@torch.no_grad()
def cpb_table(query: tuple[int, int], key: tuple[int, int], pretrain: tuple[int, int]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Relative coordinates for the continuous position bias between a query grid and a (pooled) key grid.

    Key coordinates are the query axes average-pooled to the key size; each (query, key) pair's offset is
    divided by (pretrain − 1) and multiplied by 8, then mapped to sign(t)·log2(|t| + 1)/log2(8) (TransNeXt's
    log-spaced coordinates, after Swin V2).

    Returns:
        ``(index, table)``: index (Nq·Nk,) int64 into the unique rows of table (U, 2) float32.
    """
    axes = []
    for qn, kn, pn in zip(query, key, pretrain):
        qa = torch.arange(qn, dtype=torch.float32)
        ka = F.adaptive_avg_pool1d(qa[None], kn)[0]
        axes.append((qa, ka, pn))
    (qh, kh, ph), (qw, kw, pw) = axes
    qy, qx = (t.reshape(-1) for t in torch.meshgrid(qh, qw, indexing="ij"))
    ky, kx = (t.reshape(-1) for t in torch.meshgrid(kh, kw, indexing="ij"))
    rel = torch.stack([(qy[:, None] - ky[None]) / (ph - 1) * 8, (qx[:, None] - kx[None]) / (pw - 1) * 8], -1)
    table, index = torch.unique(rel.reshape(-1, 2), return_inverse=True, dim=0)
    table = torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8)
    return index, table


def _resize_bias(bias: torch.Tensor, trained_q: tuple[int, int], trained_k: tuple[int, int],
                 q: tuple[int, int], k: tuple[int, int]) -> torch.Tensor:
    """(heads, Nq_t, Nk_t) bias on the trained grids -> (heads, Nq, Nk), bilinear over keys then queries."""
    h = bias.shape[0]
    if trained_k != k:
        bias = F.interpolate(bias.reshape(h, -1, *trained_k), size=k, mode="bilinear", align_corners=False)
    bias = bias.reshape(h, -1, k[0] * k[1])
    if trained_q != q:
        bias = bias.transpose(1, 2).reshape(h, -1, *trained_q)
        bias = F.interpolate(bias, size=q, mode="bilinear", align_corners=False)
        bias = bias.reshape(h, -1, q[0] * q[1]).transpose(1, 2)
    return bias


class _CPB(nn.Module):
    """Continuous relative position bias: MLP 2 -> 512 -> heads on the table of :func:`cpb_table`."""

    def _init_cpb(self, heads: int) -> None:
        self.cpb_fc1 = nn.Linear(2, 512)
        self.cpb_act = nn.ReLU(inplace=True)
        self.cpb_fc2 = nn.Linear(512, heads)
        self.temperature = nn.Parameter(torch.log(torch.expm1(torch.full((heads, 1, 1), 1 / 0.24))))

    def _bias(self, index: torch.Tensor, table: torch.Tensor, nq: int, nk: int) -> torch.Tensor:
        out = self.cpb_fc2(self.cpb_act(self.cpb_fc1(table))).transpose(0, 1)  # (heads, U)
        return out[:, index].reshape(-1, nq, nk)


class AggregatedAttention(_CPB):
    """Window + pooled attention of one TransNeXt block (stages 1-3): (B, N, C) -> (B, N, C)."""

    def __init__(self, dim: int, heads: int, trained: tuple[int, int], sr: int, window: int = 3) -> None:
        super().__init__()
        self.heads, self.head_dim, self.window = heads, dim // heads, window
        self.trained_q, self.trained_k = trained, (trained[0] // sr, trained[1] // sr)
        local = window * window
        self._init_cpb(heads)
        self.q = nn.Linear(dim, dim)
        self.query_embedding = nn.Parameter(nn.init.trunc_normal_(torch.empty(heads, 1, self.head_dim), std=0.02))
        self.kv = nn.Linear(dim, 2 * dim)
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)
        self.sr = nn.Conv2d(dim, dim, 1)
        self.sr_ratio = sr
        self.norm = nn.LayerNorm(dim)
        self.act = nn.GELU()
        self.relative_pos_bias_local = nn.Parameter(nn.init.trunc_normal_(torch.empty(heads, local), std=0.0004))
        self.learnable_tokens = nn.Parameter(nn.init.trunc_normal_(torch.empty(heads, self.head_dim, local),
                                                                   std=0.02))
        self.learnable_bias = nn.Parameter(torch.zeros(heads, 1, local))

    def forward(self, x: torch.Tensor, hw: tuple[int, int], index: torch.Tensor, table: torch.Tensor,
                scale: torch.Tensor, pad_mask: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        h, w = hw
        ph, pw = h // self.sr_ratio, w // self.sr_ratio
        heads, d = self.heads, self.head_dim
        q = F.normalize(self.q(x).reshape(b, n, heads, d).transpose(1, 2), dim=-1)
        q_scaled = (q + self.query_embedding) * F.softplus(self.temperature) * scale
        k_loc, v_loc = self.kv(x).chunk(2, dim=-1)
        k_loc = F.normalize(k_loc.reshape(b, n, heads, d).transpose(1, 2), dim=-1)
        v_loc = v_loc.reshape(b, n, heads, d).transpose(1, 2)
        attn_local = window_qk(q_scaled, k_loc, self.relative_pos_bias_local, h, w, self.window)
        attn_local = attn_local.masked_fill(pad_mask, float("-inf"))
        pooled = self.act(self.sr(x.transpose(1, 2).reshape(b, c, h, w)))
        pooled = self.norm(F.adaptive_avg_pool2d(pooled, (ph, pw)).reshape(b, c, ph * pw).transpose(1, 2))
        k_pool, v_pool = self.kv(pooled).reshape(b, ph * pw, 2 * heads, d).transpose(1, 2).chunk(2, dim=1)
        bias = self._bias(index, table, self.trained_q[0] * self.trained_q[1], self.trained_k[0] * self.trained_k[1])
        bias = _resize_bias(bias, self.trained_q, self.trained_k, (h, w), (ph, pw))
        attn_pool = q_scaled @ F.normalize(k_pool, dim=-1).transpose(-2, -1) + bias
        attn = self.attn_drop(torch.cat([attn_local, attn_pool], dim=-1).softmax(dim=-1))
        attn_local, attn_pool = attn.split([self.window ** 2, ph * pw], dim=-1)
        local = window_av(q @ self.learnable_tokens + self.learnable_bias + attn_local, v_loc, h, w, self.window)
        out = (local + attn_pool @ v_pool).transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(out))


class FullAttention(_CPB):
    """Full attention of the last stage with the CPB bias: (B, N, C) -> (B, N, C)."""

    def __init__(self, dim: int, heads: int, trained: tuple[int, int]) -> None:
        super().__init__()
        self.heads, self.head_dim, self.trained = heads, dim // heads, trained
        self._init_cpb(heads)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.query_embedding = nn.Parameter(nn.init.trunc_normal_(torch.empty(heads, 1, self.head_dim), std=0.02))
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], index: torch.Tensor, table: torch.Tensor,
                scale: torch.Tensor, pad_mask: torch.Tensor | None) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3 * self.heads, self.head_dim).transpose(1, 2).chunk(3, dim=1)
        t = self.trained[0] * self.trained[1]
        bias = _resize_bias(self._bias(index, table, t, t), self.trained, self.trained, hw, hw)
        q = (F.normalize(q, dim=-1) + self.query_embedding) * F.softplus(self.temperature) * scale
        attn = self.attn_drop((q @ F.normalize(k, dim=-1).transpose(-2, -1) + bias).softmax(dim=-1))
        return self.proj_drop(self.proj((attn @ v).transpose(1, 2).reshape(b, n, c)))


class _DWConv(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        return self.dwconv(x.transpose(1, 2).reshape(b, c, *hw)).flatten(2).transpose(1, 2)


class ConvGLU(nn.Module):
    """Convolutional GLU: fc1 to 2·h (h = ⌊2·hidden/3⌋), GELU(3×3 depthwise(first half)) · second half, fc2."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        hidden = int(2 * hidden / 3)
        self.fc1 = nn.Linear(dim, 2 * hidden)
        self.dwconv = _DWConv(hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        a, v = self.fc1(x).chunk(2, dim=-1)
        return self.drop(self.fc2(self.drop(self.act(self.dwconv(a, hw)) * v)))


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, mlp_ratio: float, trained: tuple[int, int], sr: int,
                 drop_path: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = FullAttention(dim, heads, trained) if sr == 1 else AggregatedAttention(dim, heads, trained, sr)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = ConvGLU(dim, int(dim * mlp_ratio))
        self.drop_path = drop_path

    def _dp(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.drop_path == 0.0:
            return x
        keep = x.new_empty(x.shape[0], 1, 1).bernoulli_(1 - self.drop_path)
        return x * keep / (1 - self.drop_path)

    def forward(self, x: torch.Tensor, hw: tuple[int, int], *geom) -> torch.Tensor:
        x = x + self._dp(self.attn(self.norm1(x), hw, *geom))
        return x + self._dp(self.mlp(self.norm2(x), hw))


class _PatchEmbed(nn.Module):
    def __init__(self, cin: int, dim: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, kernel, stride, kernel // 2)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.proj(x)
        return self.norm(x.flatten(2).transpose(1, 2)), (x.shape[2], x.shape[3])


class TransNeXt(nn.Module):
    """TransNeXt backbone: (N, 3, H, W) -> 4 maps (N, C_i, H/2^(i+2), W/2^(i+2)), C = ``embed_dims``."""

    def __init__(self, img_size: tuple[int, int] = (256, 256), pretrain_size: int = 224, embed_dims=_TINY["embed_dims"],
                 num_heads=_TINY["num_heads"], mlp_ratios=_TINY["mlp_ratios"], depths=_TINY["depths"],
                 sr_ratios=_TINY["sr_ratios"], drop_path_rate: float = 0.4, window: int = 3) -> None:
        super().__init__()
        self.sr_ratios, self.window, self.channels = tuple(sr_ratios), window, tuple(embed_dims)
        dpr = torch.linspace(0, drop_path_rate, sum(depths)).tolist()
        for i, (dim, heads, ratio, depth, sr) in enumerate(zip(embed_dims, num_heads, mlp_ratios, depths, sr_ratios)):
            q = (img_size[0] // 2 ** (i + 2), img_size[1] // 2 ** (i + 2))
            index, table = cpb_table(q, (q[0] // sr, q[1] // sr), (pretrain_size // 2 ** (i + 2),) * 2)
            self.register_buffer(f"relative_pos_index{i + 1}", index, persistent=False)
            self.register_buffer(f"relative_coords_table{i + 1}", table, persistent=False)
            cin = 3 if i == 0 else embed_dims[i - 1]
            setattr(self, f"patch_embed{i + 1}", _PatchEmbed(cin, dim, 7 if i == 0 else 3, 4 if i == 0 else 2))
            start = sum(depths[:i])
            setattr(self, f"block{i + 1}", nn.ModuleList(_Block(dim, heads, ratio, q, sr, dpr[start + j])
                                                           for j in range(depth)))
            setattr(self, f"norm{i + 1}", nn.LayerNorm(dim, eps=1e-6))
        for m in self.modules():
            self._init(m)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Conv2d):
            m.weight.data.normal_(0, math.sqrt(2.0 / (m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                                                      // m.groups)))
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for i, sr in enumerate(self.sr_ratios):
            x, (h, w) = getattr(self, f"patch_embed{i + 1}")(x)
            geom = [getattr(self, f"relative_pos_index{i + 1}"), getattr(self, f"relative_coords_table{i + 1}")]
            with torch.no_grad():
                pool_len = (h // sr) * (w // sr)
                if sr > 1:
                    ones = torch.ones(1, 1, h, w, device=x.device, dtype=x.dtype)
                    cols = F.unfold(ones, self.window, padding=self.window // 2)[0]  # (L, N)
                    geom += [torch.log(cols.sum(0)[:, None] + pool_len), (cols == 0).t()]
                else:
                    geom += [torch.log(torch.tensor(float(pool_len), device=x.device, dtype=x.dtype)), None]
            for blk in getattr(self, f"block{i + 1}"):
                x = blk(x, (h, w), *geom)
            x = getattr(self, f"norm{i + 1}")(x)
            x = x.reshape(x.shape[0], h, w, -1).permute(0, 3, 1, 2).contiguous()
            outs.append(x)
        return outs


@register("transnext_t_uper")
class TransNeXtUPer(Segmentor):
    """TransNeXt-Tiny (``self.backbone``) + UPerHead (``self.head``): ``forward(x)`` -> ``[logits]`` (N, C, H, W).

    ``encoder_weights``: none, or a local state dict of the official ImageNet TransNeXt-Tiny (its ``head.*``
    classifier is ignored; ``module.``/``backbone.`` prefixes stripped), loaded strictly.
    """

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None,
                 img_size: int | Sequence[int] = 256, pretrain_size: int = 224, drop_path_rate: float = 0.4,
                 head_channels: int = 512) -> None:
        super().__init__()
        hw = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        if len(hw) != 2 or not all(isinstance(v, int) and v % 32 == 0 and v >= 64 for v in hw):
            raise MSBError(f"model.params.img_size: an int or [H, W], multiples of 32 and >= 64 (the grid of the "
                           f"position-bias table), got {img_size!r}")
        self.backbone = TransNeXt(hw, pretrain_size, drop_path_rate=drop_path_rate)
        self.head = UPerHead(self.backbone.channels, num_classes, channels=head_channels)
        if not is_none(encoder_weights):
            load_local_weights(self.backbone, encoder_weights, strip_prefixes=("module.", "backbone."),
                               ignore_prefixes=("head.",))

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "TransNeXtUPer":
        if cfg.encoder not in (None, "transnext_tiny"):
            raise MSBError(f"model.encoder: transnext_t_uper uses TransNeXt-Tiny (transnext_tiny), got '{cfg.encoder}'")
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        logits = self.head(self.backbone(x))
        return [F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)]
