"""Near-duplicate search over packed 64-bit hashes, exact-value groups and connected components.

Hamming distance ``d(a, b) = popcount(a XOR b)`` (number of differing bits). :func:`pairs_within` finds every
pair ``i < j`` with ``d <= k`` by exhaustive comparison, vectorised in row blocks: a block of ``B`` hashes is
XOR-ed against all later hashes in one numpy operation, bits are counted with ``np.bitwise_count`` (numpy >= 2.0;
a 256-entry byte lookup table otherwise) and the positions with ``d <= k`` are kept. Work is ``N(N-1)/2``
comparisons but at numpy speed (no Python loop per pair); memory is ``O(B * N)``. Blocks run in ``workers``
threads (numpy releases the GIL inside these ufuncs).

When ``faiss`` (package ``faiss-cpu``) is importable, :func:`pairs_within` uses its exhaustive binary index
instead (``faiss.IndexBinaryFlat`` range search, Johnson, Douze & Jégou 2019, "Billion-scale similarity search
with GPUs"; SIMD popcount over the packed codes, OpenMP threads): the same pairs and distances, measured
3-5x faster at 50,000 hashes (``docs/performance.md``). The NumPy path above is the fallback. For large sets
(``auto``: from :data:`MIH_MIN` hashes, when its work model says so) both exhaustive searches give way to exact
multi-index hashing (:mod:`msb.audit.mih`): near-linear instead of ``N^2 / 2`` comparisons.

Clusters: the relation "linked by a candidate pair" is closed transitively (single linkage) with
``scipy.sparse.csgraph.connected_components``, which gives the same partition as union-find.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

try:  # optional accelerator (faiss-cpu); the NumPy path below is the fallback
    import faiss as _faiss
except ImportError:  # pragma: no cover - depends on the environment
    _faiss = None

HAS_FAISS = _faiss is not None
#: Queries per faiss range search call (bounds the memory of one call's result lists).
_FAISS_QUERIES = 65_536

#: Smallest hash set for which ``backend="auto"`` considers multi-index hashing (:mod:`msb.audit.mih`).
MIH_MIN = 20_000
#: Exhaustive comparisons per unit of the MIH work model at equal time (measured 27 at 100,000 hashes, k = 8,
#: against faiss's flat search on 2 threads; modelled break-even ~10,000 hashes; docs/performance.md).
_MIH_UNIT = 30

_BYTE_POPCOUNT = np.array([bin(v).count("1") for v in range(256)], dtype=np.uint8)
HAS_BITWISE_COUNT = hasattr(np, "bitwise_count")


def popcount64(x: np.ndarray) -> np.ndarray:
    """Number of set bits of each ``uint64`` element.

    Args:
        x: ``uint64`` array of any shape.

    Returns:
        ``uint8`` array of the same shape (values 0..64).
    """
    x = np.asarray(x, dtype=np.uint64)
    if HAS_BITWISE_COUNT:
        return np.bitwise_count(x)
    return _BYTE_POPCOUNT[np.ascontiguousarray(x).view(np.uint8)].reshape(x.shape + (8,)).sum(
        axis=-1, dtype=np.uint8)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise Hamming distance of two broadcastable ``uint64`` arrays (``uint8`` result)."""
    return popcount64(np.bitwise_xor(np.asarray(a, dtype=np.uint64), np.asarray(b, dtype=np.uint64)))


