"""Aggregation rules beyond global-micro / image-macro / class-macro, per-image tables, fold-wise summaries.

Every rule is a function of the raw counts (``docs/counts_schema.md``) and reuses the per-unit score
functions of :mod:`msb.analysis.counts.aggregate` (Dice, IoU, precision, recall; NaN = undefined, excluded and
counted). Each rule answers a different question (``docs/analysis.md``):

``global-micro`` / ``image-macro`` / ``class-macro``
    the three basic rules of :mod:`msb.analysis.counts.aggregate` (unchanged, computed there).
``image-class-mean`` (per image–class)
    mean over every image x class unit with a defined score, all units weighted equally. *What is the score
    of a randomly drawn (image, class) pair?* Equal to ``image-macro`` for a binary task; with several
    classes, a class present in more images weighs more.
``image-foreground`` (per-sample foreground)
    per image, sum TP, FP, FN over the foreground classes (class labels ignored), one score per image, then
    the mean over images with a defined score. *How well is the foreground segmented on a typical image?*
``pooled-foreground``
    sum TP, FP, FN over every image and foreground class, one ratio. *What fraction of all foreground pixels
    is right?* Counts hold foreground classes only, so this equals ``global-micro``; the name is kept for
    tables that distinguish "pooled foreground" from per-class pooling.
``pooled-class`` (one value per class, aggregation label ``pooled-class:<class_name>``)
    per class, sum the counts over images, one ratio. *How well is class c segmented over the whole test
    set?* The mean of these values over classes is ``class-macro``.

All rules are evaluated through one vectorised kernel, :func:`rule_values`, which takes image weights
``W`` (shape ``(B, n_images)``): ``W = 1`` gives the point estimate, bootstrap resampling counts give the
replicates (:mod:`msb.analysis.stats.bootstrap`). With all-ones weights every basic rule equals
:func:`msb.analysis.counts.aggregate.reaggregate` (tested).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from msb.analysis.counts.aggregate import (
    ALL_METRICS,
    ALL_RULES,
    DEFAULT_GROUP,
    POOL_FOLDS_GROUP,
    SCORE_COLUMNS,
    check_poolable,
    score_from_counts,
    score_table,
    reaggregate,
)
from msb.errors import MSBError

__all__ = [
    "BASE_RULES", "EXTRA_RULES", "EXTENDED_RULES", "RULE_QUESTIONS", "PAIR_KEY", "ImageTable",
    "image_table", "score", "rule_values", "rule_names", "aggregate_rules", "unit_scores",
    "foldwise_summary", "parse_rules", "lower_is_better",
]

#: The three rules of :mod:`msb.analysis.counts.aggregate`.
BASE_RULES: tuple[str, ...] = ALL_RULES
#: Rules added here (``pooled-class`` expands to one ``pooled-class:<class_name>`` row per class).
EXTRA_RULES: tuple[str, ...] = ("image-class-mean", "image-foreground", "pooled-foreground", "pooled-class")
#: Every rule name accepted by :func:`aggregate_rules`, in output order.
EXTENDED_RULES: tuple[str, ...] = BASE_RULES + EXTRA_RULES
#: The question each rule answers (shown in reports and ``docs/analysis.md``).
RULE_QUESTIONS: dict[str, str] = {
    "global-micro": "What fraction of all (image, class) pixels is right? Large objects dominate.",
    "image-macro": "What is the typical per-image score, classes weighted equally? Every image counts once.",
    "class-macro": "How well is each class segmented over the whole set, classes weighted equally?",
    "image-class-mean": "What is the score of a random (image, class) pair? Every defined pair counts once.",
    "image-foreground": "How well is the foreground (classes pooled) segmented on a typical image?",
    "pooled-foreground": "What fraction of all foreground pixels is right? (= global-micro for foreground counts)",
    "pooled-class": "How well is this one class segmented over the whole set (pixels pooled over images)?",
}
#: Columns pairing the same image across two systems (``fold`` is not part of it: under K-fold CV an image
#: is tested once per system, and a fold run may be compared with a non-fold run on the same images).
PAIR_KEY: tuple[str, ...] = ("dataset", "split", "image_id")

_IMAGE_KEY = ("dataset", "split", "fold", "run_id", "checkpoint_role", "image_id")
_LOWER_BETTER_PREFIXES = ("hd", "assd", "masd", "asd_")


def lower_is_better(metric: str) -> bool:
    """True for distance metrics (``hd``, ``hd95``, ``assd``, ``masd``, ``asd_*``, directed variants), whose
    smaller values are better; False for overlap metrics (Dice, IoU, precision, recall, NSD, lesion rates)."""
    return metric.startswith(_LOWER_BETTER_PREFIXES)


#: Per-unit score of a metric from counts; the single definition lives in :mod:`msb.analysis.counts.aggregate`.
score = score_from_counts


@dataclass(frozen=True)
class ImageTable:
    """Counts of one system (one run, or the pooled folds of a model) as per-image arrays.

    Attributes:
        keys: one row per image (``n`` rows) with ``dataset, split, fold, run_id, checkpoint_role,
            image_id, source`` (``RangeIndex``; row ``i`` describes row ``i`` of the arrays).
        class_ids: ``(C,)`` int64, foreground class ids in increasing order.
        class_names: the ``C`` class names.
        tp, fp, fn: ``(n, C)`` int64 pixel counts.
        extra: per image x class metric values from ``metrics.parquet`` (e.g. ``"hd95"``), each ``(n, C)``
            float64, NaN where undefined or absent.
        threshold: the one binarisation threshold of the rows; ``threshold_on`` its domain.
    """

    keys: pd.DataFrame
    class_ids: np.ndarray
    class_names: tuple[str, ...]
    tp: np.ndarray
    fp: np.ndarray
    fn: np.ndarray
    extra: Mapping[str, np.ndarray] = field(default_factory=dict)
    threshold: float = float("nan")
    threshold_on: str = ""

    @property
    def n_images(self) -> int:
        """Number of images ``n``."""
        return int(self.tp.shape[0])

    def subset(self, rows: np.ndarray) -> "ImageTable":
        """The table restricted to image positions (or a boolean mask) ``rows``, in that order."""
        rows = np.asarray(rows)
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        return ImageTable(self.keys.iloc[rows].reset_index(drop=True), self.class_ids, self.class_names,
                          self.tp[rows], self.fp[rows], self.fn[rows],
                          {k: v[rows] for k, v in self.extra.items()}, self.threshold, self.threshold_on)

    def with_metrics(self, metrics: pd.DataFrame, columns: Sequence[str] | None = None) -> "ImageTable":
        """Attach per image x class columns of a ``metrics.parquet`` table (docs/metrics.md).

        Args:
            metrics: rows keyed like the counts (``dataset, split, fold, run_id, checkpoint_role, image_id,
                class_id``); other systems' rows are ignored.
            columns: float columns to attach; default every float column except the spacing/penalty ones.

        Returns:
            A new table whose ``extra`` holds each column as ``(n, C)`` float64 (NaN where the metrics
            table has no row or an undefined value).
        """
        key = list(_IMAGE_KEY)
        missing = [c for c in (*key, "class_id") if c not in metrics.columns]
        if missing:
            raise MSBError(f"metrics table lacks key columns {missing}; re-run `msb metrics RUN_DIR`")
        if columns is None:
            skip = {"spacing_row", "spacing_col", "distance_penalty", "threshold"}
            columns = [c for c in metrics.columns if metrics[c].dtype.kind == "f" and c not in skip]
        img_index = pd.MultiIndex.from_frame(self.keys[key].astype(object))
        m_index = pd.MultiIndex.from_frame(metrics[key].astype(object))
        pos = img_index.get_indexer(m_index)
        cls_pos = pd.Index(self.class_ids).get_indexer(metrics["class_id"].to_numpy())
        ok = (pos >= 0) & (cls_pos >= 0)
        extra = dict(self.extra)
        for col in columns:
            arr = np.full(self.tp.shape, np.nan)
            arr[pos[ok], cls_pos[ok]] = metrics[col].to_numpy(dtype=np.float64)[ok]
            extra[col] = arr
        return ImageTable(self.keys, self.class_ids, self.class_names, self.tp, self.fp, self.fn, extra,
                          self.threshold, self.threshold_on)


def image_table(df: pd.DataFrame, label: str | None = None) -> ImageTable:
    """Pivot the counts rows of one system into an :class:`ImageTable`.

    Args:
        df: counts rows (``docs/counts_schema.md``) of one system, e.g. one run and checkpoint role, or all
            folds of a model.
        label: names the rows in error messages.

    Raises:
        MSBError: no rows; rows mixing thresholds (:func:`~msb.analysis.counts.aggregate.check_poolable`); an
            image missing a class row that other images have (the image and class are named).
    """
    what = label or "the selected rows"
    if len(df) == 0:
        raise MSBError(f"no count rows in {what}")
    missing = [c for c in (*_IMAGE_KEY, "class_id", "tp", "fp", "fn") if c not in df.columns]
    if missing:
        raise MSBError(f"{what}: columns {missing} not in the counts table")
    check_poolable(df, label)
    img_codes, img_uniques = pd.factorize(pd.MultiIndex.from_frame(df[list(_IMAGE_KEY)].astype(object)),
                                          sort=False)
    cls_codes, cls_uniques = pd.factorize(df["class_id"].to_numpy(dtype=np.int64), sort=True)
    n, c = len(img_uniques), len(cls_uniques)
    seen = np.zeros((n, c), dtype=np.int64)
    np.add.at(seen, (img_codes, cls_codes), 1)
    if (seen != 1).any():
        i, j = np.argwhere(seen != 1)[0]
        state = "missing" if seen[i, j] == 0 else "duplicated"
        raise MSBError(f"{what}: the row of image {img_uniques[i][-1]!r} (run {img_uniques[i][3]!r}) and "
                       f"class_id {int(cls_uniques[j])} is {state}; every image needs exactly one row per "
                       f"class. Re-run the evaluator for that run")
    arrays = []
    for col in ("tp", "fp", "fn"):
        a = np.zeros((n, c), dtype=np.int64)
        a[img_codes, cls_codes] = df[col].to_numpy(dtype=np.int64)
        arrays.append(a)
    first = pd.Series(np.arange(len(df))).groupby(img_codes).first().to_numpy()
    keys = df.iloc[first][[*_IMAGE_KEY, *(["source"] if "source" in df.columns else [])]]
    keys = keys.reset_index(drop=True)
    names_by_id = {}
    if "class_name" in df.columns:
        names_by_id = dict(zip(df["class_id"].to_numpy(dtype=np.int64), df["class_name"].astype(str)))
    names = tuple(str(names_by_id.get(int(k), int(k))) for k in cls_uniques)
    thr = float(df["threshold"].iloc[0]) if "threshold" in df.columns else float("nan")
    thr_on = str(df["threshold_on"].iloc[0]) if "threshold_on" in df.columns else ""
    return ImageTable(keys, np.asarray(cls_uniques, dtype=np.int64), names, *arrays,
                      threshold=thr, threshold_on=thr_on)


def _nanmean_rows(x: np.ndarray) -> np.ndarray:
    """Mean over the last axis ignoring NaN; NaN where a row has no finite value (no warning)."""
    ok = ~np.isnan(x)
    cnt = ok.sum(axis=-1)
    tot = np.where(ok, x, 0.0).sum(axis=-1)
    out = np.full(cnt.shape, np.nan)
    np.divide(tot, cnt, out=out, where=cnt > 0)
    return out


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out


def rule_names(rules: Sequence[str], class_names: Sequence[str]) -> list[str]:
    """Expand ``pooled-class`` into ``pooled-class:<class_name>`` labels (other rules unchanged)."""
    out: list[str] = []
    for r in rules:
        if r == "pooled-class":
            out.extend(f"pooled-class:{n}" for n in class_names)
        else:
            out.append(r)
    return out


def rule_values(table: ImageTable, rule: str, metric: str, weights: np.ndarray | None = None) -> np.ndarray:
    """Score of one rule and metric under image weights (vectorised over weight rows).

    Args:
        table: the system's :class:`ImageTable` (``n`` images, ``C`` classes).
        rule: one of :data:`EXTENDED_RULES` except ``pooled-class``, or ``pooled-class:<class_name>``.
        metric: ``dice``, ``iou``, ``precision``, ``recall`` (from counts), or a column of ``table.extra``
            (then only the mean rules ``image-macro``, ``image-class-mean`` apply: mean over defined values).
        weights: ``(B, n)`` non-negative image weights (bootstrap resampling counts); ``None`` = one row of
            ones (the point estimate).

    Returns:
        ``(B,)`` float64 values; NaN where no unit is defined. With ``s`` the per-unit score,
        ``w_i`` the weight of image ``i`` and ``d`` the defined-indicator:

        * global-micro, pooled-foreground: ``s(Σ_i w_i Σ_c TP_ic, ...)``
        * class-macro: ``mean_c s(Σ_i w_i TP_ic, ...)`` over classes with a defined score
        * pooled-class:c: ``s(Σ_i w_i TP_ic, ...)`` for the one class c
        * image-macro: ``mean_c [Σ_i w_i d_ic s_ic / Σ_i w_i d_ic]``
        * image-class-mean: ``Σ_ic w_i d_ic s_ic / Σ_ic w_i d_ic``
        * image-foreground: ``Σ_i w_i d_i s_i / Σ_i w_i d_i`` with ``s_i = s(Σ_c TP_ic, ...)``

    Raises:
        MSBError: unknown rule, metric or class name.
    """
    n = table.n_images
    w = np.ones((1, n)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[1] != n:
        raise ValueError(f"weights must have shape (B, {n}), got {w.shape}")
    from_counts = metric in ALL_METRICS
    if not from_counts and metric not in table.extra:
        raise MSBError(f"unknown metric {metric!r}; choose from {list(ALL_METRICS)} or a metrics.parquet "
                       f"column attached to the table ({sorted(table.extra)})")
    if not from_counts and rule not in ("image-macro", "image-class-mean"):
        raise MSBError(f"metric {metric!r} is a per-image value: only image-macro and image-class-mean apply, "
                       f"not {rule!r}")
    tp, fp, fn = table.tp, table.fp, table.fn
    if rule in ("global-micro", "pooled-foreground"):
        sums = w @ np.stack([tp.sum(1), fp.sum(1), fn.sum(1)], axis=1).astype(np.float64)
        return score(metric, sums[:, 0], sums[:, 1], sums[:, 2])
    if rule == "class-macro" or rule.startswith("pooled-class:"):
        c = tp.shape[1]
        sums = w @ np.concatenate([tp, fp, fn], axis=1).astype(np.float64)
        per_class = score(metric, sums[:, :c], sums[:, c:2 * c], sums[:, 2 * c:])
        if rule == "class-macro":
            return _nanmean_rows(per_class)
        name = rule.split(":", 1)[1]
        if name not in table.class_names:
            raise MSBError(f"rule {rule!r}: no class named {name!r}; classes: {list(table.class_names)}")
        return per_class[:, table.class_names.index(name)]
    if rule in ("image-macro", "image-class-mean"):
        s = score(metric, tp, fp, fn) if from_counts else table.extra[metric]
        d = ~np.isnan(s)
        s0 = np.where(d, s, 0.0)
        if rule == "image-class-mean":
            return _safe_div(w @ s0.sum(1), w @ d.sum(1).astype(np.float64))
        return _nanmean_rows(_safe_div(w @ s0, w @ d.astype(np.float64)))
    if rule == "image-foreground":
        s = score(metric, tp.sum(1), fp.sum(1), fn.sum(1))
        d = ~np.isnan(s)
        return _safe_div(w @ np.where(d, s, 0.0), w @ d.astype(np.float64))
    raise MSBError(f"unknown aggregation rule {rule!r}; choose from {list(EXTENDED_RULES)}")


def _rule_units(table: ImageTable, rule: str, metric: str) -> tuple[int, int]:
    """``(n_units, n_excluded)`` of a rule's innermost mean (the point estimate)."""
    tp, fp, fn = table.tp, table.fp, table.fn
    if rule in ("global-micro", "pooled-foreground"):
        v = rule_values(table, rule, metric)[0]
        return 1, int(np.isnan(v))
    if rule.startswith("pooled-class:"):
        v = rule_values(table, rule, metric)[0]
        return 1, int(np.isnan(v))
    if rule == "image-class-mean":
        s = score(metric, tp, fp, fn)
        return int(s.size), int(np.isnan(s).sum())
    if rule == "image-foreground":
        s = score(metric, tp.sum(1), fp.sum(1), fn.sum(1))
        return int(s.size), int(np.isnan(s).sum())
    raise MSBError(f"unknown aggregation rule {rule!r}")


