"""Building blocks of CENet (Bozorgpour et al., "CENet: Context Enhancement Network for Medical Image
Segmentation", MICCAI 2025, arXiv 2505.18423), written from the paper and the structure of the official code
(``xmindflow/cenet src/networks/cenet/modules``).

- :class:`CFAModule` (context feature attention, the decoder block): a MetaFormer-style block of
  BN -> :class:`MCA` (multi-scale contextual aggregation) and BN -> :class:`ConvFFN`, each scaled by a learned
  per-channel layer scale (initial 1e-6) and added to its input;
- :class:`MCA`: style recalibration (:class:`CCU`), a SiLU-gated product of a 1×1 "gate" and a multi-order
  dilated depth-wise "value" (:class:`MultiOrderDWConv`), a 1×1 projection, the shortcut, then a softmax
  non-local block (:class:`NonLocal`, mixed with its input by a learned weight);
- :class:`DSEBlock` (dual selective enhancement, on each skip connection): the decoder and skip features
  concatenated, a feature-edge amplification (:class:`FEA`: multi-scale blur differences) plus a differential
  attention over all pixels (:class:`DiffAttention`, Ye et al. 2024) times the input, mixed by a 1×1 conv to the
  skip width and added to the skip;
- :class:`EUCB` (efficient up-convolution: nearest ×2, depth-wise 3×3 + BN + LeakyReLU(0.2), 1×1 conv) and
  :class:`ResBlock` (MONAI's ``UnetResBlock``: two k×k convs + BN + LeakyReLU(0.01), 1×1 projection shortcut).

All tensors are (N, C, H, W) float unless stated.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CFAModule", "DSEBlock", "EUCB", "ResBlock", "MCA", "DiffAttention", "NonLocal", "FEA"]


def _conv_normal_init(module: nn.Module, std: float = 0.02) -> None:
    """Official init of the decoder's up/sep-conv blocks: conv weights N(0, std), biases 0, norms (1, 0)."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.normal_(m.weight, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


class SepConvBN(nn.Sequential):
    """Dilated depth-wise 3×3 (no bias) -> BN -> ReLU -> 1×1 (no bias) -> BN -> ReLU; same size."""

    def __init__(self, channels: int, rate: int) -> None:
        super().__init__(nn.Conv2d(channels, channels, 3, padding=rate, dilation=rate, groups=channels, bias=False),
                         nn.BatchNorm2d(channels), nn.ReLU(inplace=True), nn.Conv2d(channels, channels, 1, bias=False),
                         nn.BatchNorm2d(channels), nn.ReLU(inplace=True))
        _conv_normal_init(self)


class MultiOrderDWConv(nn.Module):
    """Channel groups in the ratio 5:5:5:1, the first three through :class:`SepConvBN` with dilations ``rates``,
    the last through image pooling (7×7 average, 1×1 conv + BN + LeakyReLU, bilinear ×7 with aligned corners,
    resized back); concatenated, then a 1×1 conv. (N, C, H, W) -> (N, C, H, W)."""

    def __init__(self, channels: int, rates: tuple[int, int, int]) -> None:
        super().__init__()
        sizes = [int(r / 16 * channels) for r in (5, 5, 5, 1)]
        bounds = [0]
        for s in sizes:
            bounds.append(bounds[-1] + s)
        self.bounds = bounds
        self.branches = nn.ModuleList([SepConvBN(sizes[i], rates[i]) for i in range(3)])
        self.branches.append(nn.Sequential(nn.AdaptiveAvgPool2d(7), nn.Conv2d(sizes[3], sizes[3], 1, bias=False),
                                           nn.BatchNorm2d(sizes[3]), nn.LeakyReLU(inplace=True),
                                           nn.UpsamplingBilinear2d(scale_factor=7)))
        self.pw = nn.Conv2d(bounds[-1], channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = []
        for i, branch in enumerate(self.branches):
            y = branch(x[:, self.bounds[i]:self.bounds[i + 1]])
            if y.shape[-2:] != x.shape[-2:]:
                y = F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)
            outs.append(y)
        return self.pw(torch.cat(outs, dim=1))


class CCU(nn.Module):
    """Style recalibration: per-channel (max, mean, std) -> grouped Conv1d 3 -> 9 (k 3, no bias) -> ReLU ->
    grouped Conv1d -> 1 -> BN (batches of more than one image) -> sigmoid gate on x."""

    def __init__(self, channels: int, hidden: int = 3) -> None:
        super().__init__()
        self.fc1 = nn.Conv1d(channels, hidden * channels, 3, groups=channels, bias=False)
        self.fc2 = nn.Conv1d(hidden * channels, channels, 1, groups=channels, bias=False)
        self.bn = nn.BatchNorm1d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[:2]
        flat = x.reshape(n, c, -1)
        u = torch.stack([flat.amax(-1), flat.mean(-1), flat.std(-1, unbiased=False)], dim=-1)  # (N, C, 3)
        z = self.fc2(F.relu(self.fc1(u))).reshape(n, c)
        if n > 1:
            z = self.bn(z)
        return x * torch.sigmoid(z).reshape(n, c, 1, 1)


