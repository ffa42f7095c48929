"""A tiny hand-built semi-supervised study folder (written under tmp_path) for the ``semi_supervised`` analysis.

One run folder per method x labelled fraction x seed, as ``msb run`` of configs/protocols/semi_supervised.yaml
writes it: ``config.yaml`` (``data.labelled_fraction``, ``random_seed``, ``train.strategy.name`` except for
supervised-only, ``axes``), ``evaluation/best/`` with ``counts.parquet`` (context: variant, seed, test-time rule),
``predictions/*.npz`` and ``metrics.parquet`` (HD convention ``medpy``, the card's columns).

Test images are 24 x 24: images 0..6 hold one 8 x 8 square reference (rows 4-11, cols 4-11), image 7 has an
empty reference. A prediction is the reference shifted right by :func:`shift` pixels, so TP = 8 (8 - k) and
FP = FN = 8 k; image 7's prediction is empty too (both empty).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import yaml

from msb.config.metrics_schema import MetricsConfig
from msb.evaluation.counts import compute_confusion_counts, counts_rows, write_counts
from msb.evaluation.image_metrics import write_metrics_table

H = W = 24
N_TEST = 8
METHODS = ("supervised", "mean_teacher", "cps")
FRACTIONS = (0.1, 0.3)
SEEDS = (0, 1)
RULES = {"supervised": "first", "mean_teacher": "average", "cps": "average"}


def shift(method: str, fraction: float, seed: int, i: int) -> int:
    """Right shift (px, 0..3) of the prediction of image ``i`` in that run."""
    return (i + 3 * METHODS.index(method) + 2 * FRACTIONS.index(fraction) + seed + (i * seed) % 3) % 4


def ref_mask(i: int) -> np.ndarray:
    """Reference of test image ``i`` (bool 24 x 24)."""
    m = np.zeros((H, W), dtype=bool)
    if i < N_TEST - 1:
        m[4:12, 4:12] = True
    return m


def pred_mask(method: str, fraction: float, seed: int, i: int) -> np.ndarray:
    """Prediction of test image ``i`` (the reference shifted right by :func:`shift`)."""
    return np.roll(ref_mask(i), shift(method, fraction, seed, i), axis=1)


def run_id(method: str, fraction: float, seed: int) -> str:
    return f"ds-unet_r18-{hashlib.sha256(f'{method}{fraction}{seed}'.encode()).hexdigest()[:8]}"


def build_semi_study(root: Path, methods=METHODS, fractions=FRACTIONS, seeds=SEEDS, rules=None,
                     metrics: bool = True) -> Path:
    """Write the study under ``root/semi`` and return it; ``rules``: method -> test-time rule."""
    rules = {**RULES, **(rules or {})}
    study = root / "semi"
    ids = [f"t{i}" for i in range(N_TEST)]
    for m in methods:
        for f in fractions:
            for s in seeds:
                run = study / run_id(m, f, s)
                run.mkdir(parents=True, exist_ok=True)
                axes = {"data.labelled_fraction": f, "random_seed": s, "train.strategy.name": m}
                cfg = {"study": "semi", "axes": axes, "random_seed": s,
                       "data": {"name": "ds", "input_size": [H, W], "split": {"mode": "fixed"},
                                "labelled_fraction": f},
                       "train": {"epochs": 1} if m == "supervised" else {"epochs": 1, "strategy": {"name": m}}}
                (run / "config.yaml").write_text(yaml.safe_dump(cfg))
                variant = ";".join(f"{k}={json.dumps(axes[k])}" for k in sorted(axes))
                ctx = {"dataset": "ds", "split": "test", "fold": -1, "run_id": run.name, "model": "unet",
                       "checkpoint_role": "best", "checkpoint_sha256": "0" * 64, "config_hash": "0" * 64,
                       "threshold": 0.5, "threshold_on": "probability", "split_policy": "fixed", "input_size": H,
                       "seed": s, "variant": variant, "test_time_rule": rules[m]}
                pred = np.stack([pred_mask(m, f, s, i) for i in range(N_TEST)])[:, None]
                ref = np.stack([ref_mask(i) for i in range(N_TEST)])[:, None]
                ev = run / "evaluation" / "best"
                df = counts_rows(ctx, compute_confusion_counts(pred, ref), image_ids=ids, class_ids=[1],
                                 class_names=["lesion"], heights=H, widths=W, sources=["s"] * N_TEST)
                write_counts(df, ev / "counts.parquet")
                (ev / "predictions").mkdir(parents=True, exist_ok=True)
                for i, sid in enumerate(ids):
                    np.savez(ev / "predictions" / f"{sid}.npz", pred=pred[i], ref=ref[i],
                             prob=(pred[i] * 255).astype(np.uint8), spacing=np.ones(2), class_ids=np.array([1]))
                if metrics:
                    write_metrics_table(ev, MetricsConfig(hd_convention="medpy", card=True))
    return study
