"""The scoring recipe of a published semi-supervised evaluation card, reproduced AS WRITTEN and named for what it is.

The card (SemiGDA, Huang et al. 2026, arXiv:2604.23274; ``../shared/reference/papers/002_*.txt``) scores each
test image with::

    inter = sum(pred & gt)
    dice  = 2 inter / (sum(pred) + sum(gt))                  # 0/0 -> NaN (numpy warning), no smoothing
    iou   = inter / sum(pred | gt)                            # 0/0 -> NaN
    hd95  = percentile(max(cdist(argwhere(pred), argwhere(gt)), axis=1), 95)

and reports the plain ``np.mean`` of each list. Its "HD95" is not a Hausdorff distance: for every predicted
foreground pixel it takes the distance to the **farthest** reference foreground pixel (one direction, all
foreground pixels rather than boundary pixels, no pixel spacing) and then the 95th percentile (numpy ``linear``).
It is about the object's diameter even for a perfect prediction (59.08 px for two identical disks of radius 30,
oracle case ``identical_disk_224``), so it measures object size, not boundary error. It raises on an empty
mask (``max`` of an empty axis, or ``percentile`` of an empty array). Here it is
``card_hd95_as_written``; it is only ever reported beside the real HD95 of a named convention
(``msb.evaluation.surface``, ``docs/metrics.md``).

Computation without the |P| x |G| distance matrix: the farthest point of a finite set from any query point is
a vertex of the set's convex hull (a convex function - the distance to the query - attains its maximum over
a polytope at a vertex). The hull of the reference pixels is found with ``scipy.spatial.ConvexHull``
(Qhull); degenerate sets (one pixel, or all pixels on one line) have no 2D hull, and their farthest points are
the two extreme pixels along the line. Distances from the predicted pixels to the hull vertices only are then
computed with ``scipy.spatial.distance.cdist`` in row chunks, with the same float64 arithmetic as the card,
so the values are identical to the card's (tested against the brute-force formula and the oracle's
``recipe_semigda`` values).
"""

from __future__ import annotations

import math
import warnings
from typing import Iterable, Sequence

import numpy as np
from scipy.spatial import ConvexHull, QhullError
from scipy.spatial.distance import cdist

from msb.errors import MSBError

__all__ = ["CARD_COLUMNS", "CardRecipeError", "card_dataset_scores", "card_dice_iou_as_written",
           "card_hd95_as_written", "card_image_metrics", "farthest_point_distances", "hull_vertices"]

#: Columns added to a metrics row by :func:`card_image_metrics` (``evaluation.metrics.card: true``).
CARD_COLUMNS: tuple[str, ...] = ("card_dice_as_written", "card_iou_as_written", "card_hd95_as_written",
                                 "card_hd95_refused")

#: Predicted pixels per block of the chunked distance computation (block x hull-vertex matrix).
_CHUNK = 65536


class CardRecipeError(MSBError):
    """The card's recipe cannot score this pair (it would crash on it): an empty prediction or reference."""


def hull_vertices(points: np.ndarray) -> np.ndarray:
    """The points of a 2D set among which the farthest point from any query point always lies.

    Args:
        points: (N, 2) pixel coordinates (row, col), any numeric dtype, N >= 1.

    Returns:
        (K, 2) float64 subset of ``points``: the vertices of the convex hull (Qhull via
        ``scipy.spatial.ConvexHull``), or for a degenerate set (one distinct point, or all points collinear)
        the one point or the two extreme points along the line.

    Raises:
        ValueError: ``points`` is empty or not (N, 2).
    """
    pts = np.asarray(points, dtype=np.float64)
    if pts.ndim != 2 or pts.shape[1] != 2 or pts.shape[0] == 0:
        raise ValueError(f"points must be a non-empty (N, 2) array, got shape {pts.shape}")
    uniq = np.unique(pts, axis=0)
    if uniq.shape[0] <= 2:
        return uniq
    centred = uniq - uniq[0]
    if np.linalg.matrix_rank(centred) >= 2:
        try:
            return uniq[ConvexHull(uniq).vertices]
        except QhullError:  # pragma: no cover - rank 2 integer sets always have a hull; keep the exact fallback
            return uniq
    direction = centred[np.argmax(np.abs(centred).sum(axis=1))]  # a non-zero vector along the line
    proj = centred @ direction
    return uniq[[int(np.argmin(proj)), int(np.argmax(proj))]]


def farthest_point_distances(query: np.ndarray, points: np.ndarray) -> np.ndarray:
    """For each query point, the Euclidean distance to the farthest point of ``points``.

    Equal to ``np.max(cdist(query, points), axis=1)`` without its (|query| x |points|) matrix: only the hull
    vertices of ``points`` (:func:`hull_vertices`) are candidates, and the queries are processed in chunks.

    Args:
        query: (M, 2) coordinates, M >= 1.
        points: (N, 2) coordinates, N >= 1 (same units as ``query``; pixels here).

    Returns:
        float64 (M,) distances, in the units of the coordinates.

    Raises:
        ValueError: an empty or malformed input.
    """
    q = np.asarray(query, dtype=np.float64)
    if q.ndim != 2 or q.shape[1] != 2 or q.shape[0] == 0:
        raise ValueError(f"query must be a non-empty (M, 2) array, got shape {q.shape}")
    hull = hull_vertices(points)
    out = np.empty(q.shape[0], dtype=np.float64)
    for start in range(0, q.shape[0], _CHUNK):
        out[start:start + _CHUNK] = cdist(q[start:start + _CHUNK], hull).max(axis=1)
    return out


