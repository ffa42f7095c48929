"""The plain-language verdict of one leaderboard block: printed under ``msb run``'s leaderboard and at the top of
the report's summary, built only from the block's numbers (:func:`block_verdict`).

The sentence names the system ranked first by the leaderboard's score (image-macro Dice, higher is better), the
share of image bootstrap replicates in which it ranks first (:mod:`msb.analysis.stats.rank_boot`, the same
replicates, level and seed as the leaderboard's CIs), its paired difference to the runner-up with the paired
bootstrap CI (:func:`msb.analysis.stats.compare.paired_differences_table`) and the Wilcoxon signed-rank p of that
pair (:func:`msb.analysis.stats.compare.family_tests`, adjusted as the setting says). The two are called
**not separable** when the rank-1 share is below :data:`SEPARABLE_SHARE` or the paired CI contains 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from msb.analysis.counts.rules import ImageTable, lower_is_better
from msb.analysis.stats.rank_boot import RankDistribution, rank_distribution

__all__ = ["SEPARABLE_SHARE", "direction", "block_ranks", "verdict_sentence"]

#: Rank-1 share below which the first system is "not separable" from the others.
SEPARABLE_SHARE = 0.95

_LABEL = {"dice": "Dice", "iou": "IoU", "precision": "precision", "recall": "recall", "hd95": "HD95"}


def direction(metric: str, unit: str = "") -> str:
    """``"Dice, higher is better"`` / ``"HD95, px, lower is better"``: a metric with its unit and direction."""
    name = _LABEL.get(metric, metric)
    return f"{name}{', ' + unit if unit else ''}, {'lower' if lower_is_better(metric) else 'higher'} is better"


def block_ranks(aligned: Mapping[str, ImageTable], n_boot: int, level: float, seed: int
                ) -> RankDistribution | None:
    """The rank distribution of a block's aligned systems by image-macro Dice (the leaderboard's score), or None
    with fewer than two systems, no common image or ``n_boot == 0``."""
    if len(aligned) < 2 or n_boot <= 0:
        return None
    return rank_distribution(aligned, "image-macro", "dice", n_boot, level, seed)


def verdict_sentence(dist: RankDistribution | None, wilcoxon: pd.DataFrame | None,
                     differences: pd.DataFrame | None, n_systems: int) -> str:
    """The verdict line of one block.

    Args:
        dist: :func:`block_ranks` (None: no rank distribution, the sentence says why).
        wilcoxon: the block's :func:`family_tests` rows (may be None or empty).
        differences: the block's :func:`paired_differences_table` rows (image-macro rows are used).
        n_systems: systems in the block.

    Returns:
        One sentence starting ``"Verdict: "``; ``""`` for a single system (its block says there is nothing to
        compare).
    """
    if dist is None:
        if n_systems < 2:
            return ""
        return "Verdict: no rank distribution (no bootstrap replicates, or the systems share no image)."
    tab = dist.table()
    first, second = tab.iloc[0], tab.iloc[1]
    share = float(first["rank1_share"])
    what = f"image-macro {direction(dist.metric)}"
    head = (f"Verdict: {first['system']} ranks first in {100 * share:.1f} % of {dist.n_boot:,} image bootstrap "
            f"replicates ({what})")
    a, b = str(first["system"]), str(second["system"])
    lo = hi = diff = float("nan")
    d = differences if differences is not None else pd.DataFrame()
    if len(d):
        d = d[d["aggregation"] == dist.rule]
        for sa, sb, sign in ((a, b, 1.0), (b, a, -1.0)):
            m = d[(d["system_a"] == sa) & (d["system_b"] == sb)]
            if len(m):
                diff = sign * float(m["difference"].iloc[0])
                lo, hi = sorted((sign * float(m["ci_low"].iloc[0]), sign * float(m["ci_high"].iloc[0])))
                break
    p_txt = ""
    w = wilcoxon if wilcoxon is not None else pd.DataFrame()
    if len(w):
        m = w[(w["metric"] == dist.metric) & (((w["system_a"] == a) & (w["system_b"] == b))
                                              | ((w["system_a"] == b) & (w["system_b"] == a)))]
        if len(m) and np.isfinite(float(m["p_adjusted"].iloc[0])):
            corr = "BH" if str(m["correction"].iloc[0]).startswith("Benjamini") else "unadjusted"
            p_txt = f", Wilcoxon p = {float(m['p_adjusted'].iloc[0]):.3g} ({corr})"
    if np.isfinite(diff):
        gap, rel = abs(diff), ("higher" if diff >= 0 else "lower")
        ci = f" [{lo:.3f}, {hi:.3f}]" if np.isfinite(lo) and np.isfinite(hi) else ""
        body = f"; its image-macro {_LABEL.get(dist.metric, dist.metric)} is {gap:.3f} {rel} than {b}{ci}{p_txt}"
    else:
        body = f"; runner-up {b}{p_txt}"
    why = []
    if share < SEPARABLE_SHARE:
        why.append(f"rank-1 share {100 * share:.1f} % < {100 * SEPARABLE_SHARE:.0f} %")
    if np.isfinite(lo) and np.isfinite(hi) and lo <= 0 <= hi:
        why.append("the paired CI contains 0")
    tail = (f": {a} and {b} are not separable ({'; '.join(why)})." if why else
            f": separable (rank-1 share >= {100 * SEPARABLE_SHARE:.0f} % and the paired CI excludes 0).")
    return head + body + tail
