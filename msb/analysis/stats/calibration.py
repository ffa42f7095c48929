"""Calibration of stored probability maps: reliability table, expected / maximum calibration error, Brier score.

Source: the prediction files of an evaluation folder (``predictions/<image_id>.npz``: ``prob`` uint8
``round(255 p)`` (C, H, W), ``ref`` bool (C, H, W); :func:`msb.evaluation.artifacts.write_prediction_file`).
Every pixel counts (no sampling): a map is reduced, one file at a time, to two 256-bin histograms per class
(:func:`level_histograms`: all pixels and foreground pixels per stored level ``v``, probability ``v / 255``), from
which every statistic below is exact, so memory stays ``O(images x classes x 512)`` counts whatever the image size.

With ``M`` equal-width bins on [0, 1] (default 15, Guo et al., "On calibration of modern neural networks",
ICML 2017; level ``v`` goes to bin ``min(floor(M v / 255), M - 1)``), ``n_b`` pixels in bin ``b``, ``o_b`` the
observed foreground frequency and ``p_b`` the mean predicted probability there, ``N = Σ n_b``:

* ``ECE = Σ_b (n_b / N) |o_b - p_b|`` (Naeini et al., AAAI 2015; Guo et al. 2017, eq. 3),
* ``MCE = max_b |o_b - p_b|`` over non-empty bins (Naeini et al. 2015),
* ``Brier = (1 / N) Σ_pixels (p - y)^2`` (Brier, Mon. Weather Rev. 1950; ``sklearn.metrics.brier_score_loss``),
* the reliability diagram plots ``o_b`` against ``p_b`` (DeGroot & Fienberg 1983; Niculescu-Mizil & Caruana 2005).

Pooled values sum the histograms of all images of a system; per-image values use one image's histograms; image
bootstrap CIs resample images (:func:`msb.analysis.stats.bootstrap.resample_weights`, the statistics setting's seed)
and recompute the pooled values on the summed histograms.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from msb.analysis.stats.bootstrap import percentile_interval, resample_weights
from msb.errors import MSBError

__all__ = ["DEFAULT_BINS", "LEVELS", "level_histograms", "read_histograms", "calibration_values",
           "reliability_table", "calibration_summary"]

#: Equal-width bins of the reliability diagram and the ECE / MCE.
DEFAULT_BINS = 15
#: Probability of each stored uint8 level.
LEVELS = np.arange(256, dtype=np.float64) / 255.0


def level_histograms(prob_u8: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per class, pixel counts of each stored level: all pixels and reference-foreground pixels.

    Args:
        prob_u8: uint8 ``(C, H, W)`` stored probabilities; ref: bool ``(C, H, W)`` reference.

    Returns:
        ``(h_all, h_fg)``, int64 ``(C, 256)`` each.

    Raises:
        MSBError: shapes differ or ``prob_u8`` is not uint8.
    """
    p = np.asarray(prob_u8)
    r = np.asarray(ref, dtype=bool)
    if p.dtype != np.uint8 or p.shape != r.shape or p.ndim != 3:
        raise MSBError(f"probability map {p.dtype} {p.shape} and reference {r.shape} must be uint8 and bool "
                       f"(C, H, W) of the same shape")
    c = p.shape[0]
    flat = p.reshape(c, -1).astype(np.int64) + (np.arange(c, dtype=np.int64) * 256)[:, None]
    h_all = np.bincount(flat.ravel(), minlength=256 * c).reshape(c, 256)
    h_fg = np.bincount(flat[r.reshape(c, -1)], minlength=256 * c).reshape(c, 256)
    return h_all, h_fg


