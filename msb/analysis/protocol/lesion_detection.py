"""(e) Lesion-level detection pooled over test sets, the polyp audit's Table 5 and its IoU-threshold robustness
("Metrics or Mirage?", §6.2 and "Lesion-detection robustness").

From the stored predictions (``predictions/<image_id>.npz``: ``pred``, ``ref`` bool (C, H, W); the foreground
classes are merged per image), lesions are the 8-connected components of the reference and the prediction,
matched per image by :func:`msb.evaluation.lesion.match_lesions_many` (components labelled once) under any-overlap, centroid-in-GT
(``centroid_in_reference``) and one-to-one IoU ≥ t. Counts are pooled over all images of all used test sets
before the ratios: sensitivity = Σ tp / Σ reference lesions, precision = Σ matched predicted components /
Σ predicted components, F1 = their harmonic mean. The robustness curve repeats the IoU rule for
t = 0.10, 0.15, ..., 0.75.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from msb.analysis.report.figures import _figure, color
from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable, evaluation_rows, fmt_num
from msb.analysis.protocol.inputs import check_one_protocol
from msb.evaluation.lesion import match_lesions_many
from msb.utils.evaluation_folder import check_predictions

__all__ = ["IOU_THRESHOLDS", "CRITERIA", "lesion_counts", "pooled_scores", "lesion_table", "lesion_curve_figure"]

#: IoU thresholds of the robustness curve (0.10 to 0.75 in steps of 0.05).
IOU_THRESHOLDS: tuple[float, ...] = tuple(round(0.10 + 0.05 * i, 2) for i in range(14))
#: The table's criteria: (label, criterion, IoU threshold).
CRITERIA: tuple[tuple[str, str, float], ...] = (("any-overlap", "any_overlap", 0.5),
                                                 ("centroid-in-GT", "centroid_in_reference", 0.5),
                                                 ("IoU≥0.5", "iou", 0.5))


def _load(eval_dir: str, image_id: str) -> tuple[np.ndarray, np.ndarray]:
    with np.load(f"{eval_dir}/predictions/{image_id}.npz") as z:
        return np.asarray(z["pred"], dtype=bool).any(axis=0), np.asarray(z["ref"], dtype=bool).any(axis=0)


def lesion_counts(counts: pd.DataFrame, thresholds: Sequence[float] = IOU_THRESHOLDS,
                  allow_mixed_protocols: bool = False) -> pd.DataFrame:
    """Per system and criterion, lesion counts summed over every image of every test set with predictions.

    Args:
        counts: study counts rows (non-ensemble, best checkpoint; their ``eval_dir`` must hold ``predictions/``).
        thresholds: IoU thresholds of the curve.
        allow_mixed_protocols: pool rows of different split policies.

    Returns:
        ``architecture, input_size, criterion`` (``any_overlap``, ``centroid_in_reference``, ``iou``),
        ``iou_threshold`` (NaN for the first two), ``tp, fn, fp, tp_pred, n_ref, n_pred, n_images, n_sets``.

    Raises:
        AnalysisSkipped: no evaluation has stored predictions. MSBError: a prediction differs from its digest;
        mixed protocols (unless allowed).
    """
    rows = evaluation_rows(counts, None)
    dirs = [d for d in sorted(set(rows["eval_dir"])) if (Path(d) / "predictions").is_dir()]
    rows = rows[rows["eval_dir"].isin(dirs)]
    if rows.empty:
        raise AnalysisSkipped("no evaluation folder with stored predictions (predictions/*.npz)")
    check_one_protocol(rows, "lesion detection table", allow_mixed_protocols)
    for d in dirs:
        check_predictions(d, rows.loc[rows["eval_dir"] == d, "image_id"].astype(str).unique())
    crit = [("any_overlap", np.nan), ("centroid_in_reference", np.nan)] + [("iou", t) for t in thresholds]
    if 0.5 not in thresholds:
        crit.append(("iou", 0.5))
    rules = [(c, 0.5 if np.isnan(t) else t) for c, t in crit]
    out = []
    for (arch, size), g in rows.groupby(["architecture", "input_size"], sort=True):
        units = g[["eval_dir", "image_id"]].drop_duplicates()
        acc = np.zeros((len(crit), 6), dtype=np.int64)
        for d, img in units.itertuples(index=False):
            pred, ref = _load(d, str(img))
            for k, m in enumerate(match_lesions_many(pred, ref, rules)):
                acc[k] += (m.tp, m.fn, m.fp, m.tp_pred, m.n_ref, m.n_pred)
        n_sets = int(g.groupby(["dataset", "split"]).ngroups)
        for (c, t), a in zip(crit, acc):
            out.append({"architecture": arch, "input_size": int(size), "criterion": c, "iou_threshold": t,
                        **dict(zip(("tp", "fn", "fp", "tp_pred", "n_ref", "n_pred"), map(int, a))),
                        "n_images": len(units), "n_sets": n_sets})
    return pd.DataFrame(out)


def pooled_scores(tidy: pd.DataFrame) -> pd.DataFrame:
    """Add ``sensitivity = tp / n_ref``, ``precision = tp_pred / n_pred`` and ``f1`` (harmonic mean; NaN when both
    are undefined, 0 when one is 0) to :func:`lesion_counts` rows."""
    t = tidy.copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        sens = np.where(t["n_ref"] > 0, t["tp"] / t["n_ref"].where(t["n_ref"] > 0, 1), np.nan)
        prec = np.where(t["n_pred"] > 0, t["tp_pred"] / t["n_pred"].where(t["n_pred"] > 0, 1), np.nan)
        f1 = np.where((sens + prec) > 0, 2 * sens * prec / (sens + prec), np.where(np.isnan(sens + prec), np.nan, 0.0))
    t["sensitivity"], t["precision"], t["f1"] = sens, prec, f1
    return t


def _label(arch: str, size: int) -> str:
    return arch if size < 0 else f"{arch} ({size})"


def lesion_table(scores: pd.DataFrame) -> PaperTable:
    """Table 5 layout: rows = models, per criterion Sens, Prec, F1."""
    cols = pd.MultiIndex.from_tuples([("", "Model")] + [(lab, m) for lab, _, _ in CRITERIA
                                                        for m in ("Sens", "Prec", "F1")])
    vals, disp = [], []
    for (arch, size), g in scores.groupby(["architecture", "input_size"], sort=True):
        v, d = [_label(arch, size)], [_label(arch, size)]
        for _, c, t in CRITERIA:
            r = g[(g["criterion"] == c) & ((g["iou_threshold"] == t) if c == "iou" else True)].iloc[0]
            x = [r["sensitivity"], r["precision"], r["f1"]]
            v += x
            d += [fmt_num(y) for y in x]
        vals.append(v)
        disp.append(d)
    g0 = scores.iloc[0]
    cap = (f"Lesion-level detection (8-connected components, foreground classes merged) pooled over "
           f"{int(g0['n_sets'])} test set(s), {int(g0['n_images'])} images: sensitivity, precision and F1 under "
           "any-overlap, centroid-in-GT and one-to-one IoU ≥ 0.5 matching")
    return PaperTable("lesion", pd.DataFrame(vals, columns=cols), pd.DataFrame(disp, columns=cols), cap)


def lesion_curve_figure(scores: pd.DataFrame):
    """Sensitivity, precision and F1 against the IoU threshold (0.10-0.75), one line per model."""
    cur = scores[scores["criterion"] == "iou"].sort_values("iou_threshold")
    fig = _figure(9.0, 3.0)
    for k, m in enumerate(("sensitivity", "precision", "f1")):
        ax = fig.add_subplot(1, 3, k + 1)
        for i, ((arch, size), g) in enumerate(cur.groupby(["architecture", "input_size"], sort=True)):
            ax.plot(g["iou_threshold"], g[m], marker="o", ms=3, color=color(i), label=_label(arch, size))
        ax.set_xlabel("IoU threshold t (match if IoU ≥ t)")
        ax.set_ylabel(f"lesion {m} (0-1)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=7)
    return fig


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry: pooled over every test set with predictions (``lesion_sets``: only these datasets)."""
    counts = art.counts
    if options.get("lesion_sets"):
        counts = counts[counts["dataset"].isin(list(options["lesion_sets"]))]
    scores = pooled_scores(lesion_counts(counts, allow_mixed_protocols=options.get("allow_mixed_protocols", False)))
    t = lesion_table(scores)
    curve = scores[scores["criterion"] == "iou"]
    return AnalysisOutput(tables=[t], figures=[("lesion_iou_curve", lesion_curve_figure(scores),
                                                "Lesion sensitivity, precision and F1 over IoU thresholds 0.10-0.75")],
                          data={"lesion_counts": scores, "lesion_iou_curve": curve})
