"""Rank stability across seeds and split seeds on study-style counts: two architecture configs that share an
adapter (``model`` ``unet`` for both ``unet_tiny`` and ``unet_mnv3s075``) are two systems, not one pooled system,
and a ``<role>-threshold`` evaluation whose systems chose different thresholds is ranked instead of refused (the
real-data run of configs/studies/kvasir_calibration_cpu.yaml stopped there with "refusing to pool count rows ...
they mix threshold values [0.4, 0.6]"). Expected values are image-macro Dice computed by hand from the counts."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from msb.analysis.stats.rank_stability import seed_stability

ARCHS = ("unet_tiny", "unet_mnv3s075")


def _rows(rng, arch: str, rep: int, role: str, thr: float, variant: str, policy: str, vals: dict) -> pd.DataFrame:
    tp = rng.integers(10, 90, 6)
    fp, fn = rng.integers(0, 40, 6), rng.integers(0, 40, 6)
    vals[(arch, rep, role)] = float(np.mean(2 * tp / (2 * tp + fp + fn)))
    h = f"{ARCHS.index(arch)}{rep}{len(role)}".ljust(8, "a")  # a distinct 8-hex config hash per run
    return pd.DataFrame({"dataset": "kv", "split": "test", "fold": -1, "run_id": f"kv-{arch}-{h}", "model": "unet",
                         "checkpoint_role": role, "image_id": [f"i{k}" for k in range(6)], "class_id": 1,
                         "class_name": "fg", "threshold": thr, "threshold_on": "probability", "seed": 0,
                         "split_policy": policy, "variant": variant, "tp": tp, "fp": fp, "fn": fn})


def _check(systems: pd.DataFrame, pairs: pd.DataFrame, vals: dict, role: str, n: int) -> None:
    s = systems[systems["checkpoint_role"] == role].set_index("system")
    assert sorted(s.index) == sorted(ARCHS)
    for a in ARCHS:
        o = [x for x in ARCHS if x != a][0]
        v = np.array([vals[(a, k, role)] for k in range(n)])
        assert s.at[a, "n_replicates"] == n
        assert s.at[a, "mean"] == pytest.approx(v.mean(), abs=1e-12)
        assert s.at[a, "sd"] == pytest.approx(v.std(ddof=1), abs=1e-12)
        assert s.at[a, "rank1_share"] == pytest.approx(sum(vals[(a, k, role)] > vals[(o, k, role)]
                                                           for k in range(n)) / n)
    p = pairs[pairs["checkpoint_role"] == role].iloc[0]
    ahead = sum(vals[(p.system_a, k, role)] > vals[(p.system_b, k, role)] for k in range(n))
    assert (p.a_ahead, p.b_ahead, bool(p.changes_order)) == (ahead, n - ahead, 0 < ahead < n)


def test_architectures_sharing_an_adapter_over_seeds_with_chosen_thresholds():
    rng = np.random.default_rng(7)
    vals: dict = {}
    frames = []
    for arch, seed in itertools.product(ARCHS, range(3)):
        frames.append(_rows(rng, arch, seed, "best", 0.5, f"random_seed={seed}", "random(seed=0)", vals)
                      .assign(seed=seed))
        # the threshold analysis's evaluation: each run's own chosen threshold (0.4 / 0.6 as in the Kvasir run)
        frames.append(_rows(rng, arch, seed, "best-threshold", 0.4 if arch == ARCHS[1] else 0.6,
                            f"random_seed={seed}", "random(seed=0)", vals).assign(seed=seed))
    rankings, systems, pairs = seed_stability(pd.concat(frames, ignore_index=True))
    for role in ("best", "best-threshold"):
        _check(systems, pairs, vals, role, 3)
    assert len(rankings) == 2 * 2 * 3
    assert set(rankings["replicate"]) == {"seed=0", "seed=1", "seed=2"}


def test_split_seed_axis_is_a_replicate_not_a_system():
    """The polyp audit's P2 design: the split seed is a study axis (``variant`` ``data.split.seed=<s>``)."""
    rng = np.random.default_rng(11)
    vals: dict = {}
    frames = [_rows(rng, arch, s, "best", 0.5, f"data.split.seed={s}", f"random(seed={s},val=0.1,test=0.2)", vals)
              for arch, s in itertools.product(ARCHS, range(4))]
    rankings, systems, pairs = seed_stability(pd.concat(frames, ignore_index=True))
    _check(systems, pairs, vals, "best", 4)
    assert rankings["replicate"].str.startswith("split=random(seed=").all()


def test_other_axes_stay_in_the_system():
    rng = np.random.default_rng(3)
    vals: dict = {}
    frames = [_rows(rng, arch, s, "best", 0.5, f"data.input_size=[128,128];random_seed={s}", "p", vals)
              .assign(seed=s) for arch, s in itertools.product(ARCHS, range(2))]
    _, systems, _ = seed_stability(pd.concat(frames, ignore_index=True))
    assert sorted(systems["system"]) == sorted(f"{a}[data.input_size=[128,128]]" for a in ARCHS)
