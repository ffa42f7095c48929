"""``msb evaluate`` computes ``metrics.parquet`` from the predictions in memory (no read-back of the files): the
table must equal the one :func:`write_metrics_table` recomputes from the stored ``predictions/*.npz`` alone."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msb.config.metrics_schema import MetricsConfig
from msb.evaluation.image_metrics import image_metric_rows, write_metrics_table


def _masks(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = np.zeros((1, 40, 48), bool)
    ref[0, 5:20, 8:30] = True
    ref[0, 30:36, 40:46] = True
    pred = ref.copy()
    pred[0, rng.integers(0, 40, 30), rng.integers(0, 48, 30)] ^= True  # scattered flips: extra lesions, holes
    return pred, ref


def test_rows_in_memory_equal_the_read_back_table(tmp_path: Path) -> None:
    """Ids ``a``, ``a-b``, ``a_b``: ``sorted(glob)`` orders the files ``a-b.npz`` < ``a.npz`` < ``a_b.npz`` (by file
    name, '-' < '.' < '_'), not ``a`` < ``a-b``; the in-memory table keeps that order and every value."""
    eval_dir = tmp_path / "ev"
    (eval_dir / "predictions").mkdir(parents=True)
    rows = {}
    for k, sid in enumerate(["a", "a-b", "a_b"]):
        pred, ref = _masks(k)
        spacing = (0.5, 0.25) if sid == "a_b" else (1.0, 1.0)
        path = eval_dir / "predictions" / f"{sid}.npz"
        np.savez_compressed(path, pred=pred, ref=ref, spacing=np.asarray(spacing), class_ids=np.array([3]))
        rows[sid] = image_metric_rows(path, pred, ref, spacing, np.array([3]), MetricsConfig())
    pd.DataFrame({"image_id": ["a", "a-b", "a_b"], "class_id": 3, "run_id": "r"}).to_parquet(
        eval_dir / "counts.parquet", index=False)
    copy = tmp_path / "copy"
    shutil.copytree(eval_dir, copy)
    mem = pd.read_parquet(write_metrics_table(eval_dir, MetricsConfig(), rows))
    disk = pd.read_parquet(write_metrics_table(copy, MetricsConfig()))
    assert list(disk["image_id"]) == ["a-b", "a", "a_b"]
    pd.testing.assert_frame_equal(mem, disk, check_exact=True)
    assert (eval_dir / "metrics.parquet").read_bytes() == (copy / "metrics.parquet").read_bytes()


def test_evaluate_checkpoint_metrics_equal_the_stored_predictions(tmp_path: Path) -> None:
    """A U-Net trained one epoch on a tiny synthetic set; its evaluation's ``metrics.parquet`` equals, byte for
    byte, the table recomputed from a copy of the evaluation folder's stored predictions."""
    from msb.config.generate import GeneratedRun, config_hash
    from msb.config.schema import RunConfig
    from msb.data.schema import load_prepared_dataset
    from msb.data.synth import make_synthetic_dataset
    from msb.engine.runner import ensure_split, train_run
    from msb.evaluation.evaluator import evaluate_checkpoint

    make_synthetic_dataset(tmp_path / "data", n_samples=24, size=(64, 64), seed=1)
    cfg = RunConfig.model_validate({
        "study": "t", "run_root": str(tmp_path / "runs"), "random_seed": 0,
        "data": {"name": "synthetic", "root": str(tmp_path / "data"), "input_size": [32, 32],
                 "split": {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.4, "seed": 0,
                           "group_column": None}, "max_samples_per_split": 6},
        "model": {"arch": "unet", "encoder": "resnet18"},
        "train": {"epochs": 1, "batch_size": 4, "device": "cpu"}})
    ds = load_prepared_dataset(tmp_path / "data")
    run_dir = tmp_path / "runs" / "t"
    run = GeneratedRun("t", cfg, config_hash(cfg), "synthetic", "unet")
    ensure_split(cfg, ds, run_dir)
    train_run(run, run_dir, ds)
    res = evaluate_checkpoint(run_dir, cfg, ds, "best", "t", run.config_hash)
    assert res.metrics_path is not None and res.n_images == 6
    copy = tmp_path / "copy"
    shutil.copytree(res.metrics_path.parent, copy)
    (copy / "metrics.parquet").unlink()
    recomputed = write_metrics_table(copy, cfg.evaluation.metrics)
    ours = pd.read_parquet(res.metrics_path)
    assert len(ours) == 6 and ours["run_id"].eq("t").all()
    pd.testing.assert_frame_equal(ours, pd.read_parquet(recomputed), check_exact=True)
    assert res.metrics_path.read_bytes() == recomputed.read_bytes()


def test_sample_lookups_equal_the_dataset_methods(tmp_path: Path) -> None:
    """The evaluator's column-wise look-up gives what ``ds.mask_path`` / ``ds.spacing`` give per id, including
    empty (None, NaN) spacing cells read as 1.0."""
    from msb.data.schema import load_prepared_dataset
    from msb.data.synth import make_synthetic_dataset
    from msb.evaluation.evaluator import _sample_lookups

    make_synthetic_dataset(tmp_path / "x", n_samples=6, size=(32, 32))
    ds = load_prepared_dataset(tmp_path / "x")
    ids = ds.sample_ids[1:5]
    assert _sample_lookups(ds, ids) == ({i: ds.mask_path(i) for i in ids}, {i: (1.0, 1.0) for i in ids})
    ds.index["spacing_row"] = [0.5, None, 2.0, float("nan"), 4.0, 5.0]
    ds.index["spacing_col"] = 0.25
    masks, spacing = _sample_lookups(ds, ids)
    assert spacing == {i: ds.spacing(i) for i in ids}
    assert spacing[ids[0]] == (1.0, 0.25) and spacing[ids[1]] == (2.0, 0.25) and spacing[ids[2]] == (1.0, 0.25)
