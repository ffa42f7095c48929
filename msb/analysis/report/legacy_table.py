"""The LEGACY six-metric table of the PraNet template, per model x dataset, from metrics tables.

Old polyp papers (PraNet, Polyp-PVT, SANet, ...) print one table: rows = models, per test dataset the columns
mDice, mIoU, F^w_beta (weighted F), S_alpha (S-measure), E_phi (E-measure; the max in PraNet, the mean in
others) and MAE, all under the template's protocol (per-image min-max of the map, 256 thresholds ``k/255``;
``msb.evaluation.legacy``). This module lays out that table from the ``legacy_*`` columns of ``metrics.parquet``
(``msb metrics --legacy``, ``msb score --legacy``); both E-measure variants are given, each named.

Dataset values (per model x dataset x class, over its images):

==============  ===================================================================================
``mDice``       mean over the 256 thresholds of the image-mean Dice curve (PraNet ``meanDic``)
``mIoU``        the same for IoU (``meanIoU``)
``wF``          image mean of the weighted F-measure (``legacy_wfmeasure``)
``S_alpha``     image mean of the S-measure (``legacy_smeasure``)
``E_phi_mean``  mean over thresholds of the image-mean E-measure curve (= image mean of ``legacy_emeasure_mean``)
``E_phi_max``   max over thresholds of the image-mean E-measure curve (PraNet's "maxEm")
``MAE``         image mean of the mean absolute error of the min-max map
==============  ===================================================================================

``maxDice`` and ``maxIoU`` (the max over thresholds) are in the tidy table as well. Every output says *LEGACY*:
these numbers are not comparable with Dice at 0.5 from the raw counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from msb.errors import MSBError
from msb.evaluation.legacy import curve_scores
from msb.utils.atomic import atomic_write_text

__all__ = ["SIX_METRICS", "LEGACY_LABEL", "legacy_scores", "six_metric_table", "write_six_metric_table",
           "legacy_report_table"]

#: Columns of the six-metric table per dataset, in the template's order.
SIX_METRICS: tuple[str, ...] = ("mDice", "mIoU", "wF", "S_alpha", "E_phi_mean", "E_phi_max", "MAE")
#: Label carried by every rendering of the table.
LEGACY_LABEL = ("LEGACY metrics (PraNet evaluation template: per-image min-max, 256 thresholds k/255; "
                "not comparable with Dice at 0.5)")
_LATEX = {"mDice": "mDice", "mIoU": "mIoU", "wF": r"$F^{w}_{\beta}$", "S_alpha": r"$S_{\alpha}$",
          "E_phi_mean": r"$E^{mean}_{\phi}$", "E_phi_max": r"$E^{max}_{\phi}$", "MAE": "MAE"}
_NEEDED = ("legacy_dice_curve", "legacy_iou_curve", "legacy_emeasure_curve", "legacy_wfmeasure", "legacy_smeasure",
           "legacy_mae")


def _curves(g: pd.DataFrame, col: str) -> np.ndarray:
    return np.stack([np.asarray(c, dtype=np.float64) for c in g[col]])


def legacy_scores(metrics: pd.DataFrame) -> pd.DataFrame:
    """Tidy dataset-level legacy scores from a metrics table holding the ``legacy_*`` columns.

    Args:
        metrics: rows image x class with ``model``, ``dataset``, ``image_id``, ``class_id`` and the legacy columns
            (``msb.evaluation.legacy.legacy_metrics``); ``run_id`` and ``checkpoint_role`` when present
            distinguish two evaluations of one model on one dataset (that model's rows are then labelled
            ``model [run_id/role]``).

    Returns:
        DataFrame ``system, model, dataset, class_id, n_images, metric, value`` with the metrics of
        :data:`SIX_METRICS` plus ``maxDice`` and ``maxIoU``; values in [0, 1].

    Raises:
        MSBError: a legacy column is missing (the table was computed without ``--legacy``), or no rows.
    """
    missing = [c for c in ("model", "dataset", *_NEEDED) if c not in metrics.columns]
    if missing:
        raise MSBError(f"metrics table lacks {missing}: recompute it with legacy metrics on "
                       f"(msb metrics RUN --legacy, or msb score ... --legacy)")
    if metrics.empty:
        raise MSBError("metrics table has no rows: nothing to tabulate")
    df = metrics.copy()
    for c in ("run_id", "checkpoint_role"):
        if c not in df.columns:
            df[c] = ""
    df["class_id"] = df["class_id"] if "class_id" in df.columns else 1
    evals = df[["model", "dataset", "run_id", "checkpoint_role"]].astype(str).drop_duplicates()
    several = evals.groupby("model")[["dataset"]].value_counts().groupby("model").max()  # evaluations per dataset
    out = []
    keys = ["model", "run_id", "checkpoint_role", "dataset", "class_id"]
    for (model, run_id, role, dataset, class_id), g in df.groupby(keys, sort=True):
        system = str(model) if several[str(model)] == 1 else f"{model} [{run_id}/{role}]"
        dice, iou = curve_scores(_curves(g, "legacy_dice_curve"), "dice"), curve_scores(_curves(g, "legacy_iou_curve"), "iou")
        em = curve_scores(_curves(g, "legacy_emeasure_curve"), "emeasure")
        values = {"mDice": dice["mdice"], "maxDice": dice["maxdice"], "mIoU": iou["miou"], "maxIoU": iou["maxiou"],
                  "wF": float(g["legacy_wfmeasure"].astype(float).mean()),
                  "S_alpha": float(g["legacy_smeasure"].astype(float).mean()),
                  "E_phi_mean": em["memeasure"], "E_phi_max": em["maxemeasure"],
                  "MAE": float(g["legacy_mae"].astype(float).mean())}
        n = int(g["image_id"].nunique()) if "image_id" in g.columns else len(g)
        out += [{"system": system, "model": str(model), "dataset": str(dataset), "class_id": int(class_id),
                 "n_images": n, "metric": k, "value": v} for k, v in values.items()]
    return pd.DataFrame(out)


def six_metric_table(scores: pd.DataFrame) -> pd.DataFrame:
    """The template layout: one row per system, columns (dataset, metric) for :data:`SIX_METRICS`.

    Datasets keep their first-seen order; a dataset scored with several classes gets one column block per
    class (``dataset/class <id>``).

    Args:
        scores: :func:`legacy_scores`.

    Returns:
        DataFrame indexed by system (name ``model``), MultiIndex columns (dataset, metric), NaN where a system
        was not scored on a dataset.
    """
    s = scores[scores["metric"].isin(SIX_METRICS)].copy()
    multi = s.groupby("dataset")["class_id"].nunique()
    s["block"] = [d if multi[d] == 1 else f"{d}/class {c}" for d, c in zip(s["dataset"], s["class_id"])]
    blocks = list(dict.fromkeys(s["block"]))
    wide = s.pivot_table(index="system", columns=["block", "metric"], values="value", aggfunc="first", sort=False)
    cols = pd.MultiIndex.from_tuples([(b, m) for b in blocks for m in SIX_METRICS], names=["dataset", "metric"])
    wide = wide.reindex(columns=cols)
    wide = wide.reindex(list(dict.fromkeys(s["system"])))
    wide.index.name = "model"
    return wide


def _markdown(table: pd.DataFrame, digits: int) -> str:
    flat = table.copy()
    flat.columns = [f"{d} {m}" for d, m in table.columns]
    return f"**{LEGACY_LABEL}**\n\n" + flat.round(digits).to_markdown(floatfmt=f".{digits}f") + "\n"


def _latex(table: pd.DataFrame, digits: int) -> str:
    t = table.rename(columns=_LATEX, level=1)
    body = t.to_latex(float_format=lambda v: f"{v:.{digits}f}", multicolumn=True, multicolumn_format="c",
                      na_rep="--", caption=LEGACY_LABEL, label="tab:legacy-six-metric")
    return "% " + LEGACY_LABEL + "\n" + body


def write_six_metric_table(table: pd.DataFrame, out_dir: Path, stem: str = "legacy_six_metric",
                           digits: int = 3) -> list[Path]:
    """Write ``<stem>.csv`` (full precision; header ``dataset/metric``), ``<stem>.tex`` and ``<stem>.md``
    (``digits`` decimals, as the papers print), each labelled LEGACY, atomically.

    Returns:
        The written paths (csv, tex, md).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    flat = table.copy()
    flat.columns = [f"{d}/{m}" for d, m in table.columns]
    flat.index.name = "model [LEGACY PraNet template]"
    paths = [out_dir / f"{stem}.csv", out_dir / f"{stem}.tex", out_dir / f"{stem}.md"]
    atomic_write_text(paths[0], flat.to_csv(float_format="%.12g"))
    atomic_write_text(paths[1], _latex(table, digits))
    atomic_write_text(paths[2], _markdown(table, digits))
    return paths