def parse_rules(text: str | Sequence[str] | None) -> list[str]:
    """Rule names from a comma-separated string (``"all"`` = :data:`EXTENDED_RULES`, ``None`` = the basic
    three). Raises :class:`MSBError` naming unknown rules."""
    if text is None:
        return list(BASE_RULES)
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if items == ["all"]:
        return list(EXTENDED_RULES)
    bad = [r for r in items if r not in EXTENDED_RULES]
    if bad or not items:
        raise MSBError(f"unknown aggregation rule(s) {bad or items}; choose from {list(EXTENDED_RULES)} "
                       f"or 'all'")
    return items


def aggregate_rules(df: pd.DataFrame, group_by: Sequence[str] = DEFAULT_GROUP,
                    rules: Sequence[str] = EXTENDED_RULES,
                    metrics: Sequence[str] = ALL_METRICS) -> pd.DataFrame:
    """Like :func:`msb.analysis.counts.aggregate.reaggregate`, with the extra rules of this module.

    Args:
        df: counts rows.
        group_by: pooling columns (see :func:`~msb.analysis.counts.aggregate.reaggregate`).
        rules: subset of :data:`EXTENDED_RULES`; basic rules are computed by ``reaggregate`` itself.
        metrics: subset of ``dice, iou, precision, recall``.

    Returns:
        The same tidy columns as ``reaggregate`` (group columns, ``aggregation, metric, value, n_images,
        n_classes, n_units, n_excluded``); ``pooled-class`` gives one ``pooled-class:<name>`` row per class.
        Rows: per group, rules in the given order, metrics in the given order.

    Raises:
        MSBError: as ``reaggregate``; unknown rule names.
    """
    rules = parse_rules(list(rules))
    metrics = list(metrics)
    base = [r for r in rules if r in BASE_RULES]
    group_by = list(group_by)
    base_table = reaggregate(df, group_by, base, metrics) if base else None
    if all(r in BASE_RULES for r in rules):
        return base_table  # type: ignore[return-value]
    missing = [c for c in group_by if c not in df.columns]
    if missing:
        raise MSBError(f"group_by: columns {missing} not in the counts table; available: {list(df.columns)}")
    groups = ([(k if isinstance(k, tuple) else (k,), g) for k, g in df.groupby(group_by, sort=True, dropna=False)]
              if group_by else [((), df)])
    records = []
    for key, g in groups:
        label = "group " + ", ".join(f"{c}={v!r}" for c, v in zip(group_by, key)) if group_by else None
        table = image_table(g, label)
        gvals = {c: (v.item() if isinstance(v, np.generic) else v) for c, v in zip(group_by, key)}
        for rule in rules:
            if rule in BASE_RULES:
                sub = base_table
                for c, v in gvals.items():
                    sub = sub[sub[c] == v]
                for _, row in sub[sub["aggregation"] == rule].iterrows():
                    records.append({**gvals, **{c: row[c] for c in SCORE_COLUMNS}})
                continue
            for name in rule_names([rule], table.class_names):
                for metric in metrics:
                    value = float(rule_values(table, name, metric)[0])
                    n_units, n_excl = _rule_units(table, name, metric)
                    records.append({**gvals, "aggregation": name, "metric": metric, "value": value,
                                    "n_images": table.n_images, "n_classes": len(table.class_ids),
                                    "n_units": n_units, "n_excluded": n_excl})
    return score_table(records, group_by, df)


