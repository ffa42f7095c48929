"""``msb.analysis.stats.compare.paired_differences_table`` (used by ``msb report`` and ``msb reaggregate --compare``)
replicate by replicate against an independent NumPy re-implementation of the paired image bootstrap.

The draw convention re-implemented here is the one documented in :mod:`msb.analysis.stats.bootstrap`: one
``numpy.random.default_rng(seed)`` per (pair, rule), replicates drawn in blocks of 250 rows, each row ``n``
image positions from ``Generator.integers(0, n, dtype=int32)``; with several folds, each fold's positions are
drawn among themselves (folds in sorted order, one ``integers`` call per fold and block). Both systems of a pair
are scored on the same drawn images; the CI is the numpy ``linear`` percentile interval of the replicate
differences. The scores are computed here from the drawn rows directly (mean over drawn images, duplicates
counted), not with the resampling-count matrix products of the implementation.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msb.analysis.stats import compare as compare_mod
from msb.analysis.stats.compare import paired_differences_table
from msb.analysis.counts.rules import image_table
from msb.analysis.counts.systems import align_tables
from msb.evaluation.counts import counts_rows, write_counts

REPO = Path(__file__).resolve().parents[2]
N_IMAGES, CLASSES = 13, (1, 2)


# --------------------------------------------------------------------------- hand-made counts of 3 systems
def _system_counts(quality: float, seed: int) -> dict[str, np.ndarray]:
    """(n, 2) counts of one system: random reference areas, TP a fraction ``quality`` of them, random FP; the
    first image has an empty reference and no prediction in class 2 (an undefined Dice unit)."""
    rng = np.random.default_rng(seed)
    ref = rng.integers(10, 120, (N_IMAGES, 2))
    tp = np.floor(ref * rng.uniform(quality - 0.35, quality, ref.shape)).astype(np.int64)
    fp = rng.integers(0, 50, ref.shape)
    ref[0, 1] = tp[0, 1] = fp[0, 1] = 0
    return {"tp": tp, "fp": fp, "fn": ref - tp}


SYSTEMS = {"sysA": _system_counts(0.9, 1), "sysB": _system_counts(0.75, 2), "sysC": _system_counts(0.6, 3)}
IMAGE_IDS = [f"img{i:02d}" for i in range(N_IMAGES)]


def _frame(label: str, folds: np.ndarray, order: np.ndarray | None = None) -> pd.DataFrame:
    """Counts rows of one system (images in ``order``), built with the counts writer's row builder."""
    c = SYSTEMS[label]
    rows = []
    order = np.arange(N_IMAGES) if order is None else order
    for i in order:
        n = {k: v[i:i + 1] for k, v in c.items()}
        ref = n["tp"] + n["fn"]
        n.update(tn=4096 - ref - n["fp"], intersection=n["tp"], reference=ref, predicted=n["tp"] + n["fp"],
                 union=ref + n["fp"])
        ctx = dict(dataset="ds", split="test", fold=int(folds[i]), run_id=f"ds-{label}", model="unet",
                   checkpoint_role="best", checkpoint_sha256="a" * 64, config_hash="b" * 64, threshold=0.5,
                   threshold_on="probability")
        rows.append(counts_rows(ctx, n, image_ids=[IMAGE_IDS[i]], class_ids=list(CLASSES),
                                class_names=["c1", "c2"], heights=64, widths=64))
    return pd.concat(rows, ignore_index=True)


# ------------------------------------------------------------------------------ independent re-implementation
def _draws(n_boot: int, seed: int, folds: np.ndarray | None) -> np.ndarray:
    """``(n_boot, n)`` drawn image positions (module docstring)."""
    rng = np.random.default_rng(seed)
    groups = None
    if folds is not None and len(np.unique(folds)) > 1:
        groups = [np.flatnonzero(folds == f) for f in np.unique(folds)]
    blocks, done = [], 0
    while done < n_boot:
        b = min(250, n_boot - done)
        if groups is None:
            idx = rng.integers(0, N_IMAGES, size=(b, N_IMAGES), dtype=np.int32).astype(np.int64)
        else:
            idx = np.empty((b, N_IMAGES), dtype=np.int64)
            for pos in groups:
                idx[:, pos] = pos[rng.integers(0, len(pos), size=(b, len(pos)), dtype=np.int32)]
        blocks.append(idx)
        done += b
    return np.concatenate(blocks)


def _dice(tp, fp, fn, rows: np.ndarray, rule: str) -> float:
    """Dice of the images at ``rows`` (repeats count) under one rule; NaN when undefined."""
    tp, fp, fn = tp[rows].astype(float), fp[rows].astype(float), fn[rows].astype(float)
    if rule == "global-micro":
        den = 2 * tp.sum() + fp.sum() + fn.sum()
        return 2 * tp.sum() / den if den > 0 else np.nan
    assert rule == "image-macro"  # per class: mean over the drawn images with a defined Dice; then over classes
    class_means = []
    for c in range(tp.shape[1]):
        den = 2 * tp[:, c] + fp[:, c] + fn[:, c]
        ok = den > 0
        if ok.any():
            class_means.append(float(np.mean(2 * tp[ok, c] / den[ok])))
    return float(np.mean(class_means)) if class_means else np.nan


