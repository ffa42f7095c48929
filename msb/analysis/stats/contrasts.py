"""Training-pool contrasts: "change the training data, hold the evaluation fixed" (``msb contrasts``).

A pool-contrast study (docs/studies.md ``### pools``) trains every pool with the same seed list and evaluates
every model on the same test rows. For a pair of pools ``(a, b)``, a population ``P`` (a subset of the test
rows, :mod:`msb.analysis.stats.populations`) and seeds ``s = 1..n`` present for both pools:

* ``d_s = M(a, s; P) - M(b, s; P)``, ``M`` = the score of the chosen metric and aggregation rule
  (:func:`msb.analysis.counts.rules.rule_values`) from the stored counts of the run's ``checkpoint`` evaluation;
* ``mean_diff = mean_s d_s``;
* **paired-t over seeds** (first row): ``mean_diff ± t_{(1+level)/2, n-1} · sd(d) / sqrt(n)`` with ``sd`` the
  sample standard deviation (``ddof = 1``) and ``t`` from ``scipy.stats.t.ppf``; needs ``n >= 2``;
* **bootstrap over images** (second row): the images of ``P`` are resampled ``n_boot`` times with replacement
  (:func:`msb.analysis.stats.bootstrap.resample_weights`, seed ``boot_seed``, one draw shared by every run), each
  replicate is ``mean_s [M_w(a, s) - M_w(b, s)]``; percentile interval at ``level``.

Both intervals describe **seed-to-seed variation (and image resampling) on fixed lists**: the same split, the
same pools, the same test rows; they are not a sampling distribution over patients or centres.
``sign_differs`` is true on every row of a pair whose ``mean_diff`` has different signs (−, 0, +) in
different populations (the ReuScope sign reversal).

Beside it, :func:`population_ranks` ranks the pools on each population (mean over seeds; rank 1 = best) and
gives Spearman's ρ (``scipy.stats.spearmanr``) between the populations' scores: the fixed-prediction view.

Pure functions over run folders' ``config.yaml`` and ``counts.parquet``; no training code is imported.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from msb.analysis.stats.bootstrap import percentile_interval, resample_weights
from msb.analysis.counts.counts_io import read_counts
from msb.analysis.stats.populations import parse_population
from msb.analysis.counts.rules import image_table, lower_is_better, rule_values
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text

__all__ = ["INTERVAL_T", "INTERVAL_BOOT", "CONTRAST_COLUMNS", "INTERVAL_NOTE", "pool_runs", "population_mask",
           "contrast_table", "population_ranks", "write_contrasts", "markdown_table", "load_pool_counts"]

INTERVAL_T = "paired-t over seeds"
INTERVAL_BOOT = "bootstrap over images"
INTERVAL_NOTE = ("Intervals: seed-to-seed variation (paired-t) and image resampling (bootstrap) on fixed lists "
                 "(one split, fixed pools, fixed test rows), not sampling of patients.")
CONTRAST_COLUMNS = ["pool_a", "pool_b", "population", "metric", "rule", "mean_diff", "ci_low", "ci_high",
                    "interval", "n_seeds", "n_rows", "n_sources", "sign_differs"]


def pool_runs(study_dir: str | Path, checkpoint: str = "best") -> pd.DataFrame:
    """The pool runs of a study folder: one row per run folder whose ``config.yaml`` has ``data.pool``.

    Returns:
        Columns ``run_id, pool, seed, counts`` (path of ``evaluation/<checkpoint>/counts.parquet``), sorted by
        pool and seed.

    Raises:
        MSBError: no such folder; no pool run in it; a pool run without that evaluation; two runs with one pool
            and seed (each names the folder).
    """
    root = Path(study_dir)
    if not root.is_dir():
        raise MSBError(f"{root}: no such study folder; give runs/<study> (or the study file)")
    rows = []
    for cfg_path in sorted(root.glob("*/config.yaml")):
        cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8")) or {}
        pool = (cfg.get("data") or {}).get("pool")
        if not pool:
            continue
        counts = cfg_path.parent / "evaluation" / checkpoint / "counts.parquet"
        if not counts.is_file():
            raise MSBError(f"{cfg_path.parent}: pool run without {counts.relative_to(cfg_path.parent)}; finish the "
                           f"study (msb run) or choose --checkpoint among its evaluations")
        rows.append({"run_id": cfg_path.parent.name, "pool": str(pool["name"]), "seed": int(cfg.get("random_seed", 0)),
                     "counts": counts})
    if not rows:
        raise MSBError(f"{root}: no run folder with data.pool in its config.yaml; run a study with 'pools' first")
    df = pd.DataFrame(rows).sort_values(["pool", "seed"]).reset_index(drop=True)
    dup = df[df.duplicated(["pool", "seed"], keep=False)]
    if len(dup):
        raise MSBError(f"{root}: pool {dup['pool'].iloc[0]!r} seed {dup['seed'].iloc[0]} has two run folders "
                       f"({', '.join(dup['run_id'])}); remove the stale one")
    return df


def population_mask(df: pd.DataFrame, spec: str) -> np.ndarray:
    """Boolean mask of the count rows in population ``spec`` (``all`` = every row, else
    :func:`msb.analysis.stats.populations.parse_population`)."""
    if spec.strip() == "all":
        return np.ones(len(df), dtype=bool)
    return parse_population(spec).mask(df)


def _tables(counts: dict[tuple[str, int], pd.DataFrame], pool: str, seeds: Sequence[int], spec: str):
    out = {}
    for s in seeds:
        df = counts[(pool, s)]
        sub = df.loc[population_mask(df, spec)]
        if sub.empty:
            raise MSBError(f"population {spec!r} selects no test row of pool {pool!r} seed {s}")
        t = image_table(sub, f"pool {pool!r} seed {s}")
        order = np.argsort(t.keys["image_id"].astype(str).to_numpy(), kind="stable")
        out[s] = t.subset(order)
    return out


def _paired_t(d: np.ndarray, level: float) -> tuple[float, float]:
    from scipy import stats

    n = len(d)
    if n < 2:
        return float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, n - 1) * np.std(d, ddof=1) / math.sqrt(n)
    return float(d.mean() - half), float(d.mean() + half)


def contrast_table(counts: dict[tuple[str, int], pd.DataFrame], pairs: Sequence[tuple[str, str]],
                   populations: dict[str, str], metric: str = "dice", rule: str = "image-macro",
                   n_boot: int = 2000, level: float = 0.95, boot_seed: int = 0) -> pd.DataFrame:
    """The contrast table (module docstring): two rows per pair x population.

    Args:
        counts: ``(pool, seed)`` -> counts rows of that run (one checkpoint role).
        pairs: ``(pool_a, pool_b)``; populations: name -> spec.
        metric, rule: as :func:`msb.analysis.counts.rules.rule_values`.
        n_boot, level, boot_seed: bootstrap replicates, interval level, draw seed.

    Returns:
        :data:`CONTRAST_COLUMNS`; ``n_rows`` = images of the population, ``n_sources`` = their distinct
        ``source`` values.

    Raises:
        MSBError: a pool with no run; fewer than two seeds shared by a pair; runs of a pair evaluated on
            different images (the pair, seed and population are named).
    """
    pools = {p for p, _ in counts}
    rows = []
    for a, b in pairs:
        for p in (a, b):
            if p not in pools:
                raise MSBError(f"contrast {a} - {b}: no run of pool {p!r}; pools with runs: {sorted(pools)}")
        seeds = sorted({s for p, s in counts if p == a} & {s for p, s in counts if p == b})
        if len(seeds) < 2:
            raise MSBError(f"contrast {a} - {b}: {len(seeds)} seed(s) shared by both pools ({seeds}); the paired-t "
                           f"interval needs at least 2 (list them in 'seeds')")
        for pop, spec in populations.items():
            ta, tb = _tables(counts, a, seeds, spec), _tables(counts, b, seeds, spec)
            ids = ta[seeds[0]].keys["image_id"].astype(str).to_numpy()
            for s in seeds:
                for t in (ta[s], tb[s]):
                    if not np.array_equal(t.keys["image_id"].astype(str).to_numpy(), ids):
                        raise MSBError(f"contrast {a} - {b}, population {pop!r}, seed {s}: the runs were evaluated "
                                       f"on different images; pools must share one split and evaluation set")
            d = np.array([rule_values(ta[s], rule, metric)[0] - rule_values(tb[s], rule, metric)[0] for s in seeds])
            mean = float(d.mean())
            lo, hi = _paired_t(d, level)
            reps = []
            for w in resample_weights(len(ids), n_boot, boot_seed):
                reps.append(np.mean([rule_values(ta[s], rule, metric, w) - rule_values(tb[s], rule, metric, w)
                                     for s in seeds], axis=0))
            blo, bhi, _ = percentile_interval(np.concatenate(reps), level)
            keys = ta[seeds[0]].keys
            n_src = int(keys["source"].astype(str).nunique()) if "source" in keys.columns else 0
            base = {"pool_a": a, "pool_b": b, "population": pop, "metric": metric, "rule": rule, "mean_diff": mean,
                    "n_seeds": len(seeds), "n_rows": len(ids), "n_sources": n_src}
            rows.append({**base, "ci_low": lo, "ci_high": hi, "interval": INTERVAL_T})
            rows.append({**base, "ci_low": blo, "ci_high": bhi, "interval": INTERVAL_BOOT})
    out = pd.DataFrame(rows)
    signs = out.groupby(["pool_a", "pool_b"])["mean_diff"].transform(lambda v: np.sign(v).nunique() > 1)
    out["sign_differs"] = signs.astype(bool)
    return out[CONTRAST_COLUMNS]


def population_ranks(counts: dict[tuple[str, int], pd.DataFrame], populations: dict[str, str],
                     metric: str = "dice", rule: str = "image-macro") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rank the pools on each population (fixed predictions, re-scored per population).

    Returns:
        ``(ranks, rho)``: ``ranks`` has ``pool, population, score`` (mean over the pool's seeds), ``n_seeds``,
        ``rank`` (1 = best; ties share the minimum rank; lower is better for distance metrics); ``rho`` has
        ``population_a, population_b, spearman_rho, n_pools`` for every pair of populations (NaN below 3 pools
        or for constant scores).
    """
    from scipy import stats

    rows = []
    for pop, spec in populations.items():
        for pool in sorted({p for p, _ in counts}):
            vals = []
            for (p, s), df in counts.items():
                if p == pool:
                    sub = df.loc[population_mask(df, spec)]
                    if not sub.empty:
                        vals.append(rule_values(image_table(sub, f"pool {p!r} seed {s}"), rule, metric)[0])
            rows.append({"pool": pool, "population": pop, "metric": metric, "rule": rule,
                         "score": float(np.nanmean(vals)) if vals else float("nan"), "n_seeds": len(vals)})
    ranks = pd.DataFrame(rows)
    asc = lower_is_better(metric)
    ranks["rank"] = ranks.groupby("population")["score"].rank(ascending=asc, method="min").astype("Int64")
    pops = list(populations)
    rho = []
    for i, pa in enumerate(pops):
        for pb in pops[i + 1:]:
            x = ranks[ranks["population"] == pa].set_index("pool")["score"]
            y = ranks[ranks["population"] == pb].set_index("pool")["score"].reindex(x.index)
            ok = x.notna() & y.notna()
            r = float("nan")
            if ok.sum() >= 3 and x[ok].nunique() > 1 and y[ok].nunique() > 1:
                r = float(stats.spearmanr(x[ok], y[ok]).statistic)
            rho.append({"population_a": pa, "population_b": pb, "spearman_rho": r, "n_pools": int(ok.sum())})
    return ranks, pd.DataFrame(rho, columns=["population_a", "population_b", "spearman_rho", "n_pools"])


