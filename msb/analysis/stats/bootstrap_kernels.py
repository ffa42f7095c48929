"""Gather kernels of the image bootstrap (:mod:`msb.analysis.stats.bootstrap`): for the rules whose replicate value is a
function of resampled sums of per-image terms, the term columns to gather at the draws and the function of
their sums. Exact for counts (integer sums), to rounding (~1e-16) for means of per-image scores, against the
weights path ``rule_values(table, rule, metric, W)`` of the same draws (tested).
"""

from __future__ import annotations

import numpy as np

from msb.analysis.counts.count_scores import ALL_METRICS
from msb.analysis.counts.rules import ImageTable, score

__all__ = ["Kernel", "gather_kernel"]


class Kernel:
    """Replicate values of one ``(table, rule, metric)`` job from the draws, for rules whose value is a function
    of resampled sums of per-image terms (global-micro, pooled-foreground, image-foreground,
    image-class-mean, single-class image-macro): each term column is gathered at the draws (``np.take``
    into a reused buffer) and summed per replicate; ``finish`` turns the sums into the values.

    Columns, chosen so that one gather serves as many terms as possible, all exact:

    * two count sums (TP and FP + FN, FP or FN): **one ``int64`` column** ``a + (b << 32)`` when every sum of
      ``n`` draws fits 32 bits (``n * max(a) < 2**32`` and ``n * max(b) < 2**31``; then the 64-bit sum of the
      packed values is exact and unpacks into the two sums), else two ``int64`` columns;
    * means of per-image scores: the ``float64`` scores (0 where undefined) and, only when some image is
      undefined, a ``uint8`` column flagging the undefined images (their draws are subtracted from ``n``).

    Sums of the draws equal ``W @ X`` of the weights path: exactly for counts, to rounding (~1e-16) for means.
    """

    def __init__(self, columns: list[np.ndarray], finish):
        self.columns = columns
        self.finish = finish
        self._buffers: list[np.ndarray] = []

    def values(self, idx: np.ndarray) -> np.ndarray:
        """``(b,)`` replicate values of a ``(b, n)`` block of draws (``b`` at most the first block's)."""
        b = idx.shape[0]
        if not self._buffers or self._buffers[0].shape[0] < b:
            self._buffers = [np.empty(idx.shape, dtype=c.dtype) for c in self.columns]
        sums = []
        for col, buf in zip(self.columns, self._buffers):
            part = buf[:b]
            np.take(col, idx, out=part, mode="clip")  # indices are in range; "clip" avoids a temporary copy
            sums.append(part.sum(axis=1, dtype=np.int64 if col.dtype.kind in "iu" else np.float64))
        return self.finish(idx.shape[1], *sums)


def _two_counts(a: np.ndarray, b: np.ndarray, n: int, finish2) -> Kernel:
    """A :class:`Kernel` of two resampled count sums, packed into one column when the sums fit (see there)."""
    a = np.asarray(a, dtype=np.int64)
    b = np.asarray(b, dtype=np.int64)
    top_a = int(a.max(initial=0))
    top_b = int(b.max(initial=0))
    if a.min(initial=0) >= 0 and b.min(initial=0) >= 0 and n * top_a < 2**32 and n * top_b < 2**31:
        def unpack(_n, s):
            return finish2(s & 0xFFFFFFFF, s >> 32)
        return Kernel([a + (b << 32)], unpack)
    return Kernel([a, b], lambda _n, sa, sb: finish2(sa, sb))


def gather_kernel(table: ImageTable, rule: str, metric: str) -> Kernel | None:
    """The :class:`Kernel` of a rule whose replicate value is a function of resampled sums.

    Args:
        table: the system's per-image counts (``tp``, ``fp``, ``fn``: int64 ``(n, C)``).
        rule, metric: as :func:`msb.analysis.counts.rules.rule_values`.

    Returns:
        The kernel, or ``None`` for the other rules and metrics (the caller uses the weights path). One gather
        per draw and term column is ~2x faster than building the weights and multiplying (measured at 10k
        images, docs/performance.md).
    """
    if metric not in ALL_METRICS:
        return None
    tp, fp, fn = table.tp, table.fp, table.fn
    n = tp.shape[0]
    if rule in ("global-micro", "pooled-foreground"):
        t, p, f = tp.sum(1), fp.sum(1), fn.sum(1)
        # every metric uses TP and one other sum: dice/iou FP + FN, precision FP, recall FN
        other = {"dice": p + f, "iou": p + f, "precision": p, "recall": f}[metric]

        def finish2(st, so):
            st = st.astype(np.float64)
            so = so.astype(np.float64)
            if metric == "recall":
                return score(metric, st, np.zeros_like(st), so)
            return score(metric, st, so, np.zeros_like(st))

        return _two_counts(t, other, n, finish2)
    if rule in ("image-macro", "image-class-mean", "image-foreground"):
        if rule == "image-macro" and tp.shape[1] != 1:
            return None
        if rule == "image-foreground":
            s_ic = score(metric, tp.sum(1), fp.sum(1), fn.sum(1))[:, None]
        else:
            s_ic = score(metric, tp, fp, fn)
        d = ~np.isnan(s_ic)
        total = np.where(d, s_ic, 0.0).sum(1)
        defined = d.sum(1)

        def finish(n_draws, s, k=None):
            den = (np.full(s.shape, n_draws, dtype=np.float64) if k is None else (n_draws - k).astype(np.float64))
            out = np.full(s.shape, np.nan)
            np.divide(s, den, out=out, where=den != 0)
            return out

        if s_ic.shape[1] == 1:  # one term per image: the mean over the defined images
            undefined = ~d[:, 0]
            return Kernel([total] + ([undefined.astype(np.uint8)] if undefined.any() else []), finish)
        # several classes (image-class-mean): the mean over defined (image, class) terms = sum / count
        return _two_float(total, defined.astype(np.float64))
    return None


def _two_float(s: np.ndarray, c: np.ndarray) -> Kernel:
    """A :class:`Kernel` of ``sum(s) / sum(c)`` over the draws (NaN where the count is 0)."""
    def finish(_n, ss, sc):
        out = np.full(ss.shape, np.nan)
        np.divide(ss, sc, out=out, where=sc != 0)
        return out
    return Kernel([np.asarray(s, dtype=np.float64), np.asarray(c, dtype=np.float64)], finish)
