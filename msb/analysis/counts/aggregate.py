"""Scores from raw counts: Dice, IoU, precision and recall under three aggregation rules.

Everything here is a pure function of a counts table (``docs/counts_schema.md``); nothing reads
predictions or models. Per-unit scores (Dice, IoU, precision, recall; NaN where the denominator is 0) come
from :mod:`msb.analysis.counts.count_scores`, whose functions are re-exported here. Undefined units are never
replaced by 0 or 1: they are excluded from means and counted (``n_excluded``).

Aggregation rules (named as in segmentation_models_pytorch ``metrics.functional`` reductions):

``global-micro``
    sum TP, FP, FN over every image and class, then one ratio. One unit (the pool).
``image-macro``
    one score per image x class row; per class the mean over images whose score is defined; then the
    unweighted mean over classes with a defined class mean. Units: image x class rows. With a single
    (foreground) class -- a binary task -- this is the plain mean over images.
``class-macro``
    per class, sum the counts over images and take the ratio; then the unweighted mean over classes
    with a defined score. Units: classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from rich.table import Table

from msb.analysis.counts.count_scores import (ALL_METRICS, dice_from_counts, iou_from_counts, precision_from_counts,
                                       ratio_or_nan, recall_from_counts, score_from_counts)
from msb.analysis.counts.aggregate_core import (ALL_RULES, DEFAULT_GROUP, GROUPINGS, IMAGE_COLUMNS, POOL_FOLDS_GROUP,
                                        SCORE_COLUMNS, aggregate_arrays as _aggregate_arrays)
from msb.errors import MSBError
from msb.utils.atomic import atomic_path

__all__ = [
    "ALL_METRICS", "ALL_RULES", "DEFAULT_GROUP", "POOL_FOLDS_GROUP", "GROUPINGS", "IMAGE_COLUMNS",
    "SCORE_COLUMNS", "AggregateResult", "aggregate", "check_poolable", "dice_from_counts",
    "iou_from_counts", "precision_from_counts", "recall_from_counts", "reaggregate",
    "render_scores_table", "score_from_counts", "score_table", "scores_wide", "write_scores",
]

_METRIC_LABELS = {"dice": "Dice", "iou": "IoU", "precision": "Precision", "recall": "Recall"}


@dataclass(frozen=True)
class AggregateResult:
    """One aggregated score.

    Attributes:
        value: the score in [0, 1], NaN when no unit has a defined score.
        n_units: units entering the innermost mean: 1 for ``global-micro`` (the pool), image x class
            rows for ``image-macro``, classes for ``class-macro``.
        n_excluded: of those units, how many have an undefined score and were left out.
        n_images: distinct images (:data:`IMAGE_COLUMNS`) in the rows.
        n_classes: distinct ``class_id`` in the rows.
    """

    value: float
    n_units: int
    n_excluded: int
    n_images: int
    n_classes: int


#: columns whose values must be the same in every row pooled into one score (:func:`check_poolable`)
POOL_COLUMNS: tuple[str, ...] = ("threshold", "threshold_on", "test_time_rule")


def _describe(label: str | None) -> str:
    return label if label else "the selected rows"


def check_poolable(df: pd.DataFrame, label: str | None = None) -> None:
    """Refuse to pool rows evaluated with different binarisation settings or test-time rules.

    Args:
        df: counts rows that are about to be pooled into one score.
        label: text naming the group in the error (e.g. ``"group dataset='x', run_id='r1'"``).

    Raises:
        MSBError: when ``threshold``, ``threshold_on`` or ``test_time_rule`` (e.g. the two-prediction rules
            ``first+mean_teacher:average`` and ``first+mean_teacher:teacher``) takes more than one value, naming
            the group and the values found.
    """
    problems = []
    for col in POOL_COLUMNS:
        if col not in df.columns:
            continue
        values = pd.unique(df[col])
        if len(values) > 1:
            shown = sorted(float(v) for v in values) if col == "threshold" else sorted(map(str, values))
            problems.append(f"{col} values {shown}")
    if problems and not any(p.startswith("test_time_rule") for p in problems):
        raise MSBError(f"refusing to pool count rows of {_describe(label)}: they mix "
                       + " and ".join(problems) + "; scores at different thresholds are not "
                       "comparable. Aggregate them separately ('msb reaggregate --by-threshold', or add 'threshold' "
                       "and 'threshold_on' to group_by) or re-evaluate with one threshold")
    if problems:
        raise MSBError(f"refusing to pool count rows of {_describe(label)}: they mix " + " and ".join(problems)
                       + "; predictions made under different test-time rules are not comparable. Aggregate them "
                       "separately (add 'test_time_rule' to group_by) or evaluate with one rule "
                       "(evaluation.two_prediction)")


def _check_columns(df: pd.DataFrame, needed: Iterable[str], what: str) -> None:
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise MSBError(f"{what}: columns {missing} not in the counts table; available columns: "
                       f"{list(df.columns)}")


def _n_images(df: pd.DataFrame) -> int:
    cols = [c for c in IMAGE_COLUMNS if c in df.columns]
    if not cols:
        return 0
    return int(len(df.drop_duplicates(subset=cols))) if len(cols) > 1 else int(df[cols[0]].nunique())


def _codes(df: pd.DataFrame, cols: Sequence[str]) -> np.ndarray:
    """``(len(df),)`` int64 codes, equal iff the rows agree in every column of ``cols`` (NaN = NaN; all
    zero for no columns)."""
    combined = np.zeros(len(df), dtype=np.int64)
    for c in cols:
        codes, uniques = pd.factorize(df[c], use_na_sentinel=False)
        combined = pd.factorize(combined * (len(uniques) + 1) + codes)[0].astype(np.int64)
    return combined


def _group_codes(df: pd.DataFrame, group_by: Sequence[str]) -> tuple[np.ndarray, list[tuple]]:
    """Group number of every row (groups in sorted key order, as ``df.groupby(group_by, sort=True,
    dropna=False)``) and the group keys."""
    gb = df[list(group_by)].groupby(list(group_by), sort=True, dropna=False)
    codes = gb.ngroup().to_numpy(dtype=np.int64)
    keys = [k if isinstance(k, tuple) else (k,) for k in gb.size().index]
    return codes, keys


def aggregate(df: pd.DataFrame, rule: str, metric: str, *, label: str | None = None) -> AggregateResult:
    """Aggregate one metric over all rows of a counts table under one rule.

    Args:
        df: counts rows (at least ``tp``, ``fp``, ``fn``, ``class_id``; see
            ``docs/counts_schema.md``), all pooled into one score.
        rule: ``"global-micro"``, ``"image-macro"`` or ``"class-macro"`` (module docstring).
        metric: ``"dice"``, ``"iou"``, ``"precision"`` or ``"recall"``.
        label: names the rows in error messages.

    Returns:
        :class:`AggregateResult` (value, n_units, n_excluded, n_images, n_classes). Formulas:
        with ``s(.)`` the metric's ratio and ``c`` ranging over classes with a defined score,

        * global-micro: ``s(sum_i,c TP, sum_i,c FP, sum_i,c FN)``
        * image-macro: ``mean_c [ mean_{i: s_ic defined} s(TP_ic, FP_ic, FN_ic) ]``
        * class-macro: ``mean_c s(sum_i TP_ic, sum_i FP_ic, sum_i FN_ic)``

    Raises:
        MSBError: unknown rule or metric; missing columns; no rows; rows mixing ``threshold`` or
            ``threshold_on`` values (:func:`check_poolable`).
    """
    if rule not in ALL_RULES:
        raise MSBError(f"unknown aggregation rule {rule!r}; choose from {list(ALL_RULES)}")
    if metric not in ALL_METRICS:
        raise MSBError(f"unknown metric {metric!r}; choose from {list(ALL_METRICS)}")
    _check_columns(df, ("tp", "fp", "fn", "class_id"), "aggregate")
    if len(df) == 0:
        raise MSBError(f"no count rows to aggregate in {_describe(label)}")
    check_poolable(df, label)
    codes, uniques = pd.factorize(df["class_id"], sort=True)
    value, n_units, n_excl = _aggregate_arrays(
        rule, metric, df["tp"].to_numpy(dtype=np.int64), df["fp"].to_numpy(dtype=np.int64),
        df["fn"].to_numpy(dtype=np.int64), codes, len(uniques))
    return AggregateResult(value=value, n_units=n_units, n_excluded=n_excl,
                           n_images=_n_images(df), n_classes=len(uniques))


def _group_label(group_by: Sequence[str], key: tuple) -> str:
    if not group_by:
        return "all rows (no grouping)"
    return "group " + ", ".join(f"{c}={_py(v)!r}" for c, v in zip(group_by, key))


def _py(v):
    return v.item() if isinstance(v, np.generic) else v


def reaggregate(
    df: pd.DataFrame,
    group_by: Sequence[str] = DEFAULT_GROUP,
    rules: Sequence[str] = ALL_RULES,
    metrics: Sequence[str] = ALL_METRICS,
) -> pd.DataFrame:
    """Aggregate a counts table per group under several rules and metrics (tidy output).

    Args:
        df: counts rows, e.g. from :func:`msb.analysis.counts.counts_io.read_counts`.
        group_by: columns defining one pool; :data:`DEFAULT_GROUP` gives one group per evaluated
            run x checkpoint role, :data:`POOL_FOLDS_GROUP` pools all runs (folds) of a model, an empty
            sequence pools everything. Adding ``threshold``/``threshold_on`` splits by threshold.
        rules: subset of :data:`ALL_RULES`.
        metrics: subset of :data:`ALL_METRICS`.

    Returns:
        DataFrame with the ``group_by`` columns then ``aggregation`` (str), ``metric`` (str),
        ``value`` (float64, NaN if undefined), ``n_images``, ``n_classes``, ``n_units``,
        ``n_excluded`` (int64): one row per group x rule x metric, groups sorted by their key, rules
        and metrics in the given order. See :func:`aggregate` for units and formulas.

    Raises:
        MSBError: unknown group column, rule or metric; empty table; a group whose rows mix
            ``threshold`` or ``threshold_on`` values (the group and the values are named).
    """
    group_by = list(group_by)
    rules = list(rules)
    metrics = list(metrics)
    bad_rules = [r for r in rules if r not in ALL_RULES]
    if bad_rules or not rules:
        raise MSBError(f"unknown aggregation rule(s) {bad_rules}; choose from {list(ALL_RULES)}")
    bad_metrics = [m for m in metrics if m not in ALL_METRICS]
    if bad_metrics or not metrics:
        raise MSBError(f"unknown metric(s) {bad_metrics}; choose from {list(ALL_METRICS)}")
    _check_columns(df, group_by, "group_by")
    _check_columns(df, ("tp", "fp", "fn", "class_id"), "reaggregate")
    if len(df) == 0:
        raise MSBError("no count rows to aggregate; check the count files given")

    # one pass of factorisations over the whole table, then per group only integer slices (the groupby
    # iterator would copy every column of every group: 2.7 s of 3.9 s at 1M rows, docs/performance.md)
    # images are told apart within a group by the image columns that are not constant in it
    img_cols = [c for c in IMAGE_COLUMNS if c in df.columns and c not in group_by]
    img_codes = _codes(df, img_cols)
    poolable = [c for c in POOL_COLUMNS if c in df.columns]
    pool_codes = _codes(df, poolable)
    if group_by:
        gcodes, gkeys = _group_codes(df, group_by)
    else:
        gcodes, gkeys = np.zeros(len(df), np.int64), [()]
    order = np.argsort(gcodes, kind="stable")
    bounds = np.searchsorted(gcodes[order], np.arange(len(gkeys) + 1))
    groups = [(key, order[bounds[k]:bounds[k + 1]]) for k, key in enumerate(gkeys)]
    # check every group before computing anything, so the first error is reported without work
    for key, rows in groups:
        if len(np.unique(pool_codes[rows])) > 1:
            check_poolable(df.iloc[rows], _group_label(group_by, key))

    class_all = df["class_id"].to_numpy(dtype=np.int64)
    tp_all, fp_all, fn_all = (df[c].to_numpy(dtype=np.int64) for c in ("tp", "fp", "fn"))
    records = []
    for key, rows in groups:
        codes, uniques = pd.factorize(class_all[rows], sort=True)
        tp, fp, fn = tp_all[rows], fp_all[rows], fn_all[rows]
        n_images = int(len(np.unique(img_codes[rows])))
        for rule in rules:
            for metric in metrics:
                value, n_units, n_excl = _aggregate_arrays(rule, metric, tp, fp, fn, codes,
                                                           len(uniques))
                rec = {c: _py(v) for c, v in zip(group_by, key)}
                rec.update(aggregation=rule, metric=metric, value=value, n_images=n_images,
                           n_classes=len(uniques), n_units=n_units, n_excluded=n_excl)
                records.append(rec)
    return score_table(records, group_by, df)


def score_table(records: list[dict], group_by: Sequence[str], source: pd.DataFrame) -> pd.DataFrame:
    """Tidy score table from records with the ``group_by`` columns and :data:`SCORE_COLUMNS`; group columns
    keep their dtype in ``source`` (the counts they were computed from), ``value`` is float64 and the
    ``n_*`` columns int64."""
    out = pd.DataFrame.from_records(records, columns=[*group_by, *SCORE_COLUMNS])
    for c in group_by:
        out[c] = out[c].astype(source[c].dtype)
    out["value"] = out["value"].astype(np.float64)
    for c in ("n_images", "n_classes", "n_units", "n_excluded"):
        out[c] = out[c].astype(np.int64)
    return out


def _group_columns(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if c not in SCORE_COLUMNS]


def scores_wide(table: pd.DataFrame) -> pd.DataFrame:
    """One row per group: ``n_images``, ``n_classes`` and a ``<metric>_<rule>`` column per score.

    Args:
        table: output of :func:`reaggregate`.

    Returns:
        DataFrame with the group columns (in the table's order), ``n_images``, ``n_classes``, then
        float columns such as ``dice_global-micro``, ``dice_image-macro``, ... (metric-major, in the
        order found in ``table``); groups in the table's order.
    """
    group_cols = _group_columns(table)
    metrics = list(dict.fromkeys(table["metric"]))
    rules = list(dict.fromkeys(table["aggregation"]))
    rows = []
    grouped = (table.groupby(group_cols, sort=False, dropna=False) if group_cols
               else [((), table)])
    for key, g in grouped:
        key = key if isinstance(key, tuple) else (key,)
        row = {c: _py(v) for c, v in zip(group_cols, key)}
        row["n_images"] = int(g["n_images"].iloc[0])
        row["n_classes"] = int(g["n_classes"].iloc[0])
        vals = {(m, r): v for m, r, v in zip(g["metric"], g["aggregation"], g["value"])}
        for m in metrics:
            for r in rules:
                row[f"{m}_{r}"] = float(vals.get((m, r), np.nan))
        rows.append(row)
    cols = [*group_cols, "n_images", "n_classes", *(f"{m}_{r}" for m in metrics for r in rules)]
    return pd.DataFrame(rows, columns=cols)


def write_scores(table: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write the long score table as ``scores.csv`` and ``scores.parquet`` in ``out_dir``.

    Both files are first written to temporary files in ``out_dir`` and renamed only when both were
    written, so an error leaves neither a partial file nor a temporary file (previous files stay).

    Args:
        table: output of :func:`reaggregate`.
        out_dir: destination folder (created if needed).

    Returns:
        ``[out_dir / "scores.csv", out_dir / "scores.parquet"]``.
    """
    out_dir = Path(out_dir)
    csv_path = out_dir / "scores.csv"
    parquet_path = out_dir / "scores.parquet"
    frame = table.reset_index(drop=True)
    with atomic_path(csv_path) as tmp_csv, atomic_path(parquet_path) as tmp_parquet:
        frame.to_csv(tmp_csv, index=False)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_parquet)
    return [csv_path, parquet_path]


