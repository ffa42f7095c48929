"""The report document of :mod:`msb.analysis.report.report`: HTML (jinja2 template) and Markdown side by side.

:class:`ReportDoc` collects the content as blocks (headings, paragraphs, tables, figures, the checklist) per
section; :meth:`ReportDoc.render_html` fills the package template ``templates/report.html.j2`` with
autoescaping on (every text is escaped by jinja2; only pandas ``Styler`` tables, whose cells pandas escapes,
are inserted as markup). The Markdown twin is built at the same time (tables by
:func:`msb.analysis.report.tables.frame_to_markdown`). Tables are also written as CSV / LaTeX / Markdown files and
figures as PNG + SVG below the output folder.
"""

from __future__ import annotations

import base64
import functools
import html
from collections.abc import Sequence
from pathlib import Path

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

from msb.analysis.report.contract import ChecklistItem
from msb.analysis.report.figures import save_figure
from msb.analysis.report.tables import CITable, frame_to_markdown, to_html, to_latex, to_markdown
from msb.utils.atomic import atomic_write_text

__all__ = ["ReportDoc", "fmt_frame"]

_TEMPLATE = "report.html.j2"
#: The one stylesheet of the report, inlined into ``<style>`` (the page stays self-contained).
_STYLESHEET = "report.css"


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("msb.analysis.report", "templates"), autoescape=True,
                              trim_blocks=True, keep_trailing_newline=True, undefined=jinja2.StrictUndefined)


def fmt_frame(df: pd.DataFrame, digits: int, p_values: bool = False) -> pd.DataFrame:
    """Cells as text for display.

    Args:
        df: any table.
        digits: float columns get ``digits`` decimals; p-value columns (name starting with ``p_``, or every
            float column when ``p_values``) get ``digits`` significant digits so small p-values stay visible.
        p_values: treat every float column as p-values.

    Returns:
        A copy of ``df`` with ``str`` cells; non-finite floats become ``"n/a"``.
    """
    out = df.copy()
    for c in out.columns:
        if out[c].dtype.kind == "f":
            sig = p_values or str(c).startswith("p_")
            out[c] = [("n/a" if not np.isfinite(v) else (f"{v:.{digits}g}" if sig else f"{v:.{digits}f}"))
                      for v in out[c]]
        else:
            out[c] = out[c].astype(str)
    return out


