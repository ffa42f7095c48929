"""The pandas-free core of the aggregation rules: rule names, the groupings and one pool's score.

Shared by :mod:`msb.analysis.counts.aggregate` (pandas tables) and :mod:`msb.analysis.counts.reaggregate_fast` (the columnar
``msb reaggregate`` path, which never imports pandas). Formulas: :func:`msb.analysis.counts.aggregate.aggregate`.
"""

from __future__ import annotations

import numpy as np

from msb.analysis.counts.count_scores import ratio_or_nan, score_from_counts
from msb.errors import MSBError

__all__ = ["ALL_RULES", "DEFAULT_GROUP", "POOL_FOLDS_GROUP", "GROUPINGS", "IMAGE_COLUMNS", "SCORE_COLUMNS",
           "aggregate_arrays"]

#: Aggregation rules, in output order.
ALL_RULES: tuple[str, ...] = ("global-micro", "image-macro", "class-macro")
#: Default grouping of :func:`msb.analysis.counts.aggregate.reaggregate`: one group per evaluated run x checkpoint role.
DEFAULT_GROUP: tuple[str, ...] = ("dataset", "split", "model", "run_id", "checkpoint_role", "fold")
#: Grouping that pools every run (e.g. all folds) of a model on a dataset split.
POOL_FOLDS_GROUP: tuple[str, ...] = ("dataset", "split", "model", "checkpoint_role")
#: Named groupings (for a CLI option).
GROUPINGS: dict[str, tuple[str, ...]] = {"run": DEFAULT_GROUP, "folds": POOL_FOLDS_GROUP}
#: Columns identifying one image (a counts key without ``class_id``): the same ``image_id`` in two
#: runs is two images.
IMAGE_COLUMNS: tuple[str, ...] = ("dataset", "split", "fold", "run_id", "checkpoint_role", "image_id")
#: Columns of the long table returned by :func:`msb.analysis.counts.aggregate.reaggregate`, after the group columns.
SCORE_COLUMNS: tuple[str, ...] = ("aggregation", "metric", "value", "n_images", "n_classes",
                                  "n_units", "n_excluded")


def aggregate_arrays(rule: str, metric: str, tp: np.ndarray, fp: np.ndarray, fn: np.ndarray,
                     class_codes: np.ndarray, n_classes: int) -> tuple[float, int, int]:
    """One score of one pool of rows under ``rule`` (the core of :func:`msb.analysis.counts.aggregate.aggregate`).

    Args:
        rule: one of :data:`ALL_RULES`; metric: one of :data:`~msb.analysis.counts.count_scores.ALL_METRICS`.
        tp, fp, fn: ``(n,)`` int64 pixel counts of the pool's rows (one row = one image x class).
        class_codes: ``(n,)`` int codes of the rows' classes in ``0..n_classes-1``.
        n_classes: number of distinct classes in the pool.

    Returns:
        ``(value, n_units, n_excluded)``; formulas in :func:`msb.analysis.counts.aggregate.aggregate`.

    Raises:
        MSBError: unknown rule.
    """
    if rule == "global-micro":
        s = score_from_counts(metric, tp.sum(), fp.sum(), fn.sum())
        v = float(s)
        return v, 1, int(np.isnan(v))
    if rule == "class-macro":
        sums = [np.bincount(class_codes, weights=a, minlength=n_classes) for a in (tp, fp, fn)]
        scores = score_from_counts(metric, *sums)
        defined = ~np.isnan(scores)
        value = float(scores[defined].mean()) if defined.any() else float("nan")
        return value, int(n_classes), int((~defined).sum())
    if rule == "image-macro":
        scores = score_from_counts(metric, tp, fp, fn)
        defined = ~np.isnan(scores)
        sums = np.bincount(class_codes[defined], weights=scores[defined], minlength=n_classes)
        counts = np.bincount(class_codes[defined], minlength=n_classes)
        class_means = ratio_or_nan(sums, counts)
        ok = ~np.isnan(class_means)
        value = float(class_means[ok].mean()) if ok.any() else float("nan")
        return value, int(len(scores)), int((~defined).sum())
    raise MSBError(f"unknown aggregation rule {rule!r}; choose from {list(ALL_RULES)}")