def _check_pair(pred: np.ndarray, gt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(pred).astype(bool, copy=False)
    g = np.asarray(gt).astype(bool, copy=False)
    if p.ndim != 2 or p.shape != g.shape:
        raise ValueError(f"pred and gt must be 2D masks of the same shape, got {p.shape} and {g.shape}")
    return p, g


def card_hd95_as_written(pred: np.ndarray, gt: np.ndarray) -> float:
    """The card's "HD95": 95th percentile over predicted foreground pixels of the distance to the FARTHEST
    reference foreground pixel (module docstring). Not a Hausdorff distance.

    Equal to ``np.percentile(np.max(cdist(np.argwhere(pred), np.argwhere(gt)), axis=1), 95)`` (numpy default
    ``linear`` interpolation), computed through the hull of the reference pixels.

    Args:
        pred: bool (H, W) hard prediction (non-zero = foreground).
        gt: bool (H, W) reference.

    Returns:
        float, in pixels (the card uses no spacing; the image's spacing is ignored on purpose).

    Raises:
        CardRecipeError: the prediction or the reference is empty (the card's code raises there: ``max`` over
            an empty axis or the percentile of an empty array); the message says which mask is empty.
        ValueError: shapes differ or are not 2D.
    """
    p, g = _check_pair(pred, gt)
    empty = [name for name, m in (("prediction", p), ("reference", g)) if not m.any()]
    if empty:
        raise CardRecipeError(f"card_hd95_as_written is undefined: the {' and the '.join(empty)} "
                              f"{'is' if len(empty) == 1 else 'are'} empty (the card's recipe crashes on an empty "
                              "mask); use the real HD95 under its named convention and the empty-mask policy")
    return float(np.percentile(farthest_point_distances(np.argwhere(p), np.argwhere(g)), 95))


def card_dice_iou_as_written(pred: np.ndarray, gt: np.ndarray) -> tuple[float, float]:
    """The card's per-image Dice and IoU: ``2|P∩G| / (|P| + |G|)`` and ``|P∩G| / |P∪G|``, no smoothing.

    Args:
        pred: bool (H, W); gt: bool (H, W).

    Returns:
        (dice, iou) floats in [0, 1]; both NaN when both masks are empty (0/0, as numpy gives it in the card).

    Raises:
        ValueError: shapes differ or are not 2D.
    """
    p, g = _check_pair(pred, gt)
    inter = int(np.count_nonzero(p & g))
    total = int(np.count_nonzero(p)) + int(np.count_nonzero(g))
    union = int(np.count_nonzero(p | g))
    dice = 2.0 * inter / total if total else math.nan
    iou = inter / union if union else math.nan
    return dice, iou


def card_image_metrics(pred: np.ndarray, gt: np.ndarray) -> dict[str, object]:
    """The card's three per-image values as metrics-table columns (:data:`CARD_COLUMNS`).

    ``card_hd95_as_written`` is NaN where the recipe refuses the pair (an empty mask), and
    ``card_hd95_refused`` then holds the reason (``""`` otherwise), so refused rows are counted, never hidden.

    Args:
        pred: bool (H, W); gt: bool (H, W).

    Returns:
        ``{"card_dice_as_written": float, "card_iou_as_written": float, "card_hd95_as_written": float (px),
        "card_hd95_refused": str}``.
    """
    dice, iou = card_dice_iou_as_written(pred, gt)
    try:
        hd95, refused = card_hd95_as_written(pred, gt), ""
    except CardRecipeError as exc:
        hd95, refused = math.nan, str(exc)
    return {"card_dice_as_written": dice, "card_iou_as_written": iou, "card_hd95_as_written": hd95,
            "card_hd95_refused": refused}


def card_dataset_scores(pairs: Iterable[tuple[np.ndarray, np.ndarray]],
                        image_ids: Sequence[str] | None = None) -> dict[str, float]:
    """The card's ``evaluate(preds, gts)``: the plain ``np.mean`` of the per-image Dice, IoU and "HD95".

    As written, an image with both masks empty has Dice and IoU 0/0 = NaN, but the card's "HD95" line crashes
    on any empty mask first, so the whole evaluation fails; here that failure is a clear refusal naming the
    image.

    Args:
        pairs: (pred, gt) bool (H, W) masks, one pair per image.
        image_ids: names for the error message (default: the 0-based position).

    Returns:
        ``{"dice": float, "iou": float, "hd95": float (px), "n_images": int}``.

    Raises:
        CardRecipeError: an image with an empty prediction or reference (the card's code would crash), or no
            image at all.
    """
    dices, ious, hd95s = [], [], []
    for i, (pred, gt) in enumerate(pairs):
        name = image_ids[i] if image_ids is not None else f"#{i}"
        d, j = card_dice_iou_as_written(pred, gt)
        try:
            hd95s.append(card_hd95_as_written(pred, gt))
        except CardRecipeError as exc:
            raise CardRecipeError(f"image {name}: {exc}") from exc
        dices.append(d)
        ious.append(j)
    if not dices:
        raise CardRecipeError("card recipe: no images to score")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return {"dice": float(np.mean(dices)), "iou": float(np.mean(ious)), "hd95": float(np.mean(hd95s)),
                "n_images": len(dices)}
