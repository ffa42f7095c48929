"""Per-unit scores from pixel counts: Dice, IoU, precision and recall (MONAI-style ``compute_*`` functions,
vectorised over counts of any broadcastable shape).

* Dice (Dice 1945; Sørensen 1948): ``2 TP / (2 TP + FP + FN)``
* IoU (Jaccard 1912): ``TP / (TP + FP + FN)``
* precision: ``TP / (TP + FP)``
* recall (sensitivity): ``TP / (TP + FN)``

A score whose denominator is 0 is *undefined* and returned as NaN (e.g. Dice and IoU of an image where both
reference and prediction are empty, precision of an empty prediction, recall of an empty reference). The
aggregation rules that pool these units live in :mod:`msb.analysis.counts.aggregate` (which re-exports every name
defined here).
"""

from __future__ import annotations

import numpy as np

from msb.errors import MSBError

__all__ = ["ALL_METRICS", "dice_from_counts", "iou_from_counts", "precision_from_counts", "ratio_or_nan",
           "recall_from_counts", "score_from_counts"]

#: Metrics, in output order.
ALL_METRICS: tuple[str, ...] = ("dice", "iou", "precision", "recall")


def ratio_or_nan(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """Element-wise ``num / den`` as ``float64`` (broadcast shape), NaN where ``den == 0`` (undefined)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    num, den = np.broadcast_arrays(num, den)
    out = np.full(num.shape, np.nan, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def dice_from_counts(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """Dice similarity coefficient ``2 TP / (2 TP + FP + FN)`` (Dice 1945; Sørensen 1948).

    Args:
        tp, fp, fn: pixel counts, any broadcastable shape, integer or float.

    Returns:
        ``float64`` array of the broadcast shape, in [0, 1]; NaN where ``2 TP + FP + FN == 0``
        (empty reference and empty prediction: undefined).
    """
    tp = np.asarray(tp, dtype=np.float64)
    return ratio_or_nan(2.0 * tp, 2.0 * tp + np.asarray(fp, dtype=np.float64) + np.asarray(fn, dtype=np.float64))


def iou_from_counts(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """Intersection over union (Jaccard index, Jaccard 1912) ``TP / (TP + FP + FN)``.

    Args:
        tp, fp, fn: pixel counts, any broadcastable shape.

    Returns:
        ``float64`` array in [0, 1]; NaN where ``TP + FP + FN == 0`` (undefined).
    """
    tp = np.asarray(tp, dtype=np.float64)
    return ratio_or_nan(tp, tp + np.asarray(fp, dtype=np.float64) + np.asarray(fn, dtype=np.float64))


def precision_from_counts(tp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """Precision (positive predictive value) ``TP / (TP + FP)``.

    Args:
        tp, fp: pixel counts, any broadcastable shape.

    Returns:
        ``float64`` array in [0, 1]; NaN where ``TP + FP == 0`` (empty prediction: undefined).
    """
    tp = np.asarray(tp, dtype=np.float64)
    return ratio_or_nan(tp, tp + np.asarray(fp, dtype=np.float64))


def recall_from_counts(tp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """Recall (sensitivity, true positive rate) ``TP / (TP + FN)``.

    Args:
        tp, fn: pixel counts, any broadcastable shape.

    Returns:
        ``float64`` array in [0, 1]; NaN where ``TP + FN == 0`` (empty reference: undefined).
    """
    tp = np.asarray(tp, dtype=np.float64)
    return ratio_or_nan(tp, tp + np.asarray(fn, dtype=np.float64))


def score_from_counts(metric: str, tp: np.ndarray, fp: np.ndarray, fn: np.ndarray) -> np.ndarray:
    """Per-unit ``metric`` (dice, iou, precision, recall) from counts of any broadcastable shape; NaN where
    undefined. Raises :class:`MSBError` for an unknown metric."""
    if metric == "dice":
        return dice_from_counts(tp, fp, fn)
    if metric == "iou":
        return iou_from_counts(tp, fp, fn)
    if metric == "precision":
        return precision_from_counts(tp, fp)
    if metric == "recall":
        return recall_from_counts(tp, fn)
    raise MSBError(f"unknown metric {metric!r}; choose from {list(ALL_METRICS)}")
