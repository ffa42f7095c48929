"""Per image x class boundary, lesion and (optional) legacy metrics, the metrics table and its summary.

Columns of one row (:func:`compute_image_metrics`; all distances in spacing units = mm when ``index.csv``
gives ``spacing_row``/``spacing_col``, else pixels):

=========================  ==============================================================================
``empty_case``             ``none`` | ``both_empty`` | ``ref_empty`` | ``pred_empty`` (empty-mask policy)
``n_pred_px``, ``n_ref_px``  foreground pixel counts
``spacing_row/col``        spacing used (row, col)
``distance_penalty``       image diagonal used for one-sided empty pairs (``empty_policy``)
``hd_convention``          convention of the distance columns (``surface.CONVENTIONS``)
``boundary_connectivity``  4 or 8 (erosion neighbourhood of the pixel boundary)
``n_boundary_pred/ref``    boundary elements (pixels, or contour corners for ``surface_distance``)
``hd``, ``hd95``, ``assd``, ``masd``  symmetric distances under ``hd_convention``
``hd95_pred_to_ref`` ...   directed 95th percentiles and mean distances (``*_pred_to_ref``, ``*_ref_to_pred``)
``nsd_convention``, ``nsd_tolerance_unit``  NSD convention and the unit of tau (``px`` or ``mm``)
``nsd_tau<t><unit>``       NSD at each tolerance, e.g. ``nsd_tau1px``, ``nsd_tau2.5mm``
``lesion_connectivity``, ``lesion_min_area``, ``n_lesions_pred``, ``n_lesions_ref``
``lesion_<rule>_<x>``      per rule (``any_overlap``, ``centroid_in_reference``, ``iou_ge_<t>``):
                           ``tp``, ``fp``, ``fn``, ``tp_pred``, ``sensitivity``, ``precision``, ``f1``
``legacy_*``               only with ``legacy: true`` (``msb.evaluation.legacy``)
``card_*_as_written``      only with ``card: true``: a published card's recipe (``msb.evaluation.card_metrics``)
=========================  ==============================================================================

No value is ever ``inf``; NaN means "not applicable" under the empty-mask policy.
"""

from __future__ import annotations

import math
import zipfile
import zlib
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from msb.config.metrics_schema import MetricsConfig
from msb.errors import MSBError
from msb.evaluation import empty_policy, lesion, surface
from msb.utils.atomic import atomic_write_with

__all__ = [
    "CONTEXT_COLUMNS",
    "CONVENTION_COLUMNS",
    "compute_image_metrics",
    "image_metric_rows",
    "metrics_table_from_predictions",
    "nsd_column",
    "summarize_metrics",
    "write_metrics_table",
    "write_run_metrics",
]

#: Columns copied from ``counts.parquet`` (joined on ``image_id``, ``class_id``) when present.
CONTEXT_COLUMNS: tuple[str, ...] = ("dataset", "split", "fold", "run_id", "model", "checkpoint_role",
                                    "checkpoint_sha256", "config_hash")

_REQUIRED_KEYS = ("pred", "ref", "spacing", "class_ids")


def nsd_column(tolerance: float, unit: str) -> str:
    """Column name of the NSD at ``tolerance`` in ``unit``: ``nsd_tau{tolerance:g}{unit}``, e.g. ``nsd_tau1px``."""
    return f"nsd_tau{tolerance:g}{unit}"