def legacy_report_table(metrics_frames: Sequence[pd.DataFrame] | pd.DataFrame | None) -> pd.DataFrame | None:
    """The report's legacy section data: the six-metric table of the metrics rows that hold legacy columns,
    flattened for display (column ``model``, then ``<dataset> <metric>``), or None when no row does (legacy
    metrics are off by default)."""
    if metrics_frames is None:
        return None
    frames = [metrics_frames] if isinstance(metrics_frames, pd.DataFrame) else list(metrics_frames)
    frames = [f[f["legacy_dice_curve"].notna()] for f in frames
              if all(c in f.columns for c in ("model", "dataset", *_NEEDED))]
    frames = [f for f in frames if len(f)]
    if not frames:
        return None
    table = six_metric_table(legacy_scores(pd.concat(frames, ignore_index=True)))
    flat = table.copy()
    flat.columns = [f"{d} {m}" for d, m in table.columns]
    return flat.reset_index()


def add_legacy_block(doc: Any, metrics_frames: Sequence[pd.DataFrame] | pd.DataFrame | None) -> bool:
    """Add the LEGACY six-metric table (:func:`legacy_report_table`) to the report document ``doc`` (a
    :class:`msb.analysis.report.report_doc.ReportDoc`: a sub-heading, then the table, saved as
    ``data/legacy-six-metric.csv``); nothing when no metrics row holds legacy columns. Returns whether it added."""
    table = legacy_report_table(metrics_frames)
    if table is None:
        return False
    doc.sub("LEGACY six-metric table (PraNet template)")
    doc.frame(table, caption=LEGACY_LABEL, name="legacy-six-metric", digits=3)
    return True
