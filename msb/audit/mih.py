"""Exact near-duplicate pairs of 64-bit hashes by multi-index hashing (MIH), for large hash sets.

Norouzi, Punjani & Fleet 2012, "Fast search in Hamming space with multi-index hashing" (CVPR): split the 64
bits into ``m`` disjoint substrings; if two hashes differ in at most ``k`` bits, some substring differs in at
most ``r = floor(k / m)`` bits (pigeonhole). So every pair within ``k`` is found among the pairs whose values in
one substring differ by a mask of at most ``r`` bits; each candidate is then verified on all 64 bits, so the
result is exact (tested equal to the exhaustive search on random and planted data). A substring of ``b`` bits is
a counting-sorted table of ``2**b`` buckets, so one probe of every hash is a gather. The work grows like
``m * masks(b, r) * (N + N**2 / 2**b)`` instead of ``N**2 / 2``: with ``b ~ log2 N`` it is near-linear in ``N``
(1M hashes, ``k = 8``: 3 substrings of 21-22 bits, ``r = 2``, 232-254 masks each; docs/performance.md).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from itertools import combinations
from math import comb

import numpy as np

__all__ = ["choose_substrings", "pairs_mih"]

#: Largest substring width (a bucket table of ``2**b`` int64 offsets: 2**24 = 128 MiB).
_MAX_BITS = 24


def _masks(b: int, r: int) -> np.ndarray:
    """Every ``b``-bit mask with at most ``r`` bits set, as int64 (0 first)."""
    out = [0]
    for t in range(1, r + 1):
        out += [sum(1 << p for p in c) for c in combinations(range(b), t)]
    return np.asarray(out, dtype=np.int64)


def _widths(m: int) -> list[int]:
    return [64 // m + (1 if s < 64 % m else 0) for s in range(m)]


def choose_substrings(n: int, k: int) -> tuple[int, float]:
    """``(m, cost)``: the number of substrings minimising the modelled work for ``n`` hashes within ``k``.

    Work model (units of one probe of one hash): ``sum over substrings of masks(b, r) * n * (1 + n / 2**b)``
    with ``r = k // m``; substrings wider than 24 bits are not considered. ``m = 0`` when none fits.
    """
    best = (0, float("inf"))
    for m in range(max(1, -(-64 // _MAX_BITS)), min(k + 1, 64) + 1):
        r = k // m
        cost = sum(sum(comb(b, t) for t in range(r + 1)) * n * (1.0 + n / 2.0**b) for b in _widths(m))
        best = min(best, (m, cost), key=lambda x: x[1])
    return best


def pairs_mih(h: np.ndarray, k: int, m: int | None = None,
              workers: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs ``i < j`` with ``popcount(h[i] ^ h[j]) <= k``, by multi-index hashing.

    Args:
        h: ``(N,)`` uint64 hashes.
        k: maximum Hamming distance, 0..64.
        m: substrings (default :func:`choose_substrings`); each at most 24 bits wide.
        workers: threads probing a substring's masks (each thread its share of the masks; the same pairs).

    Returns:
        ``(i, j, d)``: int64, int64, uint8 arrays sorted by ``(i, j)`` (the same as
        :func:`msb.audit.search.pairs_within`).

    Raises:
        ValueError: ``k`` outside 0..64; ``m`` giving substrings wider than 24 bits or more than 64 of them.
    """
    h = np.ascontiguousarray(h, dtype=np.uint64).ravel()
    n = len(h)
    if not 0 <= int(k) <= 64:
        raise ValueError(f"k must be in 0..64, got {k}")
    m = choose_substrings(n, k)[0] if m is None else int(m)
    if not 1 <= m <= 64 or max(_widths(m)) > _MAX_BITS:
        raise ValueError(f"m must give 1..64 substrings of at most {_MAX_BITS} bits, got m={m}")
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8))
    if n < 2:
        return empty
    r = int(k) // m
    found: list[np.ndarray] = []
    lo = 0
    for b in _widths(m):
        vals = ((h >> np.uint64(lo)) & np.uint64((1 << b) - 1)).astype(np.int64)
        lo += b
        order = np.argsort(vals, kind="stable")
        count = np.bincount(vals, minlength=1 << b)
        start = np.zeros(1 << b, dtype=np.int64)
        np.cumsum(count[:-1], out=start[1:])
        # the probes gather from a narrow copy of the counts (2**b bytes when they fit), at the hashes taken in
        # sorted order of the substring: neighbouring probes then hit neighbouring buckets (cache lines)
        small = count.astype(np.uint8 if count.max(initial=0) < 256 else np.int32)
        svals = vals[order]

        def probe(masks: np.ndarray) -> list[np.ndarray]:
            t = np.empty(n, dtype=np.int64)  # reused by every mask of this thread
            hit = np.empty(n, dtype=small.dtype)
            out = []
            for f in masks:
                np.bitwise_xor(svals, f, out=t)
                np.take(small, t, out=hit, mode="clip")  # t < 2**b: in range ("clip" avoids a temporary)
                q = np.flatnonzero(hit)
                if not len(q):
                    continue
                tq = t[q]
                cq = count[tq]
                i = np.repeat(order[q], cq)
                first = np.repeat(np.cumsum(cq) - cq, cq)
                j = order[np.repeat(start[tq], cq) + (np.arange(len(i), dtype=np.int64) - first)]
                keep = j > i
                i, j = i[keep], j[keep]
                ok = _popcount(h[i] ^ h[j]) <= k
                out.append(i[ok] * n + j[ok])
            return out

        masks = _masks(b, r)
        if workers > 1 and len(masks) > 1:  # NumPy releases the GIL in these loops: the masks split over threads
            with ThreadPoolExecutor(max_workers=workers) as pool:
                for part in pool.map(probe, np.array_split(masks, min(workers, len(masks)))):
                    found.extend(part)
        else:
            found.extend(probe(masks))
    if not found:
        return empty
    key = np.unique(np.concatenate(found))  # a pair close in several substrings is found several times
    i, j = key // n, key % n
    return i, j, _popcount(h[i] ^ h[j])


def _popcount(x: np.ndarray) -> np.ndarray:
    """Bits set in each uint64, as uint8 (``np.bitwise_count`` on NumPy >= 2.0, else SWAR)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(x).astype(np.uint8)
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return ((x * np.uint64(0x0101010101010101)) >> np.uint64(56)).astype(np.uint8)
