"""Core of the deformable convolution v3 (DCNv3) of InternImage (Wang et al., CVPR 2023, eq. 3-4).

For every output pixel p0, group g and kernel point k (K = kernel²), DCNv3 samples the group's channels of the
(already projected) input bilinearly at p0 + p_k + Δp_gk and sums the samples weighted by the modulation
scalars m_gk (softmax-normalised over k by the caller):

    y_g(p0) = Σ_k m_gk · x_g(p0 + p_k + Δp_gk)

Conventions of the official operator (``ops_dcnv3``), reproduced here: channels-last tensors; the kernel grid
p_k enumerates x in the outer and y in the inner loop (k = i_x · kernel + i_y); each offset is an (x, y) pair;
both the kernel grid and the offsets are multiplied by ``offset_scale``; positions are in pixel units of the
input; samples outside the image read zeros (bilinear interpolation against zero padding).

:func:`dcnv3` runs the compiled CUDA kernel of the official ``DCNv3`` extension package when it is importable and
the input is on CUDA, else :func:`dcnv3_pytorch` (``F.grid_sample`` + a weighted sum written as a batched
matrix product, so operation counters see its K multiply-accumulates per output value).
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

__all__ = ["dcnv3", "dcnv3_pytorch", "compiled_dcnv3"]


def compiled_dcnv3():
    """The official compiled extension module ``DCNv3`` (built from InternImage's ``ops_dcnv3``), or None."""
    try:
        return importlib.import_module("DCNv3")
    except ImportError:
        return None


def _kernel_points(kernel: int, dilation: int, device, dtype) -> torch.Tensor:
    """(K, 2) kernel grid offsets (x, y) in pixels, x outer: ``-d·(k-1)//2 + d·i``."""
    lin = -(dilation * (kernel - 1)) // 2 + dilation * torch.arange(kernel, device=device, dtype=dtype)
    gx, gy = torch.meshgrid(lin, lin, indexing="ij")
    return torch.stack([gx.reshape(-1), gy.reshape(-1)], dim=-1)


def dcnv3_pytorch(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, kernel: int = 3, stride: int = 1,
                  pad: int = 1, dilation: int = 1, group: int = 4, offset_scale: float = 1.0) -> torch.Tensor:
    """DCNv3 sampling and aggregation in plain PyTorch (module docstring).

    Args:
        x: input (N, H, W, C) float, channels last, C divisible by ``group``.
        offset: (N, Ho, Wo, group·K·2) float, per group and kernel point an (x, y) offset in pixels.
        mask: (N, Ho, Wo, group·K) float modulation weights.
        kernel, stride, pad, dilation: square kernel geometry; Ho = (H + 2·pad − (dilation·(kernel−1)+1)) //
            stride + 1, likewise Wo.
        group: number of groups (each has its own offsets and weights).
        offset_scale: factor on the kernel grid and on the offsets.

    Returns:
        (N, Ho, Wo, C), dtype of ``x``.

    Raises:
        ValueError: C not divisible by ``group``, or offset/mask shapes that do not match.
    """
    n, h, w, c = x.shape
    k2 = kernel * kernel
    ho, wo = offset.shape[1:3]
    if c % group or offset.shape[-1] != group * k2 * 2 or tuple(mask.shape) != (n, ho, wo, group * k2):
        raise ValueError(f"dcnv3: x {tuple(x.shape)}, offset {tuple(offset.shape)}, mask {tuple(mask.shape)} do not "
                         f"fit group={group}, kernel={kernel}")
    gc = c // group
    centre = dilation * (kernel - 1) // 2 - pad
    ys = centre + stride * torch.arange(ho, device=x.device, dtype=x.dtype)
    xs = centre + stride * torch.arange(wo, device=x.device, dtype=x.dtype)
    base = torch.stack(torch.meshgrid(xs, ys, indexing="xy"), dim=-1)  # (Ho, Wo, 2) as (x, y)
    grid_pts = _kernel_points(kernel, dilation, x.device, x.dtype) * offset_scale  # (K, 2)
    off = offset.reshape(n, ho, wo, group, k2, 2) * offset_scale
    pos = base[None, :, :, None, None, :] + grid_pts + off  # (N, Ho, Wo, G, K, 2) pixel coordinates
    size = torch.tensor([w, h], device=x.device, dtype=x.dtype)
    norm = (pos + 0.5) / size * 2 - 1  # grid_sample, align_corners=False
    norm = norm.permute(0, 3, 1, 2, 4, 5).reshape(n * group, ho * wo, k2, 2)
    value = x.reshape(n, h, w, group, gc).permute(0, 3, 4, 1, 2).reshape(n * group, gc, h, w)
    sampled = F.grid_sample(value, norm, mode="bilinear", padding_mode="zeros", align_corners=False)
    sampled = sampled.reshape(n, group, gc, ho * wo, k2).permute(0, 1, 3, 2, 4)  # (N, G, HoWo, gc, K)
    weights = mask.reshape(n, ho * wo, group, k2, 1).permute(0, 2, 1, 3, 4)  # (N, G, HoWo, K, 1)
    out = torch.matmul(sampled, weights.to(sampled.dtype)).squeeze(-1)  # (N, G, HoWo, gc)
    return out.permute(0, 2, 1, 3).reshape(n, ho, wo, c)


class _CompiledDCNv3(torch.autograd.Function):
    """Autograd wrapper of the official extension's ``dcnv3_forward`` / ``dcnv3_backward``."""

    @staticmethod
    def forward(ctx, x, offset, mask, kernel, stride, pad, dilation, group, offset_scale):  # noqa: D102
        ext = compiled_dcnv3()
        ctx.args = (kernel, kernel, stride, stride, pad, pad, dilation, dilation, group, x.shape[-1] // group,
                    offset_scale)
        ctx.save_for_backward(x, offset, mask)
        return ext.dcnv3_forward(x, offset, mask, *ctx.args, 256)

    @staticmethod
    def backward(ctx, grad):  # noqa: D102
        ext = compiled_dcnv3()
        x, offset, mask = ctx.saved_tensors
        gx, goff, gmask = ext.dcnv3_backward(x, offset, mask, *ctx.args, grad.contiguous(), 256)
        return gx, goff, gmask, None, None, None, None, None, None


def dcnv3(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor, kernel: int = 3, stride: int = 1,
          pad: int = 1, dilation: int = 1, group: int = 4, offset_scale: float = 1.0,
          use_compiled: bool = True) -> torch.Tensor:
    """DCNv3 core: the compiled kernel for CUDA inputs when the ``DCNv3`` package is installed (and
    ``use_compiled``), else :func:`dcnv3_pytorch`. Shapes and errors as :func:`dcnv3_pytorch`."""
    if use_compiled and x.is_cuda and compiled_dcnv3() is not None:
        return _CompiledDCNv3.apply(x.contiguous(), offset.contiguous(), mask.contiguous().to(x.dtype), kernel,
                                    stride, pad, dilation, group, float(offset_scale))
    return dcnv3_pytorch(x, offset, mask, kernel, stride, pad, dilation, group, offset_scale)
