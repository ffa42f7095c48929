"""The screens' grey thumbnail: the exact area mean of each thumbnail pixel's cell, in banded float64 products.

OpenCV's ``INTER_AREA`` shrink (``imgproc/src/resize.cpp``, ``computeResizeAreaTab`` + ``ResizeArea_Invoker``)
gives each output pixel the mean of the input area its cell covers: cell ``j`` of an axis spans input
coordinates ``[j n_in / n_out, (j + 1) n_in / n_out)``, and input pixel ``i`` (span ``[i, i + 1)``) counts with
the length it has inside the cell. OpenCV sums in ``float32`` (a scalar loop per pixel, bound by the latency of
its additions) and rounds half to even. Here the same definition is computed exactly: measured in units of
``1 / n_out`` every overlap is an integer (:func:`area_matrix`), so both passes are products of integers below
``2**53`` (exact in float64 BLAS), and the mean ``num / (H W)`` is rounded half to even (OpenCV's ``cvRound``) in
integer arithmetic. On the 200 real images of ``scripts/bench_audit.py`` it equals ``cv2.resize(..., INTER_AREA)``
in all but 5 of the 819,200 thumbnail pixels, which differ by 1 grey level (OpenCV's float32 sums; tested on a
sample of the shared images), at about a third of its time on the float64 copy the LANCZOS resizes have just read. Below 256 px a side, where
OpenCV's loop is cheaper than a product per block, OpenCV's float64 ``INTER_AREA`` gives the means to within
``1e-9`` and the few within ``1e-6`` of a tie are recomputed exactly: the same values.
With integer factors other than 2 (OpenCV's integer path, ``cvRound`` too) it is equal; at a factor of 2 on both
sides OpenCV rounds ties up. An image smaller than the thumbnail on either side is resized with
``cv2.INTER_AREA`` itself (OpenCV then interpolates bilinearly).
"""

from __future__ import annotations

from functools import lru_cache

import cv2
import numpy as np

from msb.audit.lanczos import band_blocks

_BLOCK = 4  # output samples per product (the fastest of 2, 4, 8 and 16 on the bench images)
_EXACT_BELOW = float(2**53)
_BANDED_FROM = 256  # px on the longer side from which the banded products run (below: _small)
_TIE = 1e-6  # |mean - (k + 1/2)| below which _small recomputes a mean exactly


@lru_cache(maxsize=512)
def area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """Overlap of input pixel ``i`` with output cell ``j``, in units of ``1 / n_out`` input pixels.

    Args:
        n_in: input samples along the axis (``>= n_out``).
        n_out: output samples.

    Returns:
        ``(n_in, n_out)`` float64 matrix of integers in ``[0, n_out]``: ``|[i n_out, (i + 1) n_out) ∩
        [j n_in, (j + 1) n_in)|``; each column sums to ``n_in``. Read-only (cached).
    """
    i = np.arange(n_in, dtype=np.int64)[:, None]
    j = np.arange(n_out, dtype=np.int64)[None, :]
    m = np.maximum(np.minimum((i + 1) * n_out, (j + 1) * n_in) - np.maximum(i * n_out, j * n_in), 0)
    out = m.astype(np.float64)
    out.flags.writeable = False
    return out


@lru_cache(maxsize=512)
def area_bands(n_in: int, n_out: int) -> tuple[tuple[int, int, int, int, np.ndarray], ...]:
    """:func:`area_matrix` cut into blocks of :data:`_BLOCK` outputs with the input span ``r0:r1`` each reads."""
    return band_blocks(area_matrix(n_in, n_out), _BLOCK)


def area_thumbnail(grey: np.ndarray, size: int, g: np.ndarray | None = None) -> np.ndarray:
    """``grey`` resized to ``size x size`` px by area mean (aspect ratio not kept), rounded half to even.

    Args:
        grey: ``(H, W)`` ``uint8`` grey image.
        size: thumbnail side in pixels (``>= 1``).
        g: optional float64 copy of ``grey`` (same shape) to read instead of converting again.

    Returns:
        ``(size, size)`` ``uint8``: ``num / (H W)`` rounded half to even, with ``num = sum_i sum_k grey[i, k] A_H[i, r]
        A_W[k, c]`` (:func:`area_matrix`), i.e. the exact mean of the cell (module docstring). ``H < size`` or
        ``W < size``, or an image so large that ``255 H W >= 2**53``: ``cv2.resize(grey, (size, size),
        interpolation=cv2.INTER_AREA)``.
    """
    h, w = grey.shape
    if h < size or w < size or 255.0 * h * w >= _EXACT_BELOW:
        return np.ascontiguousarray(cv2.resize(grey, (size, size), interpolation=cv2.INTER_AREA), dtype=np.uint8)
    src = np.asarray(grey, dtype=np.float64) if g is None else g
    if max(h, w) < _BANDED_FROM:
        return _small(src, size)
    rows = np.empty((h, size))
    for c0, c1, r0, r1, sub in area_bands(w, size):
        rows[:, c0:c1] = src[:, r0:r1] @ sub
    return area_from_rows(rows, w, size)


def area_from_rows(rows: np.ndarray, w: int, size: int) -> np.ndarray:
    """The vertical pass and rounding of :func:`area_thumbnail`'s banded path.

    Args:
        rows: ``(H, size)`` float64, the horizontal sums ``grey @ area_matrix(W, size)`` (integers).
        w: the image width ``W`` in pixels.
        size: thumbnail side in pixels.

    Returns:
        ``(size, size)`` ``uint8``, as :func:`area_thumbnail`.
    """
    h = rows.shape[0]
    num = np.empty((size, size))
    for c0, c1, r0, r1, sub in area_bands(h, size):
        num[c0:c1] = sub.T @ rows[r0:r1]
    return _half_even(num, h * w).astype(np.uint8)


def _half_even(num: np.ndarray, d: int) -> np.ndarray:
    """``num / d`` rounded half to even, for float64 ``num`` holding integers (exact, in int64)."""
    q, r = np.divmod(num.astype(np.int64), d)
    return q + ((2 * r > d) | ((2 * r == d) & (q % 2 == 1)))


def _small(src: np.ndarray, size: int) -> np.ndarray:
    """:func:`area_thumbnail` of a float64 image below :data:`_BANDED_FROM` px a side, where a product per block
    costs more than OpenCV's scalar loop: OpenCV's float64 ``INTER_AREA`` (the same cells, summed in double: within
    ``1e-9`` of the exact mean there), rounded to the nearest integer; a mean within :data:`_TIE` of a tie
    ``k + 1/2`` is recomputed exactly from :func:`area_matrix` and rounded half to even, so the result equals the
    banded path's."""
    h, w = src.shape
    mean = cv2.resize(src, (size, size), interpolation=cv2.INTER_AREA)
    out = np.rint(mean)
    near = np.abs(np.abs(mean - out) - 0.5) < _TIE
    if near.any():
        r, c = np.nonzero(near)
        num = np.einsum("ik,ik->k", area_matrix(h, size)[:, r], src @ area_matrix(w, size)[:, c])
        out[r, c] = _half_even(num, h * w)
    return out.astype(np.uint8)


__all__ = ["area_matrix", "area_thumbnail", "area_bands", "area_from_rows"]
