"""VWFormer (Yan et al., "Multi-scale representations by varying window attention for semantic segmentation",
ICLR 2024): a decoder head with varying-window attention on a MiT-B3 or ConvNeXt-S encoder.

Written from the paper and the structure of the official MMSegmentation head (``VWHead`` in
``HelIo-World/VWFormer mmsegmentation-custom/mmseg/models/decode_heads/vw_head.py``, ``channels=512``,
``short_cut=True``, ``nheads=1`` as its base config); ``ConvBNReLU`` = mmcv's ``ConvModule`` with BN and ReLU
(bias off), the attention = mmcv's ``NonLocal2d`` (embedded Gaussian, scaled) with its own key/value convs.

Head, with D = 512 and features c1..c4 at strides 4, 8, 16, 32:

1. multi-level aggregation: token-wise linear layers c4, c3, c2 -> D, bilinear to stride 8, concatenation,
   1×1 ConvBNReLU 3D -> D: the map ``F`` (N, D, h, w);
2. varying-window attention: ``F`` is cut into 8×8 query windows of P = h/8 × w/8 pixels; for each ratio
   r ∈ {2, 4, 8} the context window is r times larger (rP × rP, same centre): the context is first reduced by an
   r×r ConvBNReLU D -> D/r² (stride 1, padded [r/2-1, r/2]), padded at the borders by copying the opposite
   strip ("copy-shift padding"), cut into 8×8 overlapping windows (unfold, kernel rP, stride P), then folded
   space-to-depth (r×r -> channels, order (r_h, r_w, c)) back to P×P×D; attention of the P² query tokens on the
   P² context tokens (1×1 convs query/key/value with bias, softmax(QKᵀ/√d), 1×1 conv + BN output), plus ``F``;
3. five branches: 1×1 ConvBNReLU of ``F``, image pooling (global average, 1×1 ConvBNReLU, upsampled), the three
   attention outputs; concatenation, 1×1 ConvBNReLU 5D -> D;
4. low-level enhancement: c1 by a linear layer to 48 channels, the stride-8 map upsampled to stride 4,
   concatenation, 1×1 ConvBNReLU (D + 48) -> D; dropout 0.1, 1×1 conv -> C logits at stride 4, upsampled
   bilinearly to the input size.

Encoders: ``mit_b3`` (segmentation-models-pytorch's Mix Transformer B3, as in SegFormer-B3) or ``convnext_small``
(timm ConvNeXt-S, stochastic depth 0.4, plus a channels-first LayerNorm on each of the four outputs as
mmcls' ConvNeXt with ``out_indices=[0, 1, 2, 3]``).

Input: H, W multiples of 128 (the stride-8 map must split into 8 windows of an even side for the copy-shift
padding). One output; test-time rule ``first``. Parameters at 3 output maps: 51,423,299 (MiT-B3; Table 3:
51.42 M) and 57,005,347 (ConvNeXt-S; 57.01 M). GMACs (conv+linear, :mod:`msb.profiling.flops`): 15.50 / 62.00 (MiT-B3;
Table 3: 15.55 / 62.81) and 19.16 / 76.64 (ConvNeXt-S; 19.21 / 77.44) at 256² / 512²; the head's own attention
products (0.05 / 0.80 GMACs) are what the table appears to add.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.pretrained import IMAGENET, pretrained_guard
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["VWFormer", "VWFormerMiTB3", "VWFormerConvNeXtS", "VWHead", "VaryingWindowAttention",
           "build_encoder"]

#: encoder name -> feature channels at strides 4, 8, 16, 32
ENCODERS: dict[str, tuple[int, int, int, int]] = {"mit_b3": (64, 128, 320, 512),
                                                   "convnext_small": (96, 192, 384, 768)}


class ConvBNReLU(nn.Sequential):
    """k×k conv (no bias) -> BN -> ReLU, padding 0. (N, C_in, H, W) -> (N, C_out, H - k + 1, W - k + 1)."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int = 1) -> None:
        super().__init__(nn.Conv2d(in_ch, out_ch, kernel_size, bias=False), nn.BatchNorm2d(out_ch),
                         nn.ReLU(inplace=True))


