"""Wilcoxon, Friedman and post-hoc p-values equal scipy / scikit-posthocs on the same vectors; BH equals
statsmodels' multipletests; rank-biserial on hand examples."""

from __future__ import annotations

import numpy as np
import pytest
import scikit_posthocs as sp
from scipy import stats
from statsmodels.stats.multitest import multipletests

from msb.analysis.stats.significance import (FRIEDMAN, WILCOXON, bh_adjust, friedman_test, paired_wilcoxon,
                                       pairwise_wilcoxon, rank_biserial)
from msb.errors import MSBError


def test_rank_biserial_hand_examples():
    # d = a - b = [1, 2, -3, 4]: ranks of |d| 1, 2, 3, 4; R+ = 7, R- = 3 -> (7 - 3) / 10 = 0.4
    assert rank_biserial([2, 4, 0, 9], [1, 2, 3, 5]) == pytest.approx(0.4)
    # d = [1, -1, 2, 0]: zero dropped; |d| ranks 1.5, 1.5, 3; R+ = 4.5, R- = 1.5 -> 3 / 6 = 0.5
    assert rank_biserial([1, 0, 2, 5], [0, 1, 0, 5]) == pytest.approx(0.5)
    assert rank_biserial([1, 2], [2, 3]) == -1.0
    assert np.isnan(rank_biserial([1, 2], [1, 2]))


def test_wilcoxon_equals_scipy_with_undefined_pairs_dropped():
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 0.95, 40)
    b = a - rng.normal(0.02, 0.05, 40)
    a[[3, 17]] = np.nan
    b[5] = np.nan
    ok = ~(np.isnan(a) | np.isnan(b))
    res = paired_wilcoxon(a, b)
    ref = stats.wilcoxon(a[ok], b[ok])
    assert res.p_value == ref.pvalue and res.statistic == ref.statistic
    assert (res.n, res.n_dropped, res.test) == (37, 3, WILCOXON)
    assert res.median_difference == pytest.approx(np.median(a[ok] - b[ok]))
    # ties and zero differences (normal approximation in scipy)
    x = np.array([0.5, 0.6, 0.6, 0.7, 0.8, 0.8, 0.9, 0.4, 0.3, 0.65, 0.5, 0.75])
    y = np.array([0.5, 0.5, 0.7, 0.6, 0.6, 0.7, 0.7, 0.4, 0.2, 0.55, 0.45, 0.70])
    res = paired_wilcoxon(x, y)
    assert res.p_value == stats.wilcoxon(x, y).pvalue and res.n_zero == 2


@pytest.mark.parametrize("case", range(6))
def test_wilcoxon_small_samples_with_ties_equal_scipy_auto_exactly(case):
    # n <= 13 with tied |d| or zero differences: scipy's auto runs its (slow, per-flip) permutation test;
    # paired_wilcoxon runs it vectorized and must give the very same floats
    rng = np.random.default_rng(case)
    n = 8 + case
    a = rng.integers(0, 5, n) / 4
    b = rng.integers(0, 5, n) / 4
    if case % 2:
        b[:2] = a[:2]  # zero differences
    a, b = a.astype(np.float64), b.astype(np.float64)
    ref = stats.wilcoxon(a, b)
    r = paired_wilcoxon(a, b)
    assert r.p_value == float(ref.pvalue) and r.statistic == float(ref.statistic)


def test_wilcoxon_all_zero_differences_gives_nan():
    res = paired_wilcoxon([0.5, 0.6], [0.5, 0.6])
    assert np.isnan(res.p_value) and res.n == 2 and res.n_zero == 2
    with pytest.raises(MSBError, match="equal length"):
        paired_wilcoxon([1, 2], [1])


def test_bh_equals_statsmodels():
    p = np.random.default_rng(2).uniform(0, 0.2, 25)
    p[[1, 4]] = [0.001, 0.001]  # ties
    np.testing.assert_allclose(bh_adjust(p), multipletests(p, method="fdr_bh")[1], rtol=0, atol=1e-15)
    q = np.array([0.04, np.nan, 0.01, 0.5])
    want = multipletests([0.04, 0.01, 0.5], method="fdr_bh")[1]
    got = bh_adjust(q)
    assert np.isnan(got[1])
    np.testing.assert_allclose(got[[0, 2, 3]], want, atol=1e-15)


