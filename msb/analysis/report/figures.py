"""Report figures (matplotlib, object API: no pyplot state, the Agg canvas), saved as PNG and SVG.

* :func:`score_distributions`: per-system per-image scores (box + jittered points) with the point estimate
  and its bootstrap CI;
* :func:`paired_differences`: per-image differences of each compared pair with the paired-bootstrap CI;
* :func:`ranking_changes`: rank of each system under every (aggregation rule, metric) — a bump chart;
* :func:`dice_vs_hd95`: per-image Dice against HD95;
* :func:`overlay_grid`: qualitative overlays from stored predictions, TP green, FP red, FN blue.

Every chart (not the overlay grid) keeps the values it plots, read back from its matplotlib artists once drawn:
:func:`figure_data` returns them as a table, so the content of a figure can be checked against the numbers it
should show.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from msb.utils.atomic import atomic_path

__all__ = ["OVERLAY_COLORS", "DPI", "PALETTE", "color", "FIGURE_DATA_COLUMNS", "figure_data", "save_figure", "score_distributions",
           "paired_differences", "ranking_changes", "dice_vs_hd95", "overlay_rgb", "overlay_grid"]

#: RGB colours of the overlay: true positive, false positive, false negative.
OVERLAY_COLORS = {"tp": (0, 200, 0), "fp": (230, 0, 0), "fn": (0, 80, 255)}
#: Resolution of every saved PNG (dots per inch); SVGs are vector.
DPI = 150
#: Colour-blind-safe qualitative palette (Okabe & Ito, "Color Universal Design", 2008), cycled per system.
PALETTE: tuple[str, ...] = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
                            "#000000")
#: Columns of :func:`figure_data`.
FIGURE_DATA_COLUMNS: tuple[str, ...] = ("series", "kind", "x", "y", "low", "high", "label")
_DATA_ATTR = "_msb_plotted"


def _figure(w: float, h: float) -> Figure:
    fig = Figure(figsize=(w, h), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def color(i: int) -> str:
    """The ``i``-th colour of :data:`PALETTE` (cycled)."""
    return PALETTE[i % len(PALETTE)]


def figure_data(fig: Figure) -> pd.DataFrame:
    """The values a chart of this module plots, read back from its artists (scatter offsets, line data, error-bar
    segments) after drawing.

    Returns:
        One row per plotted mark, columns :data:`FIGURE_DATA_COLUMNS`: ``series`` (system or pair label),
        ``kind`` (``point``: one per-image mark; ``estimate``: the aggregate marker; ``rank``: a bump-chart
        vertex), ``x``, ``y`` (data coordinates), ``low``/``high`` (the error bar's ends along the CI axis,
        NaN without a bar), ``label`` (the x tick label of a ``rank`` vertex, else empty). Empty for a
        figure not drawn by this module.
    """
    rows = getattr(fig, _DATA_ATTR, None)
    return pd.DataFrame(rows or [], columns=list(FIGURE_DATA_COLUMNS))


def _record(fig: Figure, series: str, kind: str, xy: np.ndarray, low: float = np.nan, high: float = np.nan,
            labels: Sequence[str] | None = None) -> None:
    rows = fig.__dict__.setdefault(_DATA_ATTR, [])
    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    for i, (x, y) in enumerate(xy):
        rows.append({"series": series, "kind": kind, "x": float(x), "y": float(y), "low": float(low),
                     "high": float(high), "label": labels[i] if labels is not None else ""})


def _record_errorbar(fig: Figure, series: str, container, axis: int) -> None:
    """Record an ``errorbar`` marker and the ends of its bar along ``axis`` (0 = x, 1 = y)."""
    line, _, bars = container.lines
    low = high = np.nan
    if bars:
        seg = np.asarray(bars[0].get_segments()[0], dtype=np.float64)
        low, high = float(seg[:, axis].min()), float(seg[:, axis].max())
    _record(fig, series, "estimate", line.get_xydata(), low, high)


def save_figure(fig: Figure, stem: str | Path) -> tuple[Path, Path]:
    """Write ``<stem>.png`` and ``<stem>.svg`` atomically (no date metadata, so reruns give equal files).

    Returns:
        ``(png_path, svg_path)``.
    """
    stem = Path(stem)
    png, svg = stem.with_suffix(".png"), stem.with_suffix(".svg")
    with atomic_path(png) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    with atomic_path(svg) as tmp:
        fig.savefig(tmp, format="svg", metadata={"Date": None})
    return png, svg


def score_distributions(scores: Mapping[str, np.ndarray], estimates: Mapping[str, tuple[float, float, float]],
                        metric_label: str, title: str = "", seed: int = 0) -> Figure:
    """Per-image score distribution of each system with the aggregate and its CI.

    Args:
        scores: label -> per-image scores (NaN ignored).
        estimates: label -> ``(estimate, low, high)`` of the aggregate (e.g. image-macro with its bootstrap CI).
        metric_label: y-axis label.
        title: figure title.
        seed: jitter seed.
    """
    labels = list(scores)
    fig = _figure(max(4.0, 1.3 * len(labels) + 2), 3.6)
    ax = fig.subplots()
    rng = np.random.default_rng(seed)
    data = [np.asarray(scores[k], dtype=np.float64) for k in labels]
    data = [d[np.isfinite(d)] for d in data]
    pos = np.arange(1, len(labels) + 1)
    ax.boxplot([d if d.size else [np.nan] for d in data], positions=pos, widths=0.5, showfliers=False,
               medianprops={"color": "0.3"})
    for i, (p, d, k) in enumerate(zip(pos, data, labels)):
        sc = ax.scatter(p + rng.uniform(-0.15, 0.15, d.size), d, s=16, alpha=0.7, color=color(i), linewidths=0,
                        zorder=3)
        _record(fig, k, "point", sc.get_offsets())
    for p, k in zip(pos, labels):
        if k in estimates:
            e, lo, hi = estimates[k]
            if np.isfinite(e):
                yerr = np.array([[e - lo], [hi - e]]) if np.isfinite(lo) and np.isfinite(hi) else None
                eb = ax.errorbar(p + 0.3, e, yerr=yerr, fmt="D", color="black", capsize=4, ms=5,
                                 label="aggregate (CI)" if p == 1 else None)
                _record_errorbar(fig, k, eb, axis=1)
    ax.set_xticks(pos, labels, rotation=20, ha="right")
    ax.set_ylabel(metric_label)
    ax.set_title(title or f"{metric_label} per image")
    if any(k in estimates for k in labels):
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)  # outside the data
    return fig


def paired_differences(diffs: Mapping[str, np.ndarray], estimates: Mapping[str, tuple[float, float, float]],
                       metric_label: str, title: str = "", seed: int = 0) -> Figure:
    """Per-image differences (a − b) of each compared pair, with the paired-bootstrap CI of the difference.

    Args:
        diffs: pair label (``"A − B"``) -> per-image differences.
        estimates: pair label -> ``(difference, low, high)``.
    """
    labels = list(diffs)
    fig = _figure(6.0, max(2.2, 0.8 * len(labels) + 1.4))
    ax = fig.subplots()
    rng = np.random.default_rng(seed)
    for i, k in enumerate(labels):
        d = np.asarray(diffs[k], dtype=np.float64)
        d = d[np.isfinite(d)]
        sc = ax.scatter(d, i + rng.uniform(-0.18, 0.18, d.size), s=9, alpha=0.45, color=color(1), linewidths=0)
        _record(fig, k, "point", sc.get_offsets())
        if k in estimates:
            e, lo, hi = estimates[k]
            if np.isfinite(e):
                xerr = np.array([[e - lo], [hi - e]]) if np.isfinite(lo) and np.isfinite(hi) else None
                eb = ax.errorbar(e, i, xerr=xerr, fmt="D", color="black", capsize=4, ms=5)
                _record_errorbar(fig, k, eb, axis=0)
    ax.axvline(0.0, color="0.4", lw=1, ls="--")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(-0.6, len(labels) - 0.4)
    ax.set_xlabel(f"{metric_label} difference (a − b)")
    ax.set_title(title or f"Paired differences in {metric_label}")
    return fig


def ranking_changes(ranks: pd.DataFrame, title: str = "Rank under each aggregation rule and metric") -> Figure:
    """Bump chart: x = ``aggregation/metric``, y = rank (1 at the top), one line per system.

    Args:
        ranks: :func:`msb.analysis.stats.ranking.rank_table` output.
    """
    pairs = list(dict.fromkeys(zip(ranks["aggregation"], ranks["metric"])))
    xl = [f"{a}\n{m}" for a, m in pairs]
    systems = sorted(set(ranks["system"]))
    fig = _figure(max(5.0, 0.75 * len(pairs) + 2.5), 0.5 * len(systems) + 2.6)
    ax = fig.subplots()
    for i, s in enumerate(systems):
        g = ranks[ranks["system"] == s].set_index(["aggregation", "metric"])["rank"]
        y = [float(g.get(p, np.nan)) for p in pairs]
        (line,) = ax.plot(range(len(pairs)), y, marker="o", label=s, color=color(i))
        _record(fig, s, "rank", line.get_xydata(), labels=[f"{a}/{m}" for a, m in pairs])
    ax.set_xticks(range(len(pairs)), xl, fontsize=7, rotation=45, ha="right")
    ax.set_yticks(range(1, len(systems) + 1))
    ax.set_ylim(len(systems) + 0.5, 0.5)
    ax.set_ylabel("rank (1 = best)")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return fig


def dice_vs_hd95(points: Mapping[str, tuple[np.ndarray, np.ndarray]], title: str = "",
                 unit: str = "px") -> Figure:
    """Scatter of per-image Dice (x) against HD95 (y), one colour per system; undefined pairs skipped."""
    fig = _figure(5.2, 3.8)
    ax = fig.subplots()
    for i, (k, (d, h)) in enumerate(points.items()):
        d = np.asarray(d, dtype=np.float64)
        h = np.asarray(h, dtype=np.float64)
        ok = np.isfinite(d) & np.isfinite(h)
        sc = ax.scatter(d[ok], h[ok], s=14, alpha=0.7, label=f"{k} (n={int(ok.sum())})", color=color(i))
        _record(fig, k, "point", sc.get_offsets())
    ax.set_xlabel("Dice per image (0-1, unitless)")
    ax.set_ylabel(f"HD95 per image ({unit})")
    ax.set_title(title or "Dice vs HD95")
    if points:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # outside the data
    return fig


def overlay_rgb(pred: np.ndarray, ref: np.ndarray, background: np.ndarray | None = None,
                alpha: float = 0.55) -> np.ndarray:
    """Colour a prediction against its reference on a grey-scale background.

    Args:
        pred, ref: ``(H, W)`` bool masks (one class).
        background: ``(H, W, 3)`` uint8 RGB image, or None (mid grey).
        alpha: opacity of the colours.

    Returns:
        ``(H, W, 3)`` uint8: TP green, FP red, FN blue (:data:`OVERLAY_COLORS`) blended over the grey image.
    """
    pred = np.asarray(pred, dtype=bool)
    ref = np.asarray(ref, dtype=bool)
    if background is None or background.shape[:2] != pred.shape:
        grey = np.full(pred.shape, 128.0)
    else:
        grey = np.asarray(background, dtype=np.float64)[..., :3].mean(axis=-1)
    out = np.repeat(grey[..., None], 3, axis=-1)
    for mask, key in ((pred & ref, "tp"), (pred & ~ref, "fp"), (~pred & ref, "fn")):
        out[mask] = (1 - alpha) * out[mask] + alpha * np.asarray(OVERLAY_COLORS[key], dtype=np.float64)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def overlay_grid(rows: Sequence[str], columns: Sequence[str], cells: Sequence[Sequence[np.ndarray]],
                 title: str = "") -> Figure:
    """Grid of overlays: one row per image, one column per system.

    Args:
        rows: row labels (image ids); columns: column labels (systems).
        cells: ``cells[i][j]`` = ``(H, W, 3)`` uint8 overlay (:func:`overlay_rgb`) of image ``i``, system ``j``.
        title: figure title (say here when the backgrounds are grey because the dataset was not found).
    """
    nr, nc = len(rows), len(columns)
    fig = _figure(1.9 * nc + 0.6, 1.9 * nr + 0.9)
    axes = np.atleast_2d(fig.subplots(nr, nc, squeeze=False))
    for i in range(nr):
        for j in range(nc):
            ax = axes[i, j]
            ax.imshow(cells[i][j], interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_title(columns[j], fontsize=8)
            if j == 0:
                ax.set_ylabel(rows[i], fontsize=7)
    fig.suptitle((title + "\n" if title else "") + "TP green, FP red, FN blue", fontsize=9)
    return fig
