"""Pixel screens for candidate pairs: normalised cross-correlation (NCC) and SSIM on grey thumbnails.

Both work on the ``S x S`` ``uint8`` grey thumbnails of :mod:`msb.audit.hashing` (PIL ``convert("L")``, then
OpenCV ``INTER_AREA`` resize to ``S x S`` px, aspect ratio not kept; ``S = 64`` by default). The resolution and
interpolation are recorded with every result (:data:`SCREEN_DESCRIPTION`).

* NCC: zero-normalised cross-correlation at zero displacement, i.e. the Pearson correlation of the two
  thumbnails' pixel values, ``sum((a - mean a)(b - mean b)) / sqrt(sum((a - mean a)^2) sum((b - mean b)^2))``,
  in [-1, 1]; NaN when a thumbnail is constant (zero variance).
* SSIM: ``skimage.metrics.structural_similarity(a, b, data_range=255)`` with its defaults (7x7 uniform window,
  K1 = 0.01, K2 = 0.03, sample covariance), the mean SSIM of Wang et al. 2004 ("Image quality assessment: from
  error visibility to structural similarity", IEEE TIP 13(4)).
"""

from __future__ import annotations

import numpy as np
from skimage.metrics import structural_similarity

SSIM_PARAMS = {"data_range": 255, "win_size": 7, "gaussian_weights": False, "K1": 0.01, "K2": 0.03}


def screen_description(size: int) -> str:
    """Text recorded with screen results: resolution, interpolation and the two measures."""
    return (f"grey (PIL convert('L')) thumbnails {size}x{size} px, OpenCV INTER_AREA resize (aspect ratio not kept); "
            f"NCC = Pearson correlation of pixel values; SSIM = skimage structural_similarity(data_range=255, "
            f"7x7 uniform window, K1=0.01, K2=0.03)")


def ncc_pairs(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray, block: int = 4096) -> np.ndarray:
    """NCC of thumbnail pairs ``(i[t], j[t])``.

    Args:
        thumbs: ``(N, S, S)`` ``uint8``.
        i, j: ``(P,)`` integer row indices.
        block: pairs per vectorised block (memory bound).

    Returns:
        ``(P,)`` ``float64`` in [-1, 1]; NaN where a thumbnail has zero variance.
    """
    flat = thumbs.reshape(len(thumbs), -1).astype(np.float64)
    flat -= flat.mean(axis=1, keepdims=True)
    norm = np.sqrt((flat * flat).sum(axis=1))
    out = np.empty(len(i), dtype=np.float64)
    for s in range(0, len(i), block):
        a, b = flat[i[s:s + block]], flat[j[s:s + block]]
        den = norm[i[s:s + block]] * norm[j[s:s + block]]
        with np.errstate(invalid="ignore", divide="ignore"):
            out[s:s + block] = np.where(den > 0, (a * b).sum(axis=1) / np.where(den > 0, den, 1.0), np.nan)
    return np.clip(out, -1.0, 1.0)


def ssim_pairs(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Mean SSIM of thumbnail pairs ``(i[t], j[t])`` (skimage, parameters :data:`SSIM_PARAMS`).

    Returns:
        ``(P,)`` ``float64`` (1.0 for identical thumbnails).
    """
    return np.array([structural_similarity(thumbs[a], thumbs[b], **SSIM_PARAMS) for a, b in zip(i, j)],
                    dtype=np.float64)


__all__ = ["ncc_pairs", "ssim_pairs", "screen_description", "SSIM_PARAMS"]
