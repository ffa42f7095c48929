"""LEGACY polyp-leaderboard metrics (PraNet evaluation template). Not comparable with Dice at 0.5.

Old polyp tables (PraNet, Polyp-PVT, CASCADE, ...) report numbers computed by the MATLAB ``main.m`` of
``DengPingFan/PraNet eval/``: the prediction map is resized to the reference, converted with
``im2double`` and **min-max normalised per image** (``mapminmax``); the reference is ``gt > 128``. Then:

* S-measure (Fan et al. ICCV 2017, "S_alpha"), weighted F-measure (Margolin et al. CVPR 2014, "F^w_beta"),
  E-measure (Fan et al. IJCAI 2018, "E_phi"; per image a curve over the 256 thresholds, its mean, and the
  adaptive value at twice the map mean) and MAE on the continuous map: computed here with the
  ``pysodmetrics`` library (``py_sod_metrics``), whose ``prepare_data`` reproduces the MATLAB preparation
  (``pred / 255``, min-max unless the map is constant, ``gt > 128``). The dataset "mean E-measure" is the
  mean of the image-mean curve and the "max E-measure" its max (PraNet's table reports the max;
  docs/metrics.md says which paper reports which).
* The papers' "mDice" and "mIoU": for each of 256 thresholds ``t = 1, 254/255, ..., 1/255, 0`` (exactly
  ``k/255``), foreground = ``map >= t``, Dice = ``2 TP / (|P| + |G|)``, IoU = ``TP / |P u G|``, both **0
  whenever TP = 0** (MATLAB ``Fmeasure_calu``); the image-mean per threshold, then the mean over thresholds
  ("meanDic", "meanIoU") and the max ("maxDic", "maxIoU"). The per-threshold curves are
  ``py_sod_metrics.FmeasureV2`` with a ``DICEHandler`` and an ``IOUHandler`` (dynamic thresholds, sample
  based: the prepared map is binned as ``uint8(255 map)`` and thresholded at ``>= k``, k = 255..0, in
  integers). An earlier hand-written version compared the map with ``np.linspace(1, 0, 256)``,
  104 of whose values are one ulp away from ``k/255``, so 8-bit maps landing exactly on such a ``k/255``
  fell on the wrong side of the threshold.

Why it differs from Dice at 0.5: the min-max step stretches every map to [0, 1], so a low-confidence map
that is correctly empty at 0.5 still produces a lesion at most thresholds, and averaging over thresholds
rewards ranking rather than the decision the model would ship. Use these numbers only to reproduce old
tables; report Dice/IoU from the raw counts for comparisons.
"""

from __future__ import annotations

import warnings

import numpy as np

__all__ = ["CURVE_COLUMNS", "LEGACY_THRESHOLDS", "curve_scores", "legacy_metrics", "polyp_mdice",
           "prepare_legacy_map", "sod_metrics", "threshold_curves", "threshold_dice_curve", "threshold_iou_curve",
           "to_uint8_map"]

#: Per-image curve columns of a metrics table -> the metric name of their dataset-level mean / max
#: (``legacy_dice_curve`` -> ``legacy_mdice``, ``legacy_maxdice``; ``legacy_emeasure_curve`` ->
#: ``legacy_memeasure`` (= the image mean of ``legacy_emeasure_mean``) and ``legacy_maxemeasure``).
CURVE_COLUMNS: dict[str, str] = {"legacy_dice_curve": "dice", "legacy_iou_curve": "iou",
                                 "legacy_emeasure_curve": "emeasure"}

#: The 256 thresholds of the polyp "mDice" protocol, ``k/255`` for k = 255 down to 0 (the order of the curve
#: returned by :func:`threshold_dice_curve`; ``py_sod_metrics`` bins the map into these levels).
LEGACY_THRESHOLDS: np.ndarray = np.arange(255, -1, -1, dtype=np.float64) / 255.0


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