def unit_scores(table: ImageTable, metric: str, unit: str = "image") -> np.ndarray:
    """Per-image (or per image–class) scores, the paired units of significance tests.

    Args:
        table: the system's counts (and attached metrics).
        metric: ``dice, iou, precision, recall`` or an ``extra`` column (e.g. ``hd95``).
        unit: ``"image"``: per image, the mean over classes of the defined image x class scores (for a
            binary task the image's score); ``"image-foreground"``: classes pooled per image (counts metrics
            only); ``"image-class"``: the ``(n, C)`` matrix flattened row-major.

    Returns:
        float64 vector (``n`` or ``n*C``), NaN where undefined.
    """
    if metric in ALL_METRICS:
        s = score(metric, table.tp, table.fp, table.fn)
    elif metric in table.extra:
        s = table.extra[metric]
    else:
        raise MSBError(f"unknown metric {metric!r}; choose from {list(ALL_METRICS)} or "
                       f"{sorted(table.extra)}")
    if unit == "image":
        return _nanmean_rows(s)
    if unit == "image-class":
        return s.reshape(-1)
    if unit == "image-foreground":
        if metric not in ALL_METRICS:
            raise MSBError(f"unit 'image-foreground' pools counts; {metric!r} is not a counts metric")
        return score(metric, table.tp.sum(1), table.fp.sum(1), table.fn.sum(1))
    raise MSBError(f"unknown unit {unit!r}; choose from ['image', 'image-foreground', 'image-class']")


