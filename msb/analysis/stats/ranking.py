"""Ranking sensitivity: does the ranking of systems depend on the aggregation rule or the metric?

Systems are ranked under every (aggregation rule, metric) pair of a tidy score table; each ranking is
compared with a reference ranking (default: image-macro Dice) by Spearman's rank correlation ρ
(Spearman 1904; :func:`scipy.stats.spearmanr`), by how many systems changed rank, and by whether the winner
changed. Ranks: 1 = best (highest value, lowest for distance metrics such as HD95), ties share the smallest
rank (``"min"`` method), undefined values rank last.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy import stats

from msb.analysis.counts.rules import lower_is_better
from msb.errors import MSBError

__all__ = ["DEFAULT_REFERENCE", "rank_table", "ranking_sensitivity", "ranking_correlations"]

#: The reference (aggregation, metric) of :func:`ranking_sensitivity`.
DEFAULT_REFERENCE: tuple[str, str] = ("image-macro", "dice")


def _check(scores: pd.DataFrame, system_col: str) -> None:
    missing = [c for c in (system_col, "aggregation", "metric", "value") if c not in scores.columns]
    if missing:
        raise MSBError(f"ranking needs columns {missing} in the score table")
    dup = scores.duplicated(subset=[system_col, "aggregation", "metric"])
    if dup.any():
        r = scores[dup].iloc[0]
        raise MSBError(f"the score table has several values for system {r[system_col]!r}, "
                       f"{r['aggregation']}/{r['metric']}; rank one dataset split at a time")


def rank_table(scores: pd.DataFrame, system_col: str = "system") -> pd.DataFrame:
    """Rank systems under each (aggregation, metric).

    Args:
        scores: tidy table with ``system_col, aggregation, metric, value`` (one row per system x rule x metric).
        system_col: column naming the system.

    Returns:
        ``aggregation, metric, system, value, rank`` (int64, 1 = best), in the input's rule/metric order,
        systems by rank.
    """
    _check(scores, system_col)
    out = []
    for (rule, metric), g in scores.groupby(["aggregation", "metric"], sort=False):
        v = g["value"].to_numpy(dtype=np.float64)
        key = v if lower_is_better(str(metric)) else -v
        key = np.where(np.isnan(key), np.inf, key)
        ranks = stats.rankdata(key, method="min").astype(np.int64)
        part = pd.DataFrame({"aggregation": rule, "metric": metric, "system": g[system_col].astype(str).to_numpy(),
                             "value": v, "rank": ranks})
        out.append(part.sort_values(["rank", "system"], kind="stable"))
    if not out:
        return pd.DataFrame(columns=["aggregation", "metric", "system", "value", "rank"])
    return pd.concat(out, ignore_index=True)


def _rho(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2 or np.all(a == a[0]) or np.all(b == b[0]):
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(stats.spearmanr(a, b).statistic)


def ranking_sensitivity(scores: pd.DataFrame, reference: tuple[str, str] | None = None,
                        system_col: str = "system") -> pd.DataFrame:
    """The table that shows whether re-aggregation (or another metric) changes the ranking.

    Args:
        scores: tidy table (``system_col, aggregation, metric, value``) of one comparison block.
        reference: ``(aggregation, metric)`` of the reference ranking; default
            :data:`DEFAULT_REFERENCE` if present, else the first pair in the table.
        system_col: column naming the system.

    Returns:
        One row per (aggregation, metric): ``aggregation, metric, winner`` (``" = "``-joined when tied),
        ``ranking`` (``"A > B = C"``), ``spearman_rho`` (vs the reference ranking; NaN with fewer than 2
        systems or a constant ranking), ``n_rank_changes`` (systems whose rank differs from the reference),
        ``winner_changed`` (bool), ``reference`` (``"image-macro/dice"``), ``n_systems``.

    Raises:
        MSBError: missing columns, duplicate rows, reference pair absent.
    """
    ranks = rank_table(scores, system_col)
    pairs = list(dict.fromkeys(zip(ranks["aggregation"], ranks["metric"])))
    if reference is None:
        reference = DEFAULT_REFERENCE if DEFAULT_REFERENCE in pairs else pairs[0]
    if tuple(reference) not in pairs:
        raise MSBError(f"reference ranking {reference[0]}/{reference[1]} not in the score table; available: "
                       f"{[f'{a}/{m}' for a, m in pairs]}")
    by_pair = {p: g.set_index("system")["rank"] for p, g in ranks.groupby(["aggregation", "metric"], sort=False)}
    ref = by_pair[tuple(reference)]
    systems = sorted(ref.index)
    ref_r = ref.reindex(systems).to_numpy()
    ref_win = set(ref[ref == 1].index)
    rows = []
    for p in pairs:
        r = by_pair[p].reindex(systems).to_numpy()
        g = ranks[(ranks["aggregation"] == p[0]) & (ranks["metric"] == p[1])]
        order = []
        prev = None
        for _, row in g.iterrows():
            if prev is not None:
                order.append(" = " if row["rank"] == prev else " > ")
            order.append(str(row["system"]))
            prev = row["rank"]
        win = sorted(g.loc[g["rank"] == 1, "system"])
        rows.append({"aggregation": p[0], "metric": p[1], "winner": " = ".join(win), "ranking": "".join(order),
                     "spearman_rho": _rho(ref_r, r), "n_rank_changes": int((r != ref_r).sum()),
                     "winner_changed": set(win) != ref_win, "reference": f"{reference[0]}/{reference[1]}",
                     "n_systems": len(systems)})
    return pd.DataFrame(rows)


def ranking_correlations(scores: pd.DataFrame, system_col: str = "system") -> pd.DataFrame:
    """Spearman ρ between the rankings of every pair of (aggregation, metric).

    Returns:
        Square DataFrame indexed and labelled ``"<aggregation>/<metric>"`` (NaN where undefined).
    """
    ranks = rank_table(scores, system_col)
    by_pair = {f"{a}/{m}": g.set_index("system")["rank"] for (a, m), g in
               ranks.groupby(["aggregation", "metric"], sort=False)}
    names: Sequence[str] = list(by_pair)
    systems = sorted(next(iter(by_pair.values())).index) if by_pair else []
    mat = np.full((len(names), len(names)), np.nan)
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            mat[i, j] = _rho(by_pair[a].reindex(systems).to_numpy(), by_pair[b].reindex(systems).to_numpy())
    return pd.DataFrame(mat, index=names, columns=names)