class NonLocal(nn.Module):
    """Softmax non-local block (Wang et al., CVPR 2018) over all H·W positions: 1×1 θ, φ, g (bias),
    softmax(θᵀφ / √C) g, 1×1 conv + BN, mixed as (1 − w)·x + w·out with a learned scalar w (initial 0.5)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.theta = nn.Conv2d(channels, channels, 1)
        self.phi = nn.Conv2d(channels, channels, 1)
        self.g = nn.Conv2d(channels, channels, 1)
        self.out = nn.Conv2d(channels, channels, 1)
        self.bn = nn.BatchNorm2d(channels)
        self.w = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        theta, phi, g = (m(x).reshape(n, c, h * w) for m in (self.theta, self.phi, self.g))
        # einsum, as the official code writes these two products (a MAC counter that skips einsum, e.g. calflops,
        # then leaves them out as it did for MSB Table 3's CENet row)
        attn = torch.softmax(torch.einsum("nci,ncj->nij", theta, phi) * c ** -0.5, dim=2)  # (N, HW, HW)
        y = torch.einsum("nij,ncj->nci", attn, g).reshape(n, c, h, w)
        return (1 - self.w) * x + self.w * self.bn(self.out(y))


class MCA(nn.Module):
    """Multi-scale contextual aggregation (see module docstring). (N, C, H, W) -> (N, C, H, W)."""

    def __init__(self, channels: int, rates: tuple[int, int, int]) -> None:
        super().__init__()
        self.ccu = CCU(channels)
        self.gate = nn.Conv2d(channels, channels, 1)
        self.value = MultiOrderDWConv(channels, rates)
        self.proj = nn.Conv2d(channels, channels, 1)
        self.nonlocal_block = NonLocal(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ccu(x)
        y = self.proj(F.silu(self.gate(y)) * F.silu(self.value(y)))
        return self.nonlocal_block(y + x)


class SRM(nn.Module):
    """Spatial recalibration: per-pixel (max, mean, std over channels) -> 1×1 + 3×3 convs 3 -> 1 (no bias) ->
    GELU -> BN -> sigmoid gate on x."""

    def __init__(self) -> None:
        super().__init__()
        self.pwc = nn.Conv2d(3, 1, 1, bias=False)
        self.dwc = nn.Conv2d(3, 1, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = torch.cat([x.amax(1, keepdim=True), x.mean(1, keepdim=True), x.std(1, keepdim=True)], dim=1)
        return x * torch.sigmoid(self.bn(F.gelu(self.pwc(u) + self.dwc(u))))


class ConvFFN(nn.Module):
    """1×1 conv C -> rC, depth-wise 3×3, GELU, :class:`SRM`, 1×1 conv rC -> C (all with bias)."""

    def __init__(self, channels: int, ratio: int = 4) -> None:
        super().__init__()
        hidden = channels * ratio
        self.fc1 = nn.Conv2d(channels, hidden, 1)
        self.dw = nn.Conv2d(hidden, hidden, 3, padding=1, groups=hidden)
        self.srm = SRM()
        self.fc2 = nn.Conv2d(hidden, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.srm(F.gelu(self.dw(self.fc1(x)))))


class CFAModule(nn.Module):
    """Context feature attention block (see module docstring). (N, C, H, W) -> (N, C, H, W)."""

    def __init__(self, channels: int, rates: tuple[int, int, int], layer_scale: float = 1e-6) -> None:
        super().__init__()
        self.norm1 = nn.BatchNorm2d(channels)
        self.mca = MCA(channels, rates)
        self.norm2 = nn.BatchNorm2d(channels)
        self.ffn = ConvFFN(channels)
        self.scale1 = nn.Parameter(torch.full((1, channels, 1, 1), layer_scale))
        self.scale2 = nn.Parameter(torch.full((1, channels, 1, 1), layer_scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.scale1 * self.mca(self.norm1(x))
        return x + self.scale2 * self.ffn(self.norm2(x))


class FEA(nn.Module):
    """Feature edge amplification: e_s = |x − up(down_s(x))| (bilinear) per scale s; the mean over scale pairs
    of |e_i − e_j| is the edge map; returns x + w·edge with a learned per-channel w (initial N(0.5, 1))."""

    def __init__(self, channels: int, scales: tuple[float, ...]) -> None:
        super().__init__()
        self.scales = tuple(scales)
        self.w = nn.Parameter(torch.randn(1, channels, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size = x.shape[-2:]
        edges = [(x - F.interpolate(F.interpolate(x, scale_factor=s, mode="bilinear"), size=size,
                                    mode="bilinear")).abs() for s in self.scales]
        pairs = [(i, j) for i in range(len(edges)) for j in range(i + 1, len(edges))]
        edge = sum((edges[i] - edges[j]).abs() for i, j in pairs) / len(pairs)
        return x + self.w * edge


class DiffAttention(nn.Module):
    """Multi-head differential attention (Ye et al., "Differential Transformer", 2024) on tokens (N, L, D):
    two softmax maps per head from split queries/keys, A1 − λ·A2 with
    λ = exp(λq1·λk1) − exp(λq2·λk2) + λ_init,
    λ_init = 0.8 − 0.6·exp(−0.3·depth); times V, RMS-normalised per head (no affine), ×(1 − λ_init), output
    projection. Linear projections without bias. Returns (N, L, D)."""

    def __init__(self, dim: int, heads: int, depth: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads // 2
        self.q = nn.Linear(dim, dim, bias=False)
        self.k = nn.Linear(dim, dim, bias=False)
        self.v = nn.Linear(dim, dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
        self.lambdas = nn.ParameterList([nn.Parameter(torch.randn(self.head_dim) * 0.1) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, _ = x.shape
        h, d = self.heads, self.head_dim
        q = self.q(x).reshape(n, length, 2 * h, d).transpose(1, 2) * d ** -0.5
        k = self.k(x).reshape(n, length, 2 * h, d).transpose(1, 2)
        v = self.v(x).reshape(n, length, h, 2 * d).transpose(1, 2)
        attn = torch.softmax(torch.nan_to_num(torch.matmul(q, k.transpose(-1, -2))).float(), dim=-1).type_as(q)
        lq1, lk1, lq2, lk2 = self.lambdas
        lam = torch.exp((lq1 * lk1).sum()) - torch.exp((lq2 * lk2).sum()) + self.lambda_init
        attn = attn.reshape(n, h, 2, length, length)
        y = torch.matmul(attn[:, :, 0] - lam * attn[:, :, 1], v)  # (N, h, L, 2d)
        y = y * torch.rsqrt(y.float().pow(2).mean(-1, keepdim=True) + 1e-5).type_as(y) * (1 - self.lambda_init)
        return self.out(y.transpose(1, 2).reshape(n, length, 2 * h * d))


class DSEBlock(nn.Module):
    """Dual selective enhancement of a skip connection. ``forward(skip, dec)``, both (N, C, H, W):
    y = [dec, skip] (2C channels); z = FEA(y) + y + DiffAttention(tokens of y) ⊙ y; returns skip + 1×1 conv(z).

    The tokens are the raw (N, 2C, H, W) memory read as (N, H·W, 2C) and the result read back as (N, 2C, H, W)
    (``view``, not a transpose), as the official code does."""

    def __init__(self, channels: int, scales: tuple[float, ...], heads: int, depth: int) -> None:
        super().__init__()
        self.fea = FEA(2 * channels, scales)
        self.attn = DiffAttention(2 * channels, heads, depth)
        self.mixer = nn.Conv2d(2 * channels, channels, 1, bias=False)

    def forward(self, skip: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        y = torch.cat([dec, skip], dim=1)
        n, c, h, w = y.shape
        att = self.attn(y.reshape(n, h * w, c)).reshape(n, c, h, w)
        return skip + self.mixer(self.fea(y) + y + att * y)


class EUCB(nn.Module):
    """Efficient up-convolution: nearest ×2, depth-wise k×k (no bias) + BN + LeakyReLU(0.2), 1×1 conv (bias).
    (N, C_in, H, W) -> (N, C_out, 2H, 2W). (The official channel shuffle with one channel per group is the
    identity and is left out.)"""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.dw = nn.Conv2d(in_ch, in_ch, kernel_size, padding=kernel_size // 2, groups=in_ch, bias=False)
        self.bn = nn.BatchNorm2d(in_ch)
        self.pw = nn.Conv2d(in_ch, out_ch, 1)
        _conv_normal_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(x, scale_factor=2, mode="nearest")
        return self.pw(F.leaky_relu(self.bn(self.dw(x)), 0.2))


class ResBlock(nn.Module):
    """MONAI ``UnetResBlock`` (2-D, BN, LeakyReLU 0.01): k×k conv, BN, act, k×k conv, BN, + shortcut (1×1 conv +
    BN when the width changes), act. Convolutions without bias, truncated-normal init (std 0.02)."""

    def __init__(self, in_ch: int, out_ch: int, kernel_size: int) -> None:
        super().__init__()
        pad = kernel_size // 2
        self.conv1 = nn.Conv2d(in_ch, out_ch, kernel_size, padding=pad, bias=False)
        self.norm1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, kernel_size, padding=pad, bias=False)
        self.norm2 = nn.BatchNorm2d(out_ch)
        self.proj = (nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, bias=False), nn.BatchNorm2d(out_ch))
                     if in_ch != out_ch else nn.Identity())
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.trunc_normal_(m.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm2(self.conv2(F.leaky_relu(self.norm1(self.conv1(x)), 0.01)))
        return F.leaky_relu(y + self.proj(x), 0.01)
