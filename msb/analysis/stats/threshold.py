"""Threshold analysis from stored probability maps, without re-inference.

A stored map holds ``v = round(255 p)`` per pixel (uint8); at a decision threshold ``t`` the prediction is
``v / 255 >= t`` (the same float comparison a user would write on the stored array). From the per-image level
histograms (:func:`msb.analysis.stats.calibration.level_histograms`) the counts at *every* threshold follow
exactly: ``TP(t) = Σ_{v >= L(t)} h_fg(v)``, ``FP(t) = Σ_{v >= L(t)} (h_all(v) - h_fg(v))``, ``FN = |ref| - TP``,
with ``L(t)`` the smallest level whose probability reaches ``t``.

The threshold is chosen on the **selection split** (the run's ``checkpoint.selection_split``), maximising the
image-macro score of a named metric (Dice by default; ties go to the threshold nearest the declared one, then
the lower); the test split is only scored at that threshold, never used to choose it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from msb.analysis.counts.rules import score
from msb.analysis.stats.calibration import LEVELS
from msb.errors import MSBError

__all__ = ["DEFAULT_GRID", "level_of", "counts_at", "image_macro", "choose_threshold"]

#: Thresholds scanned: 0.05, 0.10, ..., 0.95.
DEFAULT_GRID: tuple[float, ...] = tuple(round(0.05 * k, 2) for k in range(1, 20))


def level_of(t: float) -> int:
    """Smallest stored level ``v`` with ``v / 255 >= t`` (256 when none)."""
    hit = np.flatnonzero(LEVELS >= t)
    return int(hit[0]) if hit.size else 256


def counts_at(h_all: np.ndarray, h_fg: np.ndarray, thresholds: Sequence[float]) -> dict[str, np.ndarray]:
    """Pixel counts at each threshold.

    Args:
        h_all, h_fg: int64 ``(..., 256)`` level histograms; thresholds: ``T`` values in (0, 1].

    Returns:
        ``{"tp", "fp", "fn", "tn"}``: int64 ``(..., T)``.
    """
    ha, hf = np.asarray(h_all, dtype=np.int64), np.asarray(h_fg, dtype=np.int64)
    # suffix sums: entry v = pixels with level >= v (entry 256 = 0)
    sa = np.concatenate([np.cumsum(ha[..., ::-1], -1)[..., ::-1], np.zeros(ha.shape[:-1] + (1,), np.int64)], -1)
    sf = np.concatenate([np.cumsum(hf[..., ::-1], -1)[..., ::-1], np.zeros(hf.shape[:-1] + (1,), np.int64)], -1)
    lv = np.array([level_of(t) for t in thresholds], dtype=np.int64)
    tp, pos = sf[..., lv], sa[..., lv]
    ref, tot = hf.sum(-1, keepdims=True), ha.sum(-1, keepdims=True)
    fp = pos - tp
    fn = ref - tp
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tot - tp - fp - fn}


def image_macro(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray, metric: str) -> np.ndarray:
    """Image-macro score per threshold of ``(n, C, T)`` counts: per image the mean over classes of the defined
    scores, then the mean over images with a defined score (0/0 images excluded, as the counts rule)."""
    s = score(metric, tp.astype(np.float64), fp.astype(np.float64), fn.astype(np.float64))
    with np.errstate(invalid="ignore"), _quiet():
        per_image = np.nanmean(s, axis=1)
        return np.nanmean(per_image, axis=0)


class _quiet:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def choose_threshold(values: np.ndarray, thresholds: Sequence[float], declared: float) -> int:
    """Index of the threshold maximising ``values`` (NaN never chosen); ties: nearest to ``declared``, then lower.

    Raises:
        MSBError: every value is NaN.
    """
    v = np.asarray(values, dtype=np.float64)
    if not np.isfinite(v).any():
        raise MSBError("threshold analysis: the selection metric is undefined at every threshold")
    best = np.nanmax(v)
    cand = [i for i in range(v.size) if np.isfinite(v[i]) and v[i] == best]
    return min(cand, key=lambda i: (abs(thresholds[i] - declared), thresholds[i]))
