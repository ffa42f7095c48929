"""Rows 4 and 5 of ``scripts/bench_analysis.py``: the post-hoc analyses (docs/analysis.md).

4. **rank distributions**, ``systems`` (20) x ``images`` (10,000) x ``replicates`` (2,000), seed 0: ours =
   :func:`msb.analysis.stats.rank_boot.rank_distribution` (replicates, ranks, Kendall τ); beside it the bootstrap
   row's work (``bootstrap_rule``, one system, image-macro Dice, same sizes; target: ours <= 2x that time) and a
   plain NumPy loop (per replicate: the same 32-bit draws, ``np.nanmean`` of the drawn per-image Dice of every
   system, ``scipy.stats.rankdata``, ``scipy.stats.kendalltau``). Value check: identical ranks, τ within 1e-12.
5. **calibration of ``maps`` (1,000) stored 352 x 352 maps**: ours = a subprocess running
   :func:`msb.analysis.stats.calibration.read_histograms` + ``calibration_summary`` (1,000 bootstrap replicates)
   on the prediction files; competitor = a subprocess that loads every map into memory and computes the ECE with
   bins ``floor(15 p)`` over the concatenated pixels and the Brier score with ``sklearn.metrics.brier_score_loss``. Peak resident memory of each
   subprocess (``ru_maxrss``) printed; target: ours <= 1 GiB. Value check: ECE and Brier equal within 1e-9.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench_common import Row, interleave

REPO = Path(__file__).resolve().parents[1]


def bench_ranks(systems: int, n: int, n_boot: int, repeats: int, synthetic_counts) -> Row:
    """Row 4 (``synthetic_counts``: the counts generator of ``bench_analysis.py``)."""
    from scipy import stats

    from msb.analysis.counts.rules import image_table
    from msb.analysis.counts.systems import align_tables
    from msb.analysis.stats.bootstrap import bootstrap_rule
    from msb.analysis.stats.rank_boot import rank_distribution

    tables = {f"s{k:02d}": image_table(synthetic_counts(n, seed=k)) for k in range(systems)}
    tables = align_tables(tables)
    per = np.stack([np.where(2 * t.tp[:, 0] + t.fp[:, 0] + t.fn[:, 0] > 0,
                             2 * t.tp[:, 0] / np.maximum(2 * t.tp[:, 0] + t.fp[:, 0] + t.fn[:, 0], 1), np.nan)
                    for t in tables.values()], 1)
    first = next(iter(tables.values()))
    row = Row(f"rank distributions, {systems} systems x {n:,} images x {n_boot:,} replicates")

    def ours():
        d = rank_distribution(tables, "image-macro", "dice", n_boot, 0.95, 0)
        d.table()
        return d

    def boot_row():
        return bootstrap_rule(first, "image-macro", "dice", n_boot=n_boot, seed=0)[0].replicates

    def plain():
        rng = np.random.default_rng(0)
        full = stats.rankdata(-np.nanmean(per, 0), method="min")
        ranks, taus = np.empty((n_boot, systems)), np.empty(n_boot)
        for b in range(n_boot):
            i = rng.integers(0, n, n, dtype=np.int32)
            v = np.nanmean(per[i], 0)
            ranks[b] = stats.rankdata(-v, method="min")
            taus[b] = stats.kendalltau(full, ranks[b]).statistic
        return ranks, taus

    vals = interleave(row, {"ours": ours, "bootstrap row (1 system)": boot_row, "plain NumPy loop": plain}, repeats)
    d = vals["ours"]
    ranks, taus = vals["plain NumPy loop"]
    same = bool(np.array_equal(d.ranks, ranks))
    dt = float(np.nanmax(np.abs(d.tau - taus)))
    row.equal = same and dt <= 1e-12
    row.check = f"ranks identical: {same}; max |tau - scipy| = {dt:.1e}"
    r = row.stats("ours")[0] / row.stats("bootstrap row (1 system)")[0]
    row.notes.append(f"ours / bootstrap row (1 system) = {r:.2f} (target <= 2)")
    return row


_OURS = r'''
import json, resource, sys, time
import numpy as np
from msb.analysis.stats.calibration import calibration_summary, read_histograms
d, n = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
ha, hf, _ = read_histograms(__import__("pathlib").Path(d), [f"img{k:05d}" for k in range(n)])
s = calibration_summary(ha[:, 0], hf[:, 0], 15, 1000, 0.95, 0)
print(json.dumps({"s": time.perf_counter() - t0, "ece": s["ece"], "brier": s["brier"],
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
'''

_COMPETITOR = r'''
import json, resource, sys, time
import numpy as np
from sklearn.metrics import brier_score_loss
d, n = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
ps, ys = [], []
for k in range(n):
    with np.load(f"{d}/img{k:05d}.npz") as z:
        ps.append(z["prob"][0].ravel() / 255.0)
        ys.append(z["ref"][0].ravel())
p, y = np.concatenate(ps), np.concatenate(ys)
b = np.minimum(np.floor(p * 15).astype(int), 14)
ece = sum(abs(y[b == k].mean() - p[b == k].mean()) * (b == k).sum() for k in range(15) if (b == k).any()) / p.size
print(json.dumps({"s": time.perf_counter() - t0, "ece": float(ece), "brier": float(brier_score_loss(y, p)),
                  "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
'''


def bench_calibration(n_maps: int, size: int, repeats: int, tmp: Path) -> Row:
    """Row 5: ``n_maps`` stored ``size`` x ``size`` maps written into ``tmp`` first."""
    from msb.evaluation.artifacts import write_prediction_file

    rng = np.random.default_rng(0)
    pred_dir = tmp / "predictions"
    pred_dir.mkdir()
    yy, xx = np.mgrid[:size, :size]
    for k in range(n_maps):
        cy, cx, r = rng.uniform(0.3, 0.7) * size, rng.uniform(0.3, 0.7) * size, rng.uniform(0.05, 0.25) * size
        ref = ((yy - cy) ** 2 + (xx - cx) ** 2 <= r * r)[None]
        p = np.clip(np.where(ref, 0.8, 0.15) + rng.normal(0, 0.12, ref.shape), 0, 1)
        write_prediction_file(pred_dir, f"img{k:05d}", p >= 0.5, ref, (1.0, 1.0), np.array([1]),
                              np.round(p * 255).astype(np.uint8), atomic=False)
    row = Row(f"calibration of {n_maps:,} stored {size}x{size} maps (ECE, MCE, Brier, 1,000 bootstrap replicates)")
    out: dict[str, dict] = {}

    def sub(code: str, key: str):
        def go():
            env = {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", code, str(pred_dir), str(n_maps)], capture_output=True,
                               text=True, env=env, timeout=3600)
            if p.returncode != 0:
                raise RuntimeError(p.stderr[-2000:])
            out[key] = {**json.loads(p.stdout.strip().splitlines()[-1]), "wall": time.perf_counter() - t0}
            return out[key]
        return go

    interleave(row, {"ours": sub(_OURS, "ours"), "load all maps + sklearn": sub(_COMPETITOR, "comp")}, repeats)
    o, c = out["ours"], out["comp"]
    de, db = abs(o["ece"] - c["ece"]), abs(o["brier"] - c["brier"])
    row.equal = de <= 1e-9 and db <= 1e-9 and o["rss"] <= 1024 * 1024
    row.check = f"|ECE ours - competitor| = {de:.1e}, |Brier| = {db:.1e}; ours peak RSS <= 1 GiB"
    row.notes.append(f"peak RSS: ours {o['rss'] / 1024:.0f} MiB, competitor {c['rss'] / 1024:.0f} MiB; "
                     f"ECE {o['ece']:.6f}, Brier {o['brier']:.6f}")
    return row