def _replicates(label: str, draws: np.ndarray, rule: str) -> np.ndarray:
    c = SYSTEMS[label]
    return np.array([_dice(c["tp"], c["fp"], c["fn"], rows, rule) for rows in draws])


def _expected_rows(labels, rules, n_boot, level, seed, folds):
    """Expected (difference, ci_low, ci_high) and replicates per (a, b, rule)."""
    draws = _draws(n_boot, seed, folds)
    out = {}
    for a, b in itertools.combinations(labels, 2):
        for rule in rules:
            ra, rb = _replicates(a, draws, rule), _replicates(b, draws, rule)
            d = ra - rb
            d = d[np.isfinite(d)]
            lo, hi = np.percentile(d, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
            every = np.arange(N_IMAGES)
            est = (_dice(**SYSTEMS[a], rows=every, rule=rule) - _dice(**SYSTEMS[b], rows=every, rule=rule))
            out[(a, b, rule)] = (est, lo, hi, ra, rb)
    return out


# ----------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("stratified, level, n_boot", [(False, 0.95, 600), (True, 0.9, 260)])
def test_paired_differences_table_replicate_by_replicate(monkeypatch, stratified: bool, level: float, n_boot: int):
    """600 replicates = blocks of 250, 250, 100; the stratified case has two folds (images 0, 2, 4, ... in
    fold 0) and 260 = 250 + 10. System B's rows are given in reverse order: pairing is by image id."""
    folds = (np.arange(N_IMAGES) % 2) if stratified else np.full(N_IMAGES, -1)
    frames = {lab: _frame(lab, folds, np.arange(N_IMAGES)[::-1] if lab == "sysB" else None) for lab in SYSTEMS}
    aligned = align_tables({lab: image_table(df) for lab, df in frames.items()})
    seen = []
    real = compare_mod.bootstrap_rule

    def spy(tables, rule, metric, *args, **kwargs):  # records the replicates; changes nothing
        res = real(tables, rule, metric, *args, **kwargs)
        seen.append((rule, [r.replicates.copy() for r in res]))
        return res

    monkeypatch.setattr(compare_mod, "bootstrap_rule", spy)
    seed = 11
    tab = paired_differences_table(aligned, ("image-macro", "global-micro"), "dice", n_boot, level, seed)
    expected = _expected_rows(list(SYSTEMS), ("image-macro", "global-micro"), n_boot, level, seed,
                              folds if stratified else None)
    assert len(tab) == 6 and len(seen) == 6
    for row, (rule, (rep_a, rep_b)) in zip(tab.itertuples(), seen):
        est, lo, hi, ra, rb = expected[(row.system_a, row.system_b, row.aggregation)]
        assert rule == row.aggregation and row.metric == "dice"
        np.testing.assert_allclose(rep_a, ra, rtol=0, atol=1e-12)  # every replicate of system a ...
        np.testing.assert_allclose(rep_b, rb, rtol=0, atol=1e-12)  # ... and of system b
        assert row.difference == pytest.approx(est, abs=1e-12)
        assert row.ci_low == pytest.approx(lo, abs=1e-12) and row.ci_high == pytest.approx(hi, abs=1e-12)
        assert row.ci_level == level and row.n_images == N_IMAGES and row.n_strata == (2 if stratified else 1)
        assert lo < hi  # a real interval: the systems and the resamples differ
    assert {(r.system_a, r.system_b) for r in tab.itertuples()} == {("sysA", "sysB"), ("sysA", "sysC"),
                                                                     ("sysB", "sysC")}


def test_reaggregate_compare_cli_differences(tmp_path: Path):
    """``msb reaggregate DIR --compare --bootstrap 300 --seed 7 --out OUT``: paired_differences.csv equals the
    NumPy re-implementation (systems = runs ``ds-sysA`` ... without the dataset prefix)."""
    folds = np.full(N_IMAGES, -1)
    for lab in SYSTEMS:
        write_counts(_frame(lab, folds), tmp_path / "runs" / f"ds-{lab}" / "evaluation" / "best" / "counts.parquet")
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200", OMP_NUM_THREADS="1")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "msb", "reaggregate", str(tmp_path / "runs"), "--compare",
                        "--bootstrap", "300", "--seed", "7", "--out", str(out)], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    tab = pd.read_csv(out / "paired_differences.csv")
    expected = _expected_rows(list(SYSTEMS), ("image-macro", "global-micro"), 300, 0.95, 7, None)
    got = {(row.system_a, row.system_b, row.aggregation): row for row in tab.itertuples()}
    assert set(got) == set(expected)
    for key, (est, lo, hi, _, _) in expected.items():
        row = got[key]
        assert row.difference == pytest.approx(est, abs=1e-12)
        assert row.ci_low == pytest.approx(lo, abs=1e-12) and row.ci_high == pytest.approx(hi, abs=1e-12)
        assert row.metric == "dice" and row.n_images == N_IMAGES and row.dataset == "ds"
