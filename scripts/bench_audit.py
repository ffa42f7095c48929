"""Benchmark: audit hashing and near-duplicate search against what a knowledgeable user would write.

Rows (one run, repeats interleaved, median / min / max, ratio ours / best competitor, value check):

1. **near-duplicate search**, ``--n`` (50,000) synthetic 64-bit hashes (random, every 10th followed by a copy
   with 0-4 flipped bits), ``k = --k`` (8), ``--workers`` threads (2). Ours: :func:`msb.audit.search.pairs_within`
   (``auto``: exact multi-index hashing from 20,000 hashes, :mod:`msb.audit.mih`; faiss below). Competitors: (a) NumPy ``bitwise_count`` in chunks of 256 rows against the later
   hashes, (b) ``faiss.IndexBinaryFlat`` range search with radius ``k + 1`` used directly (skipped with a
   note when faiss-cpu is not installed). Value check: identical ``(i, j, d)`` pair lists.
2. **hashing** (pHash + dHash of every image under ``../shared/data/*/images``, at most ``--images``): ours
   :func:`msb.audit.hashing.hash_images` (also SHA-256 and a thumbnail, one decode per image, ``--workers``
   threads below ``PROCESS_FROM`` (500) images, worker processes from it) vs a loop ``imagehash.phash(img), imagehash.dhash(img)`` over PIL images. Value check: identical
   hashes. Skipped with a note without ``../shared/data``.
3. **hashing, many images**: the same two sides on ``--many`` (10,000) JPEG files written to a temporary folder,
   each a 160x120 px tile cut at a random place (and scale) out of the real images of row 2 (so ten thousand
   distinct, realistic frames without shipping them). Value check: identical hashes.

``--large N`` also times ours once on N hashes (e.g. 1,000,000: multi-index hashing) and, up to 200,000 hashes,
faiss's flat range search once on the same hashes (identical pairs checked); above that the flat time is
extrapolated from a flat search of 100,000 of the hashes as O(N^2).

Usage: ``python scripts/bench_audit.py [--quick] [--n 50000] [--many 10000] [--repeats R] [--large N] [--json OUT]``.
``--quick`` = 5,000 hashes, 40 images, 300 tiles, 1 repeat. Exit status 1 when a value check fails.
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
sys.path.insert(0, str(REPO / "scripts"))

from bench_common import Row, interleave, print_row  # noqa: E402

from msb.audit.search import HAS_FAISS, pairs_within  # noqa: E402

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


def numpy_chunks(h: np.ndarray, k: int, chunk: int = 256):
    """The competitor a NumPy user writes: XOR a chunk of rows against the later hashes, ``np.bitwise_count``."""
    out_i, out_j, out_d = [], [], []
    for s in range(0, len(h), chunk):
        d = np.bitwise_count(h[s:s + chunk, None] ^ h[None, s:])
        r, c = np.nonzero(d <= k)
        keep = c > r
        out_i.append(r[keep] + s)
        out_j.append(c[keep] + s)
        out_d.append(d[r[keep], c[keep]])
    return np.concatenate(out_i), np.concatenate(out_j), np.concatenate(out_d)


def faiss_flat(h: np.ndarray, k: int, threads: int):
    """faiss used directly: one flat binary index, one range search of every hash, pairs j > i."""
    import faiss

    faiss.omp_set_num_threads(threads)
    codes = h.view(np.uint8).reshape(-1, 8)
    index = faiss.IndexBinaryFlat(64)
    index.add(codes)
    lims, dist, ids = index.range_search(codes, k + 1)
    q = np.repeat(np.arange(len(h)), np.diff(lims).astype(np.int64))
    keep = ids > q
    return q[keep], ids[keep], dist[keep]


def _sorted(t):
    i, j, d = (np.asarray(x).astype(np.int64) for x in t)
    o = np.lexsort((j, i))
    return i[o], j[o], d[o]


def bench_search(n: int, k: int, workers: int, repeats: int) -> Row:
    """Row 1."""
    h = synthetic_hashes(n)
    row = Row(f"near-duplicate search, {n:,} 64-bit hashes, k = {k}, {workers} thread(s)")
    sides = {"ours": lambda: pairs_within(h, k, workers=workers),
             "NumPy bitwise_count chunks": lambda: numpy_chunks(h, k)}
    if HAS_FAISS:
        sides["faiss IndexBinaryFlat range search"] = lambda: faiss_flat(h, k, workers)
    else:
        row.notes.append("faiss-cpu not installed: faiss competitor skipped, ours runs the NumPy path")
    vals = interleave(row, sides, repeats)
    ours = _sorted(vals.pop("ours"))
    same = {s: all(np.array_equal(a, b) for a, b in zip(ours, _sorted(v))) for s, v in vals.items()}
    row.equal = all(same.values())
    row.check = f"{len(ours[0])} pairs; identical (i, j, d) lists: " + ", ".join(f"{s} {v}" for s, v in same.items())
    return row


def _real_images(max_images: int) -> list[Path]:
    """At most ``max_images`` real images under ``../shared/data/*/images``, evenly spaced in sorted order."""
    from msb.data.converters.folder import IMAGE_EXTENSIONS

    files = sorted(p for p in SHARED.glob("*/images/*") if p.suffix.lower() in IMAGE_EXTENSIONS)
    return files[:: max(1, len(files) // max_images)][:max_images] if files else []


def _hash_row(work: str, files: list[Path], workers: int, repeats: int) -> Row:
    """One hashing row: :func:`msb.audit.hashing.hash_images` vs the plain imagehash loop on ``files``."""
    import imagehash
    from PIL import Image

    from msb.audit.hashing import PROCESS_FROM, hash_images

    row = Row(work)

    def loop():
        out = []
        for f in files:
            with Image.open(f) as im:
                out.append((str(imagehash.phash(im)), str(imagehash.dhash(im))))
        return out

    vals = interleave(row, {"ours": lambda: hash_images(files, workers=workers), "imagehash loop": loop}, repeats)
    table = vals["ours"]
    ours = [(f"{int(p):016x}", f"{int(d):016x}") for p, d in zip(table.phash, table.dhash)]
    row.equal = ours == vals["imagehash loop"]
    row.check = f"{len(ours)} (pHash, dHash) pairs identical"
    kind = "processes (forked)" if workers > 1 and len(files) >= PROCESS_FROM else "threads"
    row.notes.append(f"ours also computes SHA-256 and a 64x64 thumbnail per image; {workers} worker {kind}, "
                     f"the loop 1 thread")
    return row


def bench_hashing(max_images: int, workers: int, repeats: int) -> Row | None:
    """Row 2 (None without ../shared/data or with ``max_images < 1``)."""
    if max_images < 1:
        return None
    files = _real_images(max_images)
    if not files:
        print(f"hashing: skipped, no images under {SHARED}")
        return None
    return _hash_row(f"hashing (pHash + dHash), {len(files)} real images from ../shared/data, {workers} workers",
                     files, workers, repeats)


def write_tiles(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` JPEG files (quality 90), 160x120 px tiles cut at random places and scales out of the real images."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    sources = []
    for f in _real_images(200):
        with Image.open(f) as im:
            sources.append(im.convert("RGB"))
    out = []
    for t in range(n):
        im = sources[t % len(sources)]
        w, h = im.size
        cw = int(rng.integers(min(w, 160), max(min(w, 160), w // 2) + 1))
        ch = min(h, max(1, cw * 3 // 4))
        x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        p = folder / f"tile_{t:05d}.jpg"
        im.crop((x, y, x + cw, y + ch)).resize((160, 120), Image.Resampling.BILINEAR).save(p, quality=90)
        out.append(p)
    return out


def bench_hashing_many(n: int, workers: int, repeats: int) -> Row | None:
    """Row 3 (None without ../shared/data or with ``n < 1``)."""
    import tempfile

    if n < 1 or not _real_images(1):
        return None
    with tempfile.TemporaryDirectory(prefix="msb_bench_tiles_") as tmp:
        files = write_tiles(Path(tmp), n)
        return _hash_row(f"hashing (pHash + dHash), {n:,} JPEG tiles (160x120) of ../shared/data images, "
                         f"{workers} workers", files, workers, repeats)


def bench_large(n: int, k: int, workers: int) -> Row:
    """``--large``: ours once on ``n`` hashes; faiss flat once (``n <= 200,000``) or extrapolated."""
    from msb.audit.search import _mih_pays

    h = synthetic_hashes(n, seed=1)
    row = Row(f"near-duplicate search, {n:,} 64-bit hashes, k = {k}, ours "
              f"{'multi-index hashing' if _mih_pays(n, k) else 'flat'}, 1 run")
    sides = {"ours": lambda: pairs_within(h, k, workers=workers)}
    if HAS_FAISS and n <= 200_000:
        sides["faiss IndexBinaryFlat range search"] = lambda: faiss_flat(h, k, workers)
    vals = interleave(row, sides, 1)
    ours = _sorted(vals.pop("ours"))
    row.check = f"{len(ours[0])} pairs"
    if vals:
        row.equal = all(np.array_equal(a, b) for a, b in zip(ours, _sorted(vals["faiss IndexBinaryFlat range search"])))
        row.check += f"; identical to faiss flat: {row.equal}"
    elif HAS_FAISS:
        sub = h[:100_000]
        t0 = time.perf_counter()
        faiss_flat(sub, k, workers)
        dt = time.perf_counter() - t0
        row.notes.append(f"faiss flat on 100,000 of these hashes: {dt:.1f} s; at {n:,} ~ {dt * (n / 1e5) ** 2:.0f} s "
                         f"(O(N^2), extrapolated, not run)")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 repeat (CI smoke test)")
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--images", type=int, default=200, help="at most this many real images to hash")
    ap.add_argument("--many", type=int, default=10_000, help="also hash this many tiles of the real images (0: skip)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--large", type=int, default=0, help="also time ours alone on this many hashes")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.images, args.many, args.repeats = 5_000, 40, min(args.many, 300), 1
    print(f"bench_audit: {os.cpu_count()} CPU(s), numpy {np.__version__}, faiss "
          f"{'installed' if HAS_FAISS else 'not installed'}; {args.repeats} interleaved repeat(s) per side")
    rows = [bench_search(args.n, args.k, args.workers, args.repeats)]
    print_row(rows[0])
    hrow = bench_hashing(args.images, args.workers, args.repeats)
    if hrow is not None:
        print_row(hrow)
        rows.append(hrow)
    mrow = bench_hashing_many(args.many, args.workers, args.repeats)
    if mrow is not None:
        print_row(mrow)
        rows.append(mrow)
    if args.large:
        rows.append(bench_large(args.large, args.k, args.workers))
        print_row(rows[-1])
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2) + "\n")
    return 0 if all(r.equal for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
