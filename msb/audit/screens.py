"""Pixel screens for candidate pairs: normalised cross-correlation (NCC) and SSIM on grey thumbnails.

Both work on the ``S x S`` ``uint8`` grey thumbnails of :mod:`msb.audit.hashing` (PIL ``convert("L")``, then
the exact area mean of OpenCV's ``INTER_AREA`` (:mod:`msb.audit.area`) to ``S x S`` px, aspect ratio not kept;
``S = 64`` by default). The resolution and
interpolation are recorded with every result (:data:`SCREEN_DESCRIPTION`).

* NCC: zero-normalised cross-correlation at zero displacement, i.e. the Pearson correlation of the two
  thumbnails' pixel values, ``sum((a - mean a)(b - mean b)) / sqrt(sum((a - mean a)^2) sum((b - mean b)^2))``,
  in [-1, 1]; NaN when a thumbnail is constant (zero variance).
* SSIM: ``skimage.metrics.structural_similarity(a, b, data_range=255)`` with its defaults (7x7 uniform window,
  K1 = 0.01, K2 = 0.03, sample covariance), the mean SSIM of Wang et al. 2004 ("Image quality assessment: from
  error visibility to structural similarity", IEEE TIP 13(4)).

With content masks (``masks``: ``(N, S, S)`` bool, ``True`` = content; :mod:`msb.audit.content`) both measures
compare two thumbnails over the pixels that are content in *both*: NCC is the Pearson correlation over that
overlap (NaN when it has fewer than :func:`min_overlap` pixels or a side is constant there), SSIM the mean of
skimage's SSIM map (``full=True``) over the overlap pixels at least 3 px from the edge (the pixels its plain mean
uses). Without masks every function computes exactly what it did before.
"""

from __future__ import annotations

import numpy as np
from skimage.metrics import structural_similarity

SSIM_PARAMS = {"data_range": 255, "win_size": 7, "gaussian_weights": False, "K1": 0.01, "K2": 0.03}


def screen_description(size: int) -> str:
    """Text recorded with screen results: resolution, interpolation and the two measures."""
    return (f"grey (PIL convert('L')) thumbnails {size}x{size} px, area-mean resize (OpenCV INTER_AREA's cells, "
            f"exact mean rounded half to even; aspect ratio not kept); "
            f"NCC = Pearson correlation of pixel values; SSIM = skimage structural_similarity(data_range=255, "
            f"7x7 uniform window, K1=0.01, K2=0.03)")


def min_overlap(size: int) -> int:
    """Fewest shared content pixels for a masked NCC/SSIM value: ``max(16, S*S // 5)`` (a fifth of the thumbnail)."""
    return max(16, size * size // 5)


def ncc_pairs(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray, block: int = 4096,
              masks: np.ndarray | None = None) -> np.ndarray:
    """NCC of thumbnail pairs ``(i[t], j[t])``.

    Args:
        thumbs: ``(N, S, S)`` ``uint8``.
        i, j: ``(P,)`` integer row indices.
        block: pairs per vectorised block (memory bound).
        masks: optional ``(N, S, S)`` bool content masks: Pearson correlation over the overlap of the two masks
            (module docstring).

    Returns:
        ``(P,)`` ``float64`` in [-1, 1]; NaN where a thumbnail has zero variance (on the overlap) or the overlap is
        too small.
    """
    if masks is not None:
        return _masked_ncc_pairs(thumbs, masks, np.asarray(i), np.asarray(j), block)
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


def _masked_ncc_pairs(thumbs: np.ndarray, masks: np.ndarray, i: np.ndarray, j: np.ndarray, block: int
                      ) -> np.ndarray:
    flat = thumbs.reshape(len(thumbs), -1).astype(np.float64)
    mflat = masks.reshape(len(masks), -1).astype(bool)
    need = min_overlap(thumbs.shape[1])
    out = np.empty(len(i), dtype=np.float64)
    for s in range(0, len(i), block):
        ii, jj = i[s:s + block], j[s:s + block]
        m = (mflat[ii] & mflat[jj]).astype(np.float64)
        n = m.sum(axis=1, keepdims=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            a = (flat[ii] - (flat[ii] * m).sum(axis=1, keepdims=True) / n) * m
            b = (flat[jj] - (flat[jj] * m).sum(axis=1, keepdims=True) / n) * m
            den = np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))
            r = (a * b).sum(axis=1) / den
        out[s:s + block] = np.where((den > 0) & (n[:, 0] >= need), r, np.nan)
    return np.clip(out, -1.0, 1.0)


