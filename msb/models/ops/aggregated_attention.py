"""Sliding-window half of TransNeXt's aggregated attention (Shi, CVPR 2024, section 3.1): every query attends to
the ``window × window`` neighbourhood around its own position (zero padding at the border; the caller masks the
padded positions with −inf before the softmax).

- :func:`window_qk`: similarities ``q_n · k_m + rpb_j`` for the L = window² neighbours m of n (j = the neighbour's
  index, row-major over the window: dy outer, dx inner, as ``F.unfold``), shape (B, heads, N, L).
- :func:`window_av`: the weighted sum ``Σ_j a_nj · v_m(j)``, shape (B, heads, N, head_dim).

Plain PyTorch via ``F.unfold`` and batched matrix products (counted by operation counters as
2·B·heads·N·L·head_dim FLOPs each). When the official CUDA extension ``swattention`` (TransNeXt's
``swattention_extension``) is importable and the tensors are on CUDA, its kernels are used instead
(``qk_rpb_forward``/``av_forward`` and their backward functions).
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

__all__ = ["window_qk", "window_av", "window_qk_pytorch", "window_av_pytorch", "compiled_swattention"]

_THREADS = 128  # CUDA threads per block, as the official wrapper


def compiled_swattention():
    """The official compiled extension module ``swattention``, or None when it is not installed."""
    try:
        return importlib.import_module("swattention")
    except ImportError:
        return None


def _unfold(t: torch.Tensor, height: int, width: int, window: int) -> torch.Tensor:
    """(B, h, N, d) -> (B, h, N, d, L): each position's window of neighbours (zeros beyond the border)."""
    b, heads, n, d = t.shape
    grid = t.permute(0, 1, 3, 2).reshape(b, heads * d, height, width)
    cols = F.unfold(grid, kernel_size=window, padding=window // 2, stride=1)  # (B, h·d·L, N)
    return cols.reshape(b, heads, d, window * window, n).permute(0, 1, 4, 2, 3)


def window_qk_pytorch(q: torch.Tensor, k: torch.Tensor, rpb: torch.Tensor, height: int, width: int,
                      window: int) -> torch.Tensor:
    """Window similarities in plain PyTorch.

    Args:
        q, k: (B, heads, N, d) float with N = height·width (row-major positions).
        rpb: (heads, L) relative position bias, L = window².
        height, width: the token grid; window: odd window size.

    Returns:
        (B, heads, N, L) float: ``q·k`` of each neighbour (0 for padded ones) plus ``rpb``.
    """
    sim = (q.unsqueeze(-2) @ _unfold(k, height, width, window)).squeeze(-2)
    return sim + rpb.unsqueeze(1)


def window_av_pytorch(attn: torch.Tensor, v: torch.Tensor, height: int, width: int, window: int) -> torch.Tensor:
    """Window aggregation in plain PyTorch: attn (B, heads, N, L), v (B, heads, N, d) -> (B, heads, N, d)."""
    return (attn.unsqueeze(-2) @ _unfold(v, height, width, window).transpose(-2, -1)).squeeze(-2)


class _QK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, rpb, height, width, window):  # noqa: D102
        ext = compiled_swattention()
        ctx.save_for_backward(q, k)
        ctx.geom = (height, width, window)
        return ext.qk_rpb_forward(q, k, rpb, height, width, window, _THREADS)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        q, k = ctx.saved_tensors
        dq, dk, drpb = compiled_swattention().qk_rpb_backward(grad.contiguous(), q, k, *ctx.geom, _THREADS)
        return dq, dk, drpb, None, None, None


class _AV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, attn, v, height, width, window):  # noqa: D102
        ext = compiled_swattention()
        ctx.save_for_backward(attn, v)
        ctx.geom = (height, width, window)
        return ext.av_forward(attn, v, height, width, window, _THREADS)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        attn, v = ctx.saved_tensors
        dattn, dv = compiled_swattention().av_backward(grad.contiguous(), attn, v, *ctx.geom, _THREADS)
        return dattn, dv, None, None, None


def _compiled(t: torch.Tensor, use_compiled: bool) -> bool:
    return use_compiled and t.is_cuda and compiled_swattention() is not None


def window_qk(q: torch.Tensor, k: torch.Tensor, rpb: torch.Tensor, height: int, width: int, window: int,
              use_compiled: bool = True) -> torch.Tensor:
    """:func:`window_qk_pytorch`, or the ``swattention`` kernel for CUDA tensors when installed."""
    if _compiled(q, use_compiled):
        return _QK.apply(q.contiguous(), k.contiguous(), rpb.contiguous(), height, width, window)
    return window_qk_pytorch(q, k, rpb, height, width, window)


def window_av(attn: torch.Tensor, v: torch.Tensor, height: int, width: int, window: int,
              use_compiled: bool = True) -> torch.Tensor:
    """:func:`window_av_pytorch`, or the ``swattention`` kernel for CUDA tensors when installed."""
    if _compiled(attn, use_compiled):
        return _AV.apply(attn.type_as(v).contiguous(), v.contiguous(), height, width, window)
    return window_av_pytorch(attn, v, height, width, window)