@pytest.mark.parametrize("p", [
    [0.01, 0.02, 0.03, 0.04, 0.05],                       # every p scales to 0.05
    [0.05, 0.01, 0.05, 0.01, 0.9, 1.0],                   # ties, unsorted, p = 1
    [0.2, np.nan, 0.2, 0.001, np.nan, 0.04, 0.04, 0.5],   # ties and NaNs
    [0.3, 0.3, 0.3],                                      # all tied
    [0.0, 1e-300, 0.5, np.nan],                           # zero / tiny p
    [0.7],                                                # one test: unchanged
    [np.nan, 0.02],                                       # one defined test
])
def test_bh_equals_statsmodels_with_ties_and_nans(p):
    """NaN entries stay NaN and are left out of m; the defined entries equal statsmodels' fdr_bh on them
    alone (a few ulps of tolerance: scipy scales by m / i, statsmodels divides by i / m)."""
    p = np.asarray(p, dtype=float)
    got = bh_adjust(p)
    ok = ~np.isnan(p)
    assert got.shape == p.shape and got.dtype == np.float64
    assert np.isnan(got[~ok]).all()
    want = multipletests(p[ok], method="fdr_bh")[1]
    np.testing.assert_allclose(got[ok], want, rtol=0, atol=1e-15)
    tied = p[ok][:, None] == p[ok][None, :]
    assert (got[ok][:, None] == got[ok][None, :])[tied].all()  # tied p-values get the same adjusted value


def test_bh_all_nan_and_out_of_range():
    assert np.isnan(bh_adjust([np.nan, np.nan])).all() and bh_adjust([]).shape == (0,)
    with pytest.raises(ValueError):
        bh_adjust([0.5, 1.5])


def test_pairwise_wilcoxon_adjusts_across_rows():
    rng = np.random.default_rng(3)
    base = rng.uniform(0.4, 0.9, 30)
    scores = {"A": base, "B": base - rng.normal(0.05, 0.03, 30), "C": base + rng.normal(0.0, 0.05, 30)}
    tab = pairwise_wilcoxon(scores, "dice")
    assert list(zip(tab["system_a"], tab["system_b"])) == [("A", "B"), ("A", "C"), ("B", "C")]
    raw = [stats.wilcoxon(scores[a], scores[b]).pvalue for a, b in [("A", "B"), ("A", "C"), ("B", "C")]]
    np.testing.assert_array_equal(tab["p_value"], raw)
    np.testing.assert_allclose(tab["p_adjusted"], multipletests(raw, method="fdr_bh")[1], atol=1e-15)
    assert set(tab["test"]) == {WILCOXON} and (tab["n"] == 30).all()
    assert tab["correction"].iloc[0] == "Benjamini-Hochberg (m=3)"


def test_friedman_and_nemenyi_equal_scipy_and_scikit_posthocs():
    rng = np.random.default_rng(4)
    base = rng.uniform(0.3, 0.9, 25)
    scores = {"A": base + 0.05, "B": base + rng.normal(0, 0.04, 25), "C": base - 0.03, "D": base}
    scores["B"][2] = np.nan
    res = friedman_test(scores)
    mat = np.column_stack([scores[k] for k in "ABCD"])
    mat = mat[~np.isnan(mat).any(axis=1)]
    ref = stats.friedmanchisquare(*mat.T)
    assert res.p_value == pytest.approx(ref.pvalue, rel=1e-12) and res.statistic == pytest.approx(ref.statistic)
    assert (res.n, res.n_dropped, res.k, res.test) == (24, 1, 4, FRIEDMAN)
    np.testing.assert_allclose(res.posthoc.to_numpy(), np.asarray(sp.posthoc_nemenyi_friedman(mat)), atol=1e-12)
    assert list(res.posthoc.index) == list("ABCD")
    conover = friedman_test(scores, posthoc="conover")
    np.testing.assert_allclose(conover.posthoc.to_numpy(), np.asarray(sp.posthoc_conover_friedman(mat)),
                               atol=1e-12)


def test_friedman_mean_ranks_hand_example():
    # per image the ranks (1 = highest) are A 1, B 2, C 3 on both images
    res = friedman_test({"A": [0.9, 0.8], "B": [0.5, 0.6], "C": [0.1, 0.2]})
    assert res.mean_ranks == {"A": 1.0, "B": 2.0, "C": 3.0}
    low = friedman_test({"A": [0.9, 0.8], "B": [0.5, 0.6], "C": [0.1, 0.2]}, higher_is_better=False)
    assert low.mean_ranks == {"A": 3.0, "B": 2.0, "C": 1.0}


def test_friedman_errors():
    with pytest.raises(MSBError, match="at least 3 systems"):
        friedman_test({"A": [1, 2], "B": [2, 3]})
    with pytest.raises(MSBError, match="unknown post-hoc"):
        friedman_test({"A": [1, 2], "B": [2, 3], "C": [1, 1]}, posthoc="tukey")
    with pytest.raises(MSBError, match="at least 2 images"):
        friedman_test({"A": [1, np.nan], "B": [2, 3], "C": [1, 1]})
