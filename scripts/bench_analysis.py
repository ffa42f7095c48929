"""Benchmark: image-level bootstrap and ``msb reaggregate`` against what a knowledgeable user would write.

Rows (one run, repeats interleaved, median / min / max printed, ratio ours / best competitor, value check):

1. **bootstrap, global-micro Dice** and 2. **bootstrap, image-macro Dice**: ``--images`` images (10,000) x
   ``--replicates`` (2,000), seed 0, synthetic binary counts (object sizes log-uniform, 10 % empty
   references). Ours: :func:`msb.analysis.stats.bootstrap.bootstrap_rule` on a prepared
   :class:`~msb.analysis.counts.rules.ImageTable`. Competitors:

   * a plain NumPy loop over replicates: per replicate ``rng.integers(0, n, n, dtype=np.int32)`` (the faster
     32-bit draws, the same stream as ours, so the replicates must be identical: ``|diff| <= 1e-12``), then
     ``np.sum`` of the drawn TP, FP, FN (global-micro) or ``np.nanmean`` of the drawn per-image Dice;
   * ``scipy.stats.bootstrap(vectorized=True, method="percentile", batch=250)`` (``paired=True`` over
     TP, FP, FN for global-micro). Its draws are its own; the check recomputes our rule kernel
     (:func:`msb.analysis.counts.rules.rule_values`) on scipy's reconstructed draws and compares with scipy's
     ``bootstrap_distribution`` (``|diff| <= 1e-12``).

3. **reaggregate of a ``--rows`` counts.parquet** (1,000,000 rows: 20 runs x 25,000 images x 2 classes,
   every schema column, no ``digests.json``): ours = the ``msb reaggregate FILE --out DIR`` command in a
   subprocess (start-up, schema and row checks, duplicate-key check, 3 rules x 4 metrics, scores.csv and
   scores.parquet; the columnar path :mod:`msb.analysis.counts.reaggregate_fast`, which imports no pandas); competitor = a pandas script in a subprocess that reads the needed columns and computes
   the same 3 rules x 4 metrics with ``groupby`` sums and means and writes a CSV. Peak resident memory of
   each subprocess (``ru_maxrss``) is printed. Value check: every score equal (``|diff| <= 1e-12``).
   ``--rows-10m`` also measures ours at 10,000,000 rows (time and peak memory, no competitor).

4., 5. **rank distributions** and **calibration of stored maps** (post-hoc analyses): ``scripts/bench_posthoc.py``.

Usage: ``python scripts/bench_analysis.py [--quick] [--repeats R] [--only bootstrap|reaggregate|ranks|calibration]
[--rows-10m] [--json OUT]``. ``--quick`` = 2,000 images,
200 replicates, 100,000 rows, 50 maps, 1 repeat (CI smoke test). Exit status 1 when a value check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_common import Row, interleave, print_row  # noqa: E402

from msb.analysis.stats.bootstrap import bootstrap_rule  # noqa: E402
from msb.analysis.counts.rules import image_table, rule_values  # noqa: E402

HW = 256 * 256


def synthetic_counts(n: int, seed: int = 0, runs: int = 1, classes: int = 1) -> pd.DataFrame:
    """Counts rows (every schema column) of ``runs`` runs x ``n`` 256x256 images x ``classes`` classes."""
    rng = np.random.default_rng(seed)
    m = n * runs * classes
    ref = np.where(rng.random(m) < 0.1, 0, np.exp(rng.uniform(np.log(20), np.log(20000), m))).astype(np.int64)
    tp = np.floor(ref * rng.uniform(0.3, 1.0, m)).astype(np.int64)
    fn = ref - tp
    fp = np.floor(rng.uniform(0, 0.4, m) * (ref + 50)).astype(np.int64)
    run = np.repeat(np.arange(runs), n * classes)
    img = np.tile(np.repeat(np.arange(n), classes), runs)
    cls = np.tile(np.arange(1, classes + 1), n * runs)
    s = pd.Series
    return pd.DataFrame({
        "dataset": "bench", "split": "test", "fold": -1, "run_id": s([f"run{r:02d}" for r in range(runs)])[run].to_numpy(),
        "model": s([f"model{r % 4}" for r in range(runs)])[run].to_numpy(), "checkpoint_role": "best",
        "checkpoint_sha256": "0" * 64, "config_hash": "1" * 64,
        "image_id": s([f"img{i:06d}" for i in range(n)])[img].to_numpy(), "class_id": cls,
        "class_name": s([f"c{c}" for c in range(classes + 1)])[cls].to_numpy(), "threshold": 0.5,
        "threshold_on": "probability", "height": 256, "width": 256, "source": "s",
        "tp": tp, "fp": fp, "fn": fn, "tn": HW - tp - fp - fn, "intersection": tp, "reference": tp + fn,
        "predicted": tp + fp, "union": tp + fp + fn, "schema_version": 1})


def _dice(tp, fp, fn):
    den = 2 * tp + fp + fn
    return np.divide(2 * tp, den, out=np.full(np.shape(den), np.nan), where=den > 0)


def bench_bootstrap(n: int, n_boot: int, repeats: int) -> list[Row]:
    """Rows 1 and 2."""
    from scipy import stats

    df = synthetic_counts(n)
    table = image_table(df)
    tp, fp, fn = (a[:, 0] for a in (table.tp, table.fp, table.fn))
    per_image = _dice(tp, fp, fn)
    rows = []
    for rule in ("global-micro", "image-macro"):
        row = Row(f"bootstrap {rule} Dice, {n:,} images x {n_boot:,} replicates")

        def ours():
            return bootstrap_rule(table, rule, "dice", n_boot=n_boot, seed=0)[0].replicates

        def plain():
            rng = np.random.default_rng(0)
            out = np.empty(n_boot)
            for b in range(n_boot):
                i = rng.integers(0, n, n, dtype=np.int32)
                if rule == "global-micro":
                    t, p, f = tp[i].sum(), fp[i].sum(), fn[i].sum()
                    out[b] = 2 * t / (2 * t + p + f)
                else:
                    out[b] = np.nanmean(per_image[i])
            return out

        def scipy_boot():
            if rule == "global-micro":
                def stat(t, p, f, axis=-1):
                    t, p, f = t.sum(axis), p.sum(axis), f.sum(axis)
                    return 2 * t / (2 * t + p + f)
                data = (tp, fp, fn)
            else:
                def stat(x, axis=-1):
                    return np.nanmean(x, axis=axis)
                data = (per_image,)
            r = stats.bootstrap(data, stat, n_resamples=n_boot, vectorized=True, paired=rule == "global-micro",
                                method="percentile", batch=250, rng=np.random.default_rng(0))
            return r.bootstrap_distribution

        vals = interleave(row, {"ours": ours, "plain NumPy loop": plain, "scipy.stats.bootstrap": scipy_boot}, repeats)
        d_plain = float(np.max(np.abs(vals["ours"] - vals["plain NumPy loop"])))
        rng = np.random.default_rng(0)
        draws = np.concatenate([rng.integers(0, n, (min(250, n_boot - k), n)) for k in range(0, n_boot, 250)])
        w = np.stack([np.bincount(d, minlength=n) for d in draws]).astype(np.float64)
        d_scipy = float(np.max(np.abs(rule_values(table, rule, "dice", w) - vals["scipy.stats.bootstrap"])))
        row.equal = d_plain <= 1e-12 and d_scipy <= 1e-12
        row.check = (f"max |ours - plain loop| = {d_plain:.1e} (same draws); max |our kernel on scipy's draws - "
                     f"scipy| = {d_scipy:.1e}")
        rows.append(row)
    return rows


COMPETITOR = r'''
import sys, pandas as pd, numpy as np
f, out = sys.argv[1], sys.argv[2]
g = ["dataset", "split", "model", "run_id", "checkpoint_role", "fold"]
df = pd.read_parquet(f, columns=g + ["class_id", "tp", "fp", "fn"])
def scores(tp, fp, fn):
    tp, fp, fn = (np.asarray(a, dtype=np.float64) for a in (tp, fp, fn))
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"dice": 2 * tp / (2 * tp + fp + fn), "iou": tp / (tp + fp + fn), "precision": tp / (tp + fp),
                "recall": tp / (tp + fn)}
res = []
tot = df.groupby(g)[["tp", "fp", "fn"]].sum()
for m, v in scores(tot.tp, tot.fp, tot.fn).items():
    res.append(pd.DataFrame({"aggregation": "global-micro", "metric": m, "value": v}, index=tot.index))
cls = df.groupby(g + ["class_id"])[["tp", "fp", "fn"]].sum()
for m, v in scores(cls.tp, cls.fp, cls.fn).items():
    s = pd.Series(v, index=cls.index).groupby(level=g).mean()
    res.append(pd.DataFrame({"aggregation": "class-macro", "metric": m, "value": s}))
per = scores(df.tp, df.fp, df.fn)
for m, v in per.items():
    s = pd.Series(v, index=df.index).groupby([df[c] for c in g + ["class_id"]]).mean().groupby(level=g).mean()
    res.append(pd.DataFrame({"aggregation": "image-macro", "metric": m, "value": s}))
pd.concat(res).reset_index().to_csv(out, index=False)
'''


def _run(cmd: list[str]) -> tuple[float, float]:
    """Run a subprocess under ``/usr/bin/time``; return (seconds, peak resident MiB of the command; NaN
    without ``/usr/bin/time``). ``ru_maxrss`` of a child forked from this process would include the pages
    of this (large) process, hence the small wrapper."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    wrap = ["/usr/bin/time", "-f", "MAXRSS_KB %M"] if Path("/usr/bin/time").exists() else []
    t0 = time.perf_counter()
    p = subprocess.run([*wrap, *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr[-2000:]}")
    kb = [line.split()[1] for line in p.stderr.splitlines() if line.startswith("MAXRSS_KB ")]
    return dt, float(kb[-1]) / 1024 if kb else float("nan")


def bench_reaggregate(n_rows: int, repeats: int, tmp: Path, rows_10m: bool) -> Row:
    """Row 3."""
    runs, classes = 20, 2
    n = n_rows // (runs * classes)
    f = tmp / f"counts_{n_rows}" / "counts.parquet"
    f.parent.mkdir(parents=True, exist_ok=True)
    synthetic_counts(n, seed=1, runs=runs, classes=classes).to_parquet(f, index=False)
    script = tmp / "pandas_groupby.py"
    script.write_text(COMPETITOR)
    row = Row(f"reaggregate {runs * n * classes:,}-row counts.parquet (20 runs, 3 rules x 4 metrics)")
    mem: dict[str, list[float]] = {}
    for _ in range(repeats):
        for side, cmd in (("ours", [sys.executable, "-m", "msb", "reaggregate", str(f), "--out", str(tmp / "ours")]),
                          ("pandas groupby script", [sys.executable, str(script), str(f), str(tmp / "pd.csv")])):
            dt, mb = _run(cmd)
            row.times.setdefault(side, []).append(dt)
            mem.setdefault(side, []).append(mb)
    ours = pd.read_parquet(tmp / "ours" / "scores.parquet")
    comp = pd.read_csv(tmp / "pd.csv")
    key = ["run_id", "aggregation", "metric"]
    m = ours.merge(comp, on=key, suffixes=("", "_pd"))
    diff = float(np.nanmax(np.abs(m["value"] - m["value_pd"])))
    nan_same = bool((m["value"].isna() == m["value_pd"].isna()).all())
    row.equal = len(m) == len(ours) == len(comp) and diff <= 1e-12 and nan_same
    row.check = f"{len(m)} of {len(ours)} scores matched, max |diff| = {diff:.1e}"
    row.notes.append("peak RSS MiB: " + ", ".join(f"{s} {max(v):.0f}" for s, v in mem.items()))
    if rows_10m:
        f10 = tmp / "counts_10m" / "counts.parquet"
        f10.parent.mkdir(parents=True, exist_ok=True)
        synthetic_counts(10_000_000 // (runs * classes), seed=2, runs=runs, classes=classes).to_parquet(f10, index=False)
        dt, mb = _run([sys.executable, "-m", "msb", "reaggregate", str(f10), "--out", str(tmp / "ours10")])
        row.notes.append(f"ours at 10,000,000 rows: {dt:.1f} s, peak RSS {mb:.0f} MiB")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, 1 repeat (CI smoke test)")
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--replicates", type=int, default=2_000)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rows-10m", action="store_true", help="also time ours on 10M rows")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--only", choices=("bootstrap", "reaggregate", "ranks", "calibration"), default=None,
                    help="run one part only")
    ap.add_argument("--systems", type=int, default=20, help="systems of the rank-distribution row")
    ap.add_argument("--maps", type=int, default=1_000, help="stored 352x352 maps of the calibration row")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.replicates, args.rows, args.repeats, args.maps = 2_000, 200, 100_000, 1, 50
    print(f"bench_analysis: {os.cpu_count()} CPU(s), numpy {np.__version__}, pandas {pd.__version__}; "
          f"{args.repeats} interleaved repeat(s) per side")
    rows = []
    if args.only in ("ranks", "calibration"):
        return _finish(_posthoc_rows(args), args.json)
    if args.only != "reaggregate":
        bootstrap_rule(image_table(synthetic_counts(100)), "image-macro", "dice", n_boot=10)  # warm-up
        rows = bench_bootstrap(args.images, args.replicates, args.repeats)
        for r in rows:
            print_row(r)
    with tempfile.TemporaryDirectory(prefix="msb_bench_") as tmp:
        if args.only == "bootstrap":
            return _finish(rows, args.json)
        r = bench_reaggregate(args.rows, max(1, min(args.repeats, 5)), Path(tmp), args.rows_10m)
        print_row(r)
        rows.append(r)
    rows += _posthoc_rows(args)
    return _finish(rows, args.json)


def _posthoc_rows(args) -> list[Row]:
    """Rows 4 and 5 (``--only`` ranks / calibration picks one): ``scripts/bench_posthoc.py``."""
    from bench_posthoc import bench_calibration, bench_ranks

    rows = []
    if args.only in (None, "ranks"):
        rows.append(bench_ranks(args.systems, args.images, args.replicates, max(1, min(args.repeats, 3)),
                                synthetic_counts))
        print_row(rows[-1])
    if args.only in (None, "calibration"):
        with tempfile.TemporaryDirectory(prefix="msb_bench_cal_") as tmp:
            rows.append(bench_calibration(args.maps, 352, max(1, min(args.repeats, 3)), Path(tmp)))
        print_row(rows[-1])
    return rows


def _finish(rows: list[Row], out: Path | None) -> int:
    if out:
        out.write_text(json.dumps([r.as_dict() for r in rows], indent=2) + "\n")
    return 0 if all(r.equal for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