def pairs_within(hashes: np.ndarray, k: int, block: int = 256, workers: int = 1, backend: str = "auto"
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All pairs ``i < j`` with ``hamming(hashes[i], hashes[j]) <= k``.

    Args:
        hashes: ``(N,)`` ``uint64``.
        k: maximum Hamming distance (0..64).
        block: rows per block of the NumPy path (memory ``~ 10 * block * N`` bytes per worker).
        workers: threads (NumPy blocks, the multi-index probes, or faiss's OpenMP threads).
        backend: ``"auto"`` (multi-index hashing for large sets, see :data:`MIH_MIN`; else faiss when installed,
            else NumPy), ``"mih"``, ``"faiss"`` or ``"numpy"``; all give the same result.

    Returns:
        ``(i, j, d)``: ``int64``, ``int64``, ``uint8`` arrays sorted by ``(i, j)``.

    Raises:
        ValueError: ``k`` outside 0..64, ``block`` or ``workers`` < 1, unknown backend, ``"faiss"`` asked
            for but not installed.
    """
    h = np.ascontiguousarray(hashes, dtype=np.uint64).ravel()
    if not 0 <= int(k) <= 64:
        raise ValueError(f"k must be in 0..64, got {k}")
    if block < 1 or workers < 1:
        raise ValueError("block and workers must be >= 1")
    if backend not in ("auto", "mih", "faiss", "numpy"):
        raise ValueError(f"backend must be 'auto', 'mih', 'faiss' or 'numpy', got {backend!r}")
    if backend == "faiss" and not HAS_FAISS:
        raise ValueError("backend 'faiss' needs the faiss-cpu package: pip install faiss-cpu")
    if backend == "mih" or (backend == "auto" and _mih_pays(len(h), int(k))):
        from msb.audit.mih import pairs_mih

        return pairs_mih(h, int(k), workers=workers)
    if backend != "numpy" and HAS_FAISS:
        return _pairs_faiss(h, int(k), workers)
    n = len(h)
    local = threading.local()

    def run(start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        stop = min(start + block, n)
        rows, cols = h[start:stop], h[start:]
        shape = (stop - start, n - start)
        buf = getattr(local, "buf", None)
        if buf is None or buf.size < shape[0] * shape[1]:
            local.buf = buf = np.empty(block * n, dtype=np.uint64)
            local.cnt = np.empty(block * n, dtype=np.uint8)
            local.hit = np.empty(block * n, dtype=bool)
        x = buf[: shape[0] * shape[1]].reshape(shape)
        np.bitwise_xor(rows[:, None], cols[None, :], out=x)
        if HAS_BITWISE_COUNT:
            d = local.cnt[: x.size].reshape(shape)
            np.bitwise_count(x, out=d)
        else:
            d = popcount64(x)
        hit = local.hit[: x.size].reshape(shape)
        np.less_equal(d, k, out=hit)
        r, c = np.nonzero(hit)
        keep = c > r
        r, c = r[keep], c[keep]
        return r.astype(np.int64) + start, c.astype(np.int64) + start, d[r, c].astype(np.uint8)

    starts = list(range(0, n, block))
    if workers == 1 or len(starts) < 2:
        parts = [run(s) for s in starts]
    else:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            parts = list(ex.map(run, starts))
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8)
    i = np.concatenate([p[0] for p in parts])
    j = np.concatenate([p[1] for p in parts])
    d = np.concatenate([p[2] for p in parts])
    order = np.lexsort((j, i))
    return i[order], j[order], d[order]


def _mih_pays(n: int, k: int) -> bool:
    """Whether multi-index hashing is modelled faster than an exhaustive search of ``n`` hashes within ``k``."""
    if n < MIH_MIN:
        return False
    from msb.audit.mih import choose_substrings

    m, cost = choose_substrings(n, k)
    return m > 0 and cost * _MIH_UNIT < n * (n - 1) / 2


def _pairs_faiss(h: np.ndarray, k: int, workers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`pairs_within` through ``faiss.IndexBinaryFlat.range_search`` (returns distances ``< radius``,
    hence ``radius = k + 1``); queries in chunks of :data:`_FAISS_QUERIES`, pairs ``j > i`` kept."""
    n = len(h)
    if n < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint8)
    codes = h.view(np.uint8).reshape(n, 8)  # Hamming distance does not depend on the byte order
    index = _faiss.IndexBinaryFlat(64)
    index.add(codes)
    before = _faiss.omp_get_max_threads()
    _faiss.omp_set_num_threads(workers)
    parts = []
    try:
        for start in range(0, n, _FAISS_QUERIES):
            stop = min(start + _FAISS_QUERIES, n)
            lims, dist, ids = index.range_search(codes[start:stop], k + 1)
            q = np.repeat(np.arange(start, stop, dtype=np.int64), np.diff(lims).astype(np.int64))
            keep = ids > q
            parts.append((q[keep], ids[keep].astype(np.int64), dist[keep].astype(np.uint8)))
    finally:
        _faiss.omp_set_num_threads(before)
    i = np.concatenate([p[0] for p in parts])
    j = np.concatenate([p[1] for p in parts])
    d = np.concatenate([p[2] for p in parts])
    order = np.lexsort((j, i))
    return i[order], j[order], d[order]


def exact_labels(values: np.ndarray) -> np.ndarray:
    """Label rows by value: equal values share a label (``int64``, labels ``0..G-1`` in sorted-value order)."""
    _, inv = np.unique(np.asarray(values), return_inverse=True)
    return inv.astype(np.int64).ravel()


def component_labels(n: int, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Connected components of the undirected graph on ``n`` nodes with edges ``(i[t], j[t])``.

    Returns:
        ``(n,)`` ``int64`` labels; nodes without edges are components of their own. Labels are renumbered so
        that components appear in order of their smallest node (deterministic).
    """
    i = np.asarray(i, dtype=np.int64)
    j = np.asarray(j, dtype=np.int64)
    if n == 0:
        return np.zeros(0, np.int64)
    graph = coo_matrix((np.ones(len(i), dtype=np.int8), (i, j)), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    return first_occurrence_labels(labels)


def first_occurrence_labels(labels: np.ndarray) -> np.ndarray:
    """Renumber labels ``0..G-1`` in order of first occurrence (so the result is independent of label values)."""
    labels = np.asarray(labels).ravel()
    _, first, inv = np.unique(labels, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first))
    return rank[inv.ravel()]


def naive_pairs(hashes: list, k: int) -> list[tuple[int, int, int]]:
    """Reference O(N^2) Python loop over imagehash objects (``h1 - h2`` is their Hamming distance).

    Only for benchmarks and tests on small samples.
    """
    out = []
    for a in range(len(hashes)):
        for b in range(a + 1, len(hashes)):
            d = hashes[a] - hashes[b]
            if d <= k:
                out.append((a, b, int(d)))
    return out


__all__ = ["popcount64", "hamming", "pairs_within", "exact_labels", "component_labels", "first_occurrence_labels",
           "naive_pairs", "HAS_BITWISE_COUNT", "HAS_FAISS"]
