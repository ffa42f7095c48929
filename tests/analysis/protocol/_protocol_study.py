"""A tiny hand-built study folder for the protocol-analysis tests (written under tmp_path).

Layout as ``msb run`` writes it (docs/studies.md): per architecture and input size a selected run id
``kv-<arch>-<hash8>``, fold runs ``<id>-fold<j>`` with ``config.yaml`` (``data.name kv``, ``data.input_size``,
``data.split.mode``), ``evaluation/best/`` (internal test split, 6 images, sources ``centreA``/``centreB``) and
``evaluation/external/cvc/best/`` (4 images), and ``<id>-ensemble/evaluation/external/cvc/best/`` (strict majority
of the folds' stored predictions). Masks are 24 x 24 with one or two rectangular lesions; a prediction is the
reference shifted by a per-(arch, size, fold, image) offset, sometimes with a lesion missed or a false-alarm speck.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from msb.config.metrics_schema import MetricsConfig
from msb.evaluation.counts import compute_confusion_counts, counts_rows, write_counts
from msb.evaluation.image_metrics import write_metrics_table
from msb.study.ensemble import strict_majority

H = W = 24
ARCHS = ("unet", "segf", "pvt")


def _ref(i: int) -> np.ndarray:
    m = np.zeros((H, W), dtype=bool)
    m[3 + i % 4:10 + i % 5, 4:12 + i % 3] = True
    if i % 2:
        m[15:20, 14 + i % 3:21] = True
    return m


def _pred(ref: np.ndarray, key: str) -> np.ndarray:
    rng = np.random.default_rng(int(hashlib.sha256(key.encode()).hexdigest()[:8], 16))
    p = np.roll(ref, (int(rng.integers(-2, 3)), int(rng.integers(-2, 3))), axis=(0, 1))
    if rng.random() < 0.3:
        p[14:, :] = False  # miss the lower lesion
    if rng.random() < 0.4:
        r, c = rng.integers(0, H - 2, 2)
        p[r:r + 2, c:c + 2] = True  # false-alarm speck
    return p


def _write_eval(eval_dir: Path, ctx: dict, ids: list[str], preds: list[np.ndarray], refs: list[np.ndarray],
                sources: list[str], metrics: bool) -> None:
    pred = np.stack(preds)[:, None]
    ref = np.stack(refs)[:, None]
    df = counts_rows(ctx, compute_confusion_counts(pred, ref), image_ids=ids, class_ids=[1], class_names=["polyp"],
                     heights=H, widths=W, sources=sources)
    write_counts(df, eval_dir / "counts.parquet")
    (eval_dir / "predictions").mkdir(parents=True, exist_ok=True)
    for i, sid in enumerate(ids):
        np.savez(eval_dir / "predictions" / f"{sid}.npz", pred=pred[i], ref=ref[i],
                 prob=(pred[i] * 255).astype(np.uint8), spacing=np.ones(2), class_ids=np.array([1]))
    if metrics:
        write_metrics_table(eval_dir, MetricsConfig())


def build_study(root: Path, archs=ARCHS, sizes=(128, 192), folds=(0, 1), split_mode="fixed", external=True,
                metrics=True, profile=True, n_test=6, n_ext=4, skip=()) -> Path:
    """Write the study under ``root/study`` and return it. ``skip``: (arch, size) pairs not run."""
    study = root / "study"
    test_ids = [f"t{i}" for i in range(n_test)]
    ext_ids = [f"e{i}" for i in range(n_ext)]
    for arch in archs:
        for size in sizes:
            if (arch, size) in skip:
                continue
            rid = f"kv-{arch}-{hashlib.sha256(f'{arch}{size}'.encode()).hexdigest()[:8]}"
            ext_preds = []
            for j in folds:
                run = study / f"{rid}-fold{j}"
                run.mkdir(parents=True, exist_ok=True)
                cfg = {"data": {"name": "kv", "input_size": [size, size], "split": {"mode": split_mode, "seed": 0}},
                       "random_seed": 0}
                (run / "config.yaml").write_text(yaml.safe_dump(cfg))
                ctx = {"dataset": "kv", "split": "test", "fold": j, "run_id": run.name, "model": arch,
                       "checkpoint_role": "best", "checkpoint_sha256": "0" * 64, "config_hash": "0" * 64,
                       "threshold": 0.5, "threshold_on": "probability"}
                refs = [_ref(i) for i in range(n_test)]
                preds = [_pred(r, f"{arch}{size}{j}{k}") for k, r in enumerate(refs)]
                _write_eval(run / "evaluation" / "best", ctx, test_ids, preds, refs,
                            ["centreA" if i % 2 else "centreB" for i in range(n_test)], metrics)
                if external:
                    refs = [_ref(i + 7) for i in range(n_ext)]
                    preds = [_pred(r, f"ext{arch}{size}{j}{k}") for k, r in enumerate(refs)]
                    ext_preds.append(preds)
                    _write_eval(run / "evaluation" / "external" / "cvc" / "best", {**ctx, "dataset": "cvc", "split": "all"},
                                ext_ids, preds, refs, ["cvc"] * n_ext, metrics)
            if external:
                refs = [_ref(i + 7) for i in range(n_ext)]
                ens = [strict_majority([p[k] for p in ext_preds])[0] for k in range(n_ext)]
                ctx = {"dataset": "cvc", "split": "all", "fold": -1, "run_id": f"{rid}-ensemble",
                       "model": f"{arch}-ensemble{len(folds)}", "checkpoint_role": "best",
                       "checkpoint_sha256": "1" * 64, "config_hash": "0" * 64, "threshold": 0.5,
                       "threshold_on": "probability"}
                _write_eval(study / f"{rid}-ensemble" / "evaluation" / "external" / "cvc" / "best", ctx, ext_ids, ens,
                            refs, ["cvc"] * n_ext, metrics)
    if profile:
        rows = []
        for k, arch in enumerate(archs):
            for size in sizes:
                rows.append({"model": arch, "input_h": size, "input_w": size, "batch_size": 1, "precision": "fp32",
                             "device": "cpu", "device_name": "test-cpu", "params_m": 1.5 + k,
                             "gmacs": 0.1 * (k + 1) * size / 128, "latency_ms_median": 2.0 + k + size / 100,
                             "latency_ms_sd": 0.05 * (k + 1), "throughput_ips": 1000 / (2.0 + k + size / 100),
                             "peak_mem_mib": np.nan, "peak_mem_delta_mib": 64.0 * (k + 1), "status": "ok",
                             "warmup": 10, "timed_passes": 100, "repeats": 3})
        (study / "profile").mkdir(parents=True, exist_ok=True)
        pd.DataFrame(rows).to_parquet(study / "profile" / "profile_cpu.parquet", index=False)
    return study
