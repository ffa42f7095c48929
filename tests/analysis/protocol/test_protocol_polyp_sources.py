"""Polyp protocol details on hand-built counts (values written here, expectations computed by hand):
external-only rows counted under their model's training protocol, the P1 split of a multi-source test split into
one column group per source, one test set per random-split seed in the Wilcoxon tests, and the report/leaderboard
of systems that share no image (one random split per seed)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from msb.analysis.protocol.inputs import annotate_counts, check_one_protocol, training_policies
from msb.analysis.protocol import polyp
from msb.analysis.protocol.wilcoxon import pairwise_tests
from msb.analysis.report.report_data import analyse_blocks, no_pairs_reason
from msb.analysis.counts.systems import comparison_blocks, find_systems
from msb.errors import MSBError
from msb.evaluation.counts import counts_rows


def _rows(run_id: str, model: str, dataset: str, split: str, policy: str, tp, fp, fn, sources, ids=None):
    n = len(tp)
    c = {k: np.zeros((n, 1), np.int64) for k in ("tp", "fp", "fn", "tn", "intersection", "reference", "predicted",
                                                 "union")}
    c["tp"][:, 0], c["fp"][:, 0], c["fn"][:, 0] = tp, fp, fn
    c["tn"][:, 0] = 100 - c["tp"][:, 0] - c["fp"][:, 0] - c["fn"][:, 0]
    c["intersection"] = c["tp"].copy()
    c["reference"] = c["tp"] + c["fn"]
    c["predicted"] = c["tp"] + c["fp"]
    c["union"] = c["tp"] + c["fp"] + c["fn"]
    ctx = {"dataset": dataset, "split": split, "fold": -1, "run_id": run_id, "model": model, "checkpoint_role": "best",
           "checkpoint_sha256": "0" * 64, "config_hash": "0" * 64, "threshold": 0.5, "threshold_on": "probability",
           "split_policy": policy, "input_size": 32, "seed": 0, "variant": "", "test_time_rule": "first"}
    ids = ids or [f"{dataset}-{i}" for i in range(n)]
    df = counts_rows(ctx, c, image_ids=ids, class_ids=[1], class_names=["polyp"], heights=10, widths=10,
                     sources=sources)
    return annotate_counts(df, "external" if policy == "external-only" else "internal", f"/x/{run_id}/{dataset}", "kv")


def test_external_only_rows_take_their_models_training_policy():
    df = pd.concat([
        _rows("kv-unet-aaaa1111-fold0", "unet", "kv", "test", "kfold(k=2,folds=abcd1234)", [5], [1], [1], "A"),
        _rows("kv-unet-aaaa1111-fold0", "unet", "ext", "all", "external-only", [5], [1], [1], "E"),
        _rows("kv-unet-aaaa1111-ensemble", "unet-ensemble2", "ext", "all", "external-only", [5], [1], [1], "E"),
        _rows("kv-segf-bbbb2222", "segf", "ext", "all", "external-only", [5], [1], [1], "E"),
    ], ignore_index=True)
    assert list(training_policies(df)) == ["kfold(k=2,folds=abcd1234)"] * 3 + ["external-only"]
    df["train_split_policy"] = training_policies(df)
    check_one_protocol(df.iloc[:3], "P1")  # internal + external rows of one kfold model: one protocol
    with pytest.raises(MSBError, match=r"different split protocols \['external-only', 'kfold"):
        check_one_protocol(df, "P1")


def test_p1_splits_a_multi_source_test_split_into_one_group_per_source():
    # model a: Kvasir images Dice 1, 0.5; ClinicDB image Dice 0 (tp=0, fp=2, fn=2); external Dice 2*3/(6+1+1)
    a = [_rows("kv-a-11111111", "a", "kv", "test", "fixed", [4, 2, 0], [0, 2, 2], [0, 2, 2],
               ["Kvasir", "Kvasir", "CVC-ClinicDB"]),
         _rows("kv-a-11111111", "a", "colon", "all", "external-only", [3], [1], [1], "CVC-ColonDB")]
    b = [_rows("kv-b-22222222", "b", "kv", "test", "fixed", [4, 4, 4], [0, 0, 4], [0, 0, 0],
               ["Kvasir", "Kvasir", "CVC-ClinicDB"]),
         _rows("kv-b-22222222", "b", "colon", "all", "external-only", [1], [0], [3], "CVC-ColonDB")]
    counts = pd.concat(a + b, ignore_index=True)
    counts["train_split_policy"] = training_policies(counts)
    sets = polyp.test_set_tables(counts, None, "P1 table")
    assert list(sets) == ["kv", "colon"]  # internal first
    t = polyp.p1_table(polyp.split_by_source(sets)).values
    t.columns = [" ".join(x for x in c if x) for c in t.columns]
    t = t.set_index("Model")
    assert list(t.index) == ["a (32)", "b (32)"]
    assert [c for c in t.columns if c.endswith("Dice")] == ["CVC-ClinicDB (kv) Dice", "Kvasir (kv) Dice", "colon Dice"]
    assert t.loc["a (32)", "Kvasir (kv) Dice"] == pytest.approx((1.0 + 0.5) / 2)
    assert t.loc["a (32)", "CVC-ClinicDB (kv) Dice"] == pytest.approx(0.0)
    assert t.loc["b (32)", "CVC-ClinicDB (kv) Dice"] == pytest.approx(8 / 12)
    assert t.loc["a (32)", "colon Dice"] == pytest.approx(6 / 8) and t.loc["b (32)", "colon Rec"] == pytest.approx(0.25)


def test_each_random_split_seed_is_its_own_test_set_and_fixed_beside_random_is_refused():
    frames = []
    for seed in (0, 1):
        pol = f"random(seed={seed},val=0.1,test=0.2,group=group)"
        ids = [f"img{seed}{i}" for i in range(5)]  # the same ids could repeat across seeds; here they differ
        frames += [_rows(f"kv-a-{seed}1111111", "a", "kv", "test", pol, [4, 3, 2, 4, 1], [0, 1, 2, 0, 3],
                         [0, 0, 0, 0, 0], "K", ids),
                   _rows(f"kv-b-{seed}2222222", "b", "kv", "test", pol, [1, 1, 1, 1, 1], [3, 3, 3, 3, 3],
                         [0, 0, 0, 0, 0], "K", ids)]
    counts = pd.concat(frames, ignore_index=True)
    sets = polyp.test_set_tables(counts, None, "Wilcoxon tests")  # one protocol family: accepted, one set per seed
    assert list(sets) == [f"kv [random(seed={s},val=0.1,test=0.2,group=group)]" for s in (0, 1)]
    tests = pairwise_tests(sets, n_boot=50)
    assert list(tests["n"]) == [5, 5] and (tests["mean_difference"] > 0).all()
    fixed = _rows("kv-c-33333333", "c", "kv", "test", "fixed", [1], [0], [0], "K", ["z0"])
    with pytest.raises(MSBError, match="different split protocols"):
        polyp.test_set_tables(pd.concat([counts, fixed], ignore_index=True), None, "Wilcoxon tests")


def test_report_blocks_of_systems_without_a_common_image_have_no_pairs():
    counts = pd.concat([_rows("kv-a-01111111", "a", "kv", "test", "random(seed=0)", [4, 2], [0, 1], [0, 1], "K",
                              ["x0", "x1"]),
                        _rows("kv-b-02222222", "b", "kv", "test", "random(seed=1)", [3, 1], [1, 1], [0, 1], "K",
                              ["y0", "y1"])], ignore_index=True)
    notes: list[str] = []
    data = analyse_blocks(comparison_blocks(find_systems(counts, "run")), None, ("image-macro",), ("dice",), 20,
                          0.95, 0, notes)
    (b,) = data.values()
    assert b.aligned == {} and len(b.tables) == 2
    assert "share no image" in no_pairs_reason(b) and any("share no image" in n for n in notes)
