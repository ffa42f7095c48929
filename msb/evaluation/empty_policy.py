"""The empty-mask policy: what every metric reports when the prediction and/or the reference is empty.

One table, applied in one place (:func:`apply_distance_policy`, :func:`apply_nsd_policy`; the lesion
ratios follow it by construction in ``msb.evaluation.lesion.lesion_scores``). The guiding rule: **a miss
(or a false alarm) must never improve a score**, and no table holds ``inf``.

* Boundary distances (HD, HD95, ASSD, MASD and the directed values) of a one-sided empty pair are the
  distance to an empty set, i.e. infinite. Dropping them (MONAI returns NaN for HD95, so its mean skips
  the missed images and improves as misses grow, Project-MONAI/MONAI#9095) or scoring them 0
  (seg-metrics) rewards the miss. We store a finite **penalty = the image diagonal**
  ``sqrt((H s_r)^2 + (W s_c)^2)`` (spacing units), which is >= every distance that two boundaries inside
  the image can have (pixel centres or pixel corners), so replacing any measured value by the penalty can
  only raise a mean. Rows keep ``empty_case`` so the penalised rows are counted and can be filtered.
* Two empty masks (a correct negative) have no boundary: the distances and NSD are **not applicable**
  (NaN). NaNs are excluded from means and reported as counts (``n_nan`` in ``summarize_metrics``). This
  cannot be gamed: on an empty reference the alternative to "both empty" is a false alarm, which is
  penalised.
* NSD of a one-sided empty pair is 0 (the formula's value: no boundary element within tolerance).
* Lesion ratios are NaN when their denominator has no component (sensitivity without reference lesions,
  precision without predicted components); the counts (TP/FP/FN) are always integers, and pooled ratios
  (sums over images) are the recommended summary.

The per-case values are in :data:`POLICY` (machine-readable, used by the tests) and rendered in
``docs/metrics.md`` (:func:`policy_markdown`).
"""

from __future__ import annotations

import math
from typing import Literal, Mapping, Sequence

import numpy as np

__all__ = [
    "DISTANCE_KEYS",
    "EMPTY_CASES",
    "POLICY",
    "apply_distance_policy",
    "apply_nsd_policy",
    "empty_case",
    "penalty_distance",
    "policy_markdown",
]

EmptyCase = Literal["none", "both_empty", "ref_empty", "pred_empty"]

#: The four cases, in table order.
EMPTY_CASES: tuple[str, ...] = ("none", "both_empty", "ref_empty", "pred_empty")

#: Distance columns the penalty applies to.
DISTANCE_KEYS: tuple[str, ...] = ("hd", "hd95", "assd", "masd", "hd95_pred_to_ref", "hd95_ref_to_pred",
                                  "asd_pred_to_ref", "asd_ref_to_pred")

#: metric family -> {case: rule}. Rules: ``"measured"`` (the formula's value), ``"nan"`` (not applicable,
#: excluded from means and counted), ``"penalty"`` (image diagonal in spacing units), or a number.
POLICY: Mapping[str, Mapping[str, object]] = {
    "distance (hd, hd95, assd, masd, directed)": {
        "none": "measured", "both_empty": "nan", "ref_empty": "penalty", "pred_empty": "penalty"},
    "nsd_tau*": {"none": "measured", "both_empty": "nan", "ref_empty": 0.0, "pred_empty": 0.0},
    "lesion_*_tp / fp / fn / tp_pred (counts)": {
        "none": "measured", "both_empty": 0, "ref_empty": "measured (fn = 0)", "pred_empty": "measured (fp = 0)"},
    "lesion_*_sensitivity": {"none": "measured", "both_empty": "nan", "ref_empty": "nan", "pred_empty": 0.0},
    "lesion_*_precision": {"none": "measured", "both_empty": "nan", "ref_empty": 0.0, "pred_empty": "nan"},
    "lesion_*_f1": {"none": "measured", "both_empty": "nan", "ref_empty": 0.0, "pred_empty": 0.0},
    "legacy_* (pysodmetrics, mDice)": {
        "none": "library value", "both_empty": "library value", "ref_empty": "library value",
        "pred_empty": "library value"},
}