def compute_image_metrics(pred: np.ndarray, ref: np.ndarray, spacing: Sequence[float] = (1.0, 1.0),
                          config: MetricsConfig | None = None,
                          prob: np.ndarray | None = None) -> dict[str, object]:
    """Boundary, NSD, lesion (and legacy) metrics of ONE class of ONE image.

    Args:
        pred: bool (H, W) hard prediction.
        ref: bool (H, W) reference.
        spacing: (row, col) pixel spacing in mm (1 = pixels).
        config: :class:`MetricsConfig` (defaults when None).
        prob: float (H, W) in [0, 1] (or uint8 ``round(255 p)``), needed only when ``config.legacy``.

    Returns:
        Flat dict of float | int | str values (module docstring lists the columns); with legacy metrics,
        ``legacy_dice_curve`` is a list of 256 floats. Never ``inf``.

    Raises:
        ValueError: shapes differ or are not 2D, invalid spacing, legacy requested without ``prob``.
    """
    cfg = config if config is not None else MetricsConfig()
    pred = np.asarray(pred).astype(bool, copy=False)
    ref = np.asarray(ref).astype(bool, copy=False)
    if pred.ndim != 2 or pred.shape != ref.shape:
        raise ValueError(f"pred and ref must be 2D masks of the same shape, got {pred.shape} and {ref.shape}")
    sp = (float(spacing[0]), float(spacing[1]))
    if not all(math.isfinite(s) and s > 0 for s in sp):
        raise ValueError(f"spacing must be two finite positive numbers (row, col), got {spacing!r}")
    if cfg.legacy and prob is None:
        raise ValueError("legacy metrics need the probability map (prob); none was given")

    case = empty_policy.empty_case(pred, ref)
    penalty = empty_policy.penalty_distance(pred.shape, sp)
    row: dict[str, object] = {
        "empty_case": case, "n_pred_px": int(pred.sum()), "n_ref_px": int(ref.sum()),
        "spacing_row": sp[0], "spacing_col": sp[1], "distance_penalty": penalty,
    }

    cache: dict[tuple, surface.SurfaceDistances] = {}

    def distances(model: str, spc: tuple[float, float]) -> surface.SurfaceDistances:
        key = (model, spc)
        if key not in cache:
            cache[key] = surface.surface_distances(pred, ref, spc, boundary_model=model,  # type: ignore[arg-type]
                                                   connectivity=cfg.connectivity)
        return cache[key]

    hd_model = "contours" if cfg.hd_convention == "surface_distance" else "pixels"
    sd = distances(hd_model, sp)
    dist = empty_policy.apply_distance_policy(surface.distance_metrics(sd, cfg.hd_convention), case, penalty)
    row.update({"hd_convention": cfg.hd_convention, "boundary_connectivity": int(cfg.connectivity),
                "n_boundary_pred": sd.n_pred, "n_boundary_ref": sd.n_ref})
    row.update(dist)

    nsd_model = "contours" if cfg.nsd_convention == "surface_distance" else "pixels"
    nsd_spacing = sp if cfg.tolerance_unit == "mm" else (1.0, 1.0)
    sd_nsd = distances(nsd_model, nsd_spacing)
    row.update({"nsd_convention": cfg.nsd_convention, "nsd_tolerance_unit": cfg.tolerance_unit})
    for tau in cfg.nsd_tolerances:
        row[nsd_column(tau, cfg.tolerance_unit)] = empty_policy.apply_nsd_policy(surface.nsd(sd_nsd, tau), case)

    row.update({"lesion_connectivity": int(cfg.lesion_connectivity), "lesion_min_area": int(cfg.min_lesion_area)})
    row.update(lesion.lesion_metrics(pred, ref, cfg.lesion_criteria, cfg.lesion_connectivity,
                                     cfg.lesion_iou_threshold, cfg.min_lesion_area))

    if cfg.legacy:
        from msb.evaluation import legacy  # local import: pysodmetrics only when legacy metrics are requested

        row.update(legacy.legacy_metrics(prob, ref))  # type: ignore[arg-type]
    if cfg.card:  # always beside the real hd95 of row["hd_convention"], never instead of it
        from msb.evaluation.card_metrics import card_image_metrics

        row.update(card_image_metrics(pred, ref))
    return row