def read_histograms(pred_dir: Path, image_ids: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`level_histograms` of the stored maps ``pred_dir/<image_id>.npz``, one file in memory at a time.

    Returns:
        ``(h_all, h_fg, class_ids)``: int64 ``(n, C, 256)`` twice, int64 ``(C,)``.

    Raises:
        MSBError: a file is missing or holds no ``prob`` (evaluate with ``evaluation.save_probabilities: true``),
            or its classes differ from the first file's.
    """
    h_all = h_fg = class_ids = None
    for k, iid in enumerate(image_ids):
        f = Path(pred_dir) / f"{iid}.npz"
        if not f.is_file():
            raise MSBError(f"{f}: stored prediction missing; rerun msb evaluate on the run (--force)")
        with np.load(f) as z:
            if "prob" not in z.files:
                raise MSBError(f"{f}: no probability map 'prob' (evaluated with save_probabilities: false); "
                               f"re-evaluate with evaluation.save_probabilities: true")
            a, g = level_histograms(z["prob"], z["ref"])
            cid = np.asarray(z["class_ids"], dtype=np.int64)
        if h_all is None:
            h_all = np.zeros((len(image_ids), *a.shape), dtype=np.int64)
            h_fg = np.zeros_like(h_all)
            class_ids = cid
        elif not np.array_equal(cid, class_ids):
            raise MSBError(f"{f}: classes {cid.tolist()} differ from the other files' {class_ids.tolist()}")
        h_all[k], h_fg[k] = a, g
    if h_all is None:
        raise MSBError(f"{pred_dir}: no image to read")
    return h_all, h_fg, class_ids


def _bin_sums(h_all: np.ndarray, h_fg: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-bin pixel count, foreground count and probability sum of ``(..., 256)`` histograms: ``(..., bins)``."""
    b = np.minimum(np.floor(np.arange(256) * bins / 255.0).astype(np.int64), bins - 1)
    onehot = np.zeros((256, bins))
    onehot[np.arange(256), b] = 1.0
    ha, hf = h_all.astype(np.float64), h_fg.astype(np.float64)
    return ha @ onehot, hf @ onehot, (ha * LEVELS) @ onehot


def calibration_values(h_all: np.ndarray, h_fg: np.ndarray, bins: int = DEFAULT_BINS) -> dict[str, np.ndarray]:
    """ECE, MCE and Brier score of ``(..., 256)`` histograms (module docstring), vectorised over the leading axes.

    Returns:
        ``{"ece", "mce", "brier", "n_pixels"}``: float64 arrays of the leading shape (NaN without pixels).
    """
    n_b, fg_b, p_b = _bin_sums(h_all, h_fg, bins)
    n = n_b.sum(-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ece = np.abs(fg_b - p_b).sum(-1) / n
        gap = np.where(n_b > 0, np.abs(fg_b - p_b) / np.where(n_b > 0, n_b, 1), -np.inf)
        mce = np.where(n > 0, gap.max(-1), np.nan)
        ha, hf = h_all.astype(np.float64), h_fg.astype(np.float64)
        brier = ((ha - hf) @ LEVELS ** 2 + hf @ (1 - LEVELS) ** 2) / n
    return {"ece": ece, "mce": mce, "brier": brier, "n_pixels": n}


def reliability_table(h_all: np.ndarray, h_fg: np.ndarray, bins: int = DEFAULT_BINS) -> pd.DataFrame:
    """The reliability diagram of pooled ``(256,)`` histograms: ``bin, bin_low, bin_high, n_pixels, mean_prob,
    frequency, gap`` (``frequency - mean_prob``; NaN in empty bins)."""
    n_b, fg_b, p_b = _bin_sums(h_all, h_fg, bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_p = np.where(n_b > 0, p_b / n_b, np.nan)
        freq = np.where(n_b > 0, fg_b / n_b, np.nan)
    edges = np.arange(bins + 1) / bins
    return pd.DataFrame({"bin": np.arange(bins), "bin_low": edges[:-1], "bin_high": edges[1:],
                         "n_pixels": n_b.astype(np.int64), "mean_prob": mean_p, "frequency": freq,
                         "gap": freq - mean_p})


def calibration_summary(h_all: np.ndarray, h_fg: np.ndarray, bins: int = DEFAULT_BINS, n_boot: int = 0,
                        level: float = 0.95, seed: int = 0, strata: np.ndarray | None = None) -> dict[str, float]:
    """Pooled ECE, MCE, Brier of one system and class with image bootstrap CIs, and the per-image means.

    Args:
        h_all, h_fg: ``(n, 256)`` per-image histograms of one class; bins: reliability bins.
        n_boot, level, seed, strata: the image bootstrap (0 replicates: no CI columns' values, NaN).

    Returns:
        ``ece, ece_low, ece_high, mce, mce_low, mce_high, brier, brier_low, brier_high, image_ece_mean,
        image_brier_mean, n_images, n_pixels, bins, n_boot, level, seed``.
    """
    pooled = calibration_values(h_all.sum(0), h_fg.sum(0), bins)
    per = calibration_values(h_all, h_fg, bins)
    out: dict[str, float] = {}
    reps = None
    if n_boot > 0:
        ha, hf = h_all.astype(np.float64), h_fg.astype(np.float64)
        parts = [calibration_values(w @ ha, w @ hf, bins) for w in
                 resample_weights(h_all.shape[0], n_boot, seed, strata)]
        reps = {k: np.concatenate([p[k] for p in parts]) for k in ("ece", "mce", "brier")}
    for k in ("ece", "mce", "brier"):
        out[k] = float(pooled[k])
        lo, hi = (percentile_interval(reps[k], level)[:2] if reps is not None else (np.nan, np.nan))
        out[f"{k}_low"], out[f"{k}_high"] = float(lo), float(hi)
    ok = per["n_pixels"] > 0
    out["image_ece_mean"] = float(per["ece"][ok].mean()) if ok.any() else float("nan")
    out["image_brier_mean"] = float(per["brier"][ok].mean()) if ok.any() else float("nan")
    out.update(n_images=int(h_all.shape[0]), n_pixels=int(pooled["n_pixels"]), bins=int(bins), n_boot=int(n_boot),
               level=float(level), seed=int(seed))
    return out
