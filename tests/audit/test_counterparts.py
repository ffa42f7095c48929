"""Counterpart rules (first vs any) on a hand-built case, the all-pairs NCC generator against a naive per-pair
``np.corrcoef`` loop, and the hash prefilter's recall.

Hand-built case (labels per relation; ``''`` side = unassigned; reference side ``train``):

=== ===== ========= ========= ============== =====
row side  identical pHash     near-duplicate group
=== ===== ========= ========= ============== =====
0   train I1        P1        N1             G1
1   train I2        P2        N1             G1
2   train I3        P3        N2             G2
3   test  I1        P1        N1             G3
4   test  I4        P4        N2             G1
5   val   I5        P5        N3             G2
6   val   I6        P6        N4             G4
7   ''    I1        P1        N1             G1
=== ===== ========= ========= ============== =====

Counterparts, by hand: row 3 -> identical {0}, pHash {0}, near {0, 1}; row 4 -> near {2}, group {0, 1};
row 5 -> group {2}; row 6 -> none; row 7 is unassigned (neither side).
first: 3 -> identical {0}; 4 -> near {2}; 5 -> group {2}: 3 eval rows, 3 pairs, training rows {0, 2}.
any: 3 -> {0, 1}; 4 -> {0, 1, 2}; 5 -> {2}: 3 eval rows, 6 pairs, training rows {0, 1, 2}.
Denominators: 4 evaluation rows (3-6), 3 training rows, 12 row pairs, 4 sources (G3, G1, G2, G4).
"""

from __future__ import annotations

from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from msb.audit.candidates import candidate_pairs, prefilter_recall, sampled_recall
from msb.audit.counterparts import counterpart_table, rule_comparison, rule_summary
from msb.audit.screens import ncc_all_pairs, ncc_pairs, ncc_query_pairs

SIDE = np.array(["train", "train", "train", "test", "test", "val", "val", ""])
REL = {"identical_bytes": np.array(["I1", "I2", "I3", "I1", "I4", "I5", "I6", "I1"]),
       "identical_phash": np.array(["P1", "P2", "P3", "P1", "P4", "P5", "P6", "P1"]),
       "near_duplicate": np.array(["N1", "N1", "N2", "N1", "N2", "N3", "N4", "N1"]),
       "shared_group": np.array(["G1", "G1", "G2", "G3", "G1", "G2", "G4", "G1"])}
GROUP = REL["shared_group"]


def counts(table, rule: str, relation: str) -> tuple[int, int, int, int]:
    t = table[(table.rule == rule) & (table.relation == relation)].set_index("quantity")["count"]
    return int(t["eval_rows"]), int(t["counterpart_pairs"]), int(t["training_rows"]), int(t["eval_sources"])


def test_first_vs_any_hand_computed() -> None:
    t = counterpart_table(REL, SIDE, GROUP, "train")
    assert counts(t, "first", "all") == (3, 3, 2, 3)
    assert counts(t, "first", "identical_bytes") == (1, 1, 1, 1)
    assert counts(t, "first", "identical_phash") == (0, 0, 0, 0)
    assert counts(t, "first", "near_duplicate") == (1, 1, 1, 1)
    assert counts(t, "first", "shared_group") == (1, 1, 1, 1)
    assert counts(t, "any", "all") == (3, 6, 3, 3)
    assert counts(t, "any", "identical_bytes") == (1, 1, 1, 1)
    assert counts(t, "any", "identical_phash") == (1, 1, 1, 1)
    assert counts(t, "any", "near_duplicate") == (2, 3, 3, 2)
    assert counts(t, "any", "shared_group") == (2, 3, 3, 2)
    den = t.drop_duplicates("quantity").set_index("quantity")
    assert den.loc["eval_rows", "denominator"] == 4 and den.loc["training_rows", "denominator"] == 3
    assert den.loc["counterpart_pairs", "denominator"] == 12 and den.loc["eval_sources", "denominator"] == 4
    assert list(den["unit"]) == ["rows", "row pairs", "rows", "sources"]
    wide = rule_comparison(t, "counterpart_pairs").set_index("relation")
    assert (wide.loc["all", "first"], wide.loc["all", "any"], wide.loc["all", "denominator"]) == (3, 6, 12)
    summ = rule_summary(t).set_index("relation (first · any)")
    assert summ.loc["all", "evaluation rows"] == "3 · 3 of 4" and summ.loc["all", "row pairs"] == "3 · 6 of 12"
    assert summ.loc["near_duplicate", "training rows"] == "1 · 3 of 3"
    only_first = counterpart_table(REL, SIDE, GROUP, "train", rules=("first",))
    assert set(only_first["rule"]) == {"first"} and len(only_first) == 5 * 4


def test_counterparts_on_the_planted_audit(planted_result) -> None:
    # planted (conftest.py): eval rows b_small, f (val), copy_a, c_shift, g, h (test) = 6; training rows 6.
    # copy_a: identical with a; b_small, c_shift: near-duplicates of b, c; f: group patient7 with e; g, h: none
    t = planted_result.counterparts
    assert counts(t, "first", "all") == (4, 4, 4, 4)
    assert counts(t, "first", "identical_bytes") == (1, 1, 1, 1)
    assert counts(t, "first", "near_duplicate") == (2, 2, 2, 2)
    assert counts(t, "first", "shared_group") == (1, 1, 1, 1)
    assert counts(t, "any", "near_duplicate") == (3, 3, 3, 3)  # copy_a is also in a's near-duplicate group
    assert int(t[(t.quantity == "eval_rows")]["denominator"].iat[0]) == 6
    # sources: f shares patient7; the others are sources of their own; g and h (patient9) form one source
    assert int(t[(t.quantity == "eval_sources")]["denominator"].iat[0]) == 5