def _fmt(v: float) -> str:
    return "n/a" if v is None or np.isnan(v) else f"{v:.4f}"


def render_scores_table(table: pd.DataFrame, title: str | None = None) -> Table:
    """A :class:`rich.table.Table` of a :func:`reaggregate` result for the terminal (fits 80 columns).

    One row per group x aggregation rule; columns: the group columns whose value differs between groups
    (constant ones go to the title), ``aggregation``, ``images``, then Dice, IoU, precision and recall with
    4 decimals (``n/a`` when undefined). A value with units excluded as undefined carries a marker
    ``(-k)``; the caption explains it and totals the exclusions per metric.

    Args:
        table: output of :func:`reaggregate`.
        title: optional title; defaults to ``"Scores"`` plus the constant group values.
    """
    group_cols = _group_columns(table)
    wide = scores_wide(table)
    varying = [c for c in group_cols if wide[c].nunique(dropna=False) > 1]
    constant = [c for c in group_cols if c not in varying]
    if title is None:
        title = "Scores"
        if constant and len(wide):
            title += " (" + ", ".join(f"{c}={_py(wide[c].iloc[0])}" for c in constant) + ")"
    metrics = list(dict.fromkeys(table["metric"]))
    rules = list(dict.fromkeys(table["aggregation"]))
    t = Table(title=title)
    for c in varying:
        t.add_column(c, overflow="fold")
    t.add_column("aggregation", overflow="fold")
    t.add_column("images", justify="right")
    for m in metrics:
        t.add_column(_METRIC_LABELS.get(m, m), justify="right", overflow="fold")
    keyed = table.set_index(group_cols + ["aggregation", "metric"]) if group_cols else \
        table.set_index(["aggregation", "metric"])
    for _, row in wide.iterrows():
        gkey = tuple(row[c] for c in group_cols)
        for r in rules:
            cells = []
            for m in metrics:
                rec = keyed.loc[gkey + (r, m)]
                cell = _fmt(float(rec["value"]))
                if int(rec["n_excluded"]):
                    cell += f" (-{int(rec['n_excluded'])})"
                cells.append(cell)
            t.add_row(*[str(_py(row[c])) for c in varying], r, str(int(row["n_images"])), *cells)
        if len(wide) > 1:
            t.add_section()
    notes = []
    for m in metrics:
        for r in rules:
            sel = table[(table["metric"] == m) & (table["aggregation"] == r)]
            excl = int(sel["n_excluded"].sum())
            if excl:
                notes.append(f"{m}/{r} {excl} of {int(sel['n_units'].sum())}")
    t.caption = ("(-k): k units excluded as undefined (0/0): " + "; ".join(notes)) if notes else \
        "No unit excluded as undefined (0/0)."
    return t
