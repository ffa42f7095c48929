"""(d) External same-task transfer, the MSB paper's Figure 4 (MedSegBenchmarker, §4.2 "External Same-task
Cross-Dataset Evaluation"): every fold checkpoint and the strict-majority fold ensemble
(:mod:`msb.study.ensemble`: foreground where more than half of the K folds say so) on an external set, scored
from the stored counts under ``evaluation/external/<name>/`` (the ontology mapping, e.g. two polyp classes merged
into one, was applied when those counts were written; :mod:`msb.study.external`).

Scores are pooled-foreground (global-micro) Dice, IoU, precision and recall: counts summed over the set's images
(and foreground classes) before one ratio. Table rows: external set x architecture x input size; columns: folds
``K``, fold Dice mean ± SD (sample SD, ddof 1) and range, then the ensemble's Dice, IoU, precision, recall.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from msb.analysis.report.figures import _figure, color
from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable, evaluation_rows, fmt_num, fmt_pm
from msb.analysis.protocol.inputs import check_one_protocol
from msb.analysis.counts.rules import image_table, rule_values

__all__ = ["external_transfer", "external_transfer_table", "external_transfer_figure"]

_METRICS = ("dice", "iou", "precision", "recall")


def _scores(df: pd.DataFrame, label: str) -> dict[str, float]:
    t = image_table(df, label)
    return {m: float(rule_values(t, "global-micro", m)[0]) for m in _METRICS}


def external_transfer(counts: pd.DataFrame, allow_mixed_protocols: bool = False) -> pd.DataFrame:
    """Pooled-foreground scores of every fold run and fold ensemble on every external set.

    Args:
        counts: study counts rows (external evaluations, best checkpoint, are used).
        allow_mixed_protocols: put rows of different split policies in one table.

    Returns:
        Tidy rows ``dataset, architecture, input_size, member`` (``fold<j>`` or ``ensemble``), ``fold``
        (-1 for the ensemble), ``run_id, n_images, dice, iou, precision, recall``.

    Raises:
        MSBError: mixed split protocols (unless allowed).
        AnalysisSkipped: no external evaluation.
    """
    rows = evaluation_rows(counts, "external", ensembles=True)
    if rows.empty:
        raise AnalysisSkipped("no external evaluation (counts under evaluation/external/<name>/); declare "
                              "final.external in the study")
    out = []
    for ds, block in rows.groupby("dataset", sort=True):
        check_one_protocol(block, f"external transfer to {ds}", allow_mixed_protocols)
        for (arch, size, rid), g in block.groupby(["architecture", "input_size", "run_id"], sort=True):
            ens = bool(g["is_ensemble"].iloc[0])
            fold = -1 if ens else int(g["fold"].iloc[0])
            member = "ensemble" if ens else (f"fold{fold}" if fold >= 0 else "single")
            out.append({"dataset": ds, "architecture": arch, "input_size": int(size), "member": member,
                        "fold": fold, "run_id": rid, "n_images": int(g["image_id"].nunique()),
                        **_scores(g, f"{rid} on {ds}")})
    return pd.DataFrame(out)


def external_transfer_table(tidy: pd.DataFrame) -> PaperTable:
    """Paper-style table of :func:`external_transfer` output (module docstring)."""
    cols = pd.MultiIndex.from_tuples([("", "External set"), ("", "Architecture"), ("", "Size"),
                                      ("Folds", "K"), ("Folds", "DSC mean ± SD"), ("Folds", "DSC range"),
                                      ("Ensemble", "DSC"), ("Ensemble", "IoU"), ("Ensemble", "Precision"),
                                      ("Ensemble", "Recall")])
    vals, disp = [], []
    for (ds, arch, size), g in tidy.groupby(["dataset", "architecture", "input_size"], sort=True):
        f = g[g["member"] != "ensemble"]["dice"].to_numpy(dtype=np.float64)
        e = g[g["member"] == "ensemble"]
        ev = e.iloc[0] if len(e) else None
        mean = float(f.mean()) if f.size else np.nan
        sd = float(f.std(ddof=1)) if f.size > 1 else np.nan
        lo, hi = (float(f.min()), float(f.max())) if f.size else (np.nan, np.nan)
        ens = [float(ev[m]) if ev is not None else np.nan for m in _METRICS]
        vals.append([ds, arch, int(size), int(f.size), mean, f"{lo}–{hi}", *ens])
        disp.append([ds, arch, str(size) if size >= 0 else "?", str(f.size), fmt_pm(mean, sd),
                     f"{fmt_num(lo)}–{fmt_num(hi)}" if f.size else "–", *[fmt_num(v) for v in ens]])
    cap = ("External same-task transfer: pooled-foreground (global-micro) Dice of every fold checkpoint "
           "(mean ± sample SD, range) and of the strict-majority fold ensemble (foreground where more than half "
           "of the K folds predict it) with its IoU, precision and recall; no retraining or target-set tuning")
    return PaperTable("external_transfer", pd.DataFrame(vals, columns=cols), pd.DataFrame(disp, columns=cols), cap)


def external_transfer_figure(tidy: pd.DataFrame):
    """Per external set one panel: x = architecture (one offset per input size), small semi-transparent fold
    markers and a large ensemble marker of pooled-foreground Dice."""
    sets = sorted(set(tidy["dataset"]))
    archs = sorted(set(tidy["architecture"]))
    sizes = sorted(set(tidy["input_size"]))
    fig = _figure(max(4.5, 1.0 + 0.9 * len(archs)), 3.2 * len(sets))
    for k, ds in enumerate(sets):
        ax = fig.add_subplot(len(sets), 1, k + 1)
        g = tidy[tidy["dataset"] == ds]
        for j, size in enumerate(sizes):
            off = (j - (len(sizes) - 1) / 2) * 0.25
            for i, arch in enumerate(archs):
                h = g[(g["architecture"] == arch) & (g["input_size"] == size)]
                folds = h[h["member"] != "ensemble"]
                ens = h[h["member"] == "ensemble"]
                lab_f = f"folds, {size} px" if i == 0 else None
                ax.scatter(np.full(len(folds), i + off), folds["dice"], s=14, alpha=0.45, color=color(j),
                           label=lab_f)
                if len(ens):
                    ax.scatter(np.full(len(ens), i + off), ens["dice"], s=70, marker="D", color=color(j), edgecolor="black",
                               label=f"ensemble, {size} px" if i == 0 else None)
        ax.set_xticks(range(len(archs)), archs, rotation=30, ha="right")
        ax.set_ylabel("pooled foreground Dice (0-1)")
        ax.set_title(f"External set {ds}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
    return fig


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry."""
    tidy = external_transfer(art.counts, options.get("allow_mixed_protocols", False))
    t = external_transfer_table(tidy)
    notes = [f"{ds}/{a}/{s} px: no fold ensemble" for (ds, a, s), g in
             tidy.groupby(["dataset", "architecture", "input_size"]) if not (g["member"] == "ensemble").any()]
    return AnalysisOutput(tables=[t], figures=[("external_transfer", external_transfer_figure(tidy), t.caption)],
                          notes=notes, data={"external_transfer": tidy})
