"""Benchmark: MSB HD95 + NSD against medpy and MONAI on real mask pairs, same pairs, same run.

Pairs (reference, prediction) from ``../shared/data``:
* Kvasir-SEG masks (JPEG, binarised ``> 127``), each with one deterministic perturbation cycling over
  "eroded by 2 then shifted (3, -2)", "dilated by 3", "shifted (-4, 5)";
* the Kvasir frames annotated twice (PROVENANCE.md near-duplicates of identical size), real disagreement;
* BUSI lesion masks (union of the listed mask files; empty "normal" masks skipped, medpy raises on them),
  with the same perturbations.
Every pair is measured at native resolution and nearest-resized to 352x352.

Sides, timed over all pairs per repeat, repeats interleaved (median / min / max, ratio ours / best
competitor): ours = MSB ``surface_distances`` (exact k-d tree) + HD95 under the medpy and the MONAI
convention + NSD at 2 px, all from one distance computation; medpy ``hd95`` (pooled convention,
connectivity 1); MONAI ``compute_hausdorff_distance(percentile=95)`` + ``compute_surface_dice([2.0])`` (skipped
with a note when MONAI is not installed). DeepMind ``surface-distance`` is not on PyPI and is skipped with a
note. Value checks: HD95 equal to medpy (``|diff| <= 1e-9``); HD95 and NSD equal to MONAI within its float32
arithmetic (``<= 1e-5`` relative). Exit status 1 when a check fails, 2 without ``../shared/data``.

Usage: ``.venv/bin/python scripts/bench_metrics.py [--quick] [--pairs N] [--repeats R]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image
from scipy import ndimage

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "scripts"))

from bench_common import Row, interleave, print_row  # noqa: E402

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


def _ours(pred: np.ndarray, ref: np.ndarray, method: str = "kdtree") -> tuple[float, float, float]:
    """(HD95 medpy convention, HD95 MONAI convention, NSD at 2 px) from one distance computation."""
    sd = surface.surface_distances(pred, ref, (1.0, 1.0), "pixels", 4, method)  # type: ignore[arg-type]
    return (surface.distance_metrics(sd, "medpy")["hd95"], surface.distance_metrics(sd, "monai")["hd95"],
            surface.nsd(sd, 2.0))


def bench(pairs, repeats: int, label: str) -> list[Row]:
    """One row per set of pairs: ours vs medpy hd95 and MONAI hd95 + surface dice, interleaved."""
    from medpy.metric.binary import hd95 as medpy_hd95

    n = len(pairs)
    shapes = {tuple(r.shape) for _, r, _ in pairs}
    row = Row(f"HD95 + NSD, {n} real mask pairs ({label}, {len(shapes)} distinct shapes); times = all pairs")
    sides = {"ours": lambda: [_ours(p, r) for _, r, p in pairs],
             "medpy hd95": lambda: [medpy_hd95(p, r) for _, r, p in pairs]}
    try:
        import torch
        from monai.metrics import compute_hausdorff_distance, compute_surface_dice

        def monai_side():
            out = []
            for _, r, p in pairs:
                tp_, tr_ = (torch.from_numpy(np.ascontiguousarray(a))[None, None].float() for a in (p, r))
                out.append((float(compute_hausdorff_distance(tp_, tr_, percentile=95)),
                            float(compute_surface_dice(tp_, tr_, [2.0]))))
            return out
        sides["MONAI hd95 + surface dice"] = monai_side
    except ImportError:
        row.notes.append("MONAI not installed: competitor skipped (pip install monai)")
    row.notes.append("DeepMind surface-distance: not on PyPI (installed from GitHub only), competitor skipped; "
                     "its convention is checked against oracle values in tests/evaluation/test_surface_oracle.py")
    vals = interleave(row, sides, repeats)
    ours = np.asarray(vals["ours"])
    checks = [f"max |HD95 - medpy| = {np.max(np.abs(ours[:, 0] - np.asarray(vals['medpy hd95']))):.1e}"]
    ok = np.max(np.abs(ours[:, 0] - np.asarray(vals["medpy hd95"]))) <= 1e-9
    if "MONAI hd95 + surface dice" in vals:
        mo = np.asarray(vals["MONAI hd95 + surface dice"])
        d_hd = np.max(np.abs(ours[:, 1] - mo[:, 0]) / np.maximum(1.0, np.abs(mo[:, 0])))
        d_nsd = np.max(np.abs(ours[:, 2] - mo[:, 1]))
        checks.append(f"max rel |HD95 - MONAI| = {d_hd:.1e}, max |NSD(2 px) - MONAI| = {d_nsd:.1e} (float32)")
        ok = ok and d_hd <= 1e-5 and d_nsd <= 1e-5
    row.equal = bool(ok)
    row.check = "; ".join(checks)
    for side in row.times:
        row.notes.append(f"{side}: {1e3 * np.median(row.times[side]) / n:.2f} ms per pair (median repeat)")
    return [row]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 Kvasir + 1 BUSI pairs, 1 repeat")
    parser.add_argument("--pairs", type=int, default=150, help="Kvasir masks to use (default 150)")
    parser.add_argument("--busi", type=int, default=40, help="BUSI lesion masks to use (default 40)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats over all pairs")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if not SHARED.exists():
        print(f"../shared/data not found at {SHARED}; nothing to benchmark", file=sys.stderr)
        return 2
    n_kv, n_busi, repeats = (4, 1, 1) if args.quick else (args.pairs, args.busi, args.repeats)
    t0 = time.perf_counter()
    pairs = load_pairs(n_kv, n_busi)
    print(f"loaded {len(pairs)} pairs in {time.perf_counter() - t0:.1f} s")
    rows = bench(pairs, repeats, "native") + bench([(n, _resize(r), _resize(p)) for n, r, p in pairs], repeats,
                                                   "352x352")
    for r in rows:
        print_row(r)
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in rows], indent=2) + "\n")
    return 0 if all(r.equal for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