def _load_prediction(path: Path, need_prob: bool) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in _REQUIRED_KEYS + (("prob",) if need_prob else ()) if k not in z.files]
            if missing:
                hint = (" with evaluation.save_probabilities: true (legacy metrics need the probability map)"
                        if "prob" in missing else "")
                raise MSBError(f"{path}: prediction file lacks key(s) {missing} (has {sorted(z.files)}); "
                               f"re-run the evaluation to rewrite it{hint}")
            data = {k: z[k] for k in z.files}
    except MSBError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError, KeyError, zlib.error) as exc:
        raise MSBError(f"{path}: cannot read prediction file ({type(exc).__name__}: {exc}); "
                       "delete it and re-run the evaluation") from exc
    pred, ref = data["pred"], data["ref"]
    c = data["class_ids"].reshape(-1).size
    problems = []
    if pred.ndim != 3 or pred.shape != ref.shape:
        problems.append(f"pred {pred.shape} and ref {ref.shape} must both be (C, H, W)")
    elif pred.shape[0] != c:
        problems.append(f"class_ids has {c} entries but pred has {pred.shape[0]} channels")
    if data["spacing"].reshape(-1).size != 2:
        problems.append(f"spacing must hold 2 values (row, col), got shape {data['spacing'].shape}")
    if need_prob and "prob" in data and data["prob"].shape != pred.shape:
        problems.append(f"prob {data['prob'].shape} must match pred {pred.shape}")
    if problems:
        raise MSBError(f"{path}: malformed prediction file: " + "; ".join(problems))
    return data


def metrics_table_from_predictions(pred_dir: Path, config: MetricsConfig) -> pd.DataFrame:
    """Metrics of every ``<sample_id>.npz`` in a predictions folder, one row per image x class.

    File format (docs/design.md): ``pred`` bool (C,H,W), ``ref`` bool (C,H,W), ``prob`` uint8 (C,H,W) =
    round(255 p) (read only when ``config.legacy``), ``spacing`` float64 (2,) (row, col) mm/px,
    ``class_ids`` int64 (C,).

    Args:
        pred_dir: folder with the ``.npz`` files.
        config: metric settings.

    Returns:
        DataFrame with ``image_id`` (file stem), ``class_id`` and the columns of
        :func:`compute_image_metrics`, sorted by image_id then class order in the file.

    Raises:
        MSBError: folder missing or without ``.npz`` files; a file unreadable, missing keys or malformed.
    """
    pred_dir = Path(pred_dir)
    files = sorted(pred_dir.glob("*.npz")) if pred_dir.is_dir() else []
    if not files:
        raise MSBError(f"{pred_dir}: no stored predictions (<sample_id>.npz) found; run the evaluation with "
                       "prediction saving enabled first")
    rows = []
    for path in files:
        data = _load_prediction(path, config.legacy)
        rows.extend(image_metric_rows(path, data["pred"], data["ref"], data["spacing"], data["class_ids"], config,
                                      data["prob"] if config.legacy else None))
    return pd.DataFrame(rows)


def image_metric_rows(path: Path, pred: np.ndarray, ref: np.ndarray, spacing: Sequence[float] | np.ndarray,
                      class_ids: Sequence[int] | np.ndarray, config: MetricsConfig,
                      prob: np.ndarray | None = None) -> list[dict[str, object]]:
    """The metrics rows of ONE prediction file ``path`` (its stem = ``image_id``), one per class channel.

    What :func:`metrics_table_from_predictions` computes per file, callable on the arrays in memory (the
    evaluator computes the table while it writes the files, instead of reading them back).

    Args:
        path: the prediction file (``<sample_id>.npz``); names the image and any error.
        pred, ref: bool (C, H, W); spacing: (row, col) mm/px (2 values); class_ids: int (C,);
        prob: uint8 (C, H, W) ``round(255 p)``, only read when ``config.legacy``.

    Returns:
        Dicts with ``image_id``, ``class_id`` and the columns of :func:`compute_image_metrics`.

    Raises:
        MSBError: spacing not positive and finite.
    """
    sp = tuple(float(s) for s in np.asarray(spacing, dtype=np.float64).reshape(-1))
    if not all(math.isfinite(s) and s > 0 for s in sp):
        raise MSBError(f"{path}: spacing must be positive and finite, got {sp}")
    rows = []
    for c, class_id in enumerate(np.asarray(class_ids, dtype=np.int64).reshape(-1)):
        row: dict[str, object] = {"image_id": Path(path).stem, "class_id": int(class_id)}
        row.update(compute_image_metrics(pred[c], ref[c], sp, config, prob[c] if config.legacy else None))
        rows.append(row)
    return rows


