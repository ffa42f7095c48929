"""Rank stability across training seeds, random splits and cross-validation folds.

A study that repeats each system over *replicates* (the ``random_seed`` axis: counts column ``seed``; random-split
seeds as in the polyp audit's P2: ``split_policy`` ``random(seed=...)``; CV folds: ``fold >= 0``) gets, per
(dataset, split) block, the ranking of the systems within each replicate (image-macro Dice of the replicate's own
images, ranks as :func:`msb.analysis.stats.rank_boot.rank_rows`), the share of replicates each system wins, its
mean ± SD (``ddof = 1``) over replicates, and every pair of systems whose order changes between replicates.

A system here is the architecture with its study-axis values except the replicate axes (``random_seed``, the
split seed ``data.split.seed``): the architecture is read from a study run id ``<dataset>-<arch>-<hash8>`` (fold
token removed, ``-ensemble`` kept), because the counts' ``model`` is the adapter, shared by e.g. ``unet_tiny`` and
``unet_r18`` (both ``unet``); rows whose run id does not have that form fall back to ``model``. A replicate is the
combination of ``seed``, ``split_policy`` and ``fold``. Only replicates in which every system of the block was
evaluated are ranked.
"""

from __future__ import annotations

import itertools
import re

import pandas as pd

from msb.analysis.counts.rules import image_table, rule_values
from msb.analysis.stats.rank_boot import rank_rows

__all__ = ["replicate_scores", "seed_stability"]


#: Study axes whose values are replicates, not systems (their values are in ``seed`` / ``split_policy``).
_REPLICATE_AXES: frozenset[str] = frozenset({"random_seed", "data.split.seed"})
_FOLD_TOKEN = re.compile(r"[-_.]?fold[-_]?\d+", re.IGNORECASE)
_STUDY_RUN = re.compile(r"^(?P<arch>.+)-[0-9a-f]{8}(?P<ens>-ensemble\d*)?$")


def _system_name(model: str, variant: str, run_id: str = "", dataset: str = "") -> str:
    """``<arch>[<axis>=<value>;...]`` of one counts row: the architecture of a study run id
    ``<dataset>-<arch>-<hash8>[-ensemble]`` (fold token removed), else ``model``; the variant's axes except
    :data:`_REPLICATE_AXES`."""
    rid = _FOLD_TOKEN.sub("", str(run_id))
    prefix = f"{dataset}-"
    m = _STUDY_RUN.match(rid[len(prefix):]) if dataset and rid.startswith(prefix) else None
    name = m.group("arch") + (m.group("ens") or "") if m else str(model)
    keep = [t for t in str(variant).split(";") if "=" in t and t.split("=", 1)[0] not in _REPLICATE_AXES]
    return name + ("" if not keep else "[" + ";".join(sorted(keep)) + "]")


def replicate_scores(counts: pd.DataFrame, rule: str = "image-macro", metric: str = "dice") -> pd.DataFrame:
    """Score of every (block, system, replicate) of a counts table.

    Returns:
        ``dataset, split, checkpoint_role, system, replicate, value, n_images`` (``replicate`` reads
        ``seed=<s>;split=<policy>;fold=<k>``, the parts that vary in the table).
    """
    df = counts.copy()
    var = df["variant"].astype(str) if "variant" in df.columns else pd.Series("", index=df.index)
    df["_system"] = [_system_name(m, v, r, d) for m, v, r, d in zip(df["model"].astype(str), var,
                                                                      df["run_id"].astype(str),
                                                                      df["dataset"].astype(str))]
    parts = {"seed": df["seed"].astype(str) if "seed" in df.columns else None,
             "split": df["split_policy"].astype(str) if "split_policy" in df.columns else None,
             "fold": df["fold"].astype(str)}
    varying = [(name, col.to_numpy()) for name, col in parts.items() if col is not None and col.nunique() > 1]
    df["_replicate"] = [";".join(f"{name}={col[i]}" for name, col in varying) or "all" for i in range(len(df))]
    rows = []
    keys = ["dataset", "split", "checkpoint_role", "_system", "_replicate"]
    for key, g in df.groupby(keys, sort=True):
        t = image_table(g)
        rows.append({"dataset": key[0], "split": key[1], "checkpoint_role": key[2], "system": key[3],
                     "replicate": key[4], "value": float(rule_values(t, rule, metric)[0]), "n_images": t.n_images})
    return pd.DataFrame(rows)


def seed_stability(counts: pd.DataFrame, rule: str = "image-macro", metric: str = "dice"
                   ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Rankings per replicate, the per-system summary and the pairs that change order.

    Returns:
        ``(rankings, systems, pairs)``:

        * rankings: :func:`replicate_scores` rows of complete replicates with ``rank``;
        * systems: ``dataset, split, checkpoint_role, system, n_replicates, rank1_share, mean, sd, mean_rank``;
        * pairs: ``dataset, split, checkpoint_role, system_a, system_b, a_ahead, b_ahead, tied, changes_order``.

        All three empty when no block has two systems and two complete replicates.
    """
    sc = replicate_scores(counts, rule, metric)
    rk, sy, pr = [], [], []
    for (ds, sp, role), g in sc.groupby(["dataset", "split", "checkpoint_role"], sort=True):
        wide = g.pivot(index="replicate", columns="system", values="value").dropna(how="any")
        if wide.shape[1] < 2 or wide.shape[0] < 2:
            continue
        ranks = rank_rows(wide.to_numpy(), metric)
        r = pd.DataFrame(ranks, index=wide.index, columns=wide.columns)
        long = g[g["replicate"].isin(wide.index)].copy()
        long["rank"] = [int(r.at[a, b]) for a, b in zip(long["replicate"], long["system"])]
        rk.append(long)
        for s in wide.columns:
            v = wide[s].to_numpy()
            sy.append({"dataset": ds, "split": sp, "checkpoint_role": role, "system": s,
                       "n_replicates": int(v.size), "rank1_share": float((r[s] == 1).mean()),
                       "mean": float(v.mean()), "sd": float(v.std(ddof=1)), "mean_rank": float(r[s].mean())})
        for a, b in itertools.combinations(list(wide.columns), 2):
            d = wide[a].to_numpy() - wide[b].to_numpy()
            up, down = int((d > 0).sum()), int((d < 0).sum())
            pr.append({"dataset": ds, "split": sp, "checkpoint_role": role, "system_a": a, "system_b": b,
                       "a_ahead": up, "b_ahead": down, "tied": int((d == 0).sum()), "changes_order": up > 0 and down > 0})
    cat = lambda xs, cols: pd.concat(xs, ignore_index=True) if xs and isinstance(xs[0], pd.DataFrame) else (  # noqa: E731
        pd.DataFrame(xs) if xs else pd.DataFrame(columns=cols))
    return (cat(rk, list(sc.columns) + ["rank"]),
            cat(sy, ["dataset", "split", "checkpoint_role", "system", "n_replicates", "rank1_share", "mean", "sd",
                     "mean_rank"]),
            cat(pr, ["dataset", "split", "checkpoint_role", "system_a", "system_b", "a_ahead", "b_ahead", "tied",
                     "changes_order"]))
