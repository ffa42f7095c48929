"""Vision GNN graph convolution (Han, Wang, Guo, Tang, Wu; "Vision GNN: An Image is Worth Graph of Nodes",
NeurIPS 2022), the ``Grapher`` block G-CASCADE uses as its graph convolution block (GCB).

Every pixel of a feature map (N, C, H, W) is a node. Per image:

1. ``fc1``: 1×1 conv + BN (C -> C).
2. Dynamic k-NN graph: node features are L2-normalised over channels; the candidate neighbours are the nodes
   of ``avgpool_r(x)`` (r×r average pooling, ``r = reduce_ratio``; r = 1 means all nodes). The distance is the
   squared Euclidean distance of the normalised features plus a fixed relative-position term
   (:func:`relative_position_bias`); the k nearest (``torch.topk``) are the neighbours. No gradient flows
   through the graph construction. Dilation d keeps every d-th of the k·d nearest.
3. Max-relative graph conv ('mr', Li et al., DeepGCNs, ICCV 2019): ``x_j' = max_{j∈N(i)} (y_j − x_i)``, the
   channels of ``x`` and ``x_j'`` are interleaved ``[x_0, x'_0, x_1, x'_1, …]`` (2C) and fed to a 1×1 conv
   2C -> 2C with 4 groups, BN and the activation (GELU in G-CASCADE).
4. ``fc2``: 1×1 conv + BN (2C -> C); residual ``out = fc2(·) + input``.

The relative position term depends on the grid size, so a :class:`Grapher` is built for one (H, W) and
refuses another (:class:`~msb.errors.MSBError`); the reference interpolates it silently instead. With
``train_interpolate=True`` a different grid is accepted **in training mode only** (multi-scale training, as
the reference scripts), the term being resized bicubically to (n', n'/r²) exactly as the reference
``Grapher._get_relative_pos``; evaluation still requires the built grid.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from msb.errors import MSBError

__all__ = ["sincos_2d_pos_embed", "relative_position_bias", "knn_indices", "MRConv", "Grapher"]


def sincos_2d_pos_embed(dim: int, grid_h: int, grid_w: int) -> np.ndarray:
    """Fixed 2D sine-cosine position embedding (as MAE/ViG ``get_2d_sincos_pos_embed``), (grid_h·grid_w, dim)
    float64, row-major over the grid.

    The first dim/2 columns encode the column index (w), the last dim/2 the row index (h); each half is
    ``[sin(p·ω), cos(p·ω)]`` with ``ω_i = 10000^(−i/(dim/4))``, i = 0..dim/4−1. Requires dim % 4 == 0.
    """
    if dim % 4:
        raise ValueError(f"position embedding dimension must be a multiple of 4, got {dim}")
    omega = 1.0 / 10000 ** (np.arange(dim // 4, dtype=np.float64) / (dim / 4.0))
    gw, gh = np.meshgrid(np.arange(grid_w, dtype=np.float64), np.arange(grid_h, dtype=np.float64))

    def emb(pos: np.ndarray) -> np.ndarray:
        out = np.outer(pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    return np.concatenate([emb(gw), emb(gh)], axis=1)


def relative_position_bias(dim: int, grid_h: int, grid_w: int, r: int = 1, chunk: int = 1024) -> torch.Tensor:
    """ViG's relative position term added to the k-NN distances, (1, n, n // r²) float32 with n = grid_h·grid_w.

    ``B = −resize(2·P·Pᵀ/dim)`` with P = :func:`sincos_2d_pos_embed` (n, dim): nodes close on the grid have a
    large ``P_i·P_j`` and hence a smaller distance. For r > 1 the (n, n) matrix is resized to (n, n // r²) by
    bicubic interpolation (``F.interpolate``, align_corners=False), as the reference does; the row axis keeps its
    size, which bicubic interpolation leaves exactly unchanged, so rows are processed in chunks of ``chunk`` to
    bound memory.
    """
    pos = torch.from_numpy(sincos_2d_pos_embed(dim, grid_h, grid_w))  # float64, as the reference (numpy)
    n = pos.shape[0]
    m = n // (r * r)
    rows = []
    for start in range(0, n, chunk):
        block = (2 * (pos[start:start + chunk] @ pos.T) / dim).float()  # (b, n)
        if r > 1:
            block = F.interpolate(block[None, None], size=(block.shape[0], m), mode="bicubic",
                                  align_corners=False)[0, 0]
        rows.append(block)
    return -torch.cat(rows, dim=0)[None]


@torch.no_grad()
def knn_indices(x: torch.Tensor, y: torch.Tensor, k: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the k nearest candidates of each node.

    Args:
        x: nodes (N, C, n), y: candidates (N, C, m); both are L2-normalised over C here.
        k: number of neighbours (≤ m).
        bias: (1, n, m) added to the squared distances (relative position), or None.

    Returns:
        int64 (N, n, k): candidate indices, nearest first.
    """
    x = F.normalize(x, p=2.0, dim=1).transpose(1, 2)  # (N, n, C)
    y = F.normalize(y, p=2.0, dim=1).transpose(1, 2)  # (N, m, C)
    dist = (x * x).sum(-1, keepdim=True) - 2 * x @ y.transpose(1, 2) + (y * y).sum(-1).unsqueeze(1)
    if bias is not None:
        dist = dist + bias
    return torch.topk(-dist, k=k, dim=-1).indices


class MRConv(nn.Module):
    """Max-relative graph convolution: interleave ``[x, max_j (y_j − x_i)]`` -> 1×1 conv (2C -> cout, 4
    groups, bias) + BN + activation. Inputs x (N, C, n), y (N, C, m), idx (N, n, k); returns (N, cout, n)."""

    def __init__(self, channels: int, out_channels: int, act: str = "gelu") -> None:
        super().__init__()
        self.conv = nn.Conv2d(2 * channels, out_channels, 1, groups=4, bias=True)
        self.norm = nn.BatchNorm2d(out_channels)
        self.act = nn.GELU() if act == "gelu" else nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        b, c, n = x.shape
        k = idx.shape[-1]
        flat = idx.reshape(b, 1, n * k).expand(b, c, n * k)
        y_j = torch.gather(y, 2, flat).reshape(b, c, n, k)
        rel = (y_j - x.unsqueeze(-1)).amax(dim=-1)  # (N, C, n)
        h = torch.stack([x, rel], dim=2).reshape(b, 2 * c, n, 1)
        return self.act(self.norm(self.conv(h))).squeeze(-1)


class Grapher(nn.Module):
    """ViG ``Grapher`` for a fixed ``grid`` = (H, W) of the input feature map (see module docstring).

    Args:
        channels: C.
        grid: (H, W) of the feature maps it will see; a different size raises :class:`MSBError`.
        k: neighbours per node; dilation: keep every ``dilation``-th of the ``k·dilation`` nearest.
        reduce_ratio: r, candidates from r×r average pooling; H and W must be multiples of r.
        act: ``gelu`` or ``relu``.
        train_interpolate: accept other grids in training mode (see module docstring).

    Raises:
        MSBError: the pooled graph has fewer than ``k·dilation`` candidate nodes, or H, W not multiples of r.
    """

    def __init__(self, channels: int, grid: tuple[int, int], k: int = 9, dilation: int = 1, reduce_ratio: int = 1,
                 act: str = "gelu", name: str = "Grapher", train_interpolate: bool = False) -> None:
        super().__init__()
        self.train_interpolate = train_interpolate
        h, w = grid
        self.grid, self.k, self.dilation, self.r, self.name = (h, w), k, dilation, reduce_ratio, name
        if h % reduce_ratio or w % reduce_ratio:
            raise MSBError(f"{name}: feature grid {h}x{w} is not divisible by the reduce ratio {reduce_ratio}")
        m = (h // reduce_ratio) * (w // reduce_ratio)
        if m < k * dilation:
            raise MSBError(f"{name}: the graph on the {h}x{w} feature grid has {m} candidate node(s) after "
                           f"{reduce_ratio}x{reduce_ratio} pooling, fewer than k={k}x{dilation} neighbours; "
                           f"use a larger input size (model.params.img_size and data.input_size) or a smaller k")
        self.fc1 = nn.Sequential(nn.Conv2d(channels, channels, 1), nn.BatchNorm2d(channels))
        self.graph_conv = MRConv(channels, 2 * channels, act)
        self.fc2 = nn.Sequential(nn.Conv2d(2 * channels, channels, 1), nn.BatchNorm2d(channels))
        # fixed, recomputed from the grid at construction: a buffer, not a parameter, and not saved
        self.register_buffer("relative_pos", relative_position_bias(channels, h, w, reduce_ratio), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, C, H, W). Raises :class:`MSBError` when (H, W) differs from ``grid`` (unless
        training with ``train_interpolate``)."""
        rel = self.relative_pos
        if tuple(x.shape[-2:]) != self.grid and self.training and self.train_interpolate:
            n_new = x.shape[-2] * x.shape[-1]
            m_new = (x.shape[-2] // self.r) * (x.shape[-1] // self.r)
            if m_new < self.k * self.dilation:
                raise MSBError(f"{self.name}: a multi-scale batch gives a {x.shape[-2]}x{x.shape[-1]} grid with "
                               f"{m_new} candidate node(s), fewer than k={self.k}x{self.dilation}")
            rel = F.interpolate(rel[None], size=(n_new, m_new), mode="bicubic", align_corners=False)[0]
        elif tuple(x.shape[-2:]) != self.grid:
            raise MSBError(f"{self.name}: built for a {self.grid[0]}x{self.grid[1]} feature grid but got "
                           f"{x.shape[-2]}x{x.shape[-1]}; the graph size is fixed by model.params.img_size, "
                           f"which must equal data.input_size")
        shortcut = x
        x = self.fc1(x)
        b, c, h, w = x.shape
        y = F.avg_pool2d(x, self.r, self.r) if self.r > 1 else x
        xf, yf = x.reshape(b, c, h * w), y.reshape(b, c, -1)
        idx = knn_indices(xf, yf, self.k * self.dilation, rel)[..., ::self.dilation]
        out = self.graph_conv(xf, yf, idx).reshape(b, 2 * c, h, w)
        return self.fc2(out) + shortcut
