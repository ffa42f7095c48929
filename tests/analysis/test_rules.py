"""Extra aggregation rules, the weighted rule kernel and fold-wise summaries on hand-computed tables.

Hand table (the one of test_aggregate.py): 3 images (a, b, c) x 2 classes, 4 x 4 pixels each.

    image class  TP FP FN | Dice            recall
    a     1       4  2  2 | 2/3             2/3
    a     2       1  0  3 | 2/5             1/4
    b     1       0  0  0 | undefined       undefined
    b     2       2  2  0 | 2/3             1
    c     1       6  0  2 | 6/7             3/4
    c     2       0  3  0 | 0               undefined

image-class-mean Dice: (2/3 + 2/5 + 2/3 + 6/7 + 0) / 5 = (272/105) / 5 = 272/525; 6 units, 1 excluded.
image-class-mean recall: (2/3 + 1/4 + 1 + 3/4) / 4 = 2/3; 2 excluded.
image-foreground (classes pooled per image):
    a: TP 5, FP 2, FN 5 -> Dice 10/17, recall 1/2
    b: TP 2, FP 2, FN 0 -> Dice 4/6 = 2/3, recall 1
    c: TP 6, FP 3, FN 2 -> Dice 12/17, recall 3/4
    Dice mean (10/17 + 2/3 + 12/17)/3 = 100/153; recall mean (1/2 + 1 + 3/4)/3 = 3/4.
pooled-foreground = global-micro: TP 13, FP 7, FN 7 -> Dice 13/20.
pooled-class: class 1 sums (10, 2, 4) -> Dice 20/26 = 10/13; class 2 sums (3, 5, 3) -> Dice 6/14 = 3/7.
"""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pandas as pd
import pytest

from msb.analysis.counts.aggregate import ALL_METRICS, ALL_RULES, aggregate, reaggregate
from msb.analysis.counts.rules import (EXTENDED_RULES, aggregate_rules, foldwise_summary, image_table, lower_is_better,
                                parse_rules, rule_values, unit_scores)
from msb.errors import MSBError

TABLE = {("a", 1): (4, 2, 2), ("a", 2): (1, 0, 3), ("b", 1): (0, 0, 0), ("b", 2): (2, 2, 0),
         ("c", 1): (6, 0, 2), ("c", 2): (0, 3, 0)}


def counts(table=TABLE, **ctx) -> pd.DataFrame:
    """Counts rows (columns the analysis needs) of a {(image, class): (tp, fp, fn)} table, 4x4 images."""
    base = dict(dataset="toy", split="test", fold=-1, run_id="r1", model="unet", checkpoint_role="best",
                threshold=0.5, threshold_on="probability", source="hand", height=4, width=4)
    base.update(ctx)
    rows = [{**base, "image_id": i, "class_id": c, "class_name": f"class{c}", "tp": tp, "fp": fp, "fn": fn,
             "tn": 16 - tp - fp - fn} for (i, c), (tp, fp, fn) in sorted(table.items())]
    df = pd.DataFrame(rows)
    df["fold"] = df["fold"].astype(np.int64)
    return df


EXPECTED = {
    ("image-class-mean", "dice"): (F(272, 525), 6, 1),
    ("image-class-mean", "recall"): (F(2, 3), 6, 2),
    ("image-foreground", "dice"): (F(100, 153), 3, 0),
    ("image-foreground", "recall"): (F(3, 4), 3, 0),
    ("pooled-foreground", "dice"): (F(13, 20), 1, 0),
    ("pooled-class:class1", "dice"): (F(10, 13), 1, 0),
    ("pooled-class:class2", "dice"): (F(3, 7), 1, 0),
}


@pytest.mark.parametrize("rule, metric", sorted(EXPECTED))
def test_extra_rules_match_hand_values(rule, metric):
    value, n_units, n_excl = EXPECTED[(rule, metric)]
    table = aggregate_rules(counts(), [], EXTENDED_RULES, ALL_METRICS)
    row = table[(table["aggregation"] == rule) & (table["metric"] == metric)]
    assert len(row) == 1
    assert row["value"].iloc[0] == pytest.approx(float(value), abs=1e-12)
    assert (int(row["n_units"].iloc[0]), int(row["n_excluded"].iloc[0])) == (n_units, n_excl)
    assert int(row["n_images"].iloc[0]) == 3 and int(row["n_classes"].iloc[0]) == 2


