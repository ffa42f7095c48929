"""MISSFormer (Huang, Deng, Li, Yuan, Wu; IEEE TMI 2022), from the paper and the official code
(ZhifangDeng/MISSFormer, ``networks/MISSFormer.py`` + ``networks/segformer.py``).

Structure (official defaults, all kept):

- encoder: a Mix Transformer with widths 64/128/320/512, two blocks per stage, heads 1/2/5/8, spatial reduction
  8/4/2/1, overlapping patch embeddings (7×7 stride 4, then 3×3 stride 2), and the *enhanced* Mix-FFN
  (``mix_skip``: fc1 → depth-wise 3×3 conv + the fc1 output → LayerNorm → GELU → fc2);
- bridge: four "enhanced transformer context bridge" layers over one token sequence made of all four stages,
  each stage's C_i-channel tokens split into C_i/64 tokens of 64 channels (so 1, 2, 5, 8 tokens per position);
  one self-attention (64 channels, one head) whose keys/values are the stages reduced by 8×8, 4×4, 2×2 strided
  convolutions (stage 4 unreduced), then a per-stage enhanced Mix-FFN at the stage's own width;
- decoder: patch expanding (linear + 2×2 pixel shuffle + LayerNorm) from stride 32, then at strides 16, 8, 4:
  concatenation with the bridge's skip, a linear fusion, two efficient transformer blocks and an expansion
  (×4 at the last stage), and a 1×1 conv classifier at the input resolution.

The official code hard-codes the token offsets of a 224×224 input (3136, 4704, …); here they follow the input
(any H, W multiples of 32). As the official model, and counted in its parameters: the last decoder stage's
fusion linear and two transformer blocks (built, never called: the stride-32 stage only expands). Not built: the
two LayerNorms that every official enhanced Mix-FFN creates and never calls (``norm2``/``norm3``, 131 072
parameters). Parameters at 3 classes: 42.33 M (the MSB paper's Table 3: 42.46 M, which includes those norms:
42.33 + 0.13 = 42.46).
The official enhanced Mix-FFN evaluates its fc1 twice (once for the conv branch, once for the skip); so does
this one: the output is the same, and the second call is part of the paper's 9.36 GMACs at 256×256.
One output at the input resolution; test-time rule ``first``. ``encoder_weights``: a local state dict of the
encoder (this module's key names under ``backbone.``); the official code trains from scratch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["MISSFormer"]

_DIMS = (64, 128, 320, 512)
_HEADS = (1, 2, 5, 8)
_REDUCTION = (8, 4, 2, 1)


def _tokens_to_map(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """(B, h*w, C) -> (B, C, h, w)."""
    return x.transpose(1, 2).reshape(x.shape[0], -1, h, w)


class _DWConv(nn.Module):
    """Depth-wise 3×3 convolution on a token sequence (B, h*w, C) -> (B, h*w, C)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        return self.dwconv(_tokens_to_map(x, h, w)).flatten(2).transpose(1, 2)


class _MixFFNSkip(nn.Module):
    """Enhanced Mix-FFN: ``fc2(GELU(LN(dwconv(fc1 x) + fc1 x)))``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.dwconv = _DWConv(hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.norm1 = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        # fc1 runs twice, as in the official forward (same result; its cost is in the paper's GMACs)
        return self.fc2(self.act(self.norm1(self.dwconv(self.fc1(x), h, w) + self.fc1(x))))


def _attend(q: torch.Tensor, kv: torch.Tensor, heads: int, scale: float) -> torch.Tensor:
    """Multi-head attention: q (B, N, C), kv (B, M, 2C) -> (B, N, C), softmax(q k^T · scale) v."""
    b, n, c = q.shape
    q = q.reshape(b, n, heads, c // heads).transpose(1, 2)
    k, v = kv.reshape(b, -1, 2, heads, c // heads).permute(2, 0, 3, 1, 4)
    attn = ((q @ k.transpose(-2, -1)) * scale).softmax(dim=-1)
    return (attn @ v).transpose(1, 2).reshape(b, n, c)


class _EfficientAttention(nn.Module):
    """SegFormer's efficient self-attention: keys/values from an r×r strided conv + LayerNorm (r > 1)."""

    def __init__(self, dim: int, heads: int, reduction: int) -> None:
        super().__init__()
        self.heads, self.reduction, self.scale = heads, reduction, (dim // heads) ** -0.5
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        if reduction > 1:
            self.sr = nn.Conv2d(dim, dim, reduction, reduction)
            self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        src = x
        if self.reduction > 1:
            src = self.norm(self.sr(_tokens_to_map(x, h, w)).flatten(2).transpose(1, 2))
        return self.proj(_attend(self.q(x), self.kv(src), self.heads, self.scale))


class _Block(nn.Module):
    """Pre-norm transformer block: efficient attention + enhanced Mix-FFN, both residual."""

    def __init__(self, dim: int, heads: int, reduction: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _EfficientAttention(dim, heads, reduction)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = _MixFFNSkip(dim, dim * 4)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), h, w)
        return x + self.mlp(self.norm2(x), h, w)