def _attach_context(table: pd.DataFrame, counts_path: Path) -> pd.DataFrame:
    try:
        counts = pd.read_parquet(counts_path)
    except Exception as exc:  # noqa: BLE001 - any parquet failure is a user-fixable file problem
        raise MSBError(f"{counts_path}: cannot read counts table ({type(exc).__name__}: {exc})") from exc
    context = [c for c in CONTEXT_COLUMNS if c in counts.columns]
    if not context:
        return table
    if {"image_id", "class_id"} <= set(counts.columns):
        ctx = counts[["image_id", "class_id", *context]].drop_duplicates(["image_id", "class_id"])
        ctx = ctx.astype({"image_id": str, "class_id": "int64"})
        merged = table.merge(ctx, on=["image_id", "class_id"], how="left", validate="one_to_one")
    else:  # no keys: broadcast the context columns that are constant over the counts file
        merged = table.copy()
        for col in context:
            values = counts[col].dropna().unique()
            if len(values) == 1:
                merged[col] = values[0]
    front = [c for c in context if c in merged.columns]
    return merged[front + [c for c in merged.columns if c not in front]]


def write_metrics_table(eval_dir: Path, config: MetricsConfig,
                        rows: dict[str, list[dict[str, object]]] | None = None) -> Path:
    """Compute the metrics of ``eval_dir/predictions/*.npz`` and write ``eval_dir/metrics.parquet`` atomically.

    With ``rows`` (sample id -> its :func:`image_metric_rows`, computed from the arrays just written to
    ``predictions/``, one entry per file there), the files are not read back; the table is the same (files in
    sorted file-name order).

    Context columns (:data:`CONTEXT_COLUMNS`) are copied from ``eval_dir/counts.parquet`` when it exists
    (left join on ``image_id``, ``class_id``), and placed first.

    Args:
        eval_dir: ``runs/<study>/<run_id>/evaluation/<role>``.
        config: metric settings.

    Returns:
        Path of the written ``metrics.parquet``.

    Raises:
        MSBError: no predictions in ``eval_dir/predictions``, a bad prediction file or unreadable counts.
    """
    eval_dir = Path(eval_dir)
    if rows is None:
        table = metrics_table_from_predictions(eval_dir / "predictions", config)
    else:  # the order of sorted(glob("*.npz")): by file name
        table = pd.DataFrame([r for sid in sorted(rows, key=lambda s: f"{s}.npz") for r in rows[sid]])
    counts_path = eval_dir / "counts.parquet"
    if counts_path.is_file():
        table = _attach_context(table, counts_path)
    numeric = table.select_dtypes(include=[np.number])
    if np.isinf(numeric.to_numpy(dtype=np.float64)).any():  # pragma: no cover - guarded by the policy
        raise RuntimeError("metrics table contains inf; the empty-mask policy was bypassed")
    out = eval_dir / "metrics.parquet"
    atomic_write_with(out, lambda tmp: table.to_parquet(tmp, index=False))
    return out


def write_run_metrics(run_dir: Path, config: MetricsConfig) -> list[Path]:
    """``msb metrics RUN_DIR``: write ``metrics.parquet`` for every ``RUN_DIR/evaluation/<role>/predictions``.

    Uses only the stored predictions (no inference). Returns the written paths.

    Raises:
        MSBError: no ``evaluation/<role>/predictions`` folder under ``run_dir``.
    """
    run_dir = Path(run_dir)
    eval_dirs = sorted(p.parent for p in (run_dir / "evaluation").glob("*/predictions") if p.is_dir())
    if not eval_dirs:
        raise MSBError(f"{run_dir}: no evaluation/<role>/predictions folder; run the evaluation with "
                       "prediction saving enabled first")
    return [write_metrics_table(d, config) for d in eval_dirs]


_DISTANCE_PREFIXES = empty_policy.DISTANCE_KEYS