def _cell(v: object) -> str:
    if isinstance(v, (float, np.floating)):
        return "n/a" if not np.isfinite(v) else f"{v:.4f}"
    return str(v)


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub Markdown table of ``df`` (floats with 4 decimals, NaN as ``n/a``)."""
    lines = ["| " + " | ".join(map(str, df.columns)) + " |", "|" + "---|" * len(df.columns)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join(_cell(v) for v in r) + " |")
    return "\n".join(lines) + "\n"


def write_contrasts(table: pd.DataFrame, ranks: pd.DataFrame, rho: pd.DataFrame, out_dir: str | Path
                    ) -> list[Path]:
    """Write ``contrasts.csv|.md|.tex``, ``population_ranks.csv``, ``population_rho.csv`` and
    ``population_ranks.md`` into ``out_dir`` (each atomically). Returns the paths."""
    out = Path(out_dir)
    files = {
        "contrasts.csv": table.to_csv(index=False, lineterminator="\n"),
        "contrasts.md": "## Training-pool contrasts\n\n" + markdown_table(table) + "\n" + INTERVAL_NOTE + "\n",
        "contrasts.tex": table.to_latex(index=False, float_format="%.4f", caption=INTERVAL_NOTE,
                                        label="tab:pool-contrasts"),
        "population_ranks.csv": ranks.to_csv(index=False, lineterminator="\n"),
        "population_rho.csv": rho.to_csv(index=False, lineterminator="\n"),
        "population_ranks.md": ("## Pools ranked on each population (fixed predictions)\n\n" + markdown_table(ranks)
                                + "\n### Spearman ρ between populations\n\n" + markdown_table(rho)),
    }
    paths = []
    for name, text in files.items():
        atomic_write_text(out / name, text)
        paths.append(out / name)
    return paths


def load_pool_counts(runs: pd.DataFrame) -> dict[tuple[str, int], pd.DataFrame]:
    """``(pool, seed)`` -> counts rows of the run (:func:`msb.analysis.counts.counts_io.read_counts`)."""
    return {(r.pool, int(r.seed)): read_counts(r.counts) for r in runs.itertuples(index=False)}
