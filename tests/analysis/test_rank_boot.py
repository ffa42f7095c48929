"""Bootstrap rank distributions: rank shares, rank intervals and Kendall's tau against a plain NumPy recomputation
on the same replicate indices (replicate by replicate) and scipy.stats.kendalltau; the verdict sentence."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from msb.analysis.counts.rules import image_table
from msb.analysis.counts.systems import align_tables
from msb.analysis.stats.bootstrap import bootstrap_rule, resample_indices
from msb.analysis.stats.compare import family_tests, paired_differences_table
from msb.analysis.stats.rank_boot import kendall_tau_b, rank_distribution, rank_rows
from msb.analysis.report.verdict import verdict_sentence


def _counts(n: int, seed: int, run_id: str, quality: float, folds: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ref = np.where(rng.random(n) < 0.1, 0, rng.integers(20, 400, n))
    tp = np.floor(ref * np.clip(rng.normal(quality, 0.25, n), 0, 1)).astype(np.int64)
    fp = np.where(rng.random(n) < 0.1, 0, rng.integers(0, 80, n))
    df = pd.DataFrame({"dataset": "d", "split": "test", "fold": (np.arange(n) % folds) if folds else -1,
                       "run_id": run_id, "model": run_id, "checkpoint_role": "best",
                       "image_id": [f"i{k:04d}" for k in range(n)], "class_id": 1, "class_name": "fg",
                       "threshold": 0.5, "threshold_on": "probability", "source": "s",
                       "tp": tp, "fp": fp, "fn": ref - tp})
    df["fold"] = df["fold"].astype(np.int64)
    return df


def _dice(tp, fp, fn):
    den = 2 * tp + fp + fn
    return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1), np.nan)


@pytest.mark.parametrize("folds", [0, 3])
def test_rank_shares_intervals_and_tau_equal_plain_numpy(folds):
    n, n_boot, seed = 40, 300, 5
    # systems 0..3 of close quality (ties in replicates are possible but rare; ranks flip often)
    frames = {f"s{k}": _counts(n, 10 + k, f"s{k}", q, folds) for k, q in enumerate([0.62, 0.6, 0.6, 0.4])}
    aligned = align_tables({k: image_table(v) for k, v in frames.items()})
    dist = rank_distribution(aligned, "image-macro", "dice", n_boot, 0.95, seed)
    strata = frames["s0"]["fold"].to_numpy() if folds else None
    idx = np.concatenate(list(resample_indices(n, n_boot, seed, strata)))
    per = np.stack([_dice(f["tp"].to_numpy(), f["fp"].to_numpy(), f["fn"].to_numpy()) for f in frames.values()], 1)
    full = np.nanmean(per, axis=0)
    full_rank = stats.rankdata(-full, method="min")
    ranks = np.empty((n_boot, 4))
    taus = np.empty(n_boot)
    for r in range(n_boot):  # replicate by replicate
        v = np.nanmean(per[idx[r]], axis=0)
        ranks[r] = stats.rankdata(np.where(np.isnan(v), np.inf, -v), method="min")
        taus[r] = stats.kendalltau(full_rank, ranks[r]).statistic
    np.testing.assert_array_equal(dist.ranks, ranks)
    np.testing.assert_array_equal(dist.full_rank, full_rank)
    np.testing.assert_allclose(dist.tau, taus, rtol=0, atol=1e-12)
    # the same replicates as the leaderboard's paired bootstrap (bootstrap_rule on the aligned tables)
    reps = bootstrap_rule(list(aligned.values()), "image-macro", "dice", n_boot, 0.95, seed)
    np.testing.assert_allclose(dist.replicates, np.stack([x.replicates for x in reps], 1), rtol=0, atol=1e-12)
    tab = dist.table().set_index("system")
    for k, s in enumerate(frames):
        assert tab.at[s, "rank1_share"] == pytest.approx((ranks[:, k] == 1).mean(), abs=1e-15)
        assert tab.at[s, "median_rank"] == np.median(ranks[:, k])
        srt = np.sort(ranks[:, k])
        assert tab.at[s, "rank_low"] == srt[int(np.floor(0.025 * (n_boot - 1)))]
        assert tab.at[s, "rank_high"] == srt[int(np.ceil(0.975 * (n_boot - 1)))]
    assert tab["tau_median"].iloc[0] == pytest.approx(np.median(taus), abs=1e-12)
    assert tab["tau_p05"].iloc[0] == pytest.approx(np.percentile(taus, 5), abs=1e-12)
    assert 0 < tab.at["s0", "rank1_share"] < 1 and tab.at["s3", "rank1_share"] == 0.0


def test_tau_b_and_ranks_with_ties_match_scipy():
    rng = np.random.default_rng(0)
    ref = stats.rankdata(rng.integers(0, 4, 7), method="min")
    rows = np.stack([stats.rankdata(rng.integers(0, 3, 7), method="min") for _ in range(50)])
    want = [stats.kendalltau(ref, r).statistic for r in rows]
    np.testing.assert_allclose(kendall_tau_b(ref, rows), want, rtol=0, atol=1e-12, equal_nan=True)
    v = rng.integers(0, 5, (20, 6)).astype(float)
    v[0, 2] = np.nan
    want = np.stack([stats.rankdata(np.where(np.isnan(x), np.inf, x), method="min") for x in v])
    np.testing.assert_array_equal(rank_rows(v, "hd95"), want)  # lower is better for HD95


def test_verdict_names_shares_difference_and_separability():
    frames = {"good": _counts(30, 1, "good", 0.9), "bad": _counts(30, 2, "bad", 0.3)}
    aligned = align_tables({k: image_table(v) for k, v in frames.items()})
    dist = rank_distribution(aligned, n_boot=200, seed=0)
    diffs = paired_differences_table(aligned, ("image-macro",), "dice", 200, 0.95, 0)
    w = family_tests(aligned, ["dice"])
    line = verdict_sentence(dist, w, diffs, 2)
    d = float(diffs["difference"].iloc[0])
    assert line.startswith("Verdict: good ranks first in 100.0 % of 200 image bootstrap replicates "
                           "(image-macro Dice, higher is better)")
    assert f"is {d:.3f} higher than bad [{diffs['ci_low'].iloc[0]:.3f}, {diffs['ci_high'].iloc[0]:.3f}]" in line
    assert f"Wilcoxon p = {w['p_adjusted'].iloc[0]:.3g} (BH)" in line and line.endswith("excludes 0).")
    close = {"a": _counts(30, 3, "a", 0.6), "b": _counts(30, 3, "b", 0.6)}
    close["b"].loc[0, "tp"] -= 1  # nearly identical systems
    al = align_tables({k: image_table(v) for k, v in close.items()})
    line = verdict_sentence(rank_distribution(al, n_boot=200, seed=0), family_tests(al, ["dice"]),
                            paired_differences_table(al, ("image-macro",), "dice", 200, 0.95, 0), 2)
    assert "not separable" in line


def test_pipelined_replicates_equal_serial(monkeypatch):
    import msb.analysis.stats.rank_boot as rb

    frames = {f"s{k}": _counts(50, 20 + k, f"s{k}", 0.5, 2) for k in range(3)}
    aligned = align_tables({k: image_table(v) for k, v in frames.items()})
    serial = rb.rank_replicates(aligned, n_boot=120, seed=2)
    monkeypatch.setattr(rb, "_PIPELINE_DRAWS", 0)
    monkeypatch.setattr(rb, "_RANK_ELEMENTS", 100)  # 2-row blocks: many blocks through the worker thread
    piped = rb.rank_replicates(aligned, n_boot=120, seed=2)  # the same draws; sums to rounding (block sizes)
    np.testing.assert_allclose(piped, serial, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(rank_rows(piped, "dice"), rank_rows(serial, "dice"))
