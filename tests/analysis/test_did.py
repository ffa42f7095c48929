"""Local-versus-distant difference-in-differences (msb.analysis.stats.did) from hand-built counts.

10 test images: e0..e2 exposed (paired with training rows in the pairs list), u0..u6 without a match; sources
p/q; u5, u6 and e2 have empty references. Per image Dice = 2 TP / (2 TP + FP + FN) is computed here with NumPy;
image-macro Dice = the mean over images with a defined Dice; the DiD per seed, its mean and the paired-t
interval (scipy.stats.t) are recomputed from those numbers.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from msb.analysis.stats.did import DID_COLUMNS, EXPLORATORY, did_table
from msb.errors import MSBError

IMAGES = ["e0", "e1", "e2", "u0", "u1", "u2", "u3", "u4", "u5", "u6"]
SOURCE = ["p", "q", "p", "p", "q", "p", "q", "p", "p", "q"]
EMPTY = {"e2", "u5", "u6"}
PAIRS = [("e0", "t0"), ("t1", "e1"), ("e2", "t2"), ("t3", "t4")]
TRAIN = ["t0", "t1", "t2", "t3", "t4"]
RNG = np.random.default_rng(7)
TABLES = {}
for seed in range(3):
    for pool in ("local", "distant"):
        t = RNG.integers(3, 25, size=(10, 3))
        t[[IMAGES.index(i) for i in EMPTY], 0] = 0  # empty reference: TP = FN = 0 (FP > 0: Dice defined, 0)
        t[[IMAGES.index(i) for i in EMPTY], 2] = 0
        TABLES[(pool, seed)] = t


def counts(pool: str, seed: int) -> pd.DataFrame:
    t = TABLES[(pool, seed)]
    return pd.DataFrame([{"dataset": "d", "split": "test", "fold": -1, "run_id": f"{pool}{seed}", "model": "unet",
                          "checkpoint_role": "best", "image_id": i, "class_id": 1, "class_name": "polyp",
                          "threshold": 0.5, "threshold_on": "probability", "source": s, "tp": int(r[0]),
                          "fp": int(r[1]), "fn": int(r[2])} for i, s, r in zip(IMAGES, SOURCE, t)])


COUNTS = {k: counts(*k) for k in TABLES}


def macro(pool: str, seed: int, ids: list[str]) -> float:
    t = TABLES[(pool, seed)][[IMAGES.index(i) for i in ids]].astype(float)
    return float(np.mean(2 * t[:, 0] / (2 * t[:, 0] + t[:, 1] + t[:, 2])))


def test_did_without_matching_keys_equals_a_hand_computation():
    # match_on none: the unflagged images are 3 of u0..u6 drawn by default_rng(seed) over the sorted candidates
    row = did_table(COUNTS, "local", "distant", PAIRS, TRAIN, match_on=[], seed=5).iloc[0]
    cand = np.array(["u0", "u1", "u2", "u3", "u4", "u5", "u6"])
    unf = sorted(cand[np.random.default_rng(5).choice(7, size=3, replace=False)])
    exp = ["e0", "e1", "e2"]
    d = np.array([(macro("local", s, exp) - macro("distant", s, exp)) - (macro("local", s, unf)
                  - macro("distant", s, unf)) for s in range(3)])
    half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
    assert row["did"] == pytest.approx(d.mean(), abs=1e-12)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-12)
    assert row["n_negative"] == int((d < 0).sum()) and row["n_seeds"] == 3
    assert (row["n_exposed"], row["n_unflagged"], row["label"]) == (3, 3, EXPLORATORY)
    assert list(row.index) == DID_COLUMNS


def test_matching_on_source_and_empty_draws_within_strata():
    row = did_table(COUNTS, "local", "distant", PAIRS, TRAIN, match_on=["source", "empty"], seed=0).iloc[0]
    # strata of the exposed: (p, non-empty) e0, (q, non-empty) e1, (p, empty) e2 -> one unflagged each from
    # {u0, u2, u4}, {u1, u3}, {u5}; recompute with the documented draw order (strata sorted by label)
    rng = np.random.default_rng(0)
    strata = {"source=p|empty": ["u5"], "source=p|non-empty": ["u0", "u2", "u4"], "source=q|non-empty": ["u1", "u3"]}
    unf = sorted(c[rng.choice(len(c), 1, replace=False)[0]] for _, c in sorted(strata.items()))
    exp = ["e0", "e1", "e2"]
    d = [(macro("local", s, exp) - macro("distant", s, exp)) - (macro("local", s, unf) - macro("distant", s, unf))
         for s in range(3)]
    assert row["did"] == pytest.approx(np.mean(d), abs=1e-12) and row["match_on"] == "source+empty"


def test_refusals():
    with pytest.raises(MSBError, match="no evaluated image has a close training match"):
        did_table(COUNTS, "local", "distant", [("t0", "t1")], TRAIN)
    # exposed (p, empty): e2 and u5; no unflagged (p, empty) image is left
    with pytest.raises(MSBError, match="stratum 'source=p\\|empty' has 2 exposed but 0 unflagged"):
        did_table(COUNTS, "local", "distant", [("u6", "t0"), ("u5", "t1")] + PAIRS, TRAIN)
    with pytest.raises(MSBError, match="no run of pool 'other'"):
        did_table(COUNTS, "local", "other", PAIRS, TRAIN)
