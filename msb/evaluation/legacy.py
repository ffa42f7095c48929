"""LEGACY polyp-leaderboard metrics (PraNet evaluation template). Not comparable with Dice at 0.5.

Old polyp tables (PraNet, Polyp-PVT, CASCADE, ...) report numbers computed by the MATLAB ``main.m`` of
``DengPingFan/PraNet eval/``: the prediction map is resized to the reference, converted with
``im2double`` and **min-max normalised per image** (``mapminmax``); the reference is ``gt > 128``. Then:

* S-measure (Fan et al. ICCV 2017), weighted F-measure (Margolin et al. CVPR 2014), E-measure (Fan et al.
  IJCAI 2018; mean over 256 thresholds and adaptive) and MAE on the continuous map: computed here with the
  ``pysodmetrics`` library (``py_sod_metrics``), whose ``prepare_data`` reproduces the MATLAB preparation
  (``pred / 255``, min-max unless the map is constant, ``gt > 128``).
* The papers' "mDice": for each of 256 thresholds ``t = 1, 1-1/255, ..., 0`` (``np.linspace(1, 0, 256)``,
  as in the UACANet Python port), foreground = ``map >= t``, Dice = ``2 TP / (|P| + |G|)`` and **0 whenever
  TP = 0** (MATLAB ``Fmeasure_calu``); the image-mean Dice per threshold, then the mean over thresholds
  ("meanDic") and the max over thresholds ("maxDic").

Why it differs from Dice at 0.5: the min-max step stretches every map to [0, 1], so a low-confidence map
that is correctly empty at 0.5 still produces a lesion at most thresholds, and averaging over thresholds
rewards ranking rather than the decision the model would ship. Use these numbers only to reproduce old
tables; report Dice/IoU from the raw counts for comparisons.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["LEGACY_THRESHOLDS", "legacy_metrics", "polyp_mdice", "prepare_legacy_map", "sod_metrics",
           "threshold_dice_curve", "to_uint8_map"]

#: The 256 thresholds of the polyp "mDice" protocol, from 1 down to 0.
LEGACY_THRESHOLDS: np.ndarray = np.linspace(1.0, 0.0, 256)


def to_uint8_map(prob: np.ndarray) -> np.ndarray:
    """Probability map -> uint8 grey map ``round(255 p)`` (the stored prediction format); uint8 passes through.

    Args:
        prob: float (H, W) in [0, 1], or uint8 (H, W).

    Raises:
        ValueError: float values outside [0, 1] or NaN, or not 2D.
    """
    prob = np.asarray(prob)
    if prob.ndim != 2:
        raise ValueError(f"probability map must be 2D, got shape {prob.shape}")
    if prob.dtype == np.uint8:
        return prob
    p = prob.astype(np.float64)
    if np.isnan(p).any() or p.min() < 0.0 or p.max() > 1.0:
        raise ValueError("probability map must lie in [0, 1] without NaN")
    return np.rint(p * 255.0).astype(np.uint8)


def prepare_legacy_map(prob: np.ndarray) -> np.ndarray:
    """MATLAB ``mapminmax(im2double(map))`` as in ``py_sod_metrics.utils.prepare_data``.

    Args:
        prob: float (H, W) in [0, 1] or uint8 (H, W); floats are first quantised to uint8 (``round(255 p)``).

    Returns:
        float64 (H, W): ``(m - min) / (max - min)`` of ``m = uint8 / 255``; unchanged ``m`` if constant.
    """
    m = to_uint8_map(prob) / 255.0
    lo, hi = m.min(), m.max()
    if hi != lo:
        m = (m - lo) / (hi - lo)
    return m


def threshold_dice_curve(prob: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Dice of ``prepare_legacy_map(prob) >= t`` against ``ref`` for the 256 :data:`LEGACY_THRESHOLDS`.

    Args:
        prob: float (H, W) in [0, 1] or uint8 (H, W).
        ref: bool (H, W) reference.

    Returns:
        float64 (256,): ``2 TP / (|P| + |G|)``, and 0 where TP = 0 (MATLAB ``Fmeasure_calu`` rule).
    """
    ref = np.asarray(ref, dtype=bool)
    m = prepare_legacy_map(prob)
    if m.shape != ref.shape:
        raise ValueError(f"prob and ref must have the same shape, got {m.shape} and {ref.shape}")
    all_sorted = np.sort(m, axis=None)
    fg_sorted = np.sort(m[ref], axis=None)
    n_pred = all_sorted.size - np.searchsorted(all_sorted, LEGACY_THRESHOLDS, side="left")
    tp = fg_sorted.size - np.searchsorted(fg_sorted, LEGACY_THRESHOLDS, side="left")
    n_ref = int(ref.sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        dice = np.where(tp > 0, 2.0 * tp / (n_pred + n_ref), 0.0)
    return dice.astype(np.float64)


def polyp_mdice(curves: np.ndarray) -> dict[str, float]:
    """Dataset-level polyp "mDice"/"maxDice" from per-image Dice curves.

    Args:
        curves: float (N_images, 256) from :func:`threshold_dice_curve`.

    Returns:
        ``{"mdice": mean_t mean_i D[i, t], "maxdice": max_t mean_i D[i, t]}`` (PraNet ``meanDic``/``maxDic``).
    """
    curves = np.asarray(curves, dtype=np.float64)
    if curves.ndim != 2 or curves.shape[1] != LEGACY_THRESHOLDS.size or curves.shape[0] == 0:
        raise ValueError(f"curves must have shape (N>0, {LEGACY_THRESHOLDS.size}), got {curves.shape}")
    per_threshold = curves.mean(axis=0)
    return {"mdice": float(per_threshold.mean()), "maxdice": float(per_threshold.max())}


def sod_metrics(prob: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """S-measure, weighted F-measure, E-measure (mean over 256 thresholds, adaptive) and MAE of one image.

    Computed by ``py_sod_metrics`` (``Smeasure``, ``WeightedFmeasure``, ``Emeasure``, ``MAE``) with its
    default preparation (uint8 map / 255, per-image min-max, reference ``> 128``).

    Args:
        prob: float (H, W) in [0, 1] or uint8 (H, W).
        ref: bool (H, W).

    Returns:
        ``legacy_smeasure``, ``legacy_wfmeasure``, ``legacy_emeasure_mean``, ``legacy_emeasure_adaptive``,
        ``legacy_mae`` (library values, also for empty masks).
    """
    import py_sod_metrics as sod  # local import: only needed when legacy metrics are requested

    pred_u8 = to_uint8_map(prob)
    gt_u8 = np.asarray(ref, dtype=bool).astype(np.uint8) * 255
    if pred_u8.shape != gt_u8.shape:
        raise ValueError(f"prob and ref must have the same shape, got {pred_u8.shape} and {gt_u8.shape}")
    sm, wfm, em, mae = sod.Smeasure(), sod.WeightedFmeasure(), sod.Emeasure(), sod.MAE()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for metric in (sm, wfm, em, mae):
            metric.step(pred=pred_u8, gt=gt_u8)
    em_res = em.get_results()["em"]
    return {
        "legacy_smeasure": float(sm.get_results()["sm"]),
        "legacy_wfmeasure": float(wfm.get_results()["wfm"]),
        "legacy_emeasure_mean": float(np.mean(em_res["curve"])),
        "legacy_emeasure_adaptive": float(em_res["adp"]),
        "legacy_mae": float(mae.get_results()["mae"]),
    }


def legacy_metrics(prob: np.ndarray, ref: np.ndarray) -> dict[str, object]:
    """All legacy columns of one image: :func:`sod_metrics`, ``legacy_mdice`` (this image's mean over the
    256 thresholds; its image mean is the dataset "mDice") and ``legacy_dice_curve`` (list of 256 floats,
    needed for the dataset "maxDice", see :func:`polyp_mdice`)."""
    out: dict[str, object] = dict(sod_metrics(prob, ref))
    curve = threshold_dice_curve(prob, ref)
    out["legacy_mdice"] = float(curve.mean())
    out["legacy_dice_curve"] = curve.tolist()
    return out
