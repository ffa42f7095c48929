"""Benchmark: vectorised image-level bootstrap (msb.analysis.bootstrap) against a naive per-replicate loop.

Synthetic binary counts table of ``--images`` images (default 10,000; object sizes log-uniform, some empty
references), ``--replicates`` bootstrap replicates (default 2,000) of Dice under image-macro, global-micro and
class-macro, seed 0. The vectorised path draws resampling counts with one ``np.bincount`` per block of 250
replicates and scores every rule as a matrix product. The naive path takes the *same* draws
(``resample_indices``), selects the resampled rows with pandas and calls
``msb.analysis.aggregate.aggregate`` once per replicate; it runs on the first ``--naive`` replicates only
(default 40) and its time is extrapolated linearly to all replicates. Both paths must give identical replicate
values on the common replicates (checked, |diff| <= 1e-12).

Prints per rule: vectorised seconds for all replicates, naive seconds per replicate, extrapolated naive seconds,
the ratio, and whether the vectorised time is under the 2 s target.

Usage: ``.venv/bin/python scripts/bench_analysis.py [--images N] [--replicates B] [--naive K]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from msb.analysis.aggregate import aggregate  # noqa: E402
from msb.analysis.bootstrap import bootstrap_rule, resample_indices  # noqa: E402
from msb.analysis.rules import image_table  # noqa: E402

RULES = ("image-macro", "global-micro", "class-macro")


def synthetic_counts(n: int, seed: int = 0) -> pd.DataFrame:
    """Counts rows of ``n`` 256x256 images, one foreground class."""
    rng = np.random.default_rng(seed)
    hw = 256 * 256
    ref = np.where(rng.random(n) < 0.1, 0, np.exp(rng.uniform(np.log(20), np.log(20000), n))).astype(np.int64)
    tp = np.floor(ref * rng.uniform(0.3, 1.0, n)).astype(np.int64)
    fn = ref - tp
    fp = np.floor(rng.uniform(0, 0.4, n) * (ref + 50)).astype(np.int64)
    return pd.DataFrame({"dataset": "bench", "split": "test", "fold": -1, "run_id": "r", "model": "m",
                         "checkpoint_role": "best", "image_id": [f"img{i:05d}" for i in range(n)], "class_id": 1,
                         "class_name": "fg", "threshold": 0.5, "threshold_on": "probability", "source": "s",
                         "tp": tp, "fp": fp, "fn": fn, "tn": hw - tp - fp - fn})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=10_000)
    ap.add_argument("--replicates", type=int, default=2_000)
    ap.add_argument("--naive", type=int, default=40, help="replicates of the naive loop (extrapolated)")
    args = ap.parse_args()
    df = synthetic_counts(args.images)
    table = image_table(df)
    print(f"{args.images} images x {args.replicates} replicates, Dice, seed 0; naive loop on "
          f"{args.naive} replicates, extrapolated")
    bootstrap_rule(table, "image-macro", "dice", n_boot=10, seed=1)  # warm-up (first-call overheads)
    print(f"{'rule':<14}{'vectorised s':>14}{'naive s/rep':>13}{'naive s (extrap.)':>19}{'ratio':>9}  < 2 s")
    for rule in RULES:
        t0 = time.perf_counter()
        res = bootstrap_rule(table, rule, "dice", n_boot=args.replicates, seed=0)[0]
        t_vec = time.perf_counter() - t0
        idx = next(resample_indices(args.images, args.naive, seed=0, chunk=args.naive))
        t0 = time.perf_counter()
        naive = np.array([aggregate(df.iloc[row], rule, "dice").value for row in idx])
        t_naive = (time.perf_counter() - t0) / args.naive
        # the vectorised replicates use blocks of 250 draws from the same generator: the first block's first
        # rows are the same draws when --naive <= 250
        if args.naive <= 250:
            diff = np.max(np.abs(naive - res.replicates[:args.naive]))
            assert diff <= 1e-12, f"{rule}: vectorised and naive replicates differ by {diff}"
        extrap = t_naive * args.replicates
        print(f"{rule:<14}{t_vec:>14.3f}{t_naive:>13.4f}{extrap:>19.1f}{extrap / t_vec:>9.0f}  "
              f"{'yes' if t_vec < 2 else 'NO'}")
        print(f"{'':<14}estimate {res.text()} ({100 * res.level:.0f}% percentile CI)")


if __name__ == "__main__":
    main()
