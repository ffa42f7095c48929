"""Figures of the post-hoc analyses (matplotlib object API, Agg canvas; saved by
:func:`msb.analysis.report.figures.save_figure`):

* :func:`blob_plot`: bootstrap rank distribution, rank x system, dot area proportional to the share of replicates
  with that rank, the median rank and the rank interval marked (challengeR's blob plot, Wiesenfarth et al. 2021);
* :func:`reliability_diagram`: observed foreground frequency against mean predicted probability per bin, with the
  bin's pixel share (Niculescu-Mizil & Caruana 2005; Guo et al. 2017);
* :func:`threshold_curves`: selection-split scores as a function of the decision threshold.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from msb.analysis.report.figures import color
from msb.analysis.stats.rank_boot import RankDistribution

__all__ = ["blob_plot", "reliability_diagram", "threshold_curves"]


def _fig(w: float, h: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = Figure(figsize=(w, h), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def blob_plot(dist: RankDistribution, title: str = "") -> Figure:
    """Rank (y, 1 at the top) x system (x, by full-data rank); dot area = share of replicates with that rank
    (a share of 1 is a dot of 600 pt²); black bar = rank interval at ``dist.level``, black cross = median rank."""
    tab = dist.table()
    order = list(tab["system"])
    pos = {s: i for i, s in enumerate(dist.systems)}
    k = len(order)
    fig = _fig(max(4.0, 1.1 * k + 1.5), 3.2 + 0.25 * k)
    ax = fig.add_subplot()
    for x, s in enumerate(order):
        r = dist.ranks[:, pos[s]]
        ranks, cnt = np.unique(r, return_counts=True)
        ax.scatter(np.full(ranks.size, x), ranks, s=600 * cnt / r.size, color=color(x), alpha=0.75, lw=0)
        row = tab[tab["system"] == s].iloc[0]
        ax.vlines(x, row["rank_low"], row["rank_high"], color="black", lw=1.2)
        ax.plot([x], [row["median_rank"]], marker="x", color="black", ms=7)
    ax.set_xticks(range(k), order, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(1, k + 1))
    ax.set_ylim(k + 0.6, 0.4)
    ax.set_xlim(-0.6, k - 0.4)
    ax.set_ylabel("rank (1 = best)")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title or f"Bootstrap ranks ({dist.n_boot:,} replicates,\n{dist.rule} {dist.metric}); "
                 f"area = share", fontsize=8, wrap=True)
    return fig


def reliability_diagram(curves: Mapping[str, pd.DataFrame], title: str = "") -> Figure:
    """One line per system: ``mean_prob`` (x) against ``frequency`` (y) of the non-empty bins of
    :func:`msb.analysis.stats.calibration.reliability_table`, the diagonal = perfect calibration; below, the
    share of pixels per bin (log scale)."""
    fig = _fig(5.2, 5.2)
    ax, ax2 = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    ax.plot([0, 1], [0, 1], color="grey", ls="--", lw=1)
    for i, (lab, t) in enumerate(curves.items()):
        t = t[t["n_pixels"] > 0]
        ax.plot(t["mean_prob"], t["frequency"], marker="o", ms=3, color=color(i), label=lab)
        ax2.plot((t["bin_low"] + t["bin_high"]) / 2, t["n_pixels"] / t["n_pixels"].sum(), color=color(i),
                 marker=".", lw=1)
    ax.set_ylabel("observed foreground frequency")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax2.set_yscale("log")
    from matplotlib.ticker import NullFormatter

    ax2.yaxis.set_minor_formatter(NullFormatter())
    ax2.set_xlabel("predicted foreground probability")
    ax2.set_ylabel("pixel share")
    ax.set_title(title or "Reliability diagram (pixels)", fontsize=9)
    return fig


def threshold_curves(curves: Mapping[str, pd.DataFrame], metric: str = "dice", title: str = "") -> Figure:
    """Selection-split score (``metric`` column of each frame, image-macro) against ``threshold``; the chosen
    threshold (``chosen`` true) as a filled marker, 0.5 dotted."""
    fig = _fig(5.2, 3.6)
    ax = fig.add_subplot()
    for i, (lab, t) in enumerate(curves.items()):
        ax.plot(t["threshold"], t[metric], color=color(i), label=lab, lw=1.2)
        c = t[t["chosen"]]
        ax.plot(c["threshold"], c[metric], "o", color=color(i))
    ax.axvline(0.5, color="grey", ls=":", lw=1)
    ax.set_xlabel("decision threshold on the probability")
    ax.set_ylabel(f"image-macro {metric} (selection split)")
    ax.legend(fontsize=7)
    ax.set_title(title or "Threshold analysis", fontsize=9)
    return fig
