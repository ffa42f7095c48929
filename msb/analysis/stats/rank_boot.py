"""Bootstrap rank distributions: how often is each system the best, and how stable is the ranking?

The design follows challengeR (Wiesenfarth et al., "Methods and open-source toolkit for analyzing and
visualizing challenge results", Sci. Rep. 11, 2369, 2021): the images are resampled with replacement, every
system is scored on each resample and the systems are ranked per replicate. Per system we report

* the **rank-1 share**: the fraction of replicates in which it ranks first (ties share the rank),
* its **median rank** and **rank interval**: the ``α/2`` and ``1 - α/2`` quantiles of its replicate ranks
  (``numpy.quantile`` methods ``lower`` / ``higher``, so the bounds are ranks that occurred),
* per block, **Kendall's τ** (τ-b, Kendall 1945; ``scipy.stats.kendalltau``) between the full-data ranking and
  each replicate's ranking: its median and 5th percentile.

The replicates are those of the leaderboard's paired analyses: the same draws as
:func:`msb.analysis.stats.bootstrap.bootstrap_rule` on the aligned tables (same ``n``, ``n_boot``, seed and
fold strata: :func:`msb.analysis.stats.bootstrap.resample_indices`), paired across systems (one resample scores
every system). Scores come from the resampling weights (``rule_values(table, rule, metric, W)``; image-macro
of all systems in one matrix product), equal to the gather kernels' values to rounding (~1e-16).

Ranks: 1 = best (highest value; lowest for distance metrics, :func:`msb.analysis.counts.rules.lower_is_better`),
ties share the smallest rank (``min`` method, as :func:`msb.analysis.stats.ranking.rank_table`), an undefined
replicate value ranks last.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd
from threadpoolctl import threadpool_limits

from msb.analysis.counts.count_scores import ALL_METRICS
from msb.analysis.counts.rules import ImageTable, lower_is_better, rule_values, score
from msb.analysis.stats.bootstrap import (_PIPELINE_DEPTH, _PIPELINE_DRAWS, DEFAULT_LEVEL, _check_args, _draw_blocks, _strata_of, _weights_of,
                                          resample_indices)
from msb.errors import MSBError

__all__ = ["RankDistribution", "rank_rows", "kendall_tau_b", "rank_replicates", "rank_distribution"]


@dataclass(frozen=True)
class RankDistribution:
    """Bootstrap rank distribution of one comparison block.

    Attributes:
        systems: labels, in the input order; rule, metric: the ranking score.
        estimate: ``(k,)`` full-data values; full_rank: ``(k,)`` int64 ranks of ``estimate``.
        replicates: ``(n_boot, k)`` replicate values; ranks: ``(n_boot, k)`` int64 replicate ranks.
        tau: ``(n_boot,)`` Kendall τ-b of each replicate ranking vs ``full_rank`` (NaN when undefined).
        level, seed, n_images, n_strata: the setting of the draws.
    """

    systems: tuple[str, ...]
    rule: str
    metric: str
    estimate: np.ndarray
    full_rank: np.ndarray
    replicates: np.ndarray
    ranks: np.ndarray
    tau: np.ndarray
    level: float
    seed: int
    n_images: int
    n_strata: int

    @property
    def n_boot(self) -> int:
        """Number of replicates."""
        return int(self.ranks.shape[0])

    def table(self) -> pd.DataFrame:
        """One row per system, best full-data rank first: ``system, value, rank, rank1_share, median_rank,
        rank_low, rank_high, level, n_boot, tau_median, tau_p05, rule, metric`` (shares in [0, 1]; the two τ
        columns are the block's, repeated on each row)."""
        alpha = 1.0 - self.level
        r = self.ranks
        lo = np.quantile(r, alpha / 2, axis=0, method="lower")
        hi = np.quantile(r, 1 - alpha / 2, axis=0, method="higher")
        ok = np.isfinite(self.tau)
        tmed = float(np.median(self.tau[ok])) if ok.any() else float("nan")
        t05 = float(np.percentile(self.tau[ok], 5)) if ok.any() else float("nan")
        df = pd.DataFrame({"system": list(self.systems), "value": self.estimate, "rank": self.full_rank,
                           "rank1_share": (r == 1).mean(axis=0), "median_rank": np.median(r, axis=0),
                           "rank_low": lo.astype(np.int64), "rank_high": hi.astype(np.int64),
                           "level": self.level, "n_boot": self.n_boot, "tau_median": tmed, "tau_p05": t05,
                           "rule": self.rule, "metric": self.metric})
        return df.sort_values(["rank", "system"], kind="stable").reset_index(drop=True)


def rank_rows(values: np.ndarray, metric: str) -> np.ndarray:
    """Ranks of each row of ``values``.

    Args:
        values: ``(B, k)`` (or ``(k,)``) float64 scores of ``k`` systems.
        metric: decides the direction (:func:`lower_is_better`).

    Returns:
        int64 array of the same shape: 1 = best, ties share the smallest rank, NaN ranks last (``1 + the number
        of systems strictly better``; equal to ``scipy.stats.rankdata(key, method="min")`` row by row).
    """
    v = np.asarray(values, dtype=np.float64)
    key = v if lower_is_better(metric) else -v
    key = np.where(np.isnan(key), np.inf, key)
    return 1 + (key[..., None, :] < key[..., :, None]).sum(axis=-1).astype(np.int64)


def kendall_tau_b(ref: np.ndarray, ranks: np.ndarray) -> np.ndarray:
    """Kendall's τ-b between one ranking and each row of ``ranks`` (vectorised over rows).

    ``τ_b = (C - D) / sqrt((n0 - n1) (n0 - n2))`` over the ``n0 = k (k - 1) / 2`` pairs, ``n1``/``n2`` the pairs
    tied in ``ref`` / in the row (Kendall 1945; the statistic of ``scipy.stats.kendalltau``, variant ``b``).

    Args:
        ref: ``(k,)`` ranks; ranks: ``(B, k)`` ranks.

    Returns:
        ``(B,)`` float64; NaN where a ranking is constant (as scipy) or ``k < 2``.
    """
    ref = np.asarray(ref, dtype=np.float64)
    r = np.atleast_2d(np.asarray(ranks, dtype=np.float64))
    k = ref.size
    if k < 2:
        return np.full(r.shape[0], np.nan)
    i, j = np.triu_indices(k, 1)
    sa = np.sign(ref[i] - ref[j])
    sb = np.sign(r[:, i] - r[:, j])
    num = sb @ sa
    n0 = i.size
    den = np.sqrt((n0 - (sa == 0).sum()) * (n0 - (sb == 0).sum(axis=1)).astype(np.float64))
    out = np.full(r.shape[0], np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def _stack_image_macro(tables: list[ImageTable], metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The image-macro terms of all systems: ``S0`` ``(n, k C)`` per-image scores with 0 where undefined,
    ``U`` the positions of the images undefined for some system or class, and ``1 - d`` at those images
    ``(|U|, k C)`` (so that ``Σ_i w_i d_i = Σ_i w_i - W[:, U] @ (1 - d)[U]``: a small product, undefined
    images being few)."""
    s = np.concatenate([score(metric, t.tp, t.fp, t.fn) if metric in ALL_METRICS else t.extra[metric]
                        for t in tables], axis=1)
    d = ~np.isnan(s)
    u = np.flatnonzero(~d.all(axis=1))
    return np.where(d, s, 0.0), u, (~d[u]).astype(np.float64)


#: Draws per block of the rank replicates: a ``(rows, n)`` float64 weight block of ~1.3 MB stays in a core's
#: L2 cache while the product with the ``k C`` score columns reads it (measured in scripts/bench_analysis.py).
_RANK_ELEMENTS = 160_000


class _Counts:
    """Resampling counts of blocks of draws into buffers allocated once (``(rows, n)`` float64 block).

    A fresh ~1 MB array per block would be ``mmap``-ed and page-faulted anew each time (glibc's threshold for a
    worker thread's arena); refilling one buffer costs no system call (measured: 3x faster in
    scripts/bench_analysis.py). One instance per thread.
    """

    def __init__(self, rows: int, n: int) -> None:
        self.offsets = (np.arange(rows, dtype=np.int64) * n)[:, None]
        self.flat = np.empty((rows, n), np.int64)
        self.weights = np.empty((rows, n))

    def __call__(self, idx: np.ndarray) -> np.ndarray:
        """``(b, n)`` float64 view: row ``r`` holds how often each image was drawn in replicate ``r`` of ``idx``
        (``(b, n)`` draws, ``b <= rows``). Valid until the next call."""
        b = idx.shape[0]
        flat, w = self.flat[:b], self.weights[:b]
        np.add(idx, self.offsets[:b], out=flat)
        w.fill(0.0)
        np.add.at(w.reshape(-1), flat.reshape(-1), 1.0)
        return w


def rank_replicates(tables: Mapping[str, ImageTable], rule: str = "image-macro", metric: str = "dice",
                    n_boot: int = 1000, seed: int = 0, stratify_by_fold: bool = True) -> np.ndarray:
    """``(n_boot, k)`` replicate values of ``k`` aligned systems on shared draws.

    Args:
        tables: label -> table, aligned on the same images (:func:`msb.analysis.counts.systems.align_tables`).
        rule, metric: as :func:`msb.analysis.counts.rules.rule_values`.
        n_boot, seed, stratify_by_fold: as :func:`msb.analysis.stats.bootstrap.bootstrap_rule` (the same draws:
            replicate ``r`` resamples the images of row ``r`` of :func:`resample_indices`).

    Raises:
        MSBError: bad ``n_boot``; tables of different lengths; unknown rule or metric.
    """
    ts = list(tables.values())
    if not ts:
        raise MSBError("rank distribution: no system given")
    n = ts[0].n_images
    _check_args(n, n_boot, DEFAULT_LEVEL)
    if any(t.n_images != n for t in ts):
        raise MSBError("rank distribution: tables must be aligned on the same images (use align_tables)")
    strata = _strata_of(ts[0], stratify_by_fold)
    k = len(ts)
    out = np.empty((n_boot, k))
    stacked = _stack_image_macro(ts, metric) if rule == "image-macro" else None
    rows = max(1, _RANK_ELEMENTS // max(n, 1))
    blocks = (resample_indices(n, n_boot, seed, None, chunk=rows) if strata is None
              else (b[a:a + rows] for b in _draw_blocks(n, n_boot, seed, strata) for a in range(0, b.shape[0], rows)))
    if stacked is not None:
        s0, u, nd = stacked
        num = np.empty((n_boot, s0.shape[1]))
        lost = np.zeros((n_boot, s0.shape[1]))  # Σ_i w_i (1 - d_i): weight of the undefined images
        counts = _Counts(rows, n)  # one scoring thread at a time (see _pipeline)

    def score_block(at: int, idx: np.ndarray) -> None:
        for w in ([counts(idx)] if stacked is not None else _weights_of(idx)):
            b = w.shape[0]
            if stacked is not None:  # products only; the ratios are taken once for all replicates below
                np.matmul(w, s0, out=num[at:at + b])
                if u.size:
                    np.matmul(w[:, u], nd, out=lost[at:at + b])
            else:
                for j, t in enumerate(ts):
                    out[at:at + b, j] = rule_values(t, rule, metric, w)
            at += b

    with threadpool_limits(limits=1, user_api="blas"):  # small products: BLAS threads only contend with the draws
        _pipeline(blocks, score_block, n * n_boot)
    if stacked is not None:
        den = (n - lost).reshape(n_boot, k, -1)
        per = np.full(den.shape, np.nan)
        np.divide(num.reshape(n_boot, k, -1), den, out=per, where=den > 0)
        cnt = np.isfinite(per).sum(axis=2)
        out[:] = np.nan
        np.divide(np.where(np.isfinite(per), per, 0.0).sum(axis=2), cnt, out=out, where=cnt > 0)
    return out


def _pipeline(blocks, score_block, n_draws: int) -> None:
    """``score_block(first_row, idx)`` on every block of draws, in order; as the bootstrap's replicates
    (:func:`msb.analysis.stats.bootstrap._replicates`), with enough draws and two CPUs the blocks are scored in one
    worker thread while the main thread draws the next ones (the same values, each block writes its own rows)."""
    if n_draws < _PIPELINE_DRAWS or (os.cpu_count() or 1) < 2:
        done = 0
        for idx in blocks:
            score_block(done, idx)
            done += idx.shape[0]
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: deque = deque()
        done = 0
        for idx in blocks:
            while len(pending) >= 4 * _PIPELINE_DEPTH:
                pending.popleft().result()
            pending.append(pool.submit(score_block, done, idx))
            done += idx.shape[0]
        while pending:
            pending.popleft().result()


def rank_distribution(tables: Mapping[str, ImageTable], rule: str = "image-macro", metric: str = "dice",
                      n_boot: int = 1000, level: float = DEFAULT_LEVEL, seed: int = 0,
                      stratify_by_fold: bool = True) -> RankDistribution:
    """The bootstrap rank distribution of aligned systems (module docstring).

    Args:
        tables: label -> aligned table; rule, metric: the ranking score (the leaderboard's: image-macro Dice).
        n_boot, level, seed: the statistics setting's replicates, level and seed.
        stratify_by_fold: resample within folds when the first table holds several.

    Returns:
        :class:`RankDistribution` (``.table()`` for the per-system summary).

    Raises:
        MSBError: as :func:`rank_replicates`.
    """
    if not 0 < level < 1:
        raise MSBError(f"confidence level must be in (0, 1), got {level!r}")
    labels = tuple(tables)
    ts = list(tables.values())
    est = np.array([float(rule_values(t, rule, metric)[0]) for t in ts])
    reps = rank_replicates(tables, rule, metric, n_boot, seed, stratify_by_fold)
    full = rank_rows(est, metric)
    ranks = rank_rows(reps, metric)
    strata = _strata_of(ts[0], stratify_by_fold)
    return RankDistribution(labels, rule, metric, est, full, reps, ranks, kendall_tau_b(full, ranks), level, seed,
                            ts[0].n_images, 1 if strata is None else len(np.unique(strata)))
