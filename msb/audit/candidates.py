"""Candidate pairs for the pixel screens, and the measured recall of the hash prefilter.

Two generators (``msb audit --candidates``):

* ``hash``: pHash Hamming distance ``<= k`` *or* dHash distance ``<= k`` (64-bit hashes, exhaustive search,
  :func:`msb.audit.search.pairs_within`); pairs the hashes put further apart are never screened, so their
  recall against a pixel screen is unknown unless measured;
* ``all``: every pair's thumbnails are compared with NCC (:func:`msb.audit.screens.ncc_all_pairs`); candidates
  are the pairs with NCC ``>= ncc_min`` plus the hash candidates (so ``pairs.csv`` keeps the hash candidates that
  the screen rejects, for review). The confirmed pairs are then exactly those of an all-pairs NCC screen: recall
  100 % of it by construction, at ``N(N-1)/2`` dot products of ``S*S`` values.

With ``all``, :func:`prefilter_recall` states how many of the confirmed (non-identical-bytes) pairs the hash
prefilter would have found at several ``k``: the number to read before choosing ``hash`` (and ``--hamming-k``)
on a larger set of the same kind. With ``hash``, :func:`sampled_recall` measures the miss rate on the audited set
itself: ``M`` rows drawn at random (seeded) are compared with *every* row by NCC (``M * N`` dot products); the
pairs confirmed that way are the reference, and each is found when its hash distance is ``<= k``. A pair enters
the sample with probability about ``2M / N`` whatever its distances, so the share found estimates the recall
over all pairs; it comes with a 95 % Wilson interval (``statsmodels`` ``proportion_confint``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from msb.audit.screens import ncc_all_pairs, ncc_pairs, ncc_query_pairs
from msb.audit.search import hamming, pairs_within

#: ``k`` values at which :func:`prefilter_recall` reports the hash prefilter's recall
RECALL_KS = (4, 8, 12, 16, 20, 24)


@dataclass
class Candidates:
    """Candidate pairs ``a[t] < b[t]`` (``int64``, sorted), ``by_hash`` (``bool``: pHash or dHash ``<= k``),
    the generator used and the rule as text."""

    a: np.ndarray
    b: np.ndarray
    by_hash: np.ndarray
    generator: str
    rule: str


def candidate_pairs(phash: np.ndarray, dhash: np.ndarray, thumbs: np.ndarray, k: int, generator: str,
                    ncc_min: float | None, block: int = 256, workers: int = 1,
                    masks: np.ndarray | None = None) -> Candidates:
    """Candidate pairs by the chosen generator (module docstring).

    Args:
        phash, dhash: ``(N,)`` ``uint64`` hashes.
        thumbs: ``(N, S, S)`` ``uint8`` grey thumbnails (used by ``all``).
        k: Hamming threshold (bits of 64).
        generator: ``"hash"`` or ``"all"``.
        ncc_min: NCC threshold of ``all`` (required there).
        block, workers: hash search block size and threads.
        masks: optional ``(N, S, S)`` content masks of the thumbnails (:mod:`msb.audit.content`).

    Returns:
        :class:`Candidates`.

    Raises:
        ValueError: ``all`` without ``ncc_min`` (the CLI checks this first, :class:`msb.audit.core.AuditConfig`).
    """
    n = len(phash)
    pi, pj, _ = pairs_within(phash, k, block=block, workers=workers)
    di, dj, _ = pairs_within(dhash, k, block=block, workers=workers)
    hash_code = np.unique(np.concatenate([pi * n + pj, di * n + dj]).astype(np.int64))
    hash_rule = f"pHash Hamming distance <= {k} or dHash Hamming distance <= {k} (64-bit hashes)"
    if generator == "hash":
        code, rule = hash_code, hash_rule
    elif generator == "all":
        if ncc_min is None:
            raise ValueError("the all-pairs generator needs an NCC threshold")
        ni, nj = ncc_all_pairs(thumbs, float(ncc_min), masks=masks)
        code = np.unique(np.concatenate([hash_code, ni * n + nj]).astype(np.int64))
        size = thumbs.shape[1] if thumbs.ndim == 3 else 0
        rule = (f"every pair compared: NCC >= {ncc_min} on {size}x{size} px thumbnails ({n * (n - 1) // 2} pairs), "
                f"or {hash_rule}")
    else:
        raise ValueError(f"unknown candidate generator {generator!r}")
    a, b = (code // n).astype(np.int64), (code % n).astype(np.int64)
    by_hash = np.isin(code, hash_code)
    return Candidates(a=a, b=b, by_hash=by_hash, generator=generator, rule=rule)


def prefilter_recall(phash_distance: np.ndarray, dhash_distance: np.ndarray, reference: np.ndarray,
                     ks: Sequence[int] = RECALL_KS) -> dict:
    """Recall of the hash prefilter against a reference set of pairs.

    Args:
        phash_distance, dhash_distance: ``(P,)`` Hamming distances of candidate pairs.
        reference: ``(P,)`` bool, the pairs to be found (e.g. confirmed by the all-pairs NCC screen and not
            byte-identical, which every ``k`` finds).

    Returns:
        ``{"n_reference_pairs": R, "by_k": {k: {"found": f, "recall": f / R}}}`` (recall NaN when ``R == 0``),
        a pair found at ``k`` when ``min(pHash, dHash distance) <= k``.
    """
    ref = np.asarray(reference, dtype=bool)
    d = np.minimum(np.asarray(phash_distance), np.asarray(dhash_distance))[ref]
    r = int(ref.sum())
    by_k = {int(k): {"found": int((d <= k).sum()), "recall": (float((d <= k).sum()) / r) if r else float("nan")}
            for k in ks}
    return {"n_reference_pairs": r, "by_k": by_k}


def sampled_recall(phash: np.ndarray, dhash: np.ndarray, thumbs: np.ndarray, sha256: np.ndarray, k: int,
                   ncc_min: float, n_sample: int, seed: int = 0, ks: Sequence[int] = RECALL_KS,
                   masks: np.ndarray | None = None) -> dict:
    """Measured recall of the hash prefilter on a random sample of query rows (module docstring).

    Args:
        phash, dhash: ``(N,)`` ``uint64``.
        thumbs: ``(N, S, S)`` ``uint8``.
        sha256: ``(N,)`` digests (byte-identical pairs are left out of the reference: every ``k`` finds them).
        k: the audit's Hamming threshold (reported with ``ks``).
        ncc_min: NCC threshold of the reference screen.
        n_sample: query rows ``M`` (all rows when ``M >= N``).
        seed: ``numpy.random.default_rng`` seed of the draw.
        masks: optional content masks (NCC over the overlap, :mod:`msb.audit.screens`).

    Returns:
        :func:`prefilter_recall` output plus ``sample_rows``, ``seed`` and per ``k`` ``ci95`` (Wilson).
    """
    from statsmodels.stats.proportion import proportion_confint

    n = len(phash)
    m = min(int(n_sample), n)
    q = np.sort(np.random.default_rng(seed).choice(n, size=m, replace=False)) if m < n else np.arange(n)
    i, j = ncc_query_pairs(thumbs, q, ncc_min, masks=masks)
    if len(i):
        exact = ncc_pairs(thumbs, i, j, masks=masks) >= ncc_min
        i, j = i[exact], j[exact]
    sha = np.asarray(sha256, dtype=object)
    ref = sha[i] != sha[j] if len(i) else np.zeros(0, bool)
    out = prefilter_recall(hamming(phash[i], phash[j]), hamming(dhash[i], dhash[j]), ref, sorted({*ks, k}))
    for v in out["by_k"].values():
        lo, hi = proportion_confint(v["found"], out["n_reference_pairs"], method="wilson") \
            if out["n_reference_pairs"] else (float("nan"), float("nan"))
        v["ci95"] = [float(lo), float(hi)]
    out.update({"sample_rows": m, "seed": seed,
                "reference": (f"pairs with NCC >= {ncc_min} between {m} random rows (seed {seed}) and every row"
                              if m < n else f"pairs with NCC >= {ncc_min}, every pair compared")
                + ", byte-identical pairs left out"})
    return out


__all__ = ["Candidates", "candidate_pairs", "prefilter_recall", "sampled_recall", "RECALL_KS"]