def foldwise_summary(df: pd.DataFrame, group_by: Sequence[str] = POOL_FOLDS_GROUP,
                     rules: Sequence[str] = BASE_RULES, metrics: Sequence[str] = ALL_METRICS) -> pd.DataFrame:
    """Fold-wise summary: each fold scored on its own, then mean, standard deviation, min and max over
    folds, beside the value of all folds pooled.

    Args:
        df: counts rows; ``fold`` is ``-1`` for a non-fold run (then ``n_folds = 1`` and ``std`` is NaN).
        group_by: columns of one summary (default: dataset, split, model, checkpoint role: all runs of a
            model pooled); must not contain ``fold`` or ``run_id``.
        rules, metrics: as :func:`aggregate_rules`.

    Returns:
        Tidy DataFrame: group columns, ``aggregation, metric, n_folds, mean_over_folds,
        std_over_folds`` (sample standard deviation, ddof = 1), ``min_over_folds, max_over_folds,
        pooled`` (the rule over all folds' images together), ``n_images``.
    """
    group_by = list(group_by)
    if "fold" in group_by or "run_id" in group_by:
        raise MSBError("foldwise_summary: group_by must not contain 'fold' or 'run_id' (they are summarised)")
    per_fold = aggregate_rules(df, [*group_by, "fold", "run_id"], rules, metrics)
    pooled = aggregate_rules(df, group_by, rules, metrics)
    keys = [*group_by, "aggregation", "metric"]
    stats = per_fold.groupby(keys, sort=False, dropna=False)["value"].agg(
        n_folds="size", mean_over_folds="mean", std_over_folds=lambda v: v.std(ddof=1) if len(v) > 1 else np.nan,
        min_over_folds="min", max_over_folds="max").reset_index()
    out = stats.merge(pooled[[*keys, "value", "n_images"]].rename(columns={"value": "pooled"}), on=keys,
                      how="left")
    out["n_folds"] = out["n_folds"].astype(np.int64)
    return out
