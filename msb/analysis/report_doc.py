"""The report document of :mod:`msb.analysis.report`: HTML (jinja2 template) and Markdown side by side.

:class:`ReportDoc` collects the content as blocks (headings, paragraphs, tables, figures, the checklist) per
section; :meth:`ReportDoc.render_html` fills the package template ``templates/report.html.j2`` with
autoescaping on (every text is escaped by jinja2; only pandas ``Styler`` tables, whose cells pandas escapes,
are inserted as markup). The Markdown twin is built at the same time (tables by
:func:`msb.analysis.tables.frame_to_markdown`). Tables are also written as CSV / LaTeX / Markdown files and
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

from msb.analysis.contract import ChecklistItem
from msb.analysis.figures import save_figure
from msb.analysis.tables import CITable, frame_to_markdown, to_html, to_latex, to_markdown
from msb.utils.atomic import atomic_write_text

__all__ = ["ReportDoc", "fmt_frame"]

_TEMPLATE = "report.html.j2"


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.PackageLoader("msb.analysis", "templates"), autoescape=True,
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
        self.figures: list[Path] = []
        self.tables: list[Path] = []
        self.checklist: tuple[ChecklistItem, ...] = ()
        self._intro: list[dict] = []
        self._sections: list[dict] = []
        self._blocks = self._intro  # blocks before the first section form the introduction

    def section(self, sid: str, title: str) -> None:
        """Start the section ``<section id="sid">`` headed ``title`` (Markdown ``## title``)."""
        self._blocks = []
        self._sections.append({"id": sid, "title": title, "blocks": self._blocks})
        self.md.append(f"\n## {title}\n")

    def sub(self, text: str) -> None:
        """A sub-heading (``<h3>``, Markdown ``###``)."""
        self._blocks.append({"kind": "h3", "text": text})
        self.md.append(f"\n### {text}\n")

    def text(self, text: str, cls: str = "") -> None:
        """A paragraph; ``cls="note"`` renders it as a note (grey in HTML, italic in Markdown)."""
        self._blocks.append({"kind": "p", "text": text, "cls": cls})
        self.md.append(("*" + text + "*" if cls == "note" else text) + "\n")

    def _raw(self, markup: str) -> None:
        self._blocks.append({"kind": "raw", "html": Markup(markup)})

    def frame(self, df: pd.DataFrame, caption: str = "", index: bool = False, digits: int = 4,
              name: str | None = None, p_values: bool = False) -> None:
        """A data table (cells formatted by :func:`fmt_frame`), optionally saved as ``data/<name>.csv``
        (unformatted values)."""
        shown = fmt_frame(df, digits, p_values)
        sty = shown.style.format(escape="html").format_index(escape="html", axis=1)
        if not index:
            sty = sty.hide(axis="index")
        if caption:
            sty = sty.set_caption(html.escape(caption))  # pandas does not escape captions
        self._raw(sty.to_html())
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
            [{"item": i.item, "result": "PASS" if i.passed else "FAIL", "evidence": i.evidence} for i in items]),
            index=False))

    def render_html(self, study: str, notes: Sequence[str] = ()) -> str:
        """The whole HTML page from ``templates/report.html.j2``.

        Args:
            study: the study name (title and ``<h1>``).
            notes: notes listed in a final ``<section id="notes">`` (omitted when empty).

        Returns:
            The document, self-contained (CSS inline, figures as data URIs), ending with a newline.
        """
        return _environment().get_template(_TEMPLATE).render(
            study=study, intro=self._intro, sections=self._sections, notes=list(notes))

    def markdown(self) -> str:
        """The Markdown twin (chunks joined with newlines)."""
        return "\n".join(self.md)