def _legacy_curves(columns: Sequence[str]) -> list[tuple[str, str]]:
    """(curve column, metric name) of the legacy per-image curves present (``legacy.CURVE_COLUMNS``)."""
    from msb.evaluation.legacy import CURVE_COLUMNS  # numpy only at import; pysodmetrics is imported lazily

    return [(c, n) for c, n in CURVE_COLUMNS.items() if c in columns]

#: Convention columns of a metrics table: convention column -> test for the metric columns it governs.
CONVENTION_COLUMNS: dict[str, str] = {"hd_convention": "distances (hd, hd95, assd, masd, directed)",
                                      "nsd_convention": "nsd_tau*"}


#: Further settings that change distance / NSD values (erosion neighbourhood of the boundary, unit of tau):
#: also kept in the grouping of :func:`summarize_metrics` when present, so they are never averaged together.
SETTING_COLUMNS: tuple[str, ...] = ("boundary_connectivity", "nsd_tolerance_unit")


def _governed(conv_col: str, metric_cols: Sequence[str]) -> list[str]:
    """The metric columns whose values depend on ``conv_col``."""
    if conv_col == "hd_convention":
        return [c for c in metric_cols if c in _DISTANCE_PREFIXES]
    return [c for c in metric_cols if c.startswith("nsd_tau")]


