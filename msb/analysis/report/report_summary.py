"""Writes the report's first screen (sections ``summary`` and ``checklist``, both open) into a
:class:`msb.analysis.report.report_doc.ReportDoc`, and the per-run training curves (from ``train_log.csv``).

The content comes from :mod:`msb.analysis.report.summary`; this module only lays it out: per test set a two-column
grid (question + protocol | leaderboard + paired-test result), the critical-difference diagram when a block
has >= 3 systems, then the reporting checklist with each item's evidence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from msb.analysis.report.contract import ChecklistItem, RunInfo
from msb.analysis.report.figures_study import cd_diagram, training_curves
from msb.analysis.counts.identical import IdenticalGroup
from msb.analysis.report.report_data import BlockData
from msb.analysis.report.report_doc import ReportDoc
from msb.analysis.report.summary import (BlockTests, distance_unit, leaderboard, protocol_rows, question,
                                  significance_sentences)

__all__ = ["write_summary", "write_checklist", "write_training_curves"]


def write_summary(doc: ReportDoc, runs: Sequence[RunInfo], counts: pd.DataFrame,
                  eval_dirs: Mapping[tuple[str, str], Path], block_data: Mapping[tuple[str, str], BlockData],
                  tests: Mapping[tuple[str, str], BlockTests], identical: Mapping[tuple[str, str], list[IdenticalGroup]],
                  metrics_df: pd.DataFrame | None, n_boot: int, level: float, seed: int = 0) -> None:
    """Section ``summary``: question, protocol, leaderboard per test set with CIs, significance, CD diagram.

    Args:
        doc: the report document; runs, counts, eval_dirs: as in :func:`msb.analysis.report.report.build_report`;
        block_data: per (dataset, split) analyses; tests: their paired analyses; identical: identical groups;
        metrics_df: boundary metrics rows (for the distance unit) or None; n_boot, level, seed: the statistics
        setting (the verdict's rank distribution uses the same replicates as the paired CIs).

    Each block opens with its verdict (:mod:`msb.analysis.report.verdict`); the rank distributions follow in the
    section ``ranks`` (:func:`msb.analysis.report.report_posthoc.write_rank_section`), and the post-hoc tables of
    ``msb reaggregate --analyses rank_stability,calibration,threshold`` in ``posthoc`` when written.
    """
    from msb.analysis.report.report_posthoc import write_posthoc_section, write_rank_section
    from msb.analysis.report.verdict import block_ranks, verdict_sentence

    dists = {}
    doc.section("summary", "Summary: which model is better, and how sure are we?", collapsed=False)
    unit = distance_unit(metrics_df)
    protocol = pd.DataFrame(protocol_rows(list(runs), counts, eval_dirs, n_boot, level),
                            columns=["protocol", "what was done"])
    for i, (key, b) in enumerate(block_data.items()):
        sfx = "" if len(block_data) == 1 else f"-{key[0]}-{key[1]}"
        labels = [s.label for s in b.systems]
        classes = sorted({c for s in b.systems for c in s.rows["class_name"].astype(str)})
        n_img = int(counts[(counts["dataset"] == key[0]) & (counts["split"] == key[1])]["image_id"].nunique())
        dists[key] = block_ranks(b.aligned, n_boot, level, seed)
        t = tests.get(key)
        line = verdict_sentence(dists[key], t.wilcoxon if t else None, t.differences if t else None, len(b.systems))
        if line:
            doc.text(line, "verdict")
        doc.columns(2)
        doc.text(question(key, labels, classes, n_img), "question")
        doc.frame(protocol, name="protocol" if i == 0 else None, html_id=f"protocol{sfx}")
        doc.next_column()
        doc.frame(leaderboard(b.scores, b.boundary, unit), name=f"leaderboard{sfx}", html_id=f"leaderboard{sfx}",
                  caption=f"Leaderboard {key[0]}/{key[1]} (best first; rank by image-macro Dice, higher is "
                  f"better; HD95 in {unit}, lower is better)")
        for line in significance_sentences(tests.get(key), len(b.systems), identical.get(key, ())):
            doc.text(line)
        doc.end_columns()
        fr = tests[key].friedman if key in tests else None
        if fr is not None:
            doc.figure("cd-diagram", f"cd-diagram{sfx}",
                       cd_diagram(fr.mean_ranks, fr.posthoc, fr.n, title=f"{key[0]}/{key[1]}: mean Dice rank"),
                       f"Critical-difference diagram (Demšar 2006): mean per-image Dice ranks, systems joined by a "
                       f"bar are not separated by the {fr.posthoc_test} test at 0.05")
    write_rank_section(doc, dists)
    write_posthoc_section(doc, sorted({r.run_dir.parent for r in runs}))


def write_checklist(doc: ReportDoc, items: Sequence[ChecklistItem]) -> None:
    """Section ``checklist`` (open): each item's PASS / FAIL / N/A and its evidence."""
    doc.section("checklist", "Reporting checklist", collapsed=False)
    doc.checklist_table(items)


def write_training_curves(doc: ReportDoc, runs: Mapping[str, RunInfo], labels_by_run: Mapping[str, str]) -> None:
    """Figure ``training-curves``: train/val loss and val Dice per epoch of every run with a ``train_log.csv``
    (folds of one system overlaid), or a placeholder saying why there is none."""
    logs: dict[str, list[tuple[str, pd.DataFrame]]] = {}
    for rid, r in sorted(runs.items()):
        if r.train_log is not None and len(r.train_log) and {"epoch", "val_dice"} <= set(r.train_log.columns):
            logs.setdefault(labels_by_run.get(rid, rid), []).append((rid, r.train_log))
    if not logs:
        doc.missing_figure("training-curves", "training-curves", "no run has a train_log.csv")
        return
    doc.figure("training-curves", "training-curves", training_curves(logs),
               "Training curves from train_log.csv: train loss (solid) and val loss (dashed), val Dice per epoch; "
               "folds of one system overlaid in its colour")
