"""Pixel screens: NCC against numpy/scipy Pearson correlation, SSIM against a hand-written Wang et al. (2004)
implementation (7x7 uniform window, sample covariance, K1 = 0.01, K2 = 0.03, L = 255, mean over the valid
interior as skimage crops (win_size - 1) / 2 = 3 px at each border)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage, stats

from msb.audit.screens import ncc_pairs, screen_description, ssim_pairs


def ssim_reference(a: np.ndarray, b: np.ndarray) -> float:
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    w, n = 7, 49
    mu_a, mu_b = ndimage.uniform_filter(a, w), ndimage.uniform_filter(b, w)
    cov = n / (n - 1)
    va = cov * (ndimage.uniform_filter(a * a, w) - mu_a ** 2)
    vb = cov * (ndimage.uniform_filter(b * b, w) - mu_b ** 2)
    vab = cov * (ndimage.uniform_filter(a * b, w) - mu_a * mu_b)
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    s = ((2 * mu_a * mu_b + c1) * (2 * vab + c2)) / ((mu_a ** 2 + mu_b ** 2 + c1) * (va + vb + c2))
    return float(s[3:-3, 3:-3].mean())


def test_ncc_and_ssim_against_references() -> None:
    rng = np.random.default_rng(0)
    base = ndimage.gaussian_filter(rng.normal(size=(32, 32)), 2)
    t = [np.clip((base - base.min()) / np.ptp(base) * 255, 0, 255).astype(np.uint8)]
    t.append(np.clip(t[0].astype(int) + rng.integers(-20, 20, (32, 32)), 0, 255).astype(np.uint8))
    t.append(rng.integers(0, 255, (32, 32), dtype=np.uint8))
    t.append(np.full((32, 32), 77, np.uint8))  # constant: NCC undefined
    thumbs = np.stack(t)
    i, j = np.array([0, 0, 1, 0]), np.array([1, 2, 2, 3])
    ncc = ncc_pairs(thumbs, i, j, block=2)
    for k in range(3):
        r = stats.pearsonr(thumbs[i[k]].ravel().astype(float), thumbs[j[k]].ravel().astype(float))[0]
        assert ncc[k] == pytest.approx(r, abs=1e-12)
        assert ncc[k] == pytest.approx(np.corrcoef(thumbs[i[k]].ravel(), thumbs[j[k]].ravel())[0, 1], abs=1e-12)
    assert np.isnan(ncc[3])
    ssim = ssim_pairs(thumbs, i[:3], j[:3])
    for k in range(3):
        assert ssim[k] == pytest.approx(ssim_reference(thumbs[i[k]], thumbs[j[k]]), abs=1e-9)
    assert ssim_pairs(thumbs, np.array([2]), np.array([2]))[0] == pytest.approx(1.0)
    assert ncc[0] > 0.9 > abs(ncc[1]) and ssim[0] > ssim[1]  # noisy copy vs unrelated noise
    assert "64x64 px" in screen_description(64) and "INTER_AREA" in screen_description(64)
