"""Study-level report figures: the critical-difference diagram and training curves.

* :func:`nemenyi_cd`: Demšar's critical difference of mean ranks (Nemenyi, two-sided);
* :func:`cd_diagram`: the critical-difference diagram (mean ranks, systems joined by a bar when their post-hoc
  test does not separate them), drawn by ``scikit_posthocs.critical_difference_diagram``;
* :func:`training_curves`: per-epoch train/val loss and val Dice of every run from its ``train_log.csv``
  (folds of one system overlaid, one colour per system).

Figures use the object API on the Agg canvas (:mod:`msb.analysis.report.figures`), the colour-blind-safe palette
:data:`msb.analysis.report.figures.PALETTE` and keep legends outside the axes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from scipy import stats

from msb.analysis.report.figures import _figure, _record, color
from msb.errors import MSBError

__all__ = ["nemenyi_cd", "cd_diagram", "training_curves", "TRAIN_LOG_COLUMNS"]

#: Columns of ``train_log.csv`` the training-curve figure reads (``epoch`` 1-based).
TRAIN_LOG_COLUMNS: tuple[str, ...] = ("epoch", "train_loss", "val_loss", "val_dice")


def nemenyi_cd(k: int, n: int, alpha: float = 0.05) -> float:
    """Critical difference of mean ranks for the Nemenyi test (Demšar, JMLR 7, 2006, eq. 5):
    ``CD = q_alpha * sqrt(k (k + 1) / (6 N))`` with ``q_alpha`` the studentized-range quantile
    ``ppf(1 - alpha, k, inf)`` divided by ``sqrt(2)`` (Demšar's Table 5: 2.343 for k = 3, 2.569 for k = 4).

    Args:
        k: systems (>= 2); n: images (blocks) ranked (>= 1); alpha: family-wise level.

    Returns:
        CD in rank units (mean ranks that differ by more are significantly different).

    Raises:
        MSBError: k < 2, n < 1 or alpha outside (0, 1).
    """
    if k < 2 or n < 1 or not 0 < alpha < 1:
        raise MSBError(f"critical difference needs k >= 2 systems, n >= 1 images and 0 < alpha < 1; "
                       f"got k={k}, n={n}, alpha={alpha}")
    q = float(stats.studentized_range.ppf(1.0 - alpha, k, np.inf)) / np.sqrt(2.0)
    return q * float(np.sqrt(k * (k + 1) / (6.0 * n)))


def cd_diagram(mean_ranks: Mapping[str, float], posthoc: pd.DataFrame, n: int, alpha: float = 0.05,
               title: str = "") -> Figure:
    """Critical-difference diagram (Demšar 2006): systems on a mean-rank axis (1 = best), a bar joining the
    systems whose post-hoc p-value is >= ``alpha``, and the Nemenyi CD drawn as a scale bar.

    Args:
        mean_ranks: label -> mean rank over the ``n`` images (Friedman ranks).
        posthoc: k x k p-values (labels as index and columns), e.g. Nemenyi or Conover.
        n: images ranked; alpha: level.
        title: figure title.

    Returns:
        The figure; :func:`msb.analysis.report.figures.figure_data` gives one ``rank`` row per system (x = mean rank).
    """
    import scikit_posthocs as sp

    labels = list(mean_ranks)
    cd = nemenyi_cd(len(labels), n, alpha)
    fig = _figure(6.4, 0.35 * len(labels) + 2.0)
    ax = fig.subplots()
    ranks = pd.Series({k: float(v) for k, v in mean_ranks.items()})
    sig = posthoc.loc[labels, labels].astype(float)
    sp.critical_difference_diagram(ranks, sig, alpha=alpha, ax=ax,
                                   color_palette={k: color(i) for i, k in enumerate(labels)})
    lo = 1.0
    ax.plot([lo, lo + cd], [1.12, 1.12], color="black", lw=2, transform=ax.get_xaxis_transform(), clip_on=False)
    ax.set_xlabel("mean rank (1 = best)")
    ax.set_title((title or "Critical-difference diagram")
                 + f"\nscale bar: Nemenyi CD = {cd:.3f} mean ranks (alpha = {alpha:g}, N = {n} images)",
                 pad=22, fontsize=9)
    for k in labels:
        _record(fig, k, "rank", np.array([[ranks[k], 0.0]]))
    return fig


def training_curves(logs: Mapping[str, Sequence[tuple[str, pd.DataFrame]]], title: str = "") -> Figure:
    """Per-epoch training curves: left train loss (solid) and val loss (dashed), right val Dice.

    Args:
        logs: system label -> ``[(run_id, train_log), ...]`` (several runs = folds, overlaid in the system's
            colour); each frame has :data:`TRAIN_LOG_COLUMNS` (``epoch`` 1-based, losses unitless, Dice 0-1).
        title: figure title.

    Returns:
        The figure; :func:`msb.analysis.report.figures.figure_data` has one ``point`` row per (run, curve, epoch),
        series ``<run_id>/<column>``.

    Raises:
        MSBError: a frame lacks one of :data:`TRAIN_LOG_COLUMNS` (names the run).
    """
    fig = _figure(9.0, 3.4)
    ax_loss, ax_dice = fig.subplots(1, 2)
    for i, (label, runs) in enumerate(logs.items()):
        for j, (run_id, df) in enumerate(runs):
            missing = [c for c in TRAIN_LOG_COLUMNS if c not in df.columns]
            if missing:
                raise MSBError(f"run {run_id}: train_log.csv lacks column(s) {missing}")
            x = df["epoch"].to_numpy(dtype=np.float64)
            first = j == 0
            for ax, col, ls, name in ((ax_loss, "train_loss", "-", "train loss"),
                                      (ax_loss, "val_loss", "--", "val loss"), (ax_dice, "val_dice", "-", None)):
                y = df[col].to_numpy(dtype=np.float64)
                lab = (f"{label}: {name}" if name else label) if first else None
                (line,) = ax.plot(x, y, ls, color=color(i), marker="o", ms=3, alpha=0.85 if first else 0.55,
                                  label=lab)
                _record(fig, f"{run_id}/{col}", "point", line.get_xydata())
    ax_loss.set_xlabel("epoch (1-based)")
    ax_loss.set_ylabel("loss (unitless)")
    ax_loss.set_yscale("log")
    ax_dice.set_xlabel("epoch (1-based)")
    ax_dice.set_ylabel("val Dice (0-1)")
    ax_dice.set_ylim(0, 1)
    for ax in (ax_loss, ax_dice):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_loss.set_title("loss per epoch", fontsize=9)
    ax_dice.set_title("validation Dice per epoch", fontsize=9)
    fig.legend(loc="outside right upper", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