class _PatchEmbed(nn.Module):
    """Overlapping patch embedding: conv (k, stride s, padding k//2) + LayerNorm -> tokens, h, w."""

    def __init__(self, cin: int, dim: int, k: int, s: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cin, dim, k, s, k // 2)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        x = self.proj(x)
        h, w = x.shape[-2:]
        return self.norm(x.flatten(2).transpose(1, 2)), h, w


class MISSFormerEncoder(nn.Module):
    """The MiT encoder of MISSFormer: ``forward(x)`` (B, 3, H, W) -> 4 maps (B, C_i, H/s, W/s), s = 4, 8, 16, 32,
    C_i = 64, 128, 320, 512."""

    def __init__(self, depth: int = 2) -> None:
        super().__init__()
        cins = (3, *_DIMS[:3])
        for i in range(4):
            k, s = (7, 4) if i == 0 else (3, 2)
            setattr(self, f"patch_embed{i + 1}", _PatchEmbed(cins[i], _DIMS[i], k, s))
            setattr(self, f"block{i + 1}", nn.ModuleList(_Block(_DIMS[i], _HEADS[i], _REDUCTION[i])
                                                         for _ in range(depth)))
            setattr(self, f"norm{i + 1}", nn.LayerNorm(_DIMS[i]))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for i in range(1, 5):
            x, h, w = getattr(self, f"patch_embed{i}")(x)
            for blk in getattr(self, f"block{i}"):
                x = blk(x, h, w)
            x = _tokens_to_map(getattr(self, f"norm{i}")(x), h, w)
            outs.append(x)
        return outs


class _BridgeAttention(nn.Module):
    """One-head attention over the joint 64-channel sequence; keys/values reduced per stage (8, 4, 2, 1)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.scale = dim ** -0.5
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.sr = nn.ModuleList(nn.Conv2d(dim * m, dim * m, r, r) for m, r in ((1, 8), (2, 4), (5, 2)))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor, parts: list[torch.Tensor], shapes: list[tuple[int, int]]) -> torch.Tensor:
        b, _, c = x.shape
        reduced = []
        for i, part in enumerate(parts):
            if i < 3:
                h, w = shapes[i]
                part = self.sr[i](part.reshape(b, h, w, -1).permute(0, 3, 1, 2)).reshape(b, c, -1).transpose(1, 2)
            reduced.append(part)
        src = self.norm(torch.cat(reduced, 1))
        return self.proj(_attend(self.q(x), self.kv(src), 1, self.scale))


class _BridgeLayer(nn.Module):
    """x + attn(LN x), then + the per-stage enhanced Mix-FFNs (at widths 64·m, m = 1, 2, 5, 8) of LN(·)."""

    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _BridgeAttention(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mixffn = nn.ModuleList(_MixFFNSkip(dim * m, dim * m * 4) for m in (1, 2, 5, 8))

    def forward(self, x: torch.Tensor, shapes: list[tuple[int, int]], lengths: list[int]) -> torch.Tensor:
        b, _, c = x.shape
        normed = self.norm1(x)
        x = x + self.attn(normed, list(normed.split(lengths, 1)), shapes)
        t = self.norm2(x)
        outs = [ffn(part.reshape(b, h * w, -1), h, w).reshape(b, -1, c)
                for ffn, part, (h, w) in zip(self.mixffn, t.split(lengths, 1), shapes)]
        return x + torch.cat(outs, 1)


class _Expand(nn.Module):
    """Patch expanding: linear (no bias) to p²·C/p' channels, p×p pixel shuffle, LayerNorm."""

    def __init__(self, dim: int, scale: int) -> None:
        super().__init__()
        self.scale = scale
        out = dim // 2 if scale == 2 else dim
        self.expand = nn.Linear(dim, out * scale * scale, bias=False)
        self.norm = nn.LayerNorm(out)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, p = x.shape[0], self.scale
        x = self.expand(x).reshape(b, h, w, p, p, -1).permute(0, 1, 3, 2, 4, 5)
        return self.norm(x.reshape(b, h * p * w * p, -1))


class _DecoderStage(nn.Module):
    """concat(x, skip) -> linear -> 2 blocks -> expand (×2, or ×4 + 1×1 classifier for the last stage)."""

    def __init__(self, cin: int, dim: int, heads: int, reduction: int, num_classes: int, last: bool) -> None:
        super().__init__()
        self.concat_linear = nn.Linear(cin, dim)
        self.layer_up = _Expand(dim, 4 if last else 2)
        self.last_layer = nn.Conv2d(dim, num_classes, 1) if last else None
        self.layer_former_1 = _Block(dim, heads, reduction)
        self.layer_former_2 = _Block(dim, heads, reduction)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor, skip: torch.Tensor | None, h: int, w: int) -> torch.Tensor:
        if skip is None:  # the stride-32 stage: expansion only (its linear and blocks are unused, as official)
            return self.layer_up(x, h, w)
        x = self.concat_linear(torch.cat([x, skip.flatten(2).transpose(1, 2)], -1))
        x = self.layer_former_2(self.layer_former_1(x, h, w), h, w)
        x = self.layer_up(x, h, w)
        if self.last_layer is None:
            return x
        return self.last_layer(_tokens_to_map(x, 4 * h, 4 * w))


