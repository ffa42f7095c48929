"""Benchmark: MSB HD95 + NSD against medpy ``hd95`` on real mask pairs, same pairs, same run.

Pairs (reference, prediction) from ``../shared/data``:
* Kvasir-SEG masks (JPEG, binarised ``> 127``), each with one deterministic perturbation cycling over
  "eroded by 2 then shifted (3, -2)", "dilated by 3", "shifted (-4, 5)";
* the Kvasir frames annotated twice (PROVENANCE.md near-duplicates of identical size), real disagreement;
* BUSI lesion masks (union of the listed mask files; empty "normal" masks skipped, medpy raises on them),
  with the same perturbations.
Every pair is measured at native resolution and nearest-resized to 352x352.

For each pair: medpy ``hd95`` (pooled convention, connectivity 1) and MSB ``surface_distances`` +
``distance_metrics(convention="medpy")`` + NSD at tau = 1 and 2 px, with the default exact k-d tree
search and with the EDT path. The HD95 values must agree (|diff| <= 1e-9); the script prints the per-pair
median time of each and the ratio medpy / MSB.

Usage: ``.venv/bin/python scripts/bench_metrics.py [--quick] [--pairs N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from msb.evaluation import surface  # noqa: E402

SHARED = REPO.parent / "shared" / "data"
NEAR_DUPLICATES = [("cju30bmab08bi0835mvlr6e0r", "cju77k828z46w0871r0avuoo9"),
                   ("cju76lsehyia10987u54vn8rb", "cju772304yw5t0818vbw8kkjf"),
                   ("cju886ryxnsl50801r93jai7q", "cju8amfdtqi4x09871tygrgqe"),
                   ("cju5fydrud94708507vo6oy21", "cju7avvi51iox0817ym55y6tt"),
                   ("cju1hhj6mxfp90835n3wofrap", "cju3x9lttikfb0818a0g104zn")]


def _read_mask(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("L")) > 127


def _perturb(mask: np.ndarray, k: int) -> np.ndarray:
    if k % 3 == 0:
        return np.roll(ndimage.binary_erosion(mask, iterations=2), (3, -2), axis=(0, 1))
    if k % 3 == 1:
        return ndimage.binary_dilation(mask, iterations=3)
    return np.roll(mask, (-4, 5), axis=(0, 1))


def _resize(mask: np.ndarray, size: int = 352) -> np.ndarray:
    img = Image.fromarray(mask.astype(np.uint8) * 255)
    return np.asarray(img.resize((size, size), Image.NEAREST)) > 127


def load_pairs(n_kvasir: int, n_busi: int) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, reference, prediction) pairs at native resolution; both non-empty."""
    pairs = []
    kv = SHARED / "kvasir-seg" / "masks"
    files = sorted(kv.glob("*.jpg"))
    step = max(1, len(files) // max(n_kvasir, 1))
    for k, f in enumerate(files[::step][:n_kvasir]):
        ref = _read_mask(f)
        pairs.append((f"kvasir/{f.stem}", ref, _perturb(ref, k)))
    for a, b in NEAR_DUPLICATES:
        ma, mb = _read_mask(kv / f"{a}.jpg"), _read_mask(kv / f"{b}.jpg")
        if ma.shape == mb.shape:
            pairs.append((f"kvasir-dup/{a}", mb, ma))
    busi = SHARED / "busi"
    if (busi / "index.csv").exists() and n_busi > 0:
        with open(busi / "index.csv", newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if r["class"] != "normal"]
        step = max(1, len(rows) // n_busi)
        for k, r in enumerate(rows[::step][:n_busi]):
            ref = None
            for name in r["masks"].split(";"):
                m = np.asarray(Image.open(busi / "masks" / name).convert("L")) > 127
                ref = m if ref is None else ref | m
            pairs.append((f"busi/{r['image']}", ref, _perturb(ref, k)))
    return [(n, r, p) for n, r, p in pairs if r.any() and p.any()]


def _ours(pred: np.ndarray, ref: np.ndarray, method: str) -> float:
    sd = surface.surface_distances(pred, ref, (1.0, 1.0), "pixels", 4, method)  # type: ignore[arg-type]
    hd95 = surface.distance_metrics(sd, "medpy")["hd95"]
    for tau in (1.0, 2.0):
        surface.nsd(sd, tau)
    return hd95


def _time(fn, repeats: int) -> tuple[float, float]:
    best, value = float("inf"), float("nan")
    for _ in range(repeats):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def bench(pairs, repeats: int, label: str) -> dict[str, float]:
    """Time medpy hd95 and MSB (kdtree, edt) on each pair; check equal HD95; print medians and ratios."""
    from medpy.metric.binary import hd95 as medpy_hd95

    t_medpy, t_kd, t_edt, worst = [], [], [], 0.0
    for name, ref, pred in pairs:
        tm, vm = _time(lambda: medpy_hd95(pred, ref), repeats)
        tk, vk = _time(lambda: _ours(pred, ref, "kdtree"), repeats)
        te, ve = _time(lambda: _ours(pred, ref, "edt"), repeats)
        diff = max(abs(vk - vm), abs(ve - vm))
        if diff > 1e-9:
            raise SystemExit(f"{label} {name}: HD95 differs: medpy {vm!r}, msb kdtree {vk!r}, edt {ve!r}")
        worst = max(worst, diff)
        t_medpy.append(tm)
        t_kd.append(tk)
        t_edt.append(te)
    med = {k: float(np.median(v)) * 1e3 for k, v in (("medpy", t_medpy), ("kdtree", t_kd), ("edt", t_edt))}
    shapes = {tuple(r.shape) for _, r, _ in pairs}
    print(f"[{label}] {len(pairs)} pairs, {len(shapes)} distinct shapes; max |HD95 diff| = {worst:.1e}")
    print(f"  per-pair median time: medpy hd95 {med['medpy']:.2f} ms | msb HD95+NSD (kdtree, default) "
          f"{med['kdtree']:.2f} ms | msb HD95+NSD (edt) {med['edt']:.2f} ms")
    print(f"  ratio medpy / msb: {med['medpy'] / med['kdtree']:.1f}x (kdtree), "
          f"{med['medpy'] / med['edt']:.1f}x (edt)")
    return med


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 Kvasir + 5 BUSI pairs, 1 repeat")
    parser.add_argument("--pairs", type=int, default=150, help="Kvasir masks to use (default 150)")
    parser.add_argument("--busi", type=int, default=40, help="BUSI lesion masks to use (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="timing repeats per pair (min is kept)")
    args = parser.parse_args(argv)
    if not SHARED.exists():
        print(f"../shared/data not found at {SHARED}; nothing to benchmark", file=sys.stderr)
        return 2
    n_kv, n_busi, repeats = (20, 5, 1) if args.quick else (args.pairs, args.busi, args.repeats)
    t0 = time.perf_counter()
    pairs = load_pairs(n_kv, n_busi)
    print(f"loaded {len(pairs)} pairs in {time.perf_counter() - t0:.1f} s")
    bench(pairs, repeats, "native")
    bench([(n, _resize(r), _resize(p)) for n, r, p in pairs], repeats, "352x352")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