def threshold_curves(prob: np.ndarray, ref: np.ndarray) -> dict[str, np.ndarray]:
    """Per-threshold Dice and IoU of one image for the 256 :data:`LEGACY_THRESHOLDS`, by ``py_sod_metrics``.

    One ``py_sod_metrics.FmeasureV2`` with ``DICEHandler`` and ``IOUHandler`` (``with_dynamic=True``,
    ``with_adaptive=False``, ``sample_based=True``), fed the uint8 map (:func:`to_uint8_map`) and the reference
    as uint8 0/255: the library prepares the map as in :func:`prepare_legacy_map` (``/ 255``, per-image
    min-max), bins it as ``uint8(255 map)`` (integers) and counts ``TP(k), FP(k)`` for ``map_bin >= k``,
    k = 255, ..., 0 (so every threshold is exactly ``k/255`` of the binned map). Stepping one object over all
    images of a dataset gives the mean curves whose means are the dataset "mDice"/"mIoU";
    :func:`curve_scores` of the per-image curves returned here reproduces them (same per-image values).

    Args:
        prob: float (H, W) in [0, 1] or uint8 (H, W); floats are first quantised to ``round(255 p)``.
        ref: bool (H, W) reference (non-zero = foreground).

    Returns:
        ``{"dice": float64 (256,), "iou": float64 (256,)}``, thresholds in the order of
        :data:`LEGACY_THRESHOLDS` (1 down to 0): Dice ``2 TP / (2 TP + FP + FN)``, IoU ``TP / (TP + FP + FN)``;
        both 0 whenever TP = 0, including an empty reference with an empty prediction (the library's
        ``divide`` gives 0 for 0/0; MATLAB ``Fmeasure_calu`` rule).

    Raises:
        ValueError: ``prob`` not 2D, outside [0, 1] or NaN (:func:`to_uint8_map`); shapes differ.
        RuntimeError: the library returned curves of another length (a change of its binning).
    """
    import py_sod_metrics as sod  # local import: only needed when legacy metrics are requested

    pred_u8 = to_uint8_map(prob)
    gt_u8 = np.asarray(ref, dtype=bool).astype(np.uint8) * 255
    if pred_u8.shape != gt_u8.shape:
        raise ValueError(f"prob and ref must have the same shape, got {pred_u8.shape} and {gt_u8.shape}")
    fm = sod.FmeasureV2(metric_handlers={
        "dice": sod.DICEHandler(with_dynamic=True, with_adaptive=False, sample_based=True),
        "iou": sod.IOUHandler(with_dynamic=True, with_adaptive=False, sample_based=True)})
    fm.step(pred=pred_u8, gt=gt_u8)
    res = fm.get_results()
    out = {k: np.asarray(res[k]["dynamic"], dtype=np.float64) for k in ("dice", "iou")}
    for k, curve in out.items():
        if curve.shape != LEGACY_THRESHOLDS.shape:  # guards against a library change of the binning
            raise RuntimeError(f"py_sod_metrics returned a {k} curve of shape {curve.shape}, expected (256,)")
    return out