@register("missformer")
class MISSFormer(Segmentor):
    """MISSFormer as a :class:`Segmentor`: ``forward(x)`` (N, 3, H, W), H and W multiples of 32 ->
    ``[logits]``, logits (N, C, H, W)."""

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None) -> None:
        super().__init__()
        self.backbone = MISSFormerEncoder()
        self.bridge = nn.ModuleList(_BridgeLayer(64) for _ in range(4))
        # (concat width, width, heads, reduction) of the stages at strides 32, 16, 8, 4
        spec = ((1024, 512, 8, 1), (576, 320, 5, 2), (288, 128, 2, 4), (128, 64, 1, 8))
        self.decoder = nn.ModuleList(_DecoderStage(*s, num_classes, last=(i == 3)) for i, s in enumerate(spec))
        if not is_none(encoder_weights):
            load_local_weights(self.backbone, encoder_weights, strip_prefixes=("module.", "backbone."))

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "MISSFormer":
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = self.backbone(x)
        b = x.shape[0]
        shapes = [tuple(f.shape[-2:]) for f in feats]
        tokens = [f.permute(0, 2, 3, 1).reshape(b, -1, 64) for f in feats]  # C_i/64 tokens per position
        lengths = [t.shape[1] for t in tokens]
        t = torch.cat(tokens, 1)
        for layer in self.bridge:
            t = layer(t, shapes, lengths)
        skips = [p.reshape(b, h, w, -1).permute(0, 3, 1, 2) for p, (h, w) in zip(t.split(lengths, 1), shapes)]
        h, w = shapes[3]
        y = self.decoder[0](skips[3].flatten(2).transpose(1, 2), None, h, w)
        for i, skip in zip((1, 2, 3), (skips[2], skips[1], skips[0])):
            h, w = shapes[3 - i]
            y = self.decoder[i](y, skip, h, w)
        if tuple(y.shape[-2:]) != tuple(x.shape[-2:]):
            y = F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)
        return [y]
