"""Image-level percentile bootstrap: against the normal-theory interval of a known distribution, against
scipy.stats.bootstrap, and replicate by replicate against a naive loop over aggregate() on the same draws."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from msb.analysis.counts.aggregate import ALL_RULES, aggregate
from msb.analysis.stats.bootstrap import (bootstrap_mean, bootstrap_rule, bootstrap_rules, paired_difference,
                                    percentile_interval, resample_indices, resample_weights)
from msb.analysis.counts.rules import image_table, rule_values
from msb.errors import MSBError


def random_counts(n: int, seed: int, run_id: str = "r1", folds: int = 0) -> pd.DataFrame:
    """Binary counts of n images with random sizes (some empty references and predictions)."""
    rng = np.random.default_rng(seed)
    ref = np.where(rng.random(n) < 0.15, 0, rng.integers(5, 400, n))
    tp = np.floor(ref * rng.uniform(0, 1, n)).astype(np.int64)
    fp = np.where(rng.random(n) < 0.1, 0, rng.integers(0, 60, n))
    df = pd.DataFrame({"dataset": "d", "split": "test", "fold": (np.arange(n) % folds) if folds else -1,
                       "run_id": run_id, "model": "m", "checkpoint_role": "best",
                       "image_id": [f"i{k:04d}" for k in range(n)], "class_id": 1, "class_name": "fg",
                       "threshold": 0.5, "threshold_on": "probability", "source": "s",
                       "tp": tp, "fp": fp, "fn": ref - tp})
    df["fold"] = df["fold"].astype(np.int64)
    return df


def test_ci_of_a_normal_mean_matches_theory_and_scipy():
    """x ~ N(5, 2^2), n = 4000: the 95% percentile CI of the mean is mean +- 1.96 s / sqrt(n) up to Monte
    Carlo error; scipy.stats.bootstrap(method='percentile') on the same vector agrees as closely."""
    x = np.random.default_rng(1).normal(5.0, 2.0, 4000)
    res = bootstrap_mean(x, n_boot=4000, seed=3)
    half = 1.959964 * x.std(ddof=1) / np.sqrt(x.size)
    assert res.estimate == pytest.approx(x.mean(), abs=1e-12)
    assert res.low == pytest.approx(x.mean() - half, abs=0.12 * half)
    assert res.high == pytest.approx(x.mean() + half, abs=0.12 * half)
    ref = stats.bootstrap((x,), np.mean, n_resamples=4000, method="percentile", confidence_level=0.95,
                          random_state=np.random.default_rng(7)).confidence_interval
    assert res.low == pytest.approx(ref.low, abs=0.15 * half)
    assert res.high == pytest.approx(ref.high, abs=0.15 * half)
    assert res.n_boot == 4000 and res.n_undefined == 0 and res.n_images == 4000 and res.level == 0.95


def test_percentile_interval_is_numpy_linear_and_skips_undefined():
    r = np.array([np.nan, 1.0, 2.0, 3.0, 4.0, np.nan])
    lo, hi, bad = percentile_interval(r, 0.5)
    assert (lo, hi, bad) == (np.percentile([1, 2, 3, 4], 25), np.percentile([1, 2, 3, 4], 75), 2)


@pytest.mark.parametrize("rule", ALL_RULES)
def test_replicates_equal_naive_loop_on_same_draws(rule):
    df = random_counts(60, seed=0)
    t = image_table(df)
    res = bootstrap_rule(t, rule, "dice", n_boot=30, seed=11)[0]
    idx = next(resample_indices(60, 30, seed=11))
    for r in range(30):
        rows = df.set_index("image_id").loc[t.keys["image_id"].to_numpy()[idx[r]]].reset_index()
        assert res.replicates[r] == pytest.approx(aggregate(rows, rule, "dice").value, abs=1e-12)
    assert res.estimate == pytest.approx(aggregate(df, rule, "dice").value, abs=1e-12)


def test_weights_are_resampling_counts_and_strata_keep_their_size():
    strata = np.array([0] * 5 + [1] * 3 + [2] * 2)
    blocks = list(resample_weights(10, 600, seed=2, strata=strata))
    w = np.concatenate(blocks)
    assert w.shape == (600, 10) and [b.shape[0] for b in blocks] == [250, 250, 100]
    for s, size in ((0, 5), (1, 3), (2, 2)):
        np.testing.assert_array_equal(w[:, strata == s].sum(axis=1), size)
    idx = np.concatenate(list(resample_indices(10, 600, seed=2, strata=strata)))
    for r in (0, 77, 599):
        np.testing.assert_array_equal(np.bincount(idx[r], minlength=10), w[r])
    # unstratified: rows sum to n; every image is drawn about n_boot times overall
    w = np.concatenate(list(resample_weights(10, 600, seed=2)))
    np.testing.assert_array_equal(w.sum(axis=1), 10)


def test_fold_stratification_is_used_for_fold_tables():
    df = random_counts(40, seed=4, folds=4)
    res = bootstrap_rule(image_table(df), "global-micro", "dice", n_boot=50, seed=0)[0]
    assert res.n_strata == 4
    res = bootstrap_rule(image_table(df), "global-micro", "dice", n_boot=50, seed=0, stratify_by_fold=False)[0]
    assert res.n_strata == 1


def test_seeded_and_rules_share_draws():
    t = image_table(random_counts(80, seed=5))
    a = bootstrap_rule(t, "image-macro", "dice", n_boot=300, seed=9)[0]
    b = bootstrap_rule(t, "image-macro", "dice", n_boot=300, seed=9)[0]
    c = bootstrap_rule(t, "image-macro", "dice", n_boot=300, seed=10)[0]
    np.testing.assert_array_equal(a.replicates, b.replicates)
    assert not np.array_equal(a.replicates, c.replicates)
    many = bootstrap_rules(t, [("image-macro", "dice"), ("global-micro", "iou")], n_boot=300, seed=9)
    np.testing.assert_array_equal(many[("image-macro", "dice")].replicates, a.replicates)
    assert a.text().count("[") == 1


def test_paired_difference_uses_the_same_resamples():
    a_df = random_counts(50, seed=6, run_id="A")
    b_df = random_counts(50, seed=7, run_id="B")
    ta, tb = image_table(a_df), image_table(b_df)
    res = paired_difference(ta, tb, "global-micro", "dice", n_boot=40, seed=1)
    idx = next(resample_indices(50, 40, seed=1))
    ids = ta.keys["image_id"].to_numpy()
    for r in (0, 13, 39):
        pick = ids[idx[r]]
        va = aggregate(a_df.set_index("image_id").loc[pick].reset_index(), "global-micro", "dice").value
        vb = aggregate(b_df.set_index("image_id").loc[pick].reset_index(), "global-micro", "dice").value
        assert res.replicates[r] == pytest.approx(va - vb, abs=1e-12)
    same = paired_difference(ta, ta, "image-macro", "dice", n_boot=100, seed=0)
    assert (same.estimate, same.low, same.high) == (0.0, 0.0, 0.0)
    # images in another order are paired by image id
    shuffled = image_table(b_df.iloc[::-1].reset_index(drop=True))
    res2 = paired_difference(ta, shuffled, "global-micro", "dice", n_boot=40, seed=1)
    np.testing.assert_allclose(res2.replicates, res.replicates, atol=1e-12)


def test_bad_arguments_and_mismatched_images():
    t = image_table(random_counts(10, seed=0))
    with pytest.raises(MSBError, match="positive integer"):
        bootstrap_rule(t, "image-macro", "dice", n_boot=0)
    with pytest.raises(MSBError, match=r"level must be in \(0, 1\)"):
        bootstrap_mean(np.ones(3), level=1.5)
    other = image_table(random_counts(12, seed=0, run_id="B"))
    with pytest.raises(MSBError, match=r"different images: 0 only in 'a'.*2 only in 'b'.*i0010"):
        paired_difference(t, other, "image-macro", "dice", n_boot=10)
    with pytest.raises(MSBError, match="aligned"):
        bootstrap_rule([t, other], "image-macro", "dice", n_boot=10)


@pytest.mark.parametrize("rule", ["global-micro", "pooled-foreground", "image-macro", "image-class-mean",
                                  "image-foreground"])
@pytest.mark.parametrize("metric", ["dice", "iou", "precision", "recall"])
def test_gathered_rules_equal_the_weights_path(rule, metric):
    """The gather path (msb.analysis.stats.bootstrap._gather_kernel) gives the weights path's replicates: the rule
    kernel rule_values on the resampling counts of the same draws (two classes for the class-pooling rules,
    fold strata; single-class image-macro on a one-class table)."""
    two = pd.concat([random_counts(90, seed=4, folds=3), random_counts(90, seed=5, folds=3).assign(class_id=2)])
    df = random_counts(90, seed=4, folds=3) if rule == "image-macro" else two
    t = image_table(df)
    res = bootstrap_rule(t, rule, metric, n_boot=70, seed=2)[0]
    w = np.concatenate(list(resample_weights(90, 70, seed=2, strata=t.keys["fold"].to_numpy())))
    ref = rule_values(t, rule, metric, w)
    assert np.array_equal(np.isnan(res.replicates), np.isnan(ref))
    assert np.nanmax(np.abs(res.replicates - ref)) <= 1e-12
    assert res.n_strata == 3 and np.isfinite(res.replicates).sum() >= 60


def test_cache_sized_draw_blocks_are_the_chunked_draws():
    """msb.analysis.stats.bootstrap._draw_blocks draws unstratified replicates a few rows per Generator.integers call;
    the concatenation equals the 250-replicate blocks of resample_indices (one stream whatever the call sizes),
    so the replicates do not depend on the block size; stratified blocks are cut from those blocks."""
    from msb.analysis.stats.bootstrap import _draw_blocks

    for n, n_boot in [(10_001, 300), (37, 260), (3, 5)]:
        ref = np.concatenate(list(resample_indices(n, n_boot, seed=5)))
        blocks = list(_draw_blocks(n, n_boot, 5, None))
        assert max(b.shape[0] for b in blocks) == min(n_boot, max(1, 131_072 // n))
        assert np.array_equal(np.concatenate(blocks), ref)
    strata = np.arange(50) % 3
    ref = np.concatenate(list(resample_indices(50, 600, seed=1, strata=strata)))
    assert np.array_equal(np.concatenate(list(_draw_blocks(50, 600, 1, strata))), ref)


@pytest.mark.parametrize("rule", ["global-micro", "image-macro", "image-class-mean"])
def test_large_counts_and_the_worker_thread_give_the_weights_path_replicates(monkeypatch, rule):
    """Counts too large to pack two sums into one int64 (n * max(TP) >= 2**32: two columns) and the pipelined
    path (gathers in a worker thread while the next block is drawn) give the replicates of rule_values on the
    resampling counts, exactly for the count rule."""
    import msb.analysis.stats.bootstrap as bs

    df = random_counts(400, seed=8)
    df[["tp", "fp", "fn"]] *= 40_000_000  # TP up to 1.6e10 per image: n * max(TP) >> 2**32
    if rule == "image-class-mean":
        df = pd.concat([df, random_counts(400, seed=9).assign(class_id=2)])
    t = image_table(df)
    kern = bs._gather_kernel(t, rule, "dice")
    if rule == "global-micro":
        assert [c.dtype for c in kern.columns] == [np.int64, np.int64]  # not packed
    ref = rule_values(t, rule, "dice", np.concatenate(list(resample_weights(400, 90, seed=3))))
    for threshold in (10**12, 0):  # serial, then the worker thread
        monkeypatch.setattr(bs, "_PIPELINE_DRAWS", threshold)
        got = bootstrap_rule(t, rule, "dice", n_boot=90, seed=3)[0].replicates
        if rule == "global-micro":
            assert np.array_equal(got, ref)
        else:
            assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.nanmax(np.abs(got - ref)) <= 1e-12


def test_packed_counts_are_exact_at_the_32_bit_limit():
    """Two sums packed into one int64 (TP low 32 bits, FP + FN high) at the largest values allowed: the unpacked
    sums of every replicate equal the weights path exactly (Dice of the sums, exact float arithmetic)."""
    import msb.analysis.stats.bootstrap as bs

    n = 64
    rng = np.random.default_rng(0)
    tp = np.full(n, (2**32 - 1) // n)  # n * max(TP) < 2**32
    other = rng.integers(0, (2**31 - 1) // n, n)  # n * max(FP + FN) < 2**31
    df = random_counts(n, seed=1)
    df["tp"], df["fp"], df["fn"] = tp, other, 0
    t = image_table(df)
    assert [c.dtype for c in bs._gather_kernel(t, "global-micro", "dice").columns] == [np.int64]
    got = bootstrap_rule(t, "global-micro", "dice", n_boot=200, seed=4)[0].replicates
    w = np.concatenate(list(resample_weights(n, 200, seed=4)))
    s_tp, s_o = w @ tp.astype(np.float64), w @ other.astype(np.float64)
    assert np.array_equal(got, 2 * s_tp / (2 * s_tp + s_o))