def thumbs_with_copies(n: int = 24, size: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = rng.integers(0, 256, size=(n, size, size)).astype(np.float64)
    t[1] = t[0] + rng.normal(0, 10, (size, size))  # near copy
    t[5] = 0.5 * t[4] + 0.5 * t[3]  # correlated with 3 and 4 (about 0.7)
    t[7] = 255 - t[6]  # anti-correlated
    t[9] = 100.0  # constant: NCC undefined
    t[10] = t[8] * 0.8 + 20  # same after z-scoring (NCC 1)
    return np.clip(np.rint(t), 0, 255).astype(np.uint8)


@pytest.mark.parametrize("threshold", [0.95, 0.6, 0.0])
def test_all_pairs_ncc_equals_naive_corrcoef(threshold: float) -> None:
    th = thumbs_with_copies()
    naive = {}
    for i, j in combinations(range(len(th)), 2):
        a, b = th[i].ravel().astype(float), th[j].ravel().astype(float)
        if a.std() == 0 or b.std() == 0:
            continue
        naive[(i, j)] = np.corrcoef(a, b)[0, 1]
    want = {p for p, v in naive.items() if v >= threshold}
    i, j = ncc_all_pairs(th, threshold, block=5)  # blocks smaller than N: the block seams are exercised
    got = set(zip(i.tolist(), j.tolist()))
    assert want <= got and all(naive[p] >= threshold - 1e-4 for p in got)
    assert all((a, 9) not in got and (9, b) not in got for a, b in got)
    np.testing.assert_allclose(ncc_pairs(th, i, j), [naive[p] for p in zip(i.tolist(), j.tolist())], atol=1e-12)
    if threshold == 0.95:
        assert want == {(0, 1), (8, 10)}
    # the generator: NCC pairs plus hash pairs (distinct hashes and k = 0: no hash pair comes in)
    ph = np.arange(len(th), dtype=np.uint64)
    cand = candidate_pairs(ph, ph, th, 0, "all", threshold)
    assert set(zip(cand.a.tolist(), cand.b.tolist())) == got and not cand.by_hash.any()


def test_prefilter_recall_counts() -> None:
    pd_, dd = np.array([3, 9, 14, 30, 2]), np.array([10, 12, 11, 17, 40])
    ref = np.array([True, True, True, True, False])
    r = prefilter_recall(pd_, dd, ref, ks=(8, 12, 16))
    # min distances of the reference pairs: 3, 9, 11, 17
    assert r["n_reference_pairs"] == 4
    assert {k: v["found"] for k, v in r["by_k"].items()} == {8: 1, 12: 3, 16: 3}
    assert r["by_k"][12]["recall"] == pytest.approx(0.75)


def test_query_pairs_equal_naive_corrcoef_of_the_query_rows() -> None:
    th = thumbs_with_copies()
    queries = np.array([0, 3, 9, 10, 17])
    want = set()
    for q in queries:
        for j in range(len(th)):
            a, b = th[q].ravel().astype(float), th[j].ravel().astype(float)
            if j != q and a.std() > 0 and b.std() > 0 and np.corrcoef(a, b)[0, 1] >= 0.6:
                want.add((min(q, j), max(q, j)))
    i, j = ncc_query_pairs(th, queries, 0.6, block=7)  # target blocks smaller than N: seams exercised
    got = set(zip(i.tolist(), j.tolist()))
    assert want <= got and len(got) == len(i)  # each pair once, also (8, 10) reached from query 10 only
    exact = ncc_pairs(th, i, j)
    assert {p for p, v in zip(zip(i.tolist(), j.tolist()), exact) if v >= 0.6} == want


def test_sampled_recall_with_every_row_equals_the_all_pairs_recall(planted: Path) -> None:
    from msb.audit.core import AuditConfig, run_audit

    every = run_audit(planted, config=AuditConfig(candidates="all"))
    sampled = run_audit(planted, config=AuditConfig(candidates="hash", recall_sample=10_000))
    a, s = every.params["prefilter_recall"], sampled.params["prefilter_recall"]
    # reference: {b, b_small} and {c, c_shift}; {a, copy_a} and {d, d_dup} are byte-identical (left out)
    assert s["sample_rows"] == 12 and s["n_reference_pairs"] == a["n_reference_pairs"] == 2
    assert {k: v["found"] for k, v in s["by_k"].items()} == {k: v["found"] for k, v in a["by_k"].items()}
    lo, hi = s["by_k"][8]["ci95"]
    z, n = 1.959964, 2  # Wilson score interval of 2 of 2 by its formula: (p + z^2/2n -+ z sqrt(...)) / (1 + z^2/n)
    want_lo = (1 + z * z / (2 * n) - z * np.sqrt(z * z / (4 * n * n))) / (1 + z * z / n)
    assert s["by_k"][8]["found"] == 2 and lo == pytest.approx(want_lo, abs=1e-5) and hi == pytest.approx(1.0)
    off = run_audit(planted, config=AuditConfig(candidates="hash", recall_sample=0))
    assert off.params["prefilter_recall"] is None
    few = sampled_recall(every.rows["phash"].map(lambda h: int(h, 16)).to_numpy(np.uint64),
                         every.rows["dhash"].map(lambda h: int(h, 16)).to_numpy(np.uint64),
                         np.zeros((12, 8, 8), np.uint8), every.rows["sha256"].to_numpy(), 8, 0.95, 4)
    assert few["sample_rows"] == 4 and few["n_reference_pairs"] == 0  # constant thumbnails: no NCC, no reference
