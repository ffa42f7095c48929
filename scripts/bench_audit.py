"""Benchmark: audit throughput, measured in one run.

1. **Hashing** (images/s): :func:`msb.audit.hashing.hash_images` (SHA-256 + pHash + dHash + 64x64 thumbnail, one
   decode per image) over every image file under ``../shared/data/*/images`` (masks excluded), with
   ``--workers`` processes.
2. **Search** (pairs/s): :func:`msb.audit.search.pairs_within` on a synthetic set of ``--n`` 64-bit hashes
   (default 50,000; uniformly random plus planted near copies with 0-4 flipped bits), ``k = --k`` (8). Pairs
   compared = ``N(N-1)/2``.
3. **Naive reference** (pairs/s): the O(N^2) Python loop over imagehash objects (``h1 - h2 <= k``) on the first
   ``--naive-n`` hashes (default 1,500) of the same set; the vectorised search is run on that subsample too and
   must return the identical pair list. The ratio vectorised/naive is printed.

Usage: ``.venv/bin/python scripts/bench_audit.py [--n 50000] [--naive-n 1500] [--workers 2] [--json OUT]``.
Target: the 50,000-hash search in under 30 s on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import imagehash  # noqa: E402

from msb.audit.hashing import hash_images  # noqa: E402
from msb.audit.search import HAS_BITWISE_COUNT, naive_pairs, pairs_within  # noqa: E402
from msb.data.converters.folder import IMAGE_EXTENSIONS  # noqa: E402

SHARED = REPO.parent / "shared" / "data"


def synthetic_hashes(n: int, seed: int = 0) -> np.ndarray:
    """``n`` uint64 hashes: random, with every 10th followed by a copy with 0-4 flipped bits."""
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, n, dtype=np.uint64)
    for t in range(0, n - 1, 10):
        v = int(h[t])
        for f in rng.choice(64, size=t % 5, replace=False):
            v ^= 1 << int(f)
        h[t + 1] = np.uint64(v)
    return h


def to_imagehash(v: int) -> imagehash.ImageHash:
    bits = np.unpackbits(np.frombuffer(int(v).to_bytes(8, "big"), dtype=np.uint8)).astype(bool)
    return imagehash.ImageHash(bits.reshape(8, 8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--naive-n", type=int, default=1_500)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers as JSON")
    args = ap.parse_args()
    out: dict = {"cpu_count": os.cpu_count(), "workers": args.workers,
                 "popcount": "np.bitwise_count" if HAS_BITWISE_COUNT else "byte lookup table",
                 "numpy": np.__version__}

    # 1. hashing
    files = sorted(p for p in SHARED.glob("*/images/*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    if files:
        t = time.perf_counter()
        table = hash_images(files, workers=args.workers)
        dt = time.perf_counter() - t
        out["hashing"] = {"images": len(files), "seconds": round(dt, 3), "images_per_s": round(len(files) / dt, 1),
                          "megabytes": round(float(table.n_bytes.sum()) / 1e6, 1)}
        print(f"hashing: {len(files)} images from {SHARED} in {dt:.2f} s = {len(files) / dt:.1f} images/s "
              f"({args.workers} process(es); SHA-256 + pHash + dHash + thumbnail)")
    else:
        print(f"hashing: skipped, no images under {SHARED}")

    # 2. vectorised search on N hashes
    h = synthetic_hashes(args.n)
    n_pairs = args.n * (args.n - 1) // 2
    t = time.perf_counter()
    i, j, _ = pairs_within(h, args.k, workers=args.workers)
    dt = time.perf_counter() - t
    out["search"] = {"hashes": args.n, "pairs_compared": n_pairs, "found": int(len(i)), "seconds": round(dt, 3),
                     "pairs_per_s": round(n_pairs / dt), "k": args.k, "under_30_s": dt < 30}
    print(f"search: {args.n:,} hashes, {n_pairs:,} pairs in {dt:.2f} s = {n_pairs / dt:,.0f} pairs/s, "
          f"{len(i)} pairs with d <= {args.k} ({args.workers} thread(s)); target < 30 s: "
          f"{'met' if dt < 30 else 'MISSED'}")

    # 3. naive imagehash loop on a subsample, and the vectorised search on the same subsample
    sub = h[: args.naive_n]
    objs = [to_imagehash(v) for v in sub]
    m = len(sub) * (len(sub) - 1) // 2
    t = time.perf_counter()
    ref = naive_pairs(objs, args.k)
    dt_naive = time.perf_counter() - t
    t = time.perf_counter()
    si, sj, sd = pairs_within(sub, args.k)
    dt_vec = time.perf_counter() - t
    same = list(zip(si.tolist(), sj.tolist(), sd.tolist())) == ref
    out["naive"] = {"hashes": len(sub), "pairs": m, "seconds": round(dt_naive, 3), "pairs_per_s": round(m / dt_naive),
                    "vectorised_seconds_same_subsample": round(dt_vec, 4), "identical_result": same}
    out["ratio_vectorised_over_naive_pairs_per_s"] = round((n_pairs / out["search"]["seconds"]) / (m / dt_naive), 1)
    print(f"naive imagehash loop: {len(sub):,} hashes, {m:,} pairs in {dt_naive:.2f} s = {m / dt_naive:,.0f} pairs/s; "
          f"vectorised on the same subsample {dt_vec:.3f} s, identical pairs: {same}")
    print(f"ratio (vectorised 50k pairs/s / naive pairs/s): {out['ratio_vectorised_over_naive_pairs_per_s']:.0f}x; "
          f"naive extrapolated to {args.n:,} hashes: {n_pairs / (m / dt_naive) / 3600:.1f} h")
    if not same:
        raise SystemExit("vectorised and naive searches disagree")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