def test_aggregate_rules_keeps_reaggregate_for_basic_rules():
    df = pd.concat([counts(), counts(run_id="r2", table={**TABLE, ("a", 1): (1, 5, 5)})], ignore_index=True)
    ext = aggregate_rules(df, ["run_id"], EXTENDED_RULES, ALL_METRICS)
    base = reaggregate(df, ["run_id"], ALL_RULES, ALL_METRICS)
    merged = ext.merge(base, on=["run_id", "aggregation", "metric"], suffixes=("", "_base"))
    assert len(merged) == len(base) == 2 * 3 * 4
    np.testing.assert_array_equal(merged["value"], merged["value_base"])
    # order: per group, rules in the given order with pooled-class expanded per class
    first = ext[ext["run_id"] == "r1"].drop_duplicates("aggregation")["aggregation"].tolist()
    assert first == ["global-micro", "image-macro", "class-macro", "image-class-mean", "image-foreground",
                     "pooled-foreground", "pooled-class:class1", "pooled-class:class2"]
    assert list(ext.columns) == list(base.columns)


@pytest.mark.parametrize("rule", ALL_RULES)
@pytest.mark.parametrize("metric", ALL_METRICS)
def test_weighted_kernel_equals_aggregate_on_duplicated_rows(rule, metric):
    """Weights = how often each image is drawn: equal to aggregate() on the rows repeated that often."""
    df = counts()
    t = image_table(df)
    order = t.keys["image_id"].tolist()
    w = np.array([[1, 1, 1], [2, 0, 1], [0, 3, 1], [0, 1, 0]], dtype=float)
    got = rule_values(t, rule, metric, w)
    for r in range(w.shape[0]):
        rows = pd.concat([df[df["image_id"] == img] for img, k in zip(order, w[r]) for _ in range(int(k))])
        want = aggregate(rows, rule, metric).value
        if np.isnan(want):
            assert np.isnan(got[r])
        else:
            assert got[r] == pytest.approx(want, abs=1e-12)


def test_unit_scores_and_image_table():
    t = image_table(counts())
    assert t.keys["image_id"].tolist() == ["a", "b", "c"] and t.class_names == ("class1", "class2")
    np.testing.assert_allclose(unit_scores(t, "dice", "image-class"), [2 / 3, 2 / 5, np.nan, 2 / 3, 6 / 7, 0])
    # per image: mean over the defined classes
    np.testing.assert_allclose(unit_scores(t, "dice", "image"), [(2 / 3 + 2 / 5) / 2, 2 / 3, 3 / 7])
    np.testing.assert_allclose(unit_scores(t, "dice", "image-foreground"), [10 / 17, 2 / 3, 12 / 17])


def test_image_table_refuses_missing_and_mixed_rows():
    df = counts()
    with pytest.raises(MSBError, match=r"image 'b'.*class_id 1 is missing"):
        image_table(df[~((df["image_id"] == "b") & (df["class_id"] == 1))])
    mixed = df.copy()
    mixed.loc[0, "threshold"] = 0.3
    with pytest.raises(MSBError, match="threshold"):
        image_table(mixed)


def test_parse_rules_and_errors():
    assert parse_rules(None) == list(ALL_RULES)
    assert parse_rules("all") == list(EXTENDED_RULES)
    assert parse_rules("image-macro, pooled-class") == ["image-macro", "pooled-class"]
    with pytest.raises(MSBError, match=r"unknown aggregation rule\(s\) \['imag-macro'\].*image-macro"):
        parse_rules("imag-macro")
    t = image_table(counts())
    with pytest.raises(MSBError, match="no class named 'x'"):
        rule_values(t, "pooled-class:x", "dice")


def test_foldwise_summary_hand_values():
    """Fold 0: image x Dice 2*1/(2+2) = 1/2; fold 1: image y Dice 1. Mean 3/4, sample SD sqrt(1/8);
    pooled global-micro: TP 2, FP 2, FN 0 -> 4/6."""
    f0 = counts({("x", 1): (1, 2, 0)}, fold=0, run_id="m-fold0")
    f1 = counts({("y", 1): (1, 0, 0)}, fold=1, run_id="m-fold1")
    out = foldwise_summary(pd.concat([f0, f1], ignore_index=True), ["model"], ("global-micro", "image-macro"),
                           ("dice",))
    gm = out[out["aggregation"] == "global-micro"].iloc[0]
    assert gm["n_folds"] == 2
    assert gm["mean_over_folds"] == pytest.approx(0.75)
    assert gm["std_over_folds"] == pytest.approx(np.sqrt(1 / 8))
    assert (gm["min_over_folds"], gm["max_over_folds"]) == (0.5, 1.0)
    assert gm["pooled"] == pytest.approx(4 / 6)
    im = out[out["aggregation"] == "image-macro"].iloc[0]
    assert im["pooled"] == pytest.approx(0.75) and im["n_images"] == 2
    single = foldwise_summary(counts(), ["model"], ("global-micro",), ("dice",))
    assert single["n_folds"].iloc[0] == 1 and np.isnan(single["std_over_folds"].iloc[0])


def test_lower_is_better():
    assert lower_is_better("hd95") and lower_is_better("assd") and lower_is_better("hd")
    assert not lower_is_better("dice") and not lower_is_better("nsd_tau2px")
