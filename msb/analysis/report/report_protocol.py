"""The report section ``protocol``: the published protocols' analyses (:mod:`msb.analysis.protocol`) of the study,
each table shown and written as ``tables/<name>.csv|tex|md``, each figure as ``figures/<name>.png|svg``, and the
analyses whose inputs the study lacks (or that mix split protocols) listed with their one-line reason (also in
``data/protocol_skipped.json``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from msb.analysis.protocol import ANALYSES, load_study, run_analyses
from msb.analysis.protocol.common import flat_columns
from msb.analysis.protocol.writers import write_table
from msb.analysis.report.report_contrasts import write_contrasts_section
from msb.analysis.report.report_doc import ReportDoc
from msb.utils.atomic import atomic_write_text

__all__ = ["TITLES", "write_protocol_section"]

#: Sub-headings of the analyses in the report.
TITLES: dict[str, str] = {
    "ranking_sensitivity": "Ranking sensitivity to re-aggregation (G / I / C)",
    "resolution_delta": "Paired resolution change ΔDSC",
    "efficiency": "Inference efficiency at batch size 1",
    "external_transfer": "External same-task transfer (folds and ensemble)",
    "p1": "P1: Dice, recall, HD95 per test set", "p2": "P2: random-split seeds",
    "p3": "P3: pooled and per centre", "lesion": "Lesion-level detection",
    "wilcoxon": "Paired Wilcoxon tests per test set (BH)", "checklist": "Polyp Segmentation Reporting Checklist",
    "semi_supervised": "Semi-supervised protocol: methods x labelled fractions x seeds",
}


def write_protocol_section(doc: ReportDoc, study_dir: Path, notes: list[str],
                           analyses: Sequence[str] = tuple(ANALYSES), **options) -> None:
    """Add the section ``protocol`` ("Published protocols") to the report.

    Args:
        doc: the report document (tables and figures go below ``doc.out``).
        study_dir: the study folder (searched again by :func:`~msb.analysis.protocol.load_study`; hidden
            folders such as the report's staging folder are skipped).
        notes: the report's notes (the loader's remarks are appended).
        analyses: names (default all); ``options``: as :func:`~msb.analysis.protocol.run_analyses`.

    A split-protocol refusal does not stop the report: the analysis is listed as refused with the message.
    """
    write_contrasts_section(doc, study_dir)  # a pool-contrast study's table, when `msb contrasts` wrote it
    art = load_study(study_dir, exclude=(doc.out,))
    notes.extend(art.notes)
    outputs, skipped = run_analyses(art, analyses, options, refusals_as_skips=True)
    doc.section("protocol", "Published protocols: MSB case study and polyp audit analyses")
    doc.text("Tables in the layout of the MSB case study and of the polyp evaluation audit, recomputed from the "
             "stored counts, metrics, predictions and profile tables (docs/protocols.md).")
    for name, out in outputs.items():
        doc.sub(TITLES.get(name, name))
        for t in out.tables:
            shown = t.display.copy()
            shown.columns = flat_columns(shown.columns)
            doc.frame(shown, caption=t.caption, html_id=f"protocol-{t.name}")
            doc.tables.extend(write_table(t, doc.out / "tables"))
        for fname, fig, caption in out.figures:
            doc.figure(fname, fname, fig, caption)
        for note in out.notes:
            doc.text(note, "note")
    for name, reason in skipped.items():
        doc.text(f"{TITLES.get(name, name)}: not shown: {reason}", "note")
    p = doc.out / "data" / "protocol_skipped.json"
    atomic_write_text(p, json.dumps(skipped, indent=2, ensure_ascii=False) + "\n")
    doc.tables.append(p)
