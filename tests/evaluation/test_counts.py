"""Tests for msb.evaluation.counts: confusion counts of hand-made masks and the counts.parquet writer."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from msb.evaluation import counts as counts_mod
from msb.evaluation.counts import (
    COUNT_COLUMNS,
    COUNTS_COLUMNS,
    COUNTS_SCHEMA,
    COUNTS_SCHEMA_VERSION,
    KEY_COLUMNS,
    compute_confusion_counts,
    counts_rows,
    validate_counts_frame,
    write_counts,
)

# Class A (4x4).  P = prediction, R = reference.
#   P           R
#   1 1 0 0     0 1 1 0
#   1 1 0 0     0 1 1 0
#   0 0 0 0     0 0 0 0
#   0 0 0 0     0 0 0 0
# TP = P&R   = {(0,1), (1,1)}              = 2
# FP = P&~R  = {(0,0), (1,0)}              = 2
# FN = ~P&R  = {(0,2), (1,2)}              = 2
# TN = 16 - (TP + FP + FN) = 16 - 6        = 10
# intersection = 2, reference = 4, predicted = 4, union = 6
PRED_A = np.array([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
REF_A = np.array([[0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]], dtype=bool)
EXPECTED_A = dict(tp=2, fp=2, fn=2, tn=10, intersection=2, reference=4, predicted=4, union=6)

# Class B (4x4): empty prediction, reference = the 3 pixels of the last row's first three columns.
# TP = 0, FP = 0, FN = 3, TN = 13; intersection 0, reference 3, predicted 0, union 3
PRED_B = np.zeros((4, 4), dtype=bool)
REF_B = np.zeros((4, 4), dtype=bool)
REF_B[3, :3] = True
EXPECTED_B = dict(tp=0, fp=0, fn=3, tn=13, intersection=0, reference=3, predicted=0, union=3)

# Class C (4x4): prediction = reference = full image. TP = 16, FP = FN = TN = 0.
PRED_C = np.ones((4, 4), dtype=bool)
REF_C = np.ones((4, 4), dtype=bool)
EXPECTED_C = dict(tp=16, fp=0, fn=0, tn=0, intersection=16, reference=16, predicted=16, union=16)

CONTEXT = dict(dataset="toy", split="test", fold=-1, run_id="r1", model="unet",
               checkpoint_role="best", checkpoint_sha256="a" * 64, config_hash="b" * 64,
               threshold=0.5, threshold_on="probability")


def _check(c: dict, expected: dict, index: tuple) -> None:
    for k, v in expected.items():
        assert c[k][index] == v, (k, index)


def test_hw_input_is_one_image_one_class():
    c = compute_confusion_counts(PRED_A, REF_A)
    assert set(c) == set(COUNT_COLUMNS)
    for k in COUNT_COLUMNS:
        assert c[k].shape == (1, 1)
        assert c[k].dtype == np.int64
    _check(c, EXPECTED_A, (0, 0))


def test_chw_input_is_one_image():
    c = compute_confusion_counts(np.stack([PRED_A, PRED_B, PRED_C]), np.stack([REF_A, REF_B, REF_C]))
    assert c["tp"].shape == (1, 3)
    _check(c, EXPECTED_A, (0, 0))
    _check(c, EXPECTED_B, (0, 1))
    _check(c, EXPECTED_C, (0, 2))


def test_nchw_input():
    # image 0: classes (A, B); image 1: classes (C, A)
    pred = np.stack([np.stack([PRED_A, PRED_B]), np.stack([PRED_C, PRED_A])])
    ref = np.stack([np.stack([REF_A, REF_B]), np.stack([REF_C, REF_A])])
    c = compute_confusion_counts(pred, ref)
    assert c["tp"].shape == (2, 2)
    _check(c, EXPECTED_A, (0, 0))
    _check(c, EXPECTED_B, (0, 1))
    _check(c, EXPECTED_C, (1, 0))
    _check(c, EXPECTED_A, (1, 1))


def test_swapping_pred_and_ref_swaps_fp_and_fn():
    c = compute_confusion_counts(REF_A | REF_B, PRED_A | PRED_B)
    # P' = REF_A|REF_B (7 px), R' = PRED_A (4 px): TP 2, FP 5, FN 2, TN 7
    assert (int(c["tp"][0, 0]), int(c["fp"][0, 0]), int(c["fn"][0, 0]), int(c["tn"][0, 0])) == (2, 5, 2, 7)


def test_matches_brute_force_on_random_masks():
    rng = np.random.default_rng(0)
    for shape in [(3, 2, 5, 7), (2, 3, 80, 90)]:  # below and above the popcount size switch
        p = rng.random(shape) > 0.5
        r = rng.random(shape) > 0.3
        c = compute_confusion_counts(p, r)
        np.testing.assert_array_equal(c["tp"], (p & r).sum(axis=(2, 3)))
        np.testing.assert_array_equal(c["fp"], (p & ~r).sum(axis=(2, 3)))
        np.testing.assert_array_equal(c["fn"], (~p & r).sum(axis=(2, 3)))
        np.testing.assert_array_equal(c["tn"], (~p & ~r).sum(axis=(2, 3)))
        np.testing.assert_array_equal(c["union"], (p | r).sum(axis=(2, 3)))


def test_non_contiguous_input():
    pred = np.stack([PRED_A, PRED_B], axis=-1).transpose(2, 0, 1)  # (C,H,W) view, not contiguous
    ref = np.stack([REF_A, REF_B], axis=-1).transpose(2, 0, 1)
    c = compute_confusion_counts(pred, ref)
    _check(c, EXPECTED_A, (0, 0))
    _check(c, EXPECTED_B, (0, 1))


def test_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(4, 4\).*\(1, 4, 4\)"):
        compute_confusion_counts(PRED_A, REF_A[None])


@pytest.mark.parametrize("bad", [PRED_A.astype(np.uint8), PRED_A.astype(np.float32)])
def test_non_bool_input_raises(bad):
    with pytest.raises(ValueError, match="boolean"):
        compute_confusion_counts(bad, REF_A)
    with pytest.raises(ValueError, match="boolean"):
        compute_confusion_counts(PRED_A, bad)


def test_bad_rank_raises():
    with pytest.raises(ValueError, match=r"\(H, W\)"):
        compute_confusion_counts(np.zeros(4, dtype=bool), np.zeros(4, dtype=bool))


def test_schema_constants():
    assert list(COUNTS_COLUMNS) == [
        "dataset", "split", "fold", "run_id", "model", "checkpoint_role", "checkpoint_sha256",
        "config_hash", "image_id", "class_id", "class_name", "threshold", "threshold_on", "height",
        "width", "source", "split_policy", "input_size", "seed", "variant", "test_time_rule",
        "tp", "fp", "fn", "tn", "intersection", "reference", "predicted", "union", "schema_version"]
    assert COUNTS_SCHEMA.names == list(COUNTS_COLUMNS)
    assert set(KEY_COLUMNS) <= set(COUNTS_COLUMNS)


def _two_image_rows() -> pd.DataFrame:
    pred = np.stack([np.stack([PRED_A, PRED_B]), np.stack([PRED_C, PRED_A])])
    ref = np.stack([np.stack([REF_A, REF_B]), np.stack([REF_C, REF_A])])
    return counts_rows(CONTEXT, compute_confusion_counts(pred, ref), image_ids=["img0", "img1"],
                       class_ids=[1, 2], class_names=["liver", "tumour"], heights=4, widths=4,
                       sources=["siteA", "siteB"])


def test_counts_rows_layout():
    df = _two_image_rows()
    assert list(df.columns) == list(COUNTS_COLUMNS)
    assert len(df) == 4
    assert list(df["image_id"]) == ["img0", "img0", "img1", "img1"]
    assert list(df["class_id"]) == [1, 2, 1, 2]
    assert list(df["class_name"]) == ["liver", "tumour", "liver", "tumour"]
    assert list(df["source"]) == ["siteA", "siteA", "siteB", "siteB"]
    assert list(df["tp"]) == [2, 0, 16, 2]
    assert list(df["fn"]) == [2, 3, 0, 2]
    assert (df["schema_version"] == COUNTS_SCHEMA_VERSION).all()
    assert (df["fold"] == -1).all() and (df["threshold"] == 0.5).all()
    assert validate_counts_frame(df) == []


def test_counts_rows_errors():
    c = compute_confusion_counts(PRED_A, REF_A)
    kw = dict(image_ids=["i"], class_ids=[1], class_names=["x"], heights=4, widths=4)
    with pytest.raises(ValueError, match="missing keys.*fold"):
        counts_rows({k: v for k, v in CONTEXT.items() if k != "fold"}, c, **kw)
    with pytest.raises(ValueError, match="threshold_on"):
        counts_rows({**CONTEXT, "threshold_on": "prob"}, c, **kw)
    with pytest.raises(ValueError, match="image_ids"):
        counts_rows(CONTEXT, c, **{**kw, "image_ids": ["i", "j"]})
    with pytest.raises(ValueError, match="height\\*width"):
        counts_rows(CONTEXT, c, **{**kw, "heights": 5})


def test_write_counts_roundtrip(tmp_path):
    df = _two_image_rows()
    path = write_counts(df, tmp_path / "evaluation" / "best" / "counts.parquet")
    assert path.is_file()
    assert [p.name for p in path.parent.iterdir()] == ["counts.parquet"]
    schema = pq.read_schema(path)
    assert schema.names == list(COUNTS_COLUMNS)
    assert schema.metadata[b"msb.schema_version"] == str(COUNTS_SCHEMA_VERSION).encode()
    back = pd.read_parquet(path)
    assert validate_counts_frame(back) == []
    for col in COUNTS_COLUMNS:
        assert list(back[col]) == list(df[col]), col
    assert str(back["fold"].dtype) == "int64" and str(back["threshold"].dtype) == "float64"


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.drop(columns="image_id"), "missing columns.*image_id"),
    (lambda d: d.assign(extra=1), "unexpected columns.*extra"),
    (lambda d: d.assign(fold=d["fold"].astype(float)), "fold.*int64"),
    (lambda d: d.assign(tn=d["tn"] + 1), "height\\*width.*image_id='img0'"),
    (lambda d: d.assign(union=d["union"] - 1), "derived counts"),
    (lambda d: d.assign(threshold_on="odds"), "threshold_on"),
])
def test_write_counts_rejects_bad_frames_and_writes_nothing(tmp_path, mutate, message):
    df = mutate(_two_image_rows())
    with pytest.raises(ValueError, match=message):
        write_counts(df, tmp_path / "counts.parquet")
    assert list(tmp_path.iterdir()) == []


def test_write_counts_failure_leaves_no_partial_file(tmp_path, monkeypatch):
    def boom(table, where, *a, **k):
        with open(where, "wb") as f:
            f.write(b"PAR1 half")
        raise OSError("disk full")

    monkeypatch.setattr(counts_mod.pq, "write_table", boom)
    with pytest.raises(OSError, match="disk full"):
        write_counts(_two_image_rows(), tmp_path / "counts.parquet")
    assert list(tmp_path.iterdir()) == []
