"""Writing the protocol analyses: each table as CSV + LaTeX + Markdown, each figure as PNG (150 dpi) + SVG, every
file atomically (:mod:`msb.utils.atomic`).

* CSV: ``values`` (numbers at full precision; two-level column labels joined with a space), no index.
* LaTeX: ``display`` through pandas ``Styler.to_latex`` (booktabs rules, a two-level header as ``\\multicolumn``,
  text LaTeX-escaped, caption and ``tab:<name>`` label); needs ``\\usepackage{booktabs}``.
* Markdown: the caption in italics, then ``display`` as a pipe table
  (:func:`msb.analysis.report.tables.frame_to_markdown`, cells verbatim).
* Figures: :func:`msb.analysis.report.figures.save_figure` (PNG at the figure's 150 dpi, SVG; no date metadata).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from msb.analysis.report.figures import save_figure
from msb.analysis.protocol.common import PaperTable, flat_columns
from msb.analysis.report.tables import frame_to_markdown
from msb.utils.atomic import atomic_write_text

__all__ = ["table_csv", "table_latex", "table_markdown", "write_table", "write_figure", "write_frame",
           "log_skipped"]


def table_csv(t: PaperTable) -> str:
    """CSV text of ``t.values`` (columns flattened, no index)."""
    v = t.values.copy()
    v.columns = flat_columns(v.columns)
    return v.to_csv(index=False)


def table_latex(t: PaperTable) -> str:
    """LaTeX ``table`` of ``t.display`` (module docstring)."""
    d = t.display.copy()
    sty = d.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
    caption = (t.caption.replace("\\", r"\textbackslash{}").replace("&", r"\&").replace("%", r"\%")
               .replace("_", r"\_").replace("#", r"\#").replace("$", r"\$"))
    return sty.to_latex(hrules=True, caption=caption, label=f"tab:{t.name}", position_float="centering",
                        multicol_align="c", column_format="l" * d.shape[1])


def table_markdown(t: PaperTable) -> str:
    """Markdown of ``t.display``: caption line, then a pipe table (columns flattened)."""
    d = t.display.copy()
    d.columns = flat_columns(d.columns)
    return f"*{t.caption}*\n\n" + frame_to_markdown(d, index=False)


def write_table(t: PaperTable, out_dir: str | Path) -> list[Path]:
    """Write ``<out_dir>/<name>.csv``, ``.tex`` and ``.md`` atomically; returns the three paths."""
    out = Path(out_dir)
    paths = []
    for suffix, text in ((".csv", table_csv(t)), (".tex", table_latex(t)), (".md", table_markdown(t))):
        p = out / f"{t.name}{suffix}"
        atomic_write_text(p, text)
        paths.append(p)
    return paths


def write_figure(fig, name: str, out_dir: str | Path) -> list[Path]:
    """Write ``<out_dir>/<name>.png`` (150 dpi) and ``.svg`` atomically and close nothing (object-API figure);
    returns both paths."""
    png, svg = save_figure(fig, Path(out_dir) / name)
    return [png, svg]


def write_frame(df: pd.DataFrame, name: str, out_dir: str | Path) -> Path:
    """A tidy frame as ``<out_dir>/<name>.csv`` (atomic)."""
    p = Path(out_dir) / f"{name}.csv"
    atomic_write_text(p, df.to_csv(index=False))
    return p


def log_skipped(skipped_json: str | Path, log, prefix: str = "") -> None:
    """Log every skipped analysis (with its reason) and every note recorded in ``skipped.json``.

    Args:
        skipped_json: the ``skipped.json`` that :func:`msb.analysis.protocol.write_protocol_analyses` writes last
            (``{"skipped": {name: reason}, "notes": {name: [note, ...]}}``).
        log: a one-argument logger (``msb.utils.progress.Logger``).
        prefix: put before each analysis name (e.g. ``"analysis "``).

    Raises:
        OSError, json.JSONDecodeError: the file is missing or not JSON.
    """
    import json

    skipped = json.loads(Path(skipped_json).read_text(encoding="utf-8"))
    for name, reason in skipped["skipped"].items():
        log(f"{prefix}{name}: skipped: {reason}")
    for name, notes in skipped["notes"].items():
        for n in notes:
            log(f"{prefix}{name}: {n}")