class ReportDoc:
    """Collects the report's HTML blocks (rendered by the jinja2 template) and its Markdown side by side.

    Attributes:
        out: the output folder (tables go to ``out/data`` and ``out/tables``, figures to ``out/figures``).
        md: Markdown chunks, joined with newlines by :meth:`markdown`.
        figures, tables: files written so far.
        checklist: the checklist items shown (set by :meth:`checklist_table`).
    """

    def __init__(self, out: Path) -> None:
        self.out = out
        self.md: list[str] = []
        self._intro_md = self.md  # Markdown before the first section
        self.figures: list[Path] = []
        self.tables: list[Path] = []
        self.checklist: tuple[ChecklistItem, ...] = ()
        self._intro: list[dict] = []
        self._sections: list[dict] = []
        self._blocks = self._intro  # blocks before the first section form the introduction

    def section(self, sid: str, title: str, collapsed: bool = True) -> None:
        """Start the section ``<section id="sid">`` headed ``title`` (Markdown ``## title``); a ``collapsed``
        section is a closed ``<details>`` element (its heading is the ``<summary>``)."""
        self._blocks = []
        self.md = [f"\n## {title}\n"]
        self._sections.append({"id": sid, "title": title, "blocks": self._blocks, "collapsed": collapsed,
                               "md": self.md})

    def columns(self, n: int = 2) -> list[list[dict]]:
        """Start a responsive grid of ``n`` columns (one column below 900 px); the following blocks go to the
        first column until :meth:`next_column`; :meth:`end_columns` returns to the section."""
        cols: list[list[dict]] = [[] for _ in range(n)]
        self._blocks.append({"kind": "grid", "columns": cols})
        self._grid = (self._blocks, cols, 0)
        self._blocks = cols[0]
        return cols

    def next_column(self) -> None:
        """Continue in the next grid column (:meth:`columns`)."""
        outer, cols, i = self._grid
        self._grid = (outer, cols, i + 1)
        self._blocks = cols[i + 1]

    def end_columns(self) -> None:
        """Close the grid (:meth:`columns`)."""
        self._blocks = self._grid[0]

    def move_first(self, *sids: str) -> None:
        """Put the sections ``sids`` (in that order) before all others, in the HTML and the Markdown."""
        first = [s for sid in sids for s in self._sections if s["id"] == sid]
        self._sections[:] = first + [s for s in self._sections if s["id"] not in sids]

    def link_csv(self, df: pd.DataFrame, name: str, caption: str, index: bool = False) -> None:
        """Save ``df`` as ``data/<name>.csv`` and show a download link instead of the table (tidy tables)."""
        p = self.out / "data" / f"{name}.csv"
        atomic_write_text(p, df.to_csv(index=index))
        self.tables.append(p)
        self._blocks.append({"kind": "csv", "href": f"data/{name}.csv", "caption": caption,
                             "shape": f"{len(df)} rows x {df.shape[1]} columns"})
        self.md.append(f"[{caption} (CSV, {len(df)} rows)](data/{name}.csv)\n")

    def sub(self, text: str) -> None:
        """A sub-heading (``<h3>``, Markdown ``###``)."""
        self._blocks.append({"kind": "h3", "text": text})
        self.md.append(f"\n### {text}\n")

    def text(self, text: str, cls: str = "") -> None:
        """A paragraph; ``cls="note"`` renders it as a note (grey in HTML, italic in Markdown)."""
        self._blocks.append({"kind": "p", "text": text, "cls": cls})
        self.md.append(("*" + text + "*" if cls == "note" else text) + "\n")

    def _raw(self, markup: str, html_id: str = "") -> None:
        """A table's markup, in a box that scrolls horizontally by itself (never the page)."""
        ident = f' id="{html.escape(html_id)}"' if html_id else ""
        self._blocks.append({"kind": "raw", "html": Markup(f'<div class="table-wrap"{ident}>{markup}</div>')})

    def frame(self, df: pd.DataFrame, caption: str = "", index: bool = False, digits: int = 4,
              name: str | None = None, p_values: bool = False, html_id: str = "") -> None:
        """A data table (cells formatted by :func:`fmt_frame`), optionally saved as ``data/<name>.csv``
        (unformatted values); ``html_id`` names its box in the HTML."""
        shown = fmt_frame(df, digits, p_values)
        sty = shown.style.format(escape="html").format_index(escape="html", axis=1)
        if not index:
            sty = sty.hide(axis="index")
        else:
            sty = sty.hide(axis="index", names=True)  # no stray header row holding the index name
        if caption:
            sty = sty.set_caption(html.escape(caption))  # pandas does not escape captions
        self._raw(sty.to_html(), html_id)
        self.md.append((f"*{caption}*\n\n" if caption else "") + frame_to_markdown(shown, index=index))
        if name:
            p = self.out / "data" / f"{name}.csv"
            atomic_write_text(p, df.to_csv(index=index))
            self.tables.append(p)

    def ci_table(self, t: CITable, name: str) -> None:
        """A publication table, also saved as ``tables/<name>.tex`` and ``tables/<name>.md``."""
        self._raw(to_html(t))
        md = to_markdown(t)
        self.md.append(md)
        for suffix, text in ((".tex", to_latex(t, label=f"tab:{name}")), (".md", md)):
            p = self.out / "tables" / f"{name}{suffix}"
            atomic_write_text(p, text)
            self.tables.append(p)

    def figure(self, fid: str, name: str, fig, caption: str) -> None:
        """Save ``fig`` as ``figures/<name>.png|svg`` and show it (PNG embedded as base64 in the HTML,
        linked in the Markdown)."""
        png, svg = save_figure(fig, self.out / "figures" / name)
        self.figures.extend([png, svg])
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        self._blocks.append({"kind": "figure", "fid": fid, "name": name, "caption": caption, "png_base64": data})
        self.md.append(f"![{caption}](figures/{png.name})\n\n*{caption}* ([SVG](figures/{svg.name}))\n")

    def missing_figure(self, fid: str, name: str, reason: str) -> None:
        """A placeholder stating why the figure is not applicable."""
        self._blocks.append({"kind": "missing-figure", "fid": fid, "name": name, "reason": reason})
        self.md.append(f"*Figure {name}: not applicable: {reason}*\n")

    def checklist_table(self, items: Sequence[ChecklistItem]) -> None:
        """The reporting checklist as a PASS/FAIL table (``<table id="checklist-table">``)."""
        self.checklist = tuple(items)
        self._blocks.append({"kind": "checklist", "items": self.checklist})
        self.md.append(frame_to_markdown(pd.DataFrame(
            [{"item": i.item, "result": i.status, "evidence": i.evidence} for i in items]), index=False))

    def render_html(self, study: str, notes: Sequence[str] = ()) -> str:
        """The whole HTML page from ``templates/report.html.j2``.

        Args:
            study: the study name (title and ``<h1>``).
            notes: notes listed in a final ``<section id="notes">`` (omitted when empty).

        Returns:
            The document, self-contained (CSS inline, figures as data URIs), ending with a newline.
        """
        env = _environment()
        return env.get_template(_TEMPLATE).render(
            study=study, intro=self._intro, sections=self._sections, notes=list(notes),
            stylesheet=Markup(env.loader.get_source(env, _STYLESHEET)[0]))

    def markdown(self, tail: str = "") -> str:
        """The Markdown twin (introduction, the sections in their current order, then ``tail``), chunks joined
        with newlines."""
        return "\n".join(self._intro_md + [c for s in self._sections for c in s["md"]] + ([tail] if tail else []))