def threshold_dice_curve(prob: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-threshold Dice of one image: ``threshold_curves(prob, ref)["dice"]``, float64 (256,) (see
    :func:`threshold_curves` for the binning, the order of the thresholds and the TP = 0 rule)."""
    return threshold_curves(prob, ref)["dice"]


def threshold_iou_curve(prob: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-threshold IoU of one image: ``threshold_curves(prob, ref)["iou"]``, float64 (256,)."""
    return threshold_curves(prob, ref)["iou"]


def curve_scores(curves: np.ndarray, name: str) -> dict[str, float]:
    """Dataset-level mean and max over thresholds of the image-mean curve.

    PraNet ``main.m``: per threshold the mean over images, then ``mean<Name>`` = the mean over the 256
    thresholds and ``max<Name>`` = their max (py_sod_metrics: ``np.mean`` / ``np.max`` of
    ``get_results()[name]["dynamic"]`` after stepping every image).

    Args:
        curves: float (N_images, 256) per-image curves (:func:`threshold_curves`, or E-measure curves).
        name: metric name, e.g. ``"dice"`` -> keys ``mdice`` and ``maxdice``.

    Returns:
        ``{"m<name>": mean_t mean_i C[i, t], "max<name>": max_t mean_i C[i, t]}``.

    Raises:
        ValueError: ``curves`` is not (N > 0, 256).
    """
    curves = np.asarray(curves, dtype=np.float64)
    if curves.ndim != 2 or curves.shape[1] != LEGACY_THRESHOLDS.size or curves.shape[0] == 0:
        raise ValueError(f"curves must have shape (N>0, {LEGACY_THRESHOLDS.size}), got {curves.shape}")
    per_threshold = curves.mean(axis=0)
    return {f"m{name}": float(per_threshold.mean()), f"max{name}": float(per_threshold.max())}


def polyp_mdice(curves: np.ndarray) -> dict[str, float]:
    """Dataset-level polyp "mDice"/"maxDice" from per-image Dice curves (float (N_images, 256)):
    ``{"mdice": mean_t mean_i D[i, t], "maxdice": max_t mean_i D[i, t]}`` (PraNet ``meanDic``/``maxDic``;
    :func:`curve_scores`)."""
    return curve_scores(curves, "dice")


def sod_metrics(prob: np.ndarray, ref: np.ndarray) -> dict[str, object]:
    """S-measure, weighted F-measure, E-measure (curve over 256 thresholds, its mean, adaptive) and MAE of one image.

    Computed by ``py_sod_metrics`` (``Smeasure``, ``WeightedFmeasure``, ``Emeasure``, ``MAE``) with its
    default preparation (uint8 map / 255, per-image min-max, reference ``> 128``).

    Args:
        prob: float (H, W) in [0, 1] or uint8 (H, W).
        ref: bool (H, W).

    Returns:
        ``legacy_smeasure`` (S_alpha, alpha = 0.5), ``legacy_wfmeasure`` (F^w_beta, beta^2 = 1),
        ``legacy_emeasure_mean`` (mean E_phi over the 256 thresholds of this image), ``legacy_emeasure_adaptive``
        (E_phi at twice the map mean), ``legacy_mae``, all floats, and ``legacy_emeasure_curve`` (list of 256
        floats, thresholds ``k/255`` for k = 255 down to 0 as for Dice), needed for the dataset max E-measure
        (:func:`curve_scores` of the curves; PraNet's table reports that max). Library values, also for empty
        masks.
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
        "legacy_emeasure_curve": np.asarray(em_res["curve"], dtype=np.float64).tolist(),
    }


def legacy_metrics(prob: np.ndarray, ref: np.ndarray) -> dict[str, object]:
    """All legacy columns of one image: :func:`sod_metrics`, ``legacy_mdice`` / ``legacy_miou`` (this image's
    mean over the 256 thresholds; their image mean is the dataset "mDice"/"mIoU") and ``legacy_dice_curve`` /
    ``legacy_iou_curve`` (lists of 256 floats, for the dataset "maxDice"/"maxIoU", see :func:`curve_scores`).

    Args:
        prob: float (H, W) in [0, 1] or uint8 (H, W) probability map (the stored ``prob``).
        ref: bool (H, W) reference.

    Raises:
        ValueError: as :func:`threshold_curves`.
    """
    out: dict[str, object] = dict(sod_metrics(prob, ref))
    curves = threshold_curves(prob, ref)
    out["legacy_mdice"] = float(curves["dice"].mean())
    out["legacy_miou"] = float(curves["iou"].mean())
    out["legacy_dice_curve"] = curves["dice"].tolist()
    out["legacy_iou_curve"] = curves["iou"].tolist()
    return out
