"""Publication tables: values with confidence intervals, the best value per column marked, as LaTeX,
Markdown and HTML (pandas ``Styler``; LaTeX bold via ``\\textbf``, HTML via ``font-weight: bold``, Markdown
via ``**``).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from msb.analysis.counts.rules import lower_is_better
from msb.errors import MSBError

__all__ = ["CITable", "ci_table", "scores_ci_table", "to_latex", "to_markdown", "to_html",
           "frame_to_markdown"]

_METRIC_LABELS = {"dice": "Dice", "iou": "IoU", "precision": "Precision", "recall": "Recall", "hd95": "HD95"}


@dataclass(frozen=True)
class CITable:
    """A formatted table: ``display`` holds the cell strings (``"0.8123 [0.8011, 0.8230]"``), ``best`` is a
    boolean frame of the same shape marking the best value of each column, ``caption`` describes it."""

    display: pd.DataFrame
    best: pd.DataFrame
    caption: str


def _fmt(v: float, digits: int) -> str:
    return "n/a" if v is None or not np.isfinite(v) else f"{v:.{digits}f}"


def ci_table(values: pd.DataFrame, low: pd.DataFrame | None = None, high: pd.DataFrame | None = None,
             lower_better: Mapping[str, bool] | None = None, digits: int = 4, caption: str = "") -> CITable:
    """Format values (and CIs) and mark the best value per column.

    Args:
        values: rows (e.g. systems) x columns (e.g. rules), float.
        low, high: CI bounds with the same index/columns (optional).
        lower_better: column -> True when smaller is better (default False for every column).
        digits: decimals.
        caption: table caption.

    Returns:
        :class:`CITable`. Ties for best are all marked; NaN is never best.
    """
    lower_better = dict(lower_better or {})
    disp = pd.DataFrame(index=values.index, columns=values.columns, dtype=object)
    best = pd.DataFrame(False, index=values.index, columns=values.columns)
    for col in values.columns:
        v = values[col].to_numpy(dtype=np.float64)
        for i, idx in enumerate(values.index):
            cell = _fmt(v[i], digits)
            if low is not None and high is not None:
                lo, hi = float(low.loc[idx, col]), float(high.loc[idx, col])
                if np.isfinite(lo) and np.isfinite(hi):
                    cell += f" [{_fmt(lo, digits)}, {_fmt(hi, digits)}]"
            disp.loc[idx, col] = cell
        if np.isfinite(v).any():
            target = np.nanmin(v) if lower_better.get(col, False) else np.nanmax(v)
            best[col] = np.isclose(v, target, rtol=0, atol=0.5 * 10 ** -digits) & np.isfinite(v)
    return CITable(disp, best, caption)


def scores_ci_table(tidy: pd.DataFrame, metric: str, system_col: str = "system",
                    rules: Sequence[str] | None = None, digits: int = 4) -> CITable:
    """One metric's table: rows = systems, columns = aggregation rules, cells ``value [ci_low, ci_high]``.

    Args:
        tidy: rows ``system_col, aggregation, metric, value`` and optionally ``ci_low, ci_high``, ``ci_level``.
        metric: the metric to show.
        rules: columns (default: the rules in the table, in order).

    Raises:
        MSBError: no row for ``metric``.
    """
    t = tidy[tidy["metric"] == metric]
    if t.empty:
        raise MSBError(f"no scores for metric {metric!r} in the table")
    rules = list(rules) if rules is not None else list(dict.fromkeys(t["aggregation"]))
    systems = list(dict.fromkeys(t[system_col].astype(str)))
    piv = t.assign(_s=t[system_col].astype(str)).pivot_table(index="_s", columns="aggregation", values="value",
                                                              aggfunc="first", dropna=False)
    piv = piv.reindex(index=systems, columns=rules)
    low = high = None
    level = ""
    if "ci_low" in t.columns and t["ci_low"].notna().any():
        low = t.assign(_s=t[system_col].astype(str)).pivot_table(index="_s", columns="aggregation", values="ci_low",
                                                                 aggfunc="first", dropna=False)
        high = t.assign(_s=t[system_col].astype(str)).pivot_table(index="_s", columns="aggregation",
                                                                  values="ci_high", aggfunc="first", dropna=False)
        low, high = low.reindex(index=systems, columns=rules), high.reindex(index=systems, columns=rules)
        if "ci_level" in t.columns:
            level = f", {100 * float(t['ci_level'].dropna().iloc[0]):.0f}% percentile bootstrap CI in brackets"
    piv.index.name = system_col
    label = _METRIC_LABELS.get(metric, metric)
    lb = {c: lower_is_better(metric) for c in rules}
    return ci_table(piv, low, high, lb, digits, caption=f"{label} per aggregation rule (best in bold{level})")


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def _latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in text)


def _style(t: CITable, prop: str):
    props = np.where(t.best.to_numpy(), prop, "")
    return t.display.style.apply(lambda _: props, axis=None)


def to_latex(t: CITable, label: str | None = None) -> str:
    """LaTeX ``tabular`` in a ``table`` environment (booktabs rules), best cells ``\\textbf{}``, text escaped."""
    sty = _style(t, "textbf:--rwrap;").format(escape="latex").format_index(escape="latex", axis=0)
    sty = sty.format_index(escape="latex", axis=1)
    return sty.to_latex(hrules=True, caption=_latex_escape(t.caption) or None, label=label, position_float="centering",
                        column_format="l" + "r" * t.display.shape[1])


def to_html(t: CITable) -> str:
    """HTML table (pandas Styler), best cells bold, caption above; the row-index name (e.g. ``system``) heads the
    corner cell instead of a header row of its own."""
    corner = t.display.index.name
    t = CITable(t.display.rename_axis(index=None, columns=corner), t.best, t.caption)
    sty = _style(t, "font-weight: bold;").format(escape="html").format_index(escape="html", axis=0)
    sty = sty.format_index(escape="html", axis=1)
    if t.caption:
        sty = sty.set_caption(html.escape(t.caption))
    return sty.to_html()


def _md_cell(v) -> str:
    return str(v).replace("|", "\\|").replace("\n", " ")


def frame_to_markdown(df: pd.DataFrame, index: bool = True, bold: pd.DataFrame | None = None) -> str:
    """GitHub-flavoured Markdown pipe table of ``df``, rendered by :meth:`pandas.DataFrame.to_markdown`
    (``tabulate``, ``tablefmt="pipe"``, columns padded and left-aligned).

    Every cell is shown as ``str(value)`` verbatim (``disable_numparse``: ``"0.8000"`` stays ``"0.8000"``),
    with ``|`` escaped as ``\\|`` and newlines replaced by spaces so that a cell never breaks the table.

    Args:
        df: the table (any dtypes); column labels become the header.
        index: add the index as the first column, headed by ``df.index.name`` (empty when unnamed).
        bold: optional boolean frame of ``df``'s shape (same row/column order); ``True`` cells are wrapped
            in ``**``.

    Returns:
        The table as text ending with a newline: header row, alignment row, one row per row of ``df``.

    Raises:
        ValueError: ``bold`` has a different shape than ``df``.
    """
    if bold is not None and bold.shape != df.shape:
        raise ValueError(f"bold mask shape {bold.shape} differs from the table shape {df.shape}")
    mask = np.zeros(df.shape, dtype=bool) if bold is None else bold.to_numpy(dtype=bool)
    headers = ([_md_cell(df.index.name or "")] if index else []) + [_md_cell(c) for c in df.columns]
    rows = []
    for i, (idx, row) in enumerate(zip(df.index, df.itertuples(index=False, name=None))):
        cells = [_md_cell(v) for v in row]
        cells = [f"**{c}**" if mask[i, j] else c for j, c in enumerate(cells)]
        rows.append(([_md_cell(idx)] if index else []) + cells)
    cells = pd.DataFrame(rows, columns=range(len(headers)), dtype=object)
    return cells.to_markdown(index=False, headers=headers, tablefmt="pipe", disable_numparse=True) + "\n"


def to_markdown(t: CITable) -> str:
    """Markdown pipe table, best cells ``**bold**``, caption as an italic line above."""
    head = f"*{t.caption}*\n\n" if t.caption else ""
    return head + frame_to_markdown(t.display, index=True, bold=t.best)
