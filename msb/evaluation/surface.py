"""Boundary-distance metrics of two 2D binary masks: HD, HD95, ASSD, MASD and NSD under named conventions.

Each convention (:data:`CONVENTIONS`, :data:`NSD_CONVENTIONS`) reproduces one published library exactly. The
metrics are functions of the directed distance sets of :func:`surface_distances` (boundary pixels for
medpy / MONAI / MetricsReloaded, length-weighted pixel-corner contours for DeepMind ``surface-distance``),
which live in :mod:`msb.evaluation.boundary_distances` and are re-exported here, so
``surface.surface_distances``, ``surface.boundary``, ``surface.SurfaceDistances`` and
``surface.contour_length_table`` keep working.

Empty masks are *not* handled by policy here: a direction from/to an empty boundary is ``inf`` (the
distance to an empty set) and metrics of two empty masks are ``nan``; ``msb.evaluation.empty_policy``
turns those into table values.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from msb.evaluation.boundary_distances import (Method, SurfaceDistances, boundary, contour_length_table,
                                               directed_distances, surface_distances)

__all__ = [
    "CONVENTIONS",
    "NSD_CONVENTIONS",
    "Method",
    "SurfaceDistances",
    "boundary",
    "contour_length_table",
    "directed_distances",
    "distance_metrics",
    "nsd",
    "percentile_linear",
    "percentile_weighted",
    "surface_distances",
]


#: Named HD/HD95/ASSD/MASD conventions: the library each one reproduces and its exact definitions.
CONVENTIONS: Mapping[str, Mapping[str, str]] = {
    "metrics_reloaded": {
        "source": "MetricsReloaded (Project-MONAI/MetricsReloaded, commit cb38dfc) pairwise_measures.py",
        "boundary": "pixels",
        "hd": "max(max d(P->R), max d(R->P))",
        "hd95": "max(P95 d(P->R), P95 d(R->P)), numpy linear percentile per direction",
        "assd": "mean of d(P->R) and d(R->P) pooled (MetricsReloaded assd)",
        "masd": "(mean d(P->R) + mean d(R->P)) / 2 (MetricsReloaded masd)",
    },
    "monai": {
        "source": "MONAI 1.6.1 monai/metrics/hausdorff_distance.py, surface_distance.py",
        "boundary": "pixels",
        "hd": "max(max d(P->R), max d(R->P))",
        "hd95": "max(P95 d(P->R), P95 d(R->P)), torch.quantile (linear) per direction",
        "assd": "mean of d(P->R) and d(R->P) pooled (compute_average_surface_distance symmetric=True)",
        "masd": "(mean d(P->R) + mean d(R->P)) / 2 (not a MONAI metric; same formula as MetricsReloaded)",
    },
    "medpy": {
        "source": "medpy 0.5.2 medpy/metric/binary.py (hd, hd95, assd)",
        "boundary": "pixels",
        "hd": "max(max d(P->R), max d(R->P))",
        "hd95": "P95 of d(P->R) and d(R->P) pooled, numpy linear percentile (medpy hd95)",
        "assd": "mean of d(P->R) and d(R->P) pooled (medpy >= 0.5 assd)",
        "masd": "(mean d(P->R) + mean d(R->P)) / 2 (medpy 0.4 assd)",
    },
    "surface_distance": {
        "source": "DeepMind surface-distance (google-deepmind/surface-distance) surface_distance/metrics.py",
        "boundary": "contours",
        "hd": "compute_robust_hausdorff(percent=100): max over directions of the largest distance",
        "hd95": "compute_robust_hausdorff(percent=95): max over directions of the contour-length weighted "
                "percentile (sorted by (distance, length); first index with cumulative fraction >= 0.95)",
        "assd": "sum(d*w) / sum(w) over both directions pooled (w = contour length)",
        "masd": "mean of the two compute_average_surface_distance values",
    },
}

#: Named NSD conventions.
NSD_CONVENTIONS: Mapping[str, Mapping[str, str]] = {
    "metrics_reloaded": {
        "source": "MetricsReloaded normalised_surface_distance; equal to MONAI compute_surface_dice "
                  "(use_subvoxels=False)",
        "boundary": "pixels",
        "nsd": "(#{p in S_P: d(p,S_R) <= tau} + #{r in S_R: d(r,S_P) <= tau}) / (|S_P| + |S_R|)",
    },
    "surface_distance": {
        "source": "DeepMind surface-distance compute_surface_dice_at_tolerance; equal to MONAI "
                  "compute_surface_dice(use_subvoxels=True)",
        "boundary": "contours",
        "nsd": "(sum of w over S_R with d <= tau + sum of w over S_P with d <= tau) / (sum w_R + sum w_P)",
    },
}


def percentile_linear(values: np.ndarray, q: float) -> float:
    """``numpy.percentile(values, q)`` (method ``linear``; medpy, MetricsReloaded, ``torch.quantile``).

    Same arithmetic as numpy: virtual index ``(n - 1) * (q / 100)``, neighbours by partition, and numpy's
    ``_lerp`` (``a + (b - a) t`` for t < 0.5, ``b - (b - a)(1 - t)`` otherwise), without its overhead.
    Returns ``inf`` when the values contain ``inf`` (a one-sided empty pair) and ``nan`` for no values.
    """
    n = values.size
    if n == 0:
        return float("nan")
    if np.isinf(values).any():
        return float("inf")
    virtual = (n - 1) * (q / 100.0)
    lo = min(int(math.floor(virtual)), n - 1)
    hi = min(lo + 1, n - 1)
    part = np.partition(values, (lo, hi)) if hi != lo else np.partition(values, lo)
    a, b = float(part[lo]), float(part[hi])
    t = virtual - lo
    d = b - a
    return b - d * (1.0 - t) if t >= 0.5 else a + d * t


def percentile_weighted(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """DeepMind ``compute_robust_hausdorff`` percentile of one direction (no interpolation).

    Elements are sorted by (distance, weight); the result is the distance at the first index where the
    cumulative weight fraction is >= q/100 (``np.searchsorted``, side left), clipped to the last element.
    Returns ``inf`` for an all-``inf`` direction and ``nan`` for an empty one.
    """
    if values.size == 0:
        return float("nan")
    order = np.lexsort((weights, values))
    v, w = values[order], weights[order]
    cum = np.cumsum(w) / np.sum(w)
    idx = int(np.searchsorted(cum, q / 100.0))
    return float(v[min(idx, v.size - 1)])


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    if values.size == 0:
        return float("nan")
    if np.isinf(values).any():
        return float("inf")
    return float(np.sum(values * weights) / np.sum(weights))


def distance_metrics(sd: SurfaceDistances, convention: str = "metrics_reloaded") -> dict[str, float]:
    """HD, HD95, ASSD, MASD and the directed values under a named convention (see :data:`CONVENTIONS`).

    Args:
        sd: distances from :func:`surface_distances`; ``sd.kind`` must match the convention (``contours``
            for ``surface_distance``, ``pixels`` for the others).
        convention: ``metrics_reloaded``, ``monai``, ``medpy`` or ``surface_distance``.

    Returns:
        dict with float values in spacing units: ``hd``, ``hd95``, ``assd``, ``masd``, ``hd95_pred_to_ref``,
        ``hd95_ref_to_pred``, ``asd_pred_to_ref``, ``asd_ref_to_pred``. Directed percentiles are linear
        (pixel conventions) or DeepMind-weighted (``surface_distance``). When exactly one mask is empty every
        value is ``inf``; when both are empty every value is ``nan`` (policy is applied elsewhere).

    Raises:
        ValueError: unknown convention, or ``sd.kind`` does not fit it.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown HD convention {convention!r}; choose one of {sorted(CONVENTIONS)}")
    expected = "contours" if convention == "surface_distance" else "pixels"
    if sd.kind != expected:
        raise ValueError(f"convention {convention!r} needs {expected} distances, got {sd.kind}")
    keys = ("hd", "hd95", "assd", "masd", "hd95_pred_to_ref", "hd95_ref_to_pred", "asd_pred_to_ref",
            "asd_ref_to_pred")
    if sd.n_pred == 0 and sd.n_ref == 0:
        return {k: float("nan") for k in keys}
    if sd.n_pred == 0 or sd.n_ref == 0:
        return {k: float("inf") for k in keys}
    a, b, wa, wb = sd.pred_to_ref, sd.ref_to_pred, sd.pred_weights, sd.ref_weights
    if convention == "surface_distance":
        p_a, p_b = percentile_weighted(a, wa, 95), percentile_weighted(b, wb, 95)
        hd = max(percentile_weighted(a, wa, 100), percentile_weighted(b, wb, 100))
        hd95 = max(p_a, p_b)
        asd_a, asd_b = _weighted_mean(a, wa), _weighted_mean(b, wb)
        assd = float((np.sum(a * wa) + np.sum(b * wb)) / (np.sum(wa) + np.sum(wb)))
    else:
        p_a, p_b = percentile_linear(a, 95), percentile_linear(b, 95)
        hd = float(max(a.max(), b.max()))
        hd95 = percentile_linear(np.concatenate([a, b]), 95) if convention == "medpy" else max(p_a, p_b)
        asd_a, asd_b = float(np.mean(a)), float(np.mean(b))
        assd = float(np.mean(np.concatenate([a, b])))
    return {"hd": hd, "hd95": hd95, "assd": assd, "masd": (asd_a + asd_b) / 2.0,
            "hd95_pred_to_ref": p_a, "hd95_ref_to_pred": p_b, "asd_pred_to_ref": asd_a, "asd_ref_to_pred": asd_b}


def nsd(sd: SurfaceDistances, tolerance: float) -> float:
    """Normalised surface distance (surface Dice) at tolerance ``tolerance`` (same units as the distances).

    ``(sum w_P [d(P->R) <= tau] + sum w_R [d(R->P) <= tau]) / (sum w_P + sum w_R)``: with pixel weights
    (all 1) this is MetricsReloaded ``normalised_surface_distance`` and MONAI ``compute_surface_dice``; with
    contour weights it is DeepMind ``compute_surface_dice_at_tolerance`` (Nikolov et al. 2021).

    Returns:
        float in [0, 1]; 0 when exactly one mask is empty; ``nan`` when both are empty (0/0).
    """
    total = float(np.sum(sd.pred_weights) + np.sum(sd.ref_weights))
    if total == 0.0:
        return float("nan")
    hit = float(np.sum(sd.pred_weights[sd.pred_to_ref <= tolerance])
                + np.sum(sd.ref_weights[sd.ref_to_pred <= tolerance]))
    return hit / total
