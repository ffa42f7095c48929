"""Image-level percentile bootstrap confidence intervals, single-system and paired, optionally fold-stratified.

Resampling unit: the image (all classes of an image move together), drawn with replacement, ``n`` draws per
replicate (Efron & Tibshirani 1993, ch. 13 "percentile interval"). A replicate is represented by its
resampling *counts* ``w_i`` (how often image ``i`` was drawn), so every aggregation rule of
:func:`msb.analysis.counts.rules.rule_values` is one matrix product ``W @ X`` per block of replicates: no Python loop
over replicates or images. Rules whose value is a ratio of two resampled sums (global-micro, pooled-foreground,
image-foreground, image-class-mean, single-class image-macro) skip the weights: their per-image terms are
gathered at the draws (``np.take``) and summed, two count terms packed into one ``int64`` when the sums fit 32
bits (the same replicates: exactly for counts, to rounding for means). Fold-stratified: each fold's images are resampled among themselves (``n_f`` draws
from fold ``f``), so every replicate keeps the fold sizes (Davison & Hinkley 1997, §3.8 stratified sampling).
Paired: the same ``W`` is applied to both systems (aligned on the same images), and the CI is taken on the
per-replicate difference.

The percentile interval at level ``1 - α`` is ``[q(α/2), q(1 - α/2)]`` of the replicates (numpy ``linear``
percentile, as ``scipy.stats.bootstrap(method="percentile")``); replicates whose value is undefined (every unit
undefined in the resample) are left out and counted (``n_undefined``).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from msb.analysis.stats.bootstrap_kernels import gather_kernel as _gather_kernel
from msb.analysis.counts.rules import ImageTable, rule_values
from msb.analysis.counts.systems import align_tables
from msb.errors import MSBError

__all__ = ["DEFAULT_N_BOOT", "DEFAULT_LEVEL", "BootstrapResult", "resample_indices", "resample_weights",
           "percentile_interval", "bootstrap_rule", "bootstrap_rules", "bootstrap_mean", "paired_difference"]

#: Default number of bootstrap replicates.
DEFAULT_N_BOOT = 2000
#: Default confidence level.
DEFAULT_LEVEL = 0.95
#: Replicates per block (bounds memory at ``_CHUNK * n`` draws; fixed so results do not depend on it).
_CHUNK = 250
#: Weights per block handed to the rules (128k float64 = 1 MiB: cache-resident; measured 3-4x faster than
#: whole 250-replicate blocks at 10k images, docs/performance.md).
_SUB_ELEMENTS = 131_072


@dataclass(frozen=True)
class BootstrapResult:
    """A point estimate with its percentile bootstrap interval.

    Attributes:
        estimate: the statistic on the original images.
        low, high: interval bounds (NaN if no replicate is defined).
        level: confidence level, e.g. 0.95.
        n_boot: replicates drawn; ``n_undefined`` of them had an undefined value and were left out.
        n_images: images resampled (the bootstrap ``n``).
        n_strata: strata (folds) resampled separately; 1 = unstratified.
        seed: seed of ``numpy.random.default_rng``.
        replicates: the ``(n_boot,)`` replicate values.
    """

    estimate: float
    low: float
    high: float
    level: float
    n_boot: int
    n_undefined: int
    n_images: int
    n_strata: int
    seed: int
    method: str = "percentile"
    replicates: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False, compare=False)

    def text(self, digits: int = 4) -> str:
        """``"0.8123 [0.8011, 0.8230]"`` (``n/a`` for undefined parts)."""
        def f(v: float) -> str:
            return "n/a" if not np.isfinite(v) else f"{v:.{digits}f}"
        return f"{f(self.estimate)} [{f(self.low)}, {f(self.high)}]"


def _check_args(n: int, n_boot: int, level: float) -> None:
    if n < 1:
        raise MSBError("bootstrap needs at least one image")
    if isinstance(n_boot, bool) or int(n_boot) != n_boot or n_boot < 1:
        raise MSBError(f"number of bootstrap replicates must be a positive integer, got {n_boot!r}")
    if not 0 < level < 1:
        raise MSBError(f"confidence level must be in (0, 1), got {level!r}")


def resample_indices(n: int, n_boot: int, seed: int = 0, strata: np.ndarray | None = None,
                     chunk: int = _CHUNK) -> Iterator[np.ndarray]:
    """Yield blocks of bootstrap draws.

    Args:
        n: number of images.
        n_boot: replicates in total.
        seed: seed of ``numpy.random.default_rng`` (same seed, same draws).
        strata: optional ``(n,)`` labels (e.g. folds); draws of stratum ``s`` are taken from its own images,
            ``n_s`` of them per replicate.
        chunk: replicates per block.

    Yields:
        ``(b, n)`` arrays of image positions (``b <= chunk``; the blocks total ``n_boot`` rows), drawn
        with ``Generator.integers``: int32 when ``n < 2**31 - 1`` (32-bit draws are ~3x faster), else int64.
    """
    rng = np.random.default_rng(seed)
    groups = None
    if strata is not None:
        strata = np.asarray(strata)
        if strata.shape != (n,):
            raise ValueError(f"strata must have shape ({n},), got {strata.shape}")
        _, codes = np.unique(strata, return_inverse=True)
        groups = [np.flatnonzero(codes == k) for k in range(codes.max() + 1)]
    draw_dtype = np.int32 if n < 2**31 - 1 else np.int64  # 32-bit draws are ~3x faster
    done = 0
    while done < n_boot:
        b = min(chunk, n_boot - done)
        if groups is None or len(groups) == 1:
            idx = rng.integers(0, n, size=(b, n), dtype=draw_dtype)
        else:
            idx = np.empty((b, n), dtype=draw_dtype)
            for pos in groups:
                idx[:, pos] = pos[rng.integers(0, len(pos), size=(b, len(pos)), dtype=draw_dtype)]
        done += b
        yield idx


def resample_weights(n: int, n_boot: int, seed: int = 0, strata: np.ndarray | None = None,
                     chunk: int = _CHUNK) -> Iterator[np.ndarray]:
    """Like :func:`resample_indices` (the same draws, in the same order) but yield the resampling counts.

    The draws of each block of ``chunk`` replicates are turned into counts a few rows at a time (at most
    ``_SUB_ELEMENTS`` weights per yielded block, so that the weights and the matrix products of the rules on
    them stay in the CPU cache): one ``np.bincount`` over the offset draws of those rows.

    Yields:
        ``(b, n)`` float64 blocks, ``W[r, i]`` = how often image ``i`` was drawn in replicate ``r`` (each row
        sums to ``n``); the blocks total ``n_boot`` rows, in replicate order. Block sizes are an
        implementation detail (the concatenation does not depend on them).
    """
    for idx in resample_indices(n, n_boot, seed, strata, chunk):
        yield from _weights_of(idx)


def _weights_of(idx: np.ndarray) -> Iterator[np.ndarray]:
    """The resampling counts of a ``(b, n)`` block of draws, a few rows at a time (see :func:`resample_weights`)."""
    n = idx.shape[1]
    sub = max(1, _SUB_ELEMENTS // max(n, 1))
    for a in range(0, idx.shape[0], sub):
        part = idx[a:a + sub]
        b = part.shape[0]
        flat = (part + (np.arange(b, dtype=np.int64) * n)[:, None]).ravel()
        yield np.bincount(flat, minlength=b * n).reshape(b, n).astype(np.float64)


def _draw_blocks(n: int, n_boot: int, seed: int, strata: np.ndarray | None) -> Iterator[np.ndarray]:
    """The draws of :func:`resample_indices` (the same values, in the same order) in blocks of
    ``_SUB_ELEMENTS // n`` replicates, small enough to stay in the CPU cache. Unstratified blocks are drawn
    directly at that size (``Generator.integers`` gives the same stream whatever the call sizes: tested);
    stratified ones are cut from the ``_CHUNK``-replicate blocks (the order of the strata's calls depends on
    the block size)."""
    rows = max(1, _SUB_ELEMENTS // max(n, 1))
    if strata is None or len(np.unique(np.asarray(strata))) == 1:
        yield from resample_indices(n, n_boot, seed, None, chunk=rows)
        return
    for idx in resample_indices(n, n_boot, seed, strata):
        for a in range(0, idx.shape[0], rows):
            yield idx[a:a + rows]


#: Draws per call above which the gathers run in a worker thread while the main thread draws the next
#: block (NumPy releases the GIL in both); below it the thread costs more than it saves.
_PIPELINE_DRAWS = 2_000_000
#: Blocks drawn ahead of the worker thread, at most (absorbs the jitter of the two threads' block times).
_PIPELINE_DEPTH = 3


def _replicates(jobs: Sequence[tuple[ImageTable, str, str]], n: int, n_boot: int, seed: int,
                strata: np.ndarray | None) -> list[np.ndarray]:
    """``(n_boot,)`` replicates of every ``(table, rule, metric)`` job on the same draws: through a
    :func:`_gather_kernel` where the rule has one, else through the weights (each job always by the same
    method, so a job gives the same replicates alone or with others). With at least ``_PIPELINE_DRAWS``
    draws and two CPUs, block ``k`` is scored in one worker thread while block ``k + 1`` is drawn: the same
    values, in the same places (each block writes its own slice)."""
    reps = [np.empty(n_boot) for _ in jobs]
    kernels = [_gather_kernel(*job) for job in jobs]

    def score_block(at: int, idx: np.ndarray) -> None:
        b = idx.shape[0]
        for k, kern in enumerate(kernels):
            if kern is not None:
                reps[k][at:at + b] = kern.values(idx)
        if not all(kernels):
            pos = at
            for w in _weights_of(idx):
                for k, (t, rule, metric) in enumerate(jobs):
                    if kernels[k] is None:
                        reps[k][pos:pos + w.shape[0]] = rule_values(t, rule, metric, w)
                pos += w.shape[0]

    blocks = _draw_blocks(n, n_boot, seed, strata)
    if n * n_boot < _PIPELINE_DRAWS or (os.cpu_count() or 1) < 2:
        done = 0
        for idx in blocks:
            score_block(done, idx)
            done += idx.shape[0]
        return reps
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending: deque = deque()
        done = 0
        for idx in blocks:
            while len(pending) >= _PIPELINE_DEPTH:  # at most this many blocks drawn ahead of the worker
                pending.popleft().result()
            pending.append(pool.submit(score_block, done, idx))
            done += idx.shape[0]
        while pending:
            pending.popleft().result()
    return reps


def percentile_interval(replicates: np.ndarray, level: float = DEFAULT_LEVEL) -> tuple[float, float, int]:
    """``(low, high, n_undefined)``: the percentile interval of the defined replicates (numpy linear
    percentiles at ``100 α/2`` and ``100 (1 - α/2)``, ``α = 1 - level``)."""
    r = np.asarray(replicates, dtype=np.float64)
    ok = np.isfinite(r)
    if not ok.any():
        return float("nan"), float("nan"), int(r.size)
    alpha = 1.0 - level
    lo, hi = np.percentile(r[ok], [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(lo), float(hi), int((~ok).sum())


def _strata_of(table: ImageTable, stratify_by_fold: bool) -> np.ndarray | None:
    if not stratify_by_fold or "fold" not in table.keys.columns:
        return None
    folds = table.keys["fold"].to_numpy()
    return folds if len(np.unique(folds)) > 1 else None


def bootstrap_rule(tables: ImageTable | Sequence[ImageTable], rule: str, metric: str,
                   n_boot: int = DEFAULT_N_BOOT, level: float = DEFAULT_LEVEL, seed: int = 0,
                   stratify_by_fold: bool = True) -> list[BootstrapResult]:
    """Percentile CIs of one rule and metric for one or several systems on the same resamples.

    Args:
        tables: one table, or several already aligned on the same images (:func:`align_tables`); all get
            the same replicate weights, so their replicates are paired.
        rule, metric: as :func:`msb.analysis.counts.rules.rule_values`.
        n_boot, level, seed: replicates, confidence level, RNG seed.
        stratify_by_fold: resample within folds (the first table's ``fold`` column) when there are several.

    Returns:
        One :class:`BootstrapResult` per table.

    Raises:
        MSBError: bad ``n_boot`` / ``level``; tables of different lengths; unknown rule or metric.
    """
    tables = [tables] if isinstance(tables, ImageTable) else list(tables)
    n = tables[0].n_images
    _check_args(n, n_boot, level)
    if any(t.n_images != n for t in tables):
        raise MSBError("bootstrap_rule: tables must be aligned on the same images (use align_tables)")
    strata = _strata_of(tables[0], stratify_by_fold)
    est = [float(rule_values(t, rule, metric)[0]) for t in tables]
    reps = _replicates([(t, rule, metric) for t in tables], n, n_boot, seed, strata)
    n_strata = 1 if strata is None else len(np.unique(strata))
    out = []
    for e, r in zip(est, reps):
        lo, hi, bad = percentile_interval(r, level)
        out.append(BootstrapResult(e, lo, hi, level, n_boot, bad, n, n_strata, seed, replicates=r))
    return out


def bootstrap_rules(table: ImageTable, pairs: Sequence[tuple[str, str]], n_boot: int = DEFAULT_N_BOOT,
                    level: float = DEFAULT_LEVEL, seed: int = 0,
                    stratify_by_fold: bool = True) -> dict[tuple[str, str], BootstrapResult]:
    """CIs of several (rule, metric) pairs of one system, all computed on the same replicates (one draw of
    the weights for all pairs).

    Args:
        table: the system's table.
        pairs: ``(rule, metric)`` pairs (rules as :func:`msb.analysis.counts.rules.rule_values`).
        n_boot, level, seed, stratify_by_fold: as :func:`bootstrap_rule`.

    Returns:
        ``{(rule, metric): BootstrapResult}``.
    """
    pairs = list(dict.fromkeys(pairs))
    n = table.n_images
    _check_args(n, n_boot, level)
    strata = _strata_of(table, stratify_by_fold)
    est = {p: float(rule_values(table, p[0], p[1])[0]) for p in pairs}
    reps = dict(zip(pairs, _replicates([(table, r, m) for r, m in pairs], n, n_boot, seed, strata)))
    n_strata = 1 if strata is None else len(np.unique(strata))
    out = {}
    for p in pairs:
        lo, hi, bad = percentile_interval(reps[p], level)
        out[p] = BootstrapResult(est[p], lo, hi, level, n_boot, bad, n, n_strata, seed, replicates=reps[p])
    return out


def bootstrap_mean(x: np.ndarray, n_boot: int = DEFAULT_N_BOOT, level: float = DEFAULT_LEVEL, seed: int = 0,
                   strata: np.ndarray | None = None) -> BootstrapResult:
    """Percentile CI of the mean of a vector (NaN entries = undefined units: excluded from each mean,
    still resampled as units).

    Args:
        x: ``(n,)`` float values, e.g. per-image HD95 or per-image Dice differences.
        n_boot, level, seed: replicates, level, seed.
        strata: optional ``(n,)`` stratum labels.

    Returns:
        :class:`BootstrapResult` of ``mean(x[defined])``.
    """
    x = np.asarray(x, dtype=np.float64).ravel()
    _check_args(x.size, n_boot, level)
    d = ~np.isnan(x)
    x0 = np.where(d, x, 0.0)
    est = float(x0.sum() / d.sum()) if d.any() else float("nan")
    reps = np.empty(n_boot)
    done = 0
    cols = np.stack([x0, d.astype(np.float64)], axis=1)
    for w in resample_weights(x.size, n_boot, seed, strata):
        s = w @ cols
        out = np.full(w.shape[0], np.nan)
        np.divide(s[:, 0], s[:, 1], out=out, where=s[:, 1] > 0)
        reps[done:done + w.shape[0]] = out
        done += w.shape[0]
    lo, hi, bad = percentile_interval(reps, level)
    n_strata = 1 if strata is None else len(np.unique(strata))
    return BootstrapResult(est, lo, hi, level, n_boot, bad, int(x.size), n_strata, seed, replicates=reps)


def paired_difference(a: ImageTable, b: ImageTable, rule: str, metric: str, n_boot: int = DEFAULT_N_BOOT,
                      level: float = DEFAULT_LEVEL, seed: int = 0, stratify_by_fold: bool = True,
                      on_mismatch: str = "error") -> BootstrapResult:
    """Paired percentile CI of ``value(a) - value(b)`` under one rule and metric.

    Both systems are aligned on the same images (:func:`~msb.analysis.counts.systems.align_tables`), every replicate
    resamples images once and scores both systems on that resample, and the interval is taken on the
    replicate differences. Stratified by ``a``'s folds when it has several (K-fold runs).

    Returns:
        :class:`BootstrapResult` of the difference (estimate = difference of the point estimates).

    Raises:
        MSBError: different image sets (unless ``on_mismatch="intersect"``), bad arguments.
    """
    aligned = align_tables({"a": a, "b": b}, on_mismatch)
    ra, rb = bootstrap_rule([aligned["a"], aligned["b"]], rule, metric, n_boot, level, seed, stratify_by_fold)
    diff = ra.replicates - rb.replicates
    lo, hi, bad = percentile_interval(diff, level)
    return BootstrapResult(ra.estimate - rb.estimate, lo, hi, level, n_boot, bad, ra.n_images, ra.n_strata,
                           seed, replicates=diff)
