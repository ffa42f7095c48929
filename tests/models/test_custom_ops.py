"""Pure-PyTorch versions of the custom CUDA kernels (issue 32): InternImage's DCNv3 core and TransNeXt's
sliding-window attention, against plain NumPy loops written from the papers' definitions, and against the
compiled kernels where their packages (``DCNv3``, ``swattention``) and a GPU are available."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from msb.models.ops.aggregated_attention import (compiled_swattention, window_av, window_av_pytorch, window_qk,
                                                 window_qk_pytorch)
from msb.models.ops.dcnv3 import compiled_dcnv3, dcnv3, dcnv3_pytorch


def _bilinear_zero(img: np.ndarray, y: float, x: float) -> np.ndarray:
    """img (H, W, C) sampled at pixel coordinates (y, x), pixel centres at integers, zeros outside."""
    h, w, _ = img.shape
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    out = np.zeros(img.shape[-1])
    for yy, wy in ((y0, 1 - (y - y0)), (y0 + 1, y - y0)):
        for xx, wx in ((x0, 1 - (x - x0)), (x0 + 1, x - x0)):
            if 0 <= yy < h and 0 <= xx < w:
                out += wy * wx * img[yy, xx]
    return out


def _dcnv3_loop(x, offset, mask, k, stride, pad, dil, group, scale):
    n, h, w, c = x.shape
    gc = c // group
    ho, wo = offset.shape[1:3]
    lin = [-(dil * (k - 1)) // 2 + dil * i for i in range(k)]
    points = [(lin[i], lin[j]) for i in range(k) for j in range(k)]  # (dx, dy), x outer
    out = np.zeros((n, ho, wo, c))
    for b in range(n):
        for i in range(ho):
            for j in range(wo):
                cy, cx = i * stride - pad + dil * (k - 1) // 2, j * stride - pad + dil * (k - 1) // 2
                for g in range(group):
                    img = x[b, :, :, g * gc:(g + 1) * gc]
                    for p, (dx, dy) in enumerate(points):
                        ox, oy = offset[b, i, j, (g * k * k + p) * 2:(g * k * k + p) * 2 + 2]
                        m = mask[b, i, j, g * k * k + p]
                        out[b, i, j, g * gc:(g + 1) * gc] += m * _bilinear_zero(
                            img, cy + (dy + oy) * scale, cx + (dx + ox) * scale)
    return out


@pytest.mark.parametrize("stride,pad,dil,scale", [(1, 1, 1, 1.0), (2, 1, 1, 0.5), (1, 2, 2, 1.0)])
def test_dcnv3_pytorch_equals_a_numpy_loop(stride, pad, dil, scale):
    """Random offsets (up to ±2.5 px, so samples leave the image) and weights, 2 groups of 3 channels."""
    g = torch.Generator().manual_seed(0)
    n, h, w, group, k = 2, 5, 6, 2, 3
    x = torch.randn(n, h, w, 3 * group, generator=g, dtype=torch.float64)
    ho, wo = (h + 2 * pad - (dil * (k - 1) + 1)) // stride + 1, (w + 2 * pad - (dil * (k - 1) + 1)) // stride + 1
    offset = (torch.rand(n, ho, wo, group * k * k * 2, generator=g, dtype=torch.float64) - 0.5) * 5
    mask = torch.rand(n, ho, wo, group * k * k, generator=g, dtype=torch.float64)
    got = dcnv3_pytorch(x, offset, mask, k, stride, pad, dil, group, scale)
    ref = _dcnv3_loop(x.numpy(), offset.numpy(), mask.numpy(), k, stride, pad, dil, group, scale)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-10)


def test_dcnv3_zero_offsets_one_hot_weight_is_a_shift():
    """Offsets 0 and all weight on kernel point p = (dx, dy) read the input shifted by (dx, dy), zero outside."""
    x = torch.randn(1, 4, 5, 4)
    offset = torch.zeros(1, 4, 5, 2 * 9 * 2)
    mask = torch.zeros(1, 4, 5, 2 * 9)
    mask[..., 7] = 1  # group 0: point 7 = (dx, dy) = (+1, 0)
    mask[..., 9 + 3] = 1  # group 1: point 3 = (0, -1)
    out = dcnv3_pytorch(x, offset, mask, group=2)
    assert torch.allclose(out[0, :, :4, :2], x[0, :, 1:, :2]) and torch.all(out[0, :, 4, :2] == 0)
    assert torch.allclose(out[0, 1:, :, 2:], x[0, :3, :, 2:]) and torch.all(out[0, 0, :, 2:] == 0)


def _window_loop(q, k, v, rpb, attn, h, w, win):
    b, heads, n, d = q.shape
    r = win // 2
    sim = np.zeros((b, heads, n, win * win))
    agg = np.zeros((b, heads, n, d))
    for y in range(h):
        for x in range(w):
            for j, (dy, dx) in enumerate((dy, dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1)):
                yy, xx = y + dy, x + dx
                inside = 0 <= yy < h and 0 <= xx < w
                m = yy * w + xx
                dot = (q[:, :, y * w + x] * k[:, :, m]).sum(-1) if inside else 0.0
                sim[:, :, y * w + x, j] = dot + rpb[:, j]
                if inside:
                    agg[:, :, y * w + x] += attn[:, :, y * w + x, j:j + 1] * v[:, :, m]
    return sim, agg


def test_window_attention_pytorch_equals_a_numpy_loop():
    g = torch.Generator().manual_seed(1)
    b, heads, h, w, d, win = 2, 3, 4, 5, 4, 3
    q, k, v = (torch.randn(b, heads, h * w, d, generator=g, dtype=torch.float64) for _ in range(3))
    rpb = torch.randn(heads, win * win, generator=g, dtype=torch.float64)
    attn = torch.rand(b, heads, h * w, win * win, generator=g, dtype=torch.float64)
    sim, agg = _window_loop(q.numpy(), k.numpy(), v.numpy(), rpb.numpy(), attn.numpy(), h, w, win)
    np.testing.assert_allclose(window_qk_pytorch(q, k, rpb, h, w, win).numpy(), sim, atol=1e-12)
    np.testing.assert_allclose(window_av_pytorch(attn, v, h, w, win).numpy(), agg, atol=1e-12)


def _cuda_or_skip(available, package: str) -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip(f"no CUDA device: the compiled {package} kernel cannot be compared with the pure-PyTorch one")
    if available is None:
        pytest.skip(f"package '{package}' is not installed: the compiled kernel cannot be compared")
    return torch.device("cuda")


def test_compiled_dcnv3_equals_pure_pytorch():
    dev = _cuda_or_skip(compiled_dcnv3(), "DCNv3")
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(2, 16, 16, 64, device=dev, generator=g)
    offset = torch.randn(2, 16, 16, 4 * 9 * 2, device=dev, generator=g) * 2
    mask = torch.rand(2, 16, 16, 4 * 9, device=dev, generator=g)
    torch.testing.assert_close(dcnv3(x, offset, mask, group=4), dcnv3_pytorch(x, offset, mask, group=4),
                               atol=1e-4, rtol=1e-4)


def test_compiled_window_attention_equals_pure_pytorch():
    dev = _cuda_or_skip(compiled_swattention(), "swattention")
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(2, 3, 16 * 16, 24, device=dev, generator=g) for _ in range(3))
    rpb = torch.randn(3, 9, device=dev, generator=g)
    attn = torch.rand(2, 3, 16 * 16, 9, device=dev, generator=g)
    torch.testing.assert_close(window_qk(q, k, rpb, 16, 16, 3), window_qk_pytorch(q, k, rpb, 16, 16, 3),
                               atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(window_av(attn, v, 16, 16, 3), window_av_pytorch(attn, v, 16, 16, 3),
                               atol=1e-4, rtol=1e-4)