class TokenLinear(nn.Module):
    """Linear layer over the channels of every pixel (SegFormer's MLP): (N, C_in, H, W) -> (N, C_out, H, W)."""

    def __init__(self, in_ch: int, out_ch: int) -> None:
        super().__init__()
        self.proj = nn.Linear(in_ch, out_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        return self.proj(x.flatten(2).transpose(1, 2)).transpose(1, 2).reshape(n, -1, h, w)


class VaryingWindowAttention(nn.Module):
    """Attention of query windows on context windows, ``heads`` heads over ``dim`` channels.

    ``forward(query, context)``: query (B, D, P, P'), context (B, D, P, P') -> (B, D, P, P') =
    BN(W_out · softmax(Q Kᵀ / √(D/heads)) V) with Q, K, V 1×1 convolutions (bias) of query / context / context.
    The output BN starts at weight 0 (mmcv's NonLocal2d ``zeros_init``), so each branch starts as the shortcut.
    """

    def __init__(self, dim: int, heads: int = 1) -> None:
        super().__init__()
        if dim % heads:
            raise MSBError(f"model.params.heads: {heads} does not divide the head width {dim}")
        self.heads = heads
        self.theta = nn.Conv2d(dim, dim, 1)
        self.phi = nn.Conv2d(dim, dim, 1)
        self.g = nn.Conv2d(dim, dim, 1)
        self.out = nn.Sequential(nn.Conv2d(dim, dim, 1, bias=False), nn.BatchNorm2d(dim))
        for conv in (self.theta, self.phi, self.g):
            nn.init.normal_(conv.weight, std=0.01)
            nn.init.zeros_(conv.bias)
        nn.init.zeros_(self.out[1].weight)

    def _split(self, t: torch.Tensor) -> torch.Tensor:  # (B, D, P, P') -> (B*heads, P*P', D/heads)
        b, d = t.shape[:2]
        return t.reshape(b * self.heads, d // self.heads, -1).transpose(1, 2)

    def forward(self, query: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, d, ph, pw = query.shape
        q, k, v = self._split(self.theta(query)), self._split(self.phi(context)), self._split(self.g(context))
        attn = torch.softmax(torch.matmul(q, k.transpose(1, 2)) / q.shape[-1] ** 0.5, dim=-1)
        y = torch.matmul(attn, v)  # (B*heads, P*P', D/heads)
        y = y.reshape(b, self.heads, ph * pw, d // self.heads).permute(0, 1, 3, 2).reshape(b, d, ph, pw)
        return self.out(y)


def _windows(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, C, n·P, n·P') -> (B·n·n, C, P, P'), windows in row-major order."""
    b, c, h, w = x.shape
    return x.reshape(b, c, n, h // n, n, w // n).permute(0, 2, 4, 1, 3, 5).reshape(b * n * n, c, h // n, w // n)


def _unwindows(x: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`_windows`: (B·n·n, C, P, P') -> (B, C, n·P, n·P')."""
    bnn, c, ph, pw = x.shape
    b = bnn // (n * n)
    return x.reshape(b, n, n, c, ph, pw).permute(0, 3, 1, 4, 2, 5).reshape(b, c, n * ph, n * pw)


def _copy_shift_pad(x: torch.Tensor, r: int, p: int, dim: int) -> torch.Tensor:
    """Pad ``x`` along ``dim`` (2 = rows, 3 = columns) by ``r·p - (r+1)·p // 2`` on each side with the strips
    ``[(r+1)p/2, rp)`` (left) and ``[L - rp, L - (r+1)p/2)`` (right) of ``x`` itself (the official
    ``copy_shift_padding`` for r ≤ the number of windows)."""
    a, b = (r + 1) * p // 2, r * p
    length = x.shape[dim]
    return torch.cat([x.narrow(dim, a, b - a), x, x.narrow(dim, length - b, b - a)], dim=dim)


class VWHead(nn.Module):
    """VWFormer decode head (see module docstring). ``forward([c1, c2, c3, c4])`` -> logits (N, C, H/4, W/4).

    Args:
        in_channels: channels of c1..c4; channels: D (512); num_classes: C; heads: attention heads (1);
        ratios: context-window ratios (2, 4, 8); windows: query windows per side (8); dropout: before the
        classifier (0.1); short_cut: add ``F`` to each attention branch (True).

    Raises:
        MSBError: ``channels`` is not a positive multiple of every ``r**2`` (64 for the default ratios).
    """

    def __init__(self, in_channels: tuple[int, int, int, int], num_classes: int, channels: int = 512,
                 heads: int = 1, ratios: tuple[int, ...] = (2, 4, 8), windows: int = 8, dropout: float = 0.1,
                 short_cut: bool = True, low_level_channels: int = 48) -> None:
        super().__init__()
        d = channels
        side = max(ratios)
        if not isinstance(d, int) or d < 1 or any(d % (r * r) for r in ratios):
            raise MSBError(f"model.params.channels: the VWFormer head width must be a multiple of {side * side} "
                           f"(each context of ratio r is r x r-downsampled to channels / r^2 and brought back by "
                           f"space-to-depth; ratios {tuple(ratios)}), got {d!r}; use e.g. {side * side} or 512")
        self.ratios, self.windows, self.short_cut = tuple(ratios), windows, short_cut
        self.linear_c4 = TokenLinear(in_channels[3], d)
        self.linear_c3 = TokenLinear(in_channels[2], d)
        self.linear_c2 = TokenLinear(in_channels[1], d)
        self.linear_fuse = ConvBNReLU(3 * d, d)
        self.attn = nn.ModuleList([VaryingWindowAttention(d, heads) for _ in self.ratios])
        self.ds = nn.ModuleList([ConvBNReLU(d, d // (r * r), r) for r in self.ratios])
        self.short_path = ConvBNReLU(d, d)
        self.image_pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), ConvBNReLU(d, d))
        self.cat = ConvBNReLU((2 + len(self.ratios)) * d, d)
        self.linear_c1 = TokenLinear(in_channels[0], low_level_channels)
        self.low_level_fuse = ConvBNReLU(d + low_level_channels, d)
        self.dropout = nn.Dropout2d(dropout)
        self.cls = nn.Conv2d(d, num_classes, 1)
        nn.init.normal_(self.cls.weight, std=0.01)
        nn.init.zeros_(self.cls.bias)

    def _context(self, f: torch.Tensor, j: int, r: int) -> torch.Tensor:
        """Context of ratio ``r`` for every query window: (N, D, h, w) -> (N·n², D, h/n, w/n)."""
        n = self.windows
        ph, pw = f.shape[2] // n, f.shape[3] // n
        lo, hi = r // 2 - 1 if r % 2 == 0 else r // 2, r // 2
        ctx = self.ds[j](F.pad(f, (lo, hi, lo, hi)))  # (N, D/r², h, w)
        ctx = _copy_shift_pad(_copy_shift_pad(ctx, r, pw, 3), r, ph, 2)
        b, c = ctx.shape[:2]
        ctx = F.unfold(ctx, kernel_size=(r * ph, r * pw), stride=(ph, pw))  # (N, c·rph·rpw, n²)
        ctx = ctx.reshape(b, c, r * ph, r * pw, n * n).permute(0, 4, 1, 2, 3).reshape(b * n * n, c, r * ph, r * pw)
        # space-to-depth, channel order (r_h, r_w, c): 'b c (ph rh) (pw rw) -> b (rh rw c) ph pw'
        ctx = ctx.reshape(b * n * n, c, ph, r, pw, r).permute(0, 3, 5, 1, 2, 4)
        return ctx.reshape(b * n * n, r * r * c, ph, pw)

    def forward(self, feats: list[torch.Tensor]) -> torch.Tensor:
        c1, c2, c3, c4 = feats
        size2 = c2.shape[-2:]
        up = lambda t, s: F.interpolate(t, size=s, mode="bilinear", align_corners=False)  # noqa: E731
        f = self.linear_fuse(torch.cat([up(self.linear_c4(c4), size2), up(self.linear_c3(c3), size2),
                                        self.linear_c2(c2)], dim=1))
        n = self.windows
        if f.shape[2] % (2 * n) or f.shape[3] % (2 * n):
            raise MSBError(f"VWFormer: the stride-8 map {tuple(f.shape[2:])} must split into {n}×{n} windows of an "
                           f"even side; use an input size that is a multiple of {16 * n}")
        branches = [self.short_path(f), up(self.image_pool(f), f.shape[-2:])]
        query = _windows(f, n)
        for j, r in enumerate(self.ratios):
            y = _unwindows(self.attn[j](query, self._context(f, j, r)), n)
            branches.append(y + f if self.short_cut else y)
        f = self.cat(torch.cat(branches, dim=1))
        f = self.low_level_fuse(torch.cat([up(f, c1.shape[-2:]), self.linear_c1(c1)], dim=1))
        return self.cls(self.dropout(f))


class _LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of (N, C, H, W) (mmcls' ConvNeXt output norms)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class _ConvNeXtS(nn.Module):
    """timm ``convnext_small`` (classifier removed; its keys under ``model.``) + one LayerNorm per output.
    ``forward(x)`` -> 4 maps with 96/192/384/768 channels at strides 4..32."""

    def __init__(self, weights: str | None, drop_path_rate: float) -> None:
        super().__init__()
        import timm

        imagenet = str(weights).strip().lower() == IMAGENET
        with pretrained_guard("vwformer_convnext_s") if imagenet else contextlib.nullcontext():
            self.model = timm.create_model("convnext_small.fb_in1k", pretrained=imagenet, num_classes=0,
                                           drop_path_rate=drop_path_rate)
        self.model.head = nn.Identity()  # the classifier's norm is not used by forward_intermediates
        if not imagenet and not is_none(weights):
            from timm.models.convnext import checkpoint_filter_fn

            load_local_weights(self.model, weights, strip_prefixes=("module.", "backbone.", "model."),
                               transform=lambda sd: checkpoint_filter_fn(sd, self.model))
        self.norms = nn.ModuleList([_LayerNorm2d(c, eps=1e-6) for c in ENCODERS["convnext_small"]])

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = self.model.forward_intermediates(x, indices=[0, 1, 2, 3], intermediates_only=True)
        return [norm(f) for norm, f in zip(self.norms, feats)]


class _MiT(nn.Module):
    """smp's ``mit_b3`` encoder (keys under ``encoder.``). ``forward(x)`` -> 4 maps, 64/128/320/512 channels."""

    def __init__(self, weights: str | None, drop_path_rate: float) -> None:
        super().__init__()
        from segmentation_models_pytorch.encoders import get_encoder

        imagenet = str(weights).strip().lower() == IMAGENET
        with pretrained_guard("vwformer_mit_b3", "mit_b3") if imagenet else contextlib.nullcontext():
            self.encoder = get_encoder("mit_b3", weights=IMAGENET if imagenet else None,
                                       drop_path_rate=drop_path_rate)
        if not imagenet and not is_none(weights):
            load_local_weights(self.encoder, weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(self.encoder(x)[-4:])


def build_encoder(name: str, weights: str | None = None, drop_path_rate: float | None = None) -> nn.Module:
    """The VWFormer encoder ``name`` (a key of :data:`ENCODERS`), random init, ``imagenet`` or a local file.

    ``drop_path_rate`` defaults to the official configs' 0.1 (MiT, SegFormer) and 0.4 (ConvNeXt-S, VWFormer).

    Raises:
        MSBError: unknown encoder; a weights file that is missing or does not match (keys listed).
    """
    if name == "mit_b3":
        return _MiT(weights, 0.1 if drop_path_rate is None else drop_path_rate)
    if name == "convnext_small":
        return _ConvNeXtS(weights, 0.4 if drop_path_rate is None else drop_path_rate)
    raise MSBError(f"model.encoder: VWFormer encoders are {', '.join(ENCODERS)}, not '{name}'")


class VWFormer(Segmentor):
    """Encoder + :class:`VWHead`. ``forward(x)`` -> ``[logits]``, logits (N, C, H, W) (bilinear from stride 4)."""

    test_time_rule = "first"
    size_divisor = 128
    encoder_name = "mit_b3"

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None, channels: int = 512,
                 heads: int = 1, drop_path_rate: float | None = None, dropout: float = 0.1) -> None:
        super().__init__()
        self.backbone = build_encoder(self.encoder_name, encoder_weights, drop_path_rate)
        self.head = VWHead(ENCODERS[self.encoder_name], num_classes, channels=channels, heads=heads,
                           dropout=dropout)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "VWFormer":
        """Build from ``model.encoder_weights`` and ``model.params`` (``channels``, ``heads``,
        ``drop_path_rate``, ``dropout``). Raises :class:`MSBError` for another encoder or an unknown key."""
        if cfg.encoder not in (None, cls.encoder_name):
            raise MSBError(f"model.encoder: {cls.arch_name} uses the encoder '{cls.encoder_name}', got "
                           f"'{cfg.encoder}'; remove the key")
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x`` (N, 3, H, W), H and W multiples of 128 -> ``[logits (N, C, H, W)]``."""
        logits = self.head(self.backbone(x))
        return [F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)]


@register("vwformer_mit_b3")
class VWFormerMiTB3(VWFormer):
    """VWFormer with the MiT-B3 encoder (Table 3: 51.42 M parameters, 15.55 / 62.81 GMACs at 256² / 512²)."""

    encoder_name = "mit_b3"


@register("vwformer_convnext_s")
class VWFormerConvNeXtS(VWFormer):
    """VWFormer with the ConvNeXt-S encoder (Table 3: 57.01 M parameters, 19.21 / 77.44 GMACs)."""

    encoder_name = "convnext_small"
