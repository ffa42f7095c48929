"""Shared pieces of the protocol analyses: the table and output types, the skip signal, row selections and
per-system image tables.

A :class:`PaperTable` has the rows and columns of the paper table it reproduces: ``values`` holds the numbers
(written as CSV, full precision; two-level column labels are joined with a space), ``display`` the same shape
as formatted text (written as LaTeX and Markdown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from msb.analysis.counts.rules import ImageTable, image_table, unit_scores

__all__ = ["PaperTable", "AnalysisOutput", "AnalysisSkipped", "evaluation_rows", "system_tables", "image_mean", "per_image", "nanmean",
           "fmt_num", "fmt_pm", "flat_columns", "SYSTEM_KEY"]

#: Columns identifying a compared system in the protocol analyses (folds of one architecture pooled).
SYSTEM_KEY: tuple[str, ...] = ("architecture", "input_size")


class AnalysisSkipped(Exception):
    """An analysis cannot run on this study (its inputs are missing); the message is the one-line reason."""


@dataclass(frozen=True)
class PaperTable:
    """A table in a paper's layout (module docstring).

    Attributes:
        name: file stem (``tables/<name>.csv|tex|md``).
        values: numbers (and labels), paper rows x columns (columns may be a two-level MultiIndex).
        display: the same frame as strings.
        caption: what the table shows, with its protocol (rule, replicates, seed, units).
    """

    name: str
    values: pd.DataFrame
    display: pd.DataFrame
    caption: str


@dataclass
class AnalysisOutput:
    """What one analysis produced: tables, figures ``(name, matplotlib Figure, caption)``, notes (exclusions,
    unmatched units) and tidy frames (``data/<name>.csv``)."""

    tables: list[PaperTable] = field(default_factory=list)
    figures: list[tuple[str, object, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: dict[str, pd.DataFrame] = field(default_factory=dict)


def evaluation_rows(counts: pd.DataFrame, kind: str | None = None, ensembles: bool = False,
                    role: str | None = "best") -> pd.DataFrame:
    """Counts rows of one evaluation kind.

    Args:
        counts: rows of :class:`~msb.analysis.protocol.inputs.StudyArtifacts`.
        kind: ``internal``, ``external`` or None (both).
        ensembles: keep fold-ensemble rows (default: drop them).
        role: checkpoint role kept (None: all; when the role is absent, the first role present is used).
    """
    df = counts
    if kind is not None:
        df = df[df["eval_kind"] == kind]
    if not ensembles:
        df = df[~df["is_ensemble"]]
    if role is not None and len(df):
        roles = sorted(set(df["checkpoint_role"].astype(str)))
        df = df[df["checkpoint_role"].astype(str) == (role if role in roles else roles[0])]
    return df


def system_tables(df: pd.DataFrame, key: Sequence[str] = ("architecture",)) -> dict[tuple, ImageTable]:
    """One :class:`~msb.analysis.counts.rules.ImageTable` per system (rows grouped by ``key``; the folds and seeds of a
    system are distinct image rows, i.e. pooled)."""
    out = {}
    for k, g in df.groupby(list(key), sort=True):
        k = k if isinstance(k, tuple) else (k,)
        out[k] = image_table(g, "system " + ", ".join(f"{c}={v}" for c, v in zip(key, k)))
    return out


def per_image(table: ImageTable, metric: str) -> np.ndarray:
    """``(n,)`` per-image scores (``unit_scores(..., "image")``: mean over the image's defined classes; NaN =
    undefined). ``hd95``/``nsd_*`` need :meth:`ImageTable.with_metrics` first; all NaN when not attached."""
    if metric not in ("dice", "iou", "precision", "recall") and metric not in table.extra:
        return np.full(table.n_images, np.nan)
    return unit_scores(table, metric, "image")


def nanmean(x: np.ndarray) -> float:
    """Mean of the finite entries of ``x``; NaN when there is none (no warning)."""
    x = np.asarray(x, dtype=np.float64)
    ok = np.isfinite(x)
    return float(x[ok].mean()) if ok.any() else float("nan")


def image_mean(table: ImageTable, metric: str) -> float:
    """Mean over images of :func:`per_image` (undefined images excluded); NaN when none is defined."""
    return nanmean(per_image(table, metric))


def fmt_num(v: float, digits: int = 3) -> str:
    """``v`` with ``digits`` decimals; ``–`` for NaN/None."""
    return "–" if v is None or not np.isfinite(v) else f"{v:.{digits}f}"


def fmt_pm(mean: float, sd: float, digits: int = 3) -> str:
    """``mean ± sd`` (``–`` for an undefined mean; the SD omitted when undefined)."""
    if mean is None or not np.isfinite(mean):
        return "–"
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None and np.isfinite(sd) else "")


def flat_columns(columns: pd.Index) -> list[str]:
    """Column labels as single strings: the levels of a MultiIndex joined with a space (empty levels dropped)."""
    if isinstance(columns, pd.MultiIndex):
        return [" ".join(str(x) for x in c if str(x)) for c in columns]
    return [str(c) for c in columns]
