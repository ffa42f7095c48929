"""Tests for msb.analysis.counts.counts_io and msb.analysis.counts.aggregate on a hand-made counts table.

Hand-made table: 3 images (a, b, c) x 2 classes (1, 2), every image 4 x 4 = 16 pixels.

    image class  TP FP FN TN | Dice=2TP/(2TP+FP+FN)  IoU=TP/(TP+FP+FN)  Prec=TP/(TP+FP)  Rec=TP/(TP+FN)
    a     1       4  2  2  8 | 8/12  = 2/3           4/8  = 1/2         4/6 = 2/3        4/6 = 2/3
    a     2       1  0  3 12 | 2/5                   1/4                1/1 = 1          1/4
    b     1       0  0  0 16 | 0/0   undefined       0/0 undefined      0/0 undefined    0/0 undefined
    b     2       2  2  0 12 | 4/6   = 2/3           2/4  = 1/2         2/4 = 1/2        2/2 = 1
    c     1       6  0  2  8 | 12/14 = 6/7           6/8  = 3/4         6/6 = 1          6/8 = 3/4
    c     2       0  3  0 13 | 0/3   = 0             0/3  = 0           0/3 = 0          0/0 undefined

global-micro: TP = 13, FP = 7, FN = 7
    Dice 26/40 = 13/20; IoU 13/27; precision 13/20; recall 13/20. 1 unit, 0 excluded.
class-macro: class 1 sums TP 10, FP 2, FN 4; class 2 sums TP 3, FP 5, FN 3
    Dice      (20/26 + 6/14)/2 = (10/13 + 3/7)/2 = 109/182
    IoU       (10/16 + 3/11)/2 = (5/8 + 3/11)/2  = 79/176
    precision (10/12 + 3/8)/2  = (5/6 + 3/8)/2   = 29/48
    recall    (10/14 + 3/6)/2  = (5/7 + 1/2)/2   = 17/28
    2 units (classes), 0 excluded.
image-macro (per class mean over images with a defined score, then mean over classes):
    Dice      class 1 (2/3 + 6/7)/2 = 16/21; class 2 (2/5 + 2/3 + 0)/3 = 16/45; mean 176/315; 1 excluded
    IoU       class 1 (1/2 + 3/4)/2 = 5/8;   class 2 (1/4 + 1/2 + 0)/3 = 1/4;   mean 7/16;    1 excluded
    precision class 1 (2/3 + 1)/2   = 5/6;   class 2 (1 + 1/2 + 0)/3   = 1/2;   mean 2/3;     1 excluded
    recall    class 1 (2/3 + 3/4)/2 = 17/24; class 2 (1/4 + 1)/2       = 5/8;   mean 2/3;     2 excluded
    6 units (image x class rows).
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from msb.analysis.counts import aggregate as agg_mod
from msb.analysis.counts.aggregate import (
    ALL_METRICS,
    ALL_RULES,
    DEFAULT_GROUP,
    POOL_FOLDS_GROUP,
    aggregate,
    dice_from_counts,
    iou_from_counts,
    precision_from_counts,
    reaggregate,
    recall_from_counts,
    render_scores_table,
    scores_wide,
    write_scores,
)
from msb.analysis.counts.counts_io import read_counts, read_counts_with_report
from msb.errors import MSBError
from msb.evaluation.counts import COUNTS_COLUMNS, counts_rows, write_counts

# (image, class) -> (tp, fp, fn, tn)
TABLE = {
    ("a", 1): (4, 2, 2, 8),
    ("a", 2): (1, 0, 3, 12),
    ("b", 1): (0, 0, 0, 16),
    ("b", 2): (2, 2, 0, 12),
    ("c", 1): (6, 0, 2, 8),
    ("c", 2): (0, 3, 0, 13),
}

EXPECTED = {
    ("global-micro", "dice"): (F(13, 20), 1, 0),
    ("global-micro", "iou"): (F(13, 27), 1, 0),
    ("global-micro", "precision"): (F(13, 20), 1, 0),
    ("global-micro", "recall"): (F(13, 20), 1, 0),
    ("class-macro", "dice"): (F(109, 182), 2, 0),
    ("class-macro", "iou"): (F(79, 176), 2, 0),
    ("class-macro", "precision"): (F(29, 48), 2, 0),
    ("class-macro", "recall"): (F(17, 28), 2, 0),
    ("image-macro", "dice"): (F(176, 315), 6, 1),
    ("image-macro", "iou"): (F(7, 16), 6, 1),
    ("image-macro", "precision"): (F(2, 3), 6, 1),
    ("image-macro", "recall"): (F(2, 3), 6, 2),
}

BASE_CONTEXT = dict(dataset="toy", split="test", fold=-1, run_id="r1", model="unet",
                    checkpoint_role="best", checkpoint_sha256="a" * 64, config_hash="b" * 64,
                    threshold=0.5, threshold_on="probability")


def make_counts(table=TABLE, **context) -> pd.DataFrame:
    """Counts rows of ``table`` (one 4x4 image per image id) via counts_rows."""
    ctx = {**BASE_CONTEXT, **context}
    frames = []
    for image in sorted({i for i, _ in table}):
        classes = sorted(c for i, c in table if i == image)
        arr = np.array([[table[(image, c)] for c in classes]], dtype=np.int64)  # (1, C, 4)
        tp, fp, fn, tn = (arr[..., k] for k in range(4))
        counts = dict(tp=tp, fp=fp, fn=fn, tn=tn, intersection=tp, reference=tp + fn,
                      predicted=tp + fp, union=tp + fp + fn)
        frames.append(counts_rows(ctx, counts, image_ids=[image], class_ids=classes,
                                  class_names=[f"class{c}" for c in classes], heights=4, widths=4,
                                  sources="hand"))
    return pd.concat(frames, ignore_index=True)


def test_per_unit_score_functions():
    tp = np.array([4, 1, 0, 2, 6, 0])
    fp = np.array([2, 0, 0, 2, 0, 3])
    fn = np.array([2, 3, 0, 0, 2, 0])
    np.testing.assert_allclose(dice_from_counts(tp, fp, fn), [2 / 3, 2 / 5, np.nan, 2 / 3, 6 / 7, 0])
    np.testing.assert_allclose(iou_from_counts(tp, fp, fn), [1 / 2, 1 / 4, np.nan, 1 / 2, 3 / 4, 0])
    np.testing.assert_allclose(precision_from_counts(tp, fp), [2 / 3, 1, np.nan, 1 / 2, 1, 0])
    np.testing.assert_allclose(recall_from_counts(tp, fn), [2 / 3, 1 / 4, np.nan, 1, 3 / 4, np.nan])
    assert dice_from_counts(tp, fp, fn).dtype == np.float64
    assert np.isnan(dice_from_counts(0, 0, 0))


@pytest.mark.parametrize("rule, metric", sorted(EXPECTED))
def test_aggregate_matches_hand_computed(rule, metric):
    value, n_units, n_excluded = EXPECTED[(rule, metric)]
    res = aggregate(make_counts(), rule, metric)
    assert res.value == pytest.approx(float(value), abs=1e-12)
    assert (res.n_units, res.n_excluded) == (n_units, n_excluded)
    assert (res.n_images, res.n_classes) == (3, 2)


def test_reaggregate_long_table():
    table = reaggregate(make_counts())
    assert list(table.columns) == [*DEFAULT_GROUP, "aggregation", "metric", "value", "n_images",
                                   "n_classes", "n_units", "n_excluded"]
    assert len(table) == len(ALL_RULES) * len(ALL_METRICS)
    assert list(table["aggregation"].unique()) == list(ALL_RULES)
    for _, row in table.iterrows():
        value, n_units, n_excluded = EXPECTED[(row["aggregation"], row["metric"])]
        assert row["value"] == pytest.approx(float(value), abs=1e-12)
        assert (row["n_units"], row["n_excluded"]) == (n_units, n_excluded)
        assert (row["n_images"], row["n_classes"]) == (3, 2)
        assert row["dataset"] == "toy" and row["fold"] == -1


def test_binary_image_macro_is_plain_image_mean():
    # class 1 only: Dice of a, b, c = 2/3, undefined, 6/7 -> mean over defined (2/3 + 6/7)/2 = 16/21
    one_class = {k: v for k, v in TABLE.items() if k[1] == 1}
    res = aggregate(make_counts(one_class), "image-macro", "dice")
    assert res.value == pytest.approx(16 / 21)
    assert (res.n_units, res.n_excluded) == (3, 1)


def test_all_undefined_gives_nan_and_counts_exclusions():
    empty = {("a", 1): (0, 0, 0, 16), ("b", 1): (0, 0, 0, 16)}
    df = make_counts(empty)
    for rule, n_units in [("global-micro", 1), ("image-macro", 2), ("class-macro", 1)]:
        res = aggregate(df, rule, "dice")
        assert np.isnan(res.value)
        assert (res.n_units, res.n_excluded) == (n_units, n_units)


def test_class_without_defined_image_is_left_out_of_class_mean():
    # class 2 empty everywhere: image-macro Dice = class 1 mean only = (2/3 + 6/7)/2 = 16/21
    t = dict(TABLE)
    t[("a", 2)] = t[("b", 2)] = t[("c", 2)] = (0, 0, 0, 16)
    res = aggregate(make_counts(t), "image-macro", "dice")
    assert res.value == pytest.approx(16 / 21)
    assert (res.n_units, res.n_excluded) == (6, 4)
    res = aggregate(make_counts(t), "class-macro", "dice")
    assert res.value == pytest.approx(20 / 26)  # class 1 pooled: 2*10/(2*10+2+4)
    assert (res.n_units, res.n_excluded) == (2, 1)


def test_groups_and_pooling_across_folds():
    # fold 0 = the table, fold 1 = the table with class 2 of image a perfect (1,0,0,15).
    t1 = dict(TABLE)
    t1[("a", 2)] = (1, 0, 0, 15)
    df = pd.concat([make_counts(fold=0, run_id="f0"), make_counts(t1, fold=1, run_id="f1")],
                   ignore_index=True)
    per_run = scores_wide(reaggregate(df))
    assert list(per_run["run_id"]) == ["f0", "f1"]
    assert per_run.loc[0, "dice_global-micro"] == pytest.approx(13 / 20)
    # fold 1 global-micro: TP 13, FP 7, FN 4 -> 26/37
    assert per_run.loc[1, "dice_global-micro"] == pytest.approx(26 / 37)
    pooled = reaggregate(df, group_by=POOL_FOLDS_GROUP)
    dice_gm = pooled[(pooled["aggregation"] == "global-micro") & (pooled["metric"] == "dice")]
    # pooled: TP 26, FP 14, FN 11 -> 52/77; 6 images (same image ids in two runs are two images)
    assert dice_gm["value"].item() == pytest.approx(52 / 77)
    assert dice_gm["n_images"].item() == 6
    everything = reaggregate(df, group_by=())
    assert list(everything.columns)[:2] == ["aggregation", "metric"]


def test_mixed_threshold_in_a_group_is_refused():
    df = pd.concat([make_counts(), make_counts(run_id="r2", threshold=0.6)], ignore_index=True)
    reaggregate(df)  # one threshold per run: fine
    with pytest.raises(MSBError, match=r"model='unet'.*threshold values \[0.5, 0.6\]"):
        reaggregate(df, group_by=POOL_FOLDS_GROUP)
    pooled = reaggregate(df, group_by=[*POOL_FOLDS_GROUP, "threshold", "threshold_on"])
    assert len(pooled) == 2 * 12
    with pytest.raises(MSBError, match="threshold"):
        aggregate(df, "global-micro", "dice")


def test_mixed_threshold_semantics_is_refused():
    df = make_counts()
    df.loc[df["image_id"] == "c", "threshold_on"] = "logit"
    with pytest.raises(MSBError, match=r"run_id='r1'.*threshold_on values \['logit', 'probability'\]"):
        reaggregate(df)


def test_reaggregate_bad_arguments():
    df = make_counts()
    with pytest.raises(MSBError, match="centre"):
        reaggregate(df, group_by=["centre"])
    with pytest.raises(MSBError, match="micro"):
        reaggregate(df, rules=["micro"])
    with pytest.raises(MSBError, match="hd95"):
        reaggregate(df, metrics=["hd95"])
    with pytest.raises(MSBError, match="no count rows"):
        reaggregate(df.iloc[:0])


# ---------------------------------------------------------------- reading count files


@pytest.fixture()
def counts_file(tmp_path):
    return write_counts(make_counts(), tmp_path / "runs" / "s" / "r1" / "evaluation" / "best" /
                        "counts.parquet")


def test_read_counts_file_and_folder(tmp_path, counts_file):
    df = read_counts([counts_file])
    assert list(df.columns) == list(COUNTS_COLUMNS)
    assert len(df) == 6 and df.attrs["n_duplicates_dropped"] == 0
    other = write_counts(make_counts(run_id="r2"), tmp_path / "runs" / "s" / "r2" / "evaluation" /
                         "best" / "counts.parquet")
    both = read_counts([tmp_path / "runs"])
    assert len(both) == 12
    assert both.attrs["files"] == [str(counts_file), str(other)]
    table = reaggregate(read_counts(counts_file))
    dice = table[(table["aggregation"] == "image-macro") & (table["metric"] == "dice")]
    assert dice["value"].item() == pytest.approx(176 / 315)


def test_exact_duplicates_are_dropped_and_reported(tmp_path, counts_file):
    df, report = read_counts_with_report([counts_file, counts_file])
    assert (report.n_rows_read, report.n_duplicates_dropped, report.n_rows) == (12, 6, 6)
    assert "6 exact duplicate" in report.notes[0]
    # the folder above plus the file itself: same file twice
    df2 = read_counts([tmp_path / "runs", counts_file])
    assert df2.attrs["n_duplicates_dropped"] == 6
    pd.testing.assert_frame_equal(reaggregate(df), reaggregate(make_counts()))


def test_conflicting_duplicates_are_refused(tmp_path, counts_file):
    t = dict(TABLE)
    t[("a", 1)] = (5, 1, 1, 9)
    other = write_counts(make_counts(t), tmp_path / "stale" / "counts.parquet")
    with pytest.raises(MSBError, match=r"1 key\(s\).*image_id='a', class_id=1.*'tp'.*stale") as e:
        read_counts([counts_file, other])
    assert str(counts_file) in str(e.value)


def test_columnar_read_skips_optional_columns_but_not_checks_or_conflicts(tmp_path, counts_file):
    df, _ = read_counts_with_report([counts_file], columns=["model"])
    assert "checkpoint_sha256" not in df.columns and "source" not in df.columns and "model" in df.columns
    pd.testing.assert_frame_equal(reaggregate(df), reaggregate(read_counts(counts_file)))
    # same key, rows differing only in an unread column: still a conflict (the files are re-read in full)
    other_df = make_counts()
    other_df["checkpoint_sha256"] = "f" * 64
    other = write_counts(other_df, tmp_path / "stale" / "counts.parquet")
    with pytest.raises(MSBError, match=r"conflicting duplicate.*'checkpoint_sha256'"):
        read_counts_with_report([counts_file, other], columns=["model"])
    df2, report = read_counts_with_report([counts_file, counts_file], columns=["model"])
    assert report.n_duplicates_dropped == 6 and len(df2) == 6


def test_missing_path(tmp_path):
    with pytest.raises(MSBError, match=r"nope\.parquet: no such file or folder \(the path does not exist\)"):
        read_counts([tmp_path / "nope.parquet"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(MSBError, match="empty: folder contains no counts.parquet"):
        read_counts([tmp_path / "empty"])


def test_not_parquet(tmp_path):
    bad = tmp_path / "counts.parquet"
    bad.write_text("image_id,tp\na,1\n")
    with pytest.raises(MSBError, match=r"counts\.parquet: cannot read as Parquet"):
        read_counts([bad])


def test_missing_columns_are_listed(tmp_path):
    bad = tmp_path / "counts.parquet"
    make_counts().drop(columns=["threshold", "union"]).to_parquet(bad)
    with pytest.raises(MSBError, match=r"counts\.parquet: .*missing columns \['threshold', 'union'\]"):
        read_counts([bad])


def test_a_scores_file_is_named_as_such(tmp_path, counts_file):
    """``msb reaggregate runs/s/scores.parquet`` (the scores, not the counts) says what the file is and which
    path to give instead, not "rewrite it with the current schema"."""
    from msb.analysis.counts.aggregate import write_scores

    _, scores = write_scores(reaggregate(read_counts(counts_file)), tmp_path / "runs" / "s")
    with pytest.raises(MSBError) as e:
        read_counts([scores])
    msg = str(e.value)
    assert msg.startswith(f"{scores}: this is a scores table") and "not a counts file" in msg
    assert f"msb reaggregate {scores.parent}" in msg and "schema" not in msg


def test_inconsistent_totals_name_the_row(tmp_path):
    df = make_counts()
    df.loc[3, "tn"] += 1  # image b, class 2
    bad = tmp_path / "counts.parquet"
    df.to_parquet(bad)
    with pytest.raises(MSBError, match=r"counts\.parquet: .*tp\+fp\+fn\+tn = 17.*height\*width = 4\*4 = 16"
                                       r".*row 3 \(image_id='b', class_id=2\)"):
        read_counts([bad])


def test_negative_counts_name_the_row(tmp_path):
    df = make_counts()
    df.loc[4, ["fp", "tn"]] = [-1, 9]
    df.loc[4, "predicted"] = 5
    bad = tmp_path / "counts.parquet"
    df.to_parquet(bad)
    with pytest.raises(MSBError, match=r"counts\.parquet: negative counts in \['fp'\].*image_id='c', class_id=1"):
        read_counts([bad])


def test_wrong_dtype_is_refused(tmp_path):
    bad = tmp_path / "counts.parquet"
    make_counts().assign(fold="minus one").to_parquet(bad)
    with pytest.raises(MSBError, match=r"counts\.parquet: column 'fold' has dtype"):
        read_counts([bad])


# ---------------------------------------------------------------- outputs


def test_scores_wide_and_render():
    table = reaggregate(make_counts())
    wide = scores_wide(table)
    assert len(wide) == 1
    assert list(wide.columns)[len(DEFAULT_GROUP):len(DEFAULT_GROUP) + 3] == [
        "n_images", "n_classes", "dice_global-micro"]
    assert wide.loc[0, "recall_image-macro"] == pytest.approx(2 / 3)
    console = Console(record=True, width=250)
    console.print(render_scores_table(table))
    text = " ".join(console.export_text().split())  # the caption wraps at the table width
    assert "0.6500" in text and "0.5587" in text  # 13/20 and 176/315
    assert "dice/image-macro 1 of 6" in text and "recall/image-macro 2 of 6" in text


def test_write_scores(tmp_path):
    table = reaggregate(make_counts())
    paths = write_scores(table, tmp_path / "out")
    assert [p.name for p in paths] == ["scores.csv", "scores.parquet"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["scores.csv", "scores.parquet"]
    back = pd.read_parquet(paths[1])
    np.testing.assert_allclose(back["value"], table["value"])
    csv = pd.read_csv(paths[0])
    np.testing.assert_allclose(csv["value"], table["value"])


def test_write_scores_failure_leaves_no_file(tmp_path, monkeypatch):
    def boom(table, where, *a, **k):
        with open(where, "wb") as f:
            f.write(b"PAR1 half")
        raise OSError("disk full")

    monkeypatch.setattr(agg_mod.pq, "write_table", boom)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="disk full"):
        write_scores(reaggregate(make_counts()), out)
    assert list(out.iterdir()) == []  # neither the CSV (already written) nor temp files remain


def test_cli_by_threshold_scores_thresholds_separately(tmp_path):
    """`msb reaggregate --pool` refuses two thresholds (exit 2, one line naming the fix); `--by-threshold`
    scores each: the global-micro Dice of each threshold's rows is the hand value 13/20 (same table)."""
    import subprocess
    import sys

    make_counts().to_parquet(tmp_path / "a.parquet")
    make_counts(run_id="r2", threshold=0.6).to_parquet(tmp_path / "b.parquet")
    cmd = [sys.executable, "-m", "msb", "reaggregate", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"),
           "--pool"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 2 and "--by-threshold" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([*cmd, "--by-threshold", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    scores = pd.read_csv(tmp_path / "out" / "scores.csv")
    dice = scores[(scores.aggregation == "global-micro") & (scores.metric == "dice")]
    assert sorted(dice["threshold"]) == [0.5, 0.6]
    assert np.allclose(dice["value"], 13 / 20)