_POLICY_NOTES: Mapping[str, str] = {
    "distance (hd, hd95, assd, masd, directed)": "penalty = sqrt((H*s_r)^2 + (W*s_c)^2) >= any attainable "
                                                "distance; never inf, never dropped",
    "nsd_tau*": "0/0 -> NaN; one-sided: no element within tolerance",
    "lesion_*_tp / fp / fn / tp_pred (counts)": "always integers; after min_lesion_area the cases refer to "
                                                "components, not pixels",
    "lesion_*_sensitivity": "tp / n_ref; NaN when no reference lesion",
    "lesion_*_precision": "tp_pred / n_pred; NaN when no predicted component",
    "lesion_*_f1": "harmonic mean; NaN only with no lesion on either side",
    "legacy_* (pysodmetrics, mDice)": "legacy only: e.g. mDice counts Dice = 0 whenever TP = 0, even for two "
                                      "empty masks (PraNet MATLAB rule)",
}


def empty_case(pred: np.ndarray, ref: np.ndarray) -> str:
    """Classify a mask pair: ``none``, ``both_empty``, ``ref_empty`` (false alarm) or ``pred_empty`` (miss).

    Args:
        pred, ref: bool (H, W).
    """
    p, r = bool(np.any(pred)), bool(np.any(ref))
    if p and r:
        return "none"
    if not p and not r:
        return "both_empty"
    return "ref_empty" if p else "pred_empty"


def penalty_distance(shape: Sequence[int], spacing: Sequence[float] = (1.0, 1.0)) -> float:
    """Image diagonal ``sqrt((H*s_r)^2 + (W*s_c)^2)`` in spacing units: the one-sided-empty distance value.

    It bounds every distance between pixel centres (at most ``(H-1, W-1)`` pixels apart) and between pixel
    corners (at most ``(H, W)`` apart), so it is >= any finite HD/HD95/ASSD in the image.
    """
    return float(math.hypot(shape[0] * float(spacing[0]), shape[1] * float(spacing[1])))


def apply_distance_policy(values: Mapping[str, float], case: str, penalty: float) -> dict[str, float]:
    """Apply the distance rule of :data:`POLICY` to a dict from ``surface.distance_metrics``.

    Args:
        values: distance values (may contain ``inf``/``nan`` for empty cases).
        case: result of :func:`empty_case`.
        penalty: :func:`penalty_distance` of the image.

    Returns:
        A new dict: unchanged for ``none``; NaN for ``both_empty``; ``penalty`` for ``ref_empty`` and
        ``pred_empty``.

    Raises:
        ValueError: unknown case, or a non-finite value in the ``none`` case (programming error).
    """
    if case == "none":
        bad = {k: v for k, v in values.items() if not math.isfinite(v)}
        if bad:
            raise ValueError(f"non-finite distance for two non-empty masks: {bad}")
        return dict(values)
    if case == "both_empty":
        return {k: float("nan") for k in values}
    if case in ("ref_empty", "pred_empty"):
        return {k: float(penalty) for k in values}
    raise ValueError(f"unknown empty case {case!r}; expected one of {EMPTY_CASES}")


def apply_nsd_policy(value: float, case: str) -> float:
    """NSD rule of :data:`POLICY`: measured for ``none``, NaN for ``both_empty``, 0 for one-sided empty."""
    if case == "none":
        return float(value)
    if case == "both_empty":
        return float("nan")
    if case in ("ref_empty", "pred_empty"):
        return 0.0
    raise ValueError(f"unknown empty case {case!r}; expected one of {EMPTY_CASES}")


def policy_markdown() -> str:
    """The policy table as Markdown (rows = metric families, columns = the empty cases, plus notes)."""
    header = "| metric | both empty | reference empty, prediction not | prediction empty, reference not | note |"
    lines = [header, "| --- | --- | --- | --- | --- |"]
    for family, rules in POLICY.items():
        cells = [str(rules[c]).replace("nan", "NaN (excluded, counted)") for c in EMPTY_CASES[1:]]
        lines.append(f"| `{family}` | " + " | ".join(cells) + f" | {_POLICY_NOTES[family]} |")
    return "\n".join(lines)