def summarize_metrics(table: pd.DataFrame, by: Sequence[str] = ("class_id",)) -> pd.DataFrame:
    """Summarise a metrics table per group and convention: image means with NaNs excluded, pooled lesion scores.

    Distances (HD, HD95, ASSD, MASD, directed) and NSD depend on their convention (``hd_convention``,
    ``nsd_convention``; e.g. HD95 of one case is 175.43 under ``medpy`` and 356.18 under
    ``metrics_reloaded``), so values of different conventions are never averaged: the convention columns
    present in the table are always added to the grouping and kept in the output. A table holding two HD
    conventions gives two ``hd95`` rows, one per convention (and every other metric is likewise summarised
    per convention group, so rows of one image scored under two conventions are not pooled twice).

    For every metric column (distances, ``nsd_*``, lesion ratios, scalar ``legacy_*``,
    ``card_*_as_written``) and group: ``value`` = mean over rows with a non-NaN value (aggregation
    ``image_mean``), ``n_used`` = rows in the mean, ``n_nan`` = rows excluded as not applicable (NaN),
    ``n_policy`` = rows whose value was set by the empty-mask policy (one-sided empty: distance penalty,
    NSD 0), ``n_rows``. Lesion rules are also pooled
    over the group (aggregation ``pooled_counts``: sensitivity = sum tp / sum(tp + fn), precision =
    sum tp_pred / sum(tp_pred + fp), F1 = their harmonic mean). With legacy curves, ``legacy_mdice`` and
    ``legacy_maxdice``, ``legacy_miou``, ``legacy_maxiou``, ``legacy_memeasure``, ``legacy_maxemeasure``
    (aggregation ``threshold_curve``: mean / max over thresholds of the image-mean curve,
    ``legacy.curve_scores``).

    Args:
        table: output of :func:`metrics_table_from_predictions` (or ``metrics.parquet``); distances in
            spacing units (mm or px), NSD in [0, 1].
        by: grouping columns (must exist); ``()`` for one overall group. ``hd_convention``,
            ``nsd_convention``, ``boundary_connectivity`` and ``nsd_tolerance_unit`` are appended when present
            and not already listed (each changes distance or NSD values).

    Returns:
        Long DataFrame: ``*by, hd_convention, nsd_convention, boundary_connectivity, nsd_tolerance_unit, metric, aggregation, value, n_used, n_nan,
        n_policy, n_rows`` (a convention column only when the table has it); ``value`` float64, counts int.

    Raises:
        ValueError: a grouping column is missing; the table holds ``inf`` (policy violated); distance (or
            NSD) columns without an ``hd_convention`` (``nsd_convention``) column, or rows where it is empty
            (their convention is unknown, so they cannot be summarised without risking a mixed mean).
    """
    by = list(by)
    missing = [c for c in by if c not in table.columns]
    if missing:
        raise ValueError(f"grouping column(s) {missing} not in the metrics table")
    metric_cols = [c for c in table.columns
                   if c in _DISTANCE_PREFIXES or c.startswith("nsd_tau")
                   or (c.startswith("lesion_") and c.rsplit("_", 1)[-1] in ("sensitivity", "precision", "f1"))
                   or (c.startswith("legacy_") and not c.endswith("_curve"))
                   or (c.startswith("card_") and c.endswith("_as_written"))]
    if metric_cols and np.isinf(table[metric_cols].to_numpy(dtype=np.float64)).any():
        raise ValueError("metrics table contains inf: every empty-mask case must follow the policy table")
    for conv, what in CONVENTION_COLUMNS.items():
        governed = _governed(conv, metric_cols)
        if not governed:
            continue
        if conv not in table.columns:
            raise ValueError(f"metrics table has {what} columns {governed[:3]} but no '{conv}' column: their "
                             f"convention is unknown; recompute the table (msb metrics RUN_DIR)")
        blank = table[conv].isna() | (table[conv].astype(str).str.strip() == "")
        if blank.any():
            raise ValueError(f"metrics table: {int(blank.sum())} row(s) with an empty '{conv}': their {what} "
                             f"cannot be summarised with the others; recompute the table (msb metrics RUN_DIR)")
    keys = by + [c for c in (*CONVENTION_COLUMNS, *SETTING_COLUMNS) if c in table.columns and c not in by]
    one_sided = table["empty_case"].isin(["ref_empty", "pred_empty"]) if "empty_case" in table else None
    rule_keys = sorted({c[len("lesion_"):-len("_tp_pred")] for c in table.columns
                        if c.startswith("lesion_") and c.endswith("_tp_pred")})
    groups = table.groupby(keys, sort=True, dropna=False) if keys else [((), table)]
    out = []
    for key, g in groups:
        key = key if isinstance(key, tuple) else (key,)
        base = dict(zip(keys, key))
        for col in metric_cols:
            vals = g[col].astype(np.float64)
            used = vals.notna()
            policy = 0
            if one_sided is not None and (col in _DISTANCE_PREFIXES or col.startswith("nsd_tau")):
                policy = int((one_sided.loc[g.index] & used).sum())
            out.append({**base, "metric": col, "aggregation": "image_mean",
                        "value": float(vals[used].mean()) if used.any() else float("nan"),
                        "n_used": int(used.sum()), "n_nan": int((~used).sum()), "n_policy": policy,
                        "n_rows": int(len(g))})
        for rk in rule_keys:
            tp, fn = g[f"lesion_{rk}_tp"].sum(), g[f"lesion_{rk}_fn"].sum()
            tpp, fp = g[f"lesion_{rk}_tp_pred"].sum(), g[f"lesion_{rk}_fp"].sum()
            m = lesion.LesionMatch(tp=int(tp), fp=int(fp), fn=int(fn), tp_pred=int(tpp), n_pred=int(tpp + fp),
                                   n_ref=int(tp + fn))
            for name, v in lesion.lesion_scores(m).items():
                out.append({**base, "metric": f"lesion_{rk}_{name}", "aggregation": "pooled_counts", "value": v,
                            "n_used": int(len(g)), "n_nan": 0, "n_policy": 0, "n_rows": int(len(g))})
        for curve_col, name in _legacy_curves(g.columns):
            from msb.evaluation.legacy import curve_scores

            curves = np.stack([np.asarray(c, dtype=np.float64) for c in g[curve_col]])
            for sname, v in curve_scores(curves, name).items():
                out.append({**base, "metric": f"legacy_{sname}", "aggregation": "threshold_curve", "value": v,
                            "n_used": int(len(g)), "n_nan": 0, "n_policy": 0, "n_rows": int(len(g))})
    return pd.DataFrame(out, columns=[*keys, "metric", "aggregation", "value", "n_used", "n_nan", "n_policy",
                                      "n_rows"])