def _standardised(thumbs: np.ndarray, masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``float64`` rows centred and scaled on their own content pixels (0 elsewhere), and the masks as 0/1."""
    x = thumbs.reshape(len(thumbs), -1).astype(np.float64)
    m = masks.reshape(len(masks), -1).astype(np.float64)
    n = np.maximum(m.sum(axis=1, keepdims=True), 1.0)
    mu = (x * m).sum(axis=1, keepdims=True) / n
    x = (x - mu) * m
    sd = np.sqrt((x * x).sum(axis=1, keepdims=True) / n)
    return x / np.where(sd > 0, sd, 1.0), m


def _masked_r(xa: np.ndarray, ma: np.ndarray, xb: np.ndarray, mb: np.ndarray, need: int) -> np.ndarray:
    """``(A, B)`` Pearson correlations over the mask overlaps (six matrix products of the running sums);
    ``-inf`` where undefined."""
    n = ma @ mb.T
    sx, sy = xa @ mb.T, ma @ xb.T
    sxx, syy, sxy = (xa * xa) @ mb.T, ma @ (xb * xb).T, xa @ xb.T
    with np.errstate(invalid="ignore", divide="ignore"):
        cov = sxy - sx * sy / n
        den = np.sqrt(np.maximum(sxx - sx * sx / n, 0) * np.maximum(syy - sy * sy / n, 0))
        r = cov / den
    return np.where((n >= need) & (den > 1e-9 * n), r, -np.inf)


def ncc_all_pairs(thumbs: np.ndarray, threshold: float, block: int = 1024, margin: float = 1e-4,
                  masks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``i < j`` whose NCC is ``>= threshold - margin``, comparing all ``N(N-1)/2`` pairs.

    Vectorised: the thumbnails become a ``(N, S*S)`` ``float32`` matrix of centred, unit-norm rows (``z``-scored
    pixels divided by ``sqrt(S*S)``), so NCC of rows ``i, j`` is their dot product; row blocks of ``block`` are
    multiplied with all later rows (BLAS). Zero-variance thumbnails (NCC undefined) pair with nothing. The
    ``margin`` absorbs ``float32`` rounding (about 1e-6 here); callers recompute the kept pairs exactly in
    ``float64`` with :func:`ncc_pairs` and apply the threshold to those values.

    Args:
        thumbs: ``(N, S, S)`` ``uint8``.
        threshold: NCC threshold in [-1, 1].
        block: rows per block (memory ``block * N * 4`` bytes).
        margin: kept below the threshold (see above).
        masks: optional ``(N, S, S)`` bool content masks: NCC over each pair's mask overlap, from six ``float64``
            matrix products of running sums per row block (about six times the work; margin ``1e-6`` enough).

    Returns:
        ``(i, j)``: ``int64`` arrays, ``i < j``, sorted by ``i`` then ``j``.
    """
    n = len(thumbs)
    if masks is not None:
        x, m = _standardised(thumbs, masks)
        need = min_overlap(thumbs.shape[1])
        ii, jj = [], []
        for s in range(0, n, block):
            r, c = np.nonzero(_masked_r(x[s:s + block], m[s:s + block], x[s:], m[s:], need) >= threshold - margin)
            keep = c > r
            ii.append(r[keep] + s)
            jj.append(c[keep] + s)
        i = np.concatenate(ii).astype(np.int64) if ii else np.zeros(0, np.int64)
        j = np.concatenate(jj).astype(np.int64) if jj else np.zeros(0, np.int64)
        o = np.lexsort((j, i))
        return i[o], j[o]
    flat, ok = _unit_rows(thumbs)
    ii, jj = [], []
    cut = np.float32(threshold - margin)
    for s in range(0, n, block):
        sim = flat[s:s + block] @ flat[s:].T  # (b, n - s): rows s.. against rows s..
        r, c = np.nonzero(sim >= cut)
        keep = c > r  # j > i (the diagonal and the lower triangle of the first square are dropped)
        r, c = r[keep] + s, c[keep] + s
        valid = ok[r] & ok[c]
        ii.append(r[valid])
        jj.append(c[valid])
    i = np.concatenate(ii).astype(np.int64) if ii else np.zeros(0, np.int64)
    j = np.concatenate(jj).astype(np.int64) if jj else np.zeros(0, np.int64)
    o = np.lexsort((j, i))
    return i[o], j[o]


def _unit_rows(thumbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Centred, unit-norm ``float32`` rows of ``(n, S, S)`` thumbnails and the mask of non-constant ones."""
    flat = thumbs.reshape(len(thumbs), -1).astype(np.float32)
    flat -= flat.mean(axis=1, keepdims=True)
    norm = np.sqrt((flat.astype(np.float64) ** 2).sum(axis=1))
    ok = norm > 0
    flat[ok] /= norm[ok, None].astype(np.float32)
    flat[~ok] = 0.0
    return flat, ok


def ncc_query_pairs(thumbs: np.ndarray, queries: np.ndarray, threshold: float, block: int = 8192,
                    margin: float = 1e-4, masks: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every pair ``(q, j)``, ``q`` in ``queries``, ``j`` any other row, with NCC ``>= threshold - margin``.

    Same arithmetic as :func:`ncc_all_pairs` (unit-norm centred ``float32`` rows, dot products), but only the
    query rows against all ``N`` rows (``len(queries) * N`` dot products), the ``N`` rows normalised ``block``
    at a time (memory ``(M + block) * S*S * 4`` bytes plus ``M * block * 4``; no ``float32`` copy of all rows).

    Args:
        thumbs: ``(N, S, S)`` ``uint8``.
        queries: ``(M,)`` distinct row indices.
        threshold, margin: as :func:`ncc_all_pairs`.
        block: target rows per matrix product.
        masks: optional content masks (as :func:`ncc_all_pairs`).

    Returns:
        ``(i, j)``: ``int64``, ``i < j``, unique, sorted (a pair of two query rows appears once).
    """
    n = len(thumbs)
    q = np.asarray(queries, dtype=np.int64)
    if masks is not None:
        xq, mq = _standardised(thumbs[q], masks[q])
        need = min_overlap(thumbs.shape[1])
        codes = []
        for s in range(0, n, block):
            xt, mt = _standardised(thumbs[s:s + block], masks[s:s + block])
            r, c = np.nonzero(_masked_r(xq, mq, xt, mt, need) >= threshold - margin)
            a, t = q[r], c + s
            keep = a != t
            codes.append(np.minimum(a[keep], t[keep]) * n + np.maximum(a[keep], t[keep]))
        code = np.unique(np.concatenate(codes)) if codes else np.zeros(0, np.int64)
        return (code // n).astype(np.int64), (code % n).astype(np.int64)
    qz, qok = _unit_rows(thumbs[q])
    codes = []
    cut = np.float32(threshold - margin)
    for s in range(0, n, block):
        tz, tok = _unit_rows(thumbs[s:s + block])
        r, c = np.nonzero(qz @ tz.T >= cut)
        a, t = q[r], c + s
        keep = (a != t) & qok[r] & tok[c]
        a, t = a[keep], t[keep]
        codes.append(np.minimum(a, t) * n + np.maximum(a, t))
    code = np.unique(np.concatenate(codes)) if codes else np.zeros(0, np.int64)
    return (code // n).astype(np.int64), (code % n).astype(np.int64)


def ssim_pairs(thumbs: np.ndarray, i: np.ndarray, j: np.ndarray, masks: np.ndarray | None = None) -> np.ndarray:
    """Mean SSIM of thumbnail pairs ``(i[t], j[t])`` (skimage, parameters :data:`SSIM_PARAMS`).

    Args:
        masks: optional ``(N, S, S)`` content masks: the mean of the SSIM map over the overlap (module docstring).

    Returns:
        ``(P,)`` ``float64`` (1.0 for identical thumbnails; NaN when the masked overlap is too small).
    """
    if masks is not None:
        pad = (SSIM_PARAMS["win_size"] - 1) // 2
        need = min_overlap(thumbs.shape[1])
        out = np.full(len(i), np.nan)
        for t, (a, b) in enumerate(zip(i, j)):
            _, smap = structural_similarity(thumbs[a], thumbs[b], full=True, **SSIM_PARAMS)
            m = masks[a] & masks[b]
            if m.sum() < need:
                continue
            inner = m[pad:-pad, pad:-pad]
            if inner.any():
                out[t] = float(smap[pad:-pad, pad:-pad][inner].mean())
        return out
    return np.array([structural_similarity(thumbs[a], thumbs[b], **SSIM_PARAMS) for a, b in zip(i, j)],
                    dtype=np.float64)


__all__ = ["min_overlap", "ncc_pairs", "ncc_all_pairs", "ncc_query_pairs", "ssim_pairs", "screen_description",
           "SSIM_PARAMS"]
