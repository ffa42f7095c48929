"""Strict-majority fold ensemble from stored predictions: hand-derived votes and counts, row naming, errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msb.errors import MSBError
from msb.evaluation.counts import compute_confusion_counts, counts_rows, write_counts
from msb.study.ensemble import ensemble_evaluation, strict_majority


def test_strict_majority_hand_values():
    a = np.array([1, 1, 0, 0, 1], bool)
    b = np.array([1, 0, 1, 0, 0], bool)
    c = np.array([1, 0, 0, 0, 1], bool)
    d = np.array([0, 1, 1, 0, 1], bool)
    ens, votes = strict_majority([a, b, c])          # K=3: foreground with >= 2 votes
    assert votes.tolist() == [3, 1, 1, 0, 2] and ens.tolist() == [True, False, False, False, True]
    ens, _ = strict_majority([a, b])                 # K=2: both (intersection)
    assert ens.tolist() == [True, False, False, False, False]
    ens, votes = strict_majority([a, b, c, d])       # K=4: >= 3 votes; a 2-2 tie is background
    assert votes.tolist() == [3, 2, 2, 0, 3] and ens.tolist() == [True, False, False, False, True]
    with pytest.raises(ValueError, match="boolean"):
        strict_majority([a.astype(np.uint8)])
    with pytest.raises(ValueError, match="shapes differ"):
        strict_majority([a, a[:3]])


CTX = {"dataset": "ext", "split": "all", "run_id": "r", "model": "unet", "checkpoint_role": "best",
       "config_hash": "h" * 64, "threshold": 0.5, "threshold_on": "probability"}


def _member(folder: Path, fold: int, preds: dict[str, np.ndarray], refs: dict[str, np.ndarray],
            sha: str, threshold: float = 0.5) -> Path:
    pred_dir = folder / "predictions"
    pred_dir.mkdir(parents=True)
    frames = []
    for sid, p in preds.items():
        r = refs[sid]
        np.savez_compressed(pred_dir / f"{sid}.npz", pred=p, ref=r, spacing=np.ones(2), class_ids=np.array([1]))
        ctx = {**CTX, "fold": fold, "run_id": f"r-fold{fold}", "checkpoint_sha256": sha, "threshold": threshold}
        frames.append(counts_rows(ctx, compute_confusion_counts(p[None], r[None]), image_ids=[sid], class_ids=[1],
                                  class_names=["polyp"], heights=r.shape[1], widths=r.shape[2], sources="src"))
    write_counts(pd.concat(frames, ignore_index=True), folder / "counts.parquet")
    (folder / "DONE").write_text(sha)
    return folder


def test_ensemble_counts_hand_derived(tmp_path: Path):
    """One 2x3 image, three folds. Votes per pixel (row-major): [3,2,1 / 0,2,1] -> ensemble [1,1,0 / 0,1,0].
    Reference [1,0,0 / 0,1,1]: tp = 2 (pixels 0, 4), fp = 1 (pixel 1), fn = 1 (pixel 5), tn = 2."""
    ref = np.array([[[1, 0, 0], [0, 1, 1]]], bool)
    p0 = np.array([[[1, 1, 1], [0, 1, 0]]], bool)
    p1 = np.array([[[1, 1, 0], [0, 0, 1]]], bool)
    p2 = np.array([[[1, 0, 0], [0, 1, 0]]], bool)
    shas = ["a" * 64, "b" * 64, "c" * 64]
    members = [_member(tmp_path / f"m{k}", k, {"img": p}, {"img": ref}, shas[k]) for k, p in enumerate([p0, p1, p2])]
    out = tmp_path / "ens"
    path = ensemble_evaluation(members, out, "r-ensemble", "unet-ensemble3")
    df = pd.read_parquet(path)
    assert len(df) == 1
    row = df.iloc[0]
    assert (row.tp, row.fp, row.fn, row.tn) == (2, 1, 1, 2)
    assert row.fold == -1 and row.run_id == "r-ensemble" and row.model == "unet-ensemble3"
    assert row.checkpoint_sha256 == hashlib.sha256(json.dumps(shas, separators=(",", ":")).encode()).hexdigest()
    assert row.dataset == "ext" and row.split == "all" and row.source == "src" and row.class_name == "polyp"
    with np.load(out / "predictions" / "img.npz") as z:
        assert z["votes"].tolist() == [[[3, 2, 1], [0, 2, 1]]]
        assert z["prob"].tolist() == [[[255, 170, 85], [0, 170, 85]]]  # round(255 * votes / 3)
    # unchanged members: skipped (file untouched)
    mtime = path.stat().st_mtime_ns
    ensemble_evaluation(members, out, "r-ensemble", "unet-ensemble3")
    assert path.stat().st_mtime_ns == mtime


def test_ensemble_refuses_mismatched_members(tmp_path: Path):
    ref = np.zeros((1, 2, 2), bool)
    p = np.ones((1, 2, 2), bool)
    a = _member(tmp_path / "a", 0, {"x": p}, {"x": ref}, "a" * 64)
    b = _member(tmp_path / "b", 1, {"y": p}, {"y": ref}, "b" * 64)
    with pytest.raises(MSBError, match="evaluated other images"):
        ensemble_evaluation([a, b], tmp_path / "e1", "r-ensemble", "m")
    c = _member(tmp_path / "c", 1, {"x": p}, {"x": ref}, "c" * 64, threshold=0.3)
    with pytest.raises(MSBError, match="differs in 'threshold'"):
        ensemble_evaluation([a, c], tmp_path / "e2", "r-ensemble", "m")
    d = _member(tmp_path / "d", 1, {"x": p}, {"x": ~ref}, "d" * 64)
    with pytest.raises(MSBError, match="reference differs"):
        ensemble_evaluation([a, d], tmp_path / "e3", "r-ensemble", "m")
    assert not [p for p in (tmp_path / "e3").rglob("*") if p.is_file()]  # nothing half-written
    with pytest.raises(MSBError, match="no counts.parquet"):
        ensemble_evaluation([a, tmp_path / "missing"], tmp_path / "e4", "r-ensemble", "m")
