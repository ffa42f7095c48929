"""Lesion-level detection: connected components of prediction and reference, matched under named rules.

Components are the connected components of a 2D mask (``scipy.ndimage.label``) with 4-connectivity
(edge neighbours) or 8-connectivity (edge and corner neighbours, default). Components with fewer than
``min_area`` pixels are removed on both sides before matching (``min_area=0`` keeps all).

Matching rules (they reproduce the ``lesion_detection`` block of ``../shared/oracle``):

* ``any_overlap``: a reference lesion is a TP if any predicted foreground pixel (of a kept component) lies
  in it, else FN; a predicted component is matched (``tp_pred``) if it touches a reference lesion, else FP.
  Many-to-one is allowed: one merged prediction can detect two lesions.
* ``centroid_in_reference``: a predicted component is matched if its centre of mass, rounded to the nearest
  pixel (``numpy.rint``, ties to even), lies inside a reference lesion, else FP; a reference lesion is a TP
  if at least one predicted centroid lies in it, else FN.
* ``iou`` (``iou_ge_<t>``): one-to-one, greedy by descending component IoU (ties: lower reference label,
  then lower prediction label first); a pair is matched when IoU >= t (MetricsReloaded uses IoU > t).

Per image: ``tp`` (reference lesions detected), ``fn``, ``fp`` (predicted components not matched) and
``tp_pred`` (predicted components matched; equals ``tp`` for one-to-one rules).
Scores: sensitivity = tp / n_ref, precision = tp_pred / n_pred, F1 = harmonic mean of the two (equals
``2 tp / (2 tp + fp + fn)`` for one-to-one rules). A ratio with a zero denominator is NaN (see
``msb.evaluation.empty_policy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import ndimage

__all__ = ["LesionMatch", "criterion_key", "label_components", "lesion_metrics", "lesion_scores", "match_lesions",
           "match_lesions_many"]

CRITERIA = ("any_overlap", "centroid_in_reference", "iou")


@dataclass(frozen=True)
class LesionMatch:
    """Lesion counts of one image (one class) under one matching rule.

    Attributes:
        tp: reference lesions detected; fn: reference lesions missed; fp: predicted components not matched;
        tp_pred: predicted components matched; n_pred, n_ref: component counts after ``min_area``.
    """

    tp: int
    fp: int
    fn: int
    tp_pred: int
    n_pred: int
    n_ref: int


def criterion_key(criterion: str, iou_threshold: float = 0.5) -> str:
    """Column key of a rule: ``any_overlap``, ``centroid_in_reference`` or ``iou_ge_<t>`` (``%g`` of t)."""
    if criterion == "iou":
        return f"iou_ge_{iou_threshold:g}"
    if criterion in CRITERIA:
        return criterion
    raise ValueError(f"unknown lesion criterion {criterion!r}; choose one of {list(CRITERIA)}")


def label_components(mask: np.ndarray, connectivity: int = 8, min_area: int = 0) -> tuple[np.ndarray, int]:
    """Connected components of a 2D mask.

    Args:
        mask: bool (H, W).
        connectivity: 4 (``generate_binary_structure(2, 1)``) or 8 (``generate_binary_structure(2, 2)``).
        min_area: components with fewer pixels are removed (labels are renumbered 1..n in scan order).

    Returns:
        (labels int32 (H, W) with 0 = background, n components).

    Raises:
        ValueError: connectivity not 4/8, negative ``min_area`` or mask not 2D.
    """
    mask = np.asarray(mask, dtype=bool)
    if mask.ndim != 2:
        raise ValueError(f"mask must be 2D, got shape {mask.shape}")
    if connectivity not in (4, 8):
        raise ValueError(f"connectivity must be 4 or 8, got {connectivity!r}")
    if min_area < 0:
        raise ValueError(f"min_area must be >= 0, got {min_area}")
    structure = ndimage.generate_binary_structure(2, 1 if connectivity == 4 else 2)
    labels, n = ndimage.label(mask, structure=structure)
    labels = labels.astype(np.int32, copy=False)
    if min_area > 1 and n > 0:
        areas = np.bincount(labels.ravel(), minlength=n + 1)
        keep = areas >= min_area
        keep[0] = False
        remap = np.zeros(n + 1, dtype=np.int32)
        remap[keep] = np.arange(1, int(keep.sum()) + 1, dtype=np.int32)
        labels = remap[labels]
        n = int(keep.sum())
    return labels, int(n)


def _crop_to_union(pred: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """Crop both masks to their joint bounding box; also return the crop's offset (row, col) in the image.

    Components and overlaps are invariant under the crop; centroids are rounded in image coordinates
    (``numpy.rint`` ties to even, which is not translation invariant). Empty pairs are returned unchanged.
    """
    union = pred | ref
    rows = np.flatnonzero(union.any(axis=1))
    if rows.size == 0:
        return pred, ref, (0, 0)
    cols = np.flatnonzero(union.any(axis=0))
    box = (slice(rows[0], rows[-1] + 1), slice(cols[0], cols[-1] + 1))
    return pred[box], ref[box], (int(rows[0]), int(cols[0]))


def _joint_histogram(lab_p: np.ndarray, n_p: int, lab_r: np.ndarray, n_r: int) -> np.ndarray:
    """``inter[r, p]`` = pixels in reference lesion ``r`` and predicted component ``p`` (0 = background),
    int64 ``(n_r + 1, n_p + 1)``."""
    return np.bincount((lab_r.ravel().astype(np.int64) * (n_p + 1) + lab_p.ravel()),
                       minlength=(n_r + 1) * (n_p + 1)).reshape(n_r + 1, n_p + 1)


def _match(lab_p: np.ndarray, n_p: int, lab_r: np.ndarray, n_r: int, criterion: str,
           iou_threshold: float, offset: tuple[int, int] = (0, 0), inter: np.ndarray | None = None) -> LesionMatch:
    """One rule's match; ``inter``: the :func:`_joint_histogram` of the labels when already computed (it is
    the same for every rule of an image)."""
    if n_p == 0 or n_r == 0:
        return LesionMatch(tp=0, fp=n_p, fn=n_r, tp_pred=0, n_pred=n_p, n_ref=n_r)
    if inter is None and criterion != "centroid_in_reference":
        inter = _joint_histogram(lab_p, n_p, lab_r, n_r)
    if criterion == "any_overlap":
        overlap = inter[1:, 1:] > 0
        tp = int(overlap.any(axis=1).sum())
        tp_pred = int(overlap.any(axis=0).sum())
    elif criterion == "centroid_in_reference":
        rows, cols = np.nonzero(lab_p)
        idx = lab_p[rows, cols]
        area = np.bincount(idx, minlength=n_p + 1)[1:].astype(np.float64)
        cr = np.bincount(idx, weights=rows, minlength=n_p + 1)[1:] / area
        cc = np.bincount(idx, weights=cols, minlength=n_p + 1)[1:] / area
        # round in image coordinates (offset = position of the crop), then index the cropped labels
        hit = lab_r[np.rint(cr + offset[0]).astype(np.int64) - offset[0],
                    np.rint(cc + offset[1]).astype(np.int64) - offset[1]]
        tp_pred = int(np.count_nonzero(hit))
        tp = int(np.unique(hit[hit > 0]).size)
    elif criterion == "iou":
        area_r = inter.sum(axis=1)[1:]
        area_p = inter.sum(axis=0)[1:]
        i = inter[1:, 1:].astype(np.float64)
        iou = i / (area_r[:, None] + area_p[None, :] - i)
        r_idx, p_idx = np.nonzero((i > 0) & (iou >= iou_threshold))
        order = np.lexsort((p_idx, r_idx, -iou[r_idx, p_idx]))
        used_r: set[int] = set()
        used_p: set[int] = set()
        for k in order:
            r, p = int(r_idx[k]), int(p_idx[k])
            if r not in used_r and p not in used_p:
                used_r.add(r)
                used_p.add(p)
        tp = tp_pred = len(used_r)
    else:
        raise ValueError(f"unknown lesion criterion {criterion!r}; choose one of {list(CRITERIA)}")
    return LesionMatch(tp=tp, fp=n_p - tp_pred, fn=n_r - tp, tp_pred=tp_pred, n_pred=n_p, n_ref=n_r)


def match_lesions(pred: np.ndarray, ref: np.ndarray, criterion: str = "any_overlap", connectivity: int = 8,
                  iou_threshold: float = 0.5, min_area: int = 0) -> LesionMatch:
    """Match predicted components to reference lesions of one image under one rule (module docstring).

    Args:
        pred: bool (H, W) prediction; ref: bool (H, W) reference.
        criterion: ``any_overlap``, ``centroid_in_reference`` or ``iou``.
        connectivity: 4 or 8 for the components of both masks.
        iou_threshold: t in (0, 1] for ``iou``.
        min_area: minimum component area in pixels (both sides).

    Returns:
        :class:`LesionMatch`.

    Raises:
        ValueError: shape mismatch, unknown criterion, threshold outside (0, 1].
    """
    pred = np.asarray(pred, dtype=bool)
    ref = np.asarray(ref, dtype=bool)
    if pred.shape != ref.shape:
        raise ValueError(f"pred and ref must have the same shape, got {pred.shape} and {ref.shape}")
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold must be in (0, 1], got {iou_threshold}")
    pred, ref, offset = _crop_to_union(pred, ref)
    lab_p, n_p = label_components(pred, connectivity, min_area)
    lab_r, n_r = label_components(ref, connectivity, min_area)
    return _match(lab_p, n_p, lab_r, n_r, criterion, iou_threshold, offset)


def match_lesions_many(pred: np.ndarray, ref: np.ndarray, rules: Sequence[tuple[str, float]], connectivity: int = 8,
                       min_area: int = 0) -> list[LesionMatch]:
    """:func:`match_lesions` under several ``(criterion, iou_threshold)`` rules, the components labelled once.

    Returns:
        One :class:`LesionMatch` per rule, in order (the threshold matters for ``iou`` only).

    Raises:
        ValueError: as :func:`match_lesions`.
    """
    pred = np.asarray(pred, dtype=bool)
    ref = np.asarray(ref, dtype=bool)
    if pred.shape != ref.shape:
        raise ValueError(f"pred and ref must have the same shape, got {pred.shape} and {ref.shape}")
    if any(not 0.0 < t <= 1.0 for _, t in rules):
        raise ValueError(f"iou thresholds must be in (0, 1], got {[t for _, t in rules]}")
    pred, ref, offset = _crop_to_union(pred, ref)
    lab_p, n_p = label_components(pred, connectivity, min_area)
    lab_r, n_r = label_components(ref, connectivity, min_area)
    inter = _joint_histogram(lab_p, n_p, lab_r, n_r) if n_p and n_r else None  # once for every rule
    return [_match(lab_p, n_p, lab_r, n_r, c, t, offset, inter) for c, t in rules]


def lesion_scores(match: LesionMatch) -> dict[str, float]:
    """Sensitivity (tp/n_ref), precision (tp_pred/n_pred) and F1 (their harmonic mean) of one match.

    Returns NaN for a ratio whose denominator is 0 (no reference lesion -> sensitivity NaN; no predicted
    component -> precision NaN); F1 is NaN only when there is no lesion on either side, and 0 when exactly
    one side has none.
    """
    sens = match.tp / match.n_ref if match.n_ref else float("nan")
    prec = match.tp_pred / match.n_pred if match.n_pred else float("nan")
    if match.n_ref == 0 and match.n_pred == 0:
        f1 = float("nan")
    elif match.n_ref == 0 or match.n_pred == 0 or (sens + prec) == 0:
        f1 = 0.0
    else:
        f1 = 2 * sens * prec / (sens + prec)
    return {"sensitivity": float(sens), "precision": float(prec), "f1": float(f1)}


def lesion_metrics(pred: np.ndarray, ref: np.ndarray, criteria: Sequence[str] = CRITERIA, connectivity: int = 8,
                   iou_threshold: float = 0.5, min_area: int = 0) -> dict[str, float | int]:
    """All lesion columns of one image (one class): ``n_lesions_pred``, ``n_lesions_ref`` and, per rule key
    ``k`` (:func:`criterion_key`), ``lesion_k_{tp,fp,fn,tp_pred,sensitivity,precision,f1}``.

    Components are labelled once and reused for every rule. Arguments as in :func:`match_lesions`.
    """
    pred = np.asarray(pred, dtype=bool)
    ref = np.asarray(ref, dtype=bool)
    if pred.shape != ref.shape:
        raise ValueError(f"pred and ref must have the same shape, got {pred.shape} and {ref.shape}")
    pred, ref, offset = _crop_to_union(pred, ref)
    lab_p, n_p = label_components(pred, connectivity, min_area)
    lab_r, n_r = label_components(ref, connectivity, min_area)
    out: dict[str, float | int] = {"n_lesions_pred": n_p, "n_lesions_ref": n_r}
    inter = (_joint_histogram(lab_p, n_p, lab_r, n_r)  # once for every rule
             if n_p and n_r and any(c != "centroid_in_reference" for c in criteria) else None)
    for criterion in criteria:
        key = criterion_key(criterion, iou_threshold)
        m = _match(lab_p, n_p, lab_r, n_r, criterion, iou_threshold, offset, inter)
        out.update({f"lesion_{key}_tp": m.tp, f"lesion_{key}_fp": m.fp, f"lesion_{key}_fn": m.fn,
                    f"lesion_{key}_tp_pred": m.tp_pred})
        out.update({f"lesion_{key}_{name}": v for name, v in lesion_scores(m).items()})
    return out
