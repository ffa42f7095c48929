"""Training pools (msb.data.pools, msb.config.pools_schema): sizes, strata counts, disjointness, the swap, the
study-file checks, pool.csv, and run-config hashes unchanged without pools. Expected values are recomputed
here with plain pandas/NumPy from the hand-made index (and, for mask presence, from the mask files)."""

from __future__ import annotations

import cv2
import numpy as np
import pandas as pd
import pytest

from msb.config.pools_schema import PoolConfig, PoolSpec, pool_axes, resolve_pools
from msb.config.schema import RunConfig
from msb.data.pools import build_pool, ensure_pool, mask_presence, read_pool_file
from msb.errors import MSBError

# 40 training rows: sources a (16), b (14), c (10); groups of two rows; presence "1" or "none" (every 4th empty)
IDS = [f"s{i:02d}" for i in range(40)]
SOURCE = {sid: ("a" if i < 16 else "b" if i < 30 else "c") for i, sid in enumerate(IDS)}
GROUP = {sid: f"g{i // 2}" for i, sid in enumerate(IDS)}
PRESENCE = {sid: ("none" if i % 4 == 0 else "1") for i, sid in enumerate(IDS)}
FRAME = pd.DataFrame({"sample_id": IDS, "source": [SOURCE[i] for i in IDS], "group": [GROUP[i] for i in IDS],
                      "presence": [PRESENCE[i] for i in IDS]})


def _pool(**kw) -> PoolConfig:
    return PoolConfig.model_validate(kw)


def _build(pool: PoolConfig, calls: list | None = None) -> list[str]:
    def presence():
        if calls is not None:
            calls.append(1)
        return PRESENCE
    return build_pool(pool, IDS, SOURCE, GROUP, presence)


REMOVE_A = {"name": "no_a", "kind": "remove", "sources": ["a"]}


def test_full_and_remove_by_source_group_and_flag(tmp_path):
    assert _build(_pool(name="full", kind="full")) == sorted(IDS)
    no_a = _build(_pool(**REMOVE_A))
    assert no_a == sorted(FRAME.loc[FRAME["source"] != "a", "sample_id"])
    assert len(no_a) == 24 and not set(no_a) & set(FRAME.loc[FRAME["source"] == "a", "sample_id"])
    no_g = _build(_pool(name="no_g", kind="remove", groups=["g0", "g19"]))
    assert no_g == sorted(set(IDS) - {"s00", "s01", "s38", "s39"})
    flags = tmp_path / "dups.csv"
    pd.DataFrame({"sample_id": ["s05", "s06", "s07"], "near_duplicate_in_train": ["true", "false", "1"]}).to_csv(
        flags, index=False)
    no_flag = _build(_pool(name="no_dup", kind="remove", flag_file=str(flags)))
    assert no_flag == sorted(set(IDS) - {"s05", "s07"})


def test_random_match_has_the_size_of_its_match_and_is_seeded():
    rm = _build(_pool(name="rm", kind="random_match", match=REMOVE_A, seed=0))
    assert len(rm) == 24 and set(rm) <= set(IDS) and len(set(rm)) == 24
    assert rm == _build(_pool(name="rm", kind="random_match", match=REMOVE_A, seed=0))
    other = _build(_pool(name="rm", kind="random_match", match=REMOVE_A, seed=1))
    assert len(other) == 24 and other != rm
    # independent reference: the documented draw (default_rng(seed).choice on the sorted ids)
    idx = np.random.default_rng(0).choice(40, size=24, replace=False)
    assert rm == sorted(np.array(sorted(IDS))[idx])


def test_count_match_copies_the_per_stratum_counts():
    calls: list = []
    cm = _build(_pool(name="cm", kind="count_match", match=REMOVE_A, strata=["empty"], seed=3), calls)
    assert calls == [1]  # masks read once
    f = FRAME.set_index("sample_id")
    want = f.loc[f["source"] != "a", "presence"].eq("none").value_counts().sort_index()
    got = f.loc[cm, "presence"].eq("none").value_counts().sort_index()
    assert got.to_dict() == want.to_dict() == {False: 18, True: 6}
    # drawn from every source, not only the match pool's
    assert "a" in set(f.loc[cm, "source"])
    cm2 = _build(_pool(name="cm2", kind="count_match", match={"name": "rm", "kind": "random_match",
                                                               "match": REMOVE_A, "seed": 0},
                       strata=["presence", "source"], seed=0))
    rm = _build(_pool(name="rm", kind="random_match", match=REMOVE_A, seed=0))
    key = lambda ids: f.loc[ids].groupby(["presence", "source"]).size().to_dict()  # noqa: E731
    assert key(cm2) == key(rm)


def test_swap_replaces_the_rows_of_one_source_by_as_many_of_another():
    base = _build(_pool(**REMOVE_A))
    sw = _build(_pool(name="sw", kind="swap", match=REMOVE_A, from_source="b", to_source="a", seed=0))
    f = FRAME.set_index("sample_id")
    assert len(sw) == len(base) == 24
    assert not (f.loc[sw, "source"] == "b").any()
    assert (f.loc[sw, "source"] == "a").sum() == 14  # the 14 b rows of the base, replaced by 14 a rows
    assert set(f.loc[sw][f.loc[sw, "source"] == "c"].index) == set(f.loc[base][f.loc[base, "source"] == "c"].index)
    assert not set(f.loc[sw][f.loc[sw, "source"] == "a"].index) & set(base)
    with pytest.raises(MSBError, match="24 rows of 'b' to replace|14 rows of 'b' to replace"):
        _build(_pool(name="sw", kind="swap", from_source="b", to_source="a"))  # base = full: no a row outside


def test_bad_pools_are_refused_with_the_pool_named():
    with pytest.raises(MSBError, match=r"pool 'no_z' \(remove\): \['z'\] occur in no training row"):
        _build(_pool(name="no_z", kind="remove", sources=["z"]))
    with pytest.raises(MSBError, match="is empty"):
        _build(_pool(name="none", kind="remove", sources=["a", "b", "c"]))
    with pytest.raises(ValueError, match="kind remove needs sources"):
        _pool(name="r", kind="remove")
    with pytest.raises(ValueError, match="needs 'match'"):
        _pool(name="r", kind="random_match")
    with pytest.raises(ValueError, match="two different from_source and to_source"):
        _pool(name="s", kind="swap", from_source="a", to_source="a")


def test_study_pools_resolve_into_axes():
    pools = [PoolSpec(name="full", kind="full"), PoolSpec(**REMOVE_A),
             PoolSpec(name="rm", kind="random_match", match="no_a")]
    axes = pool_axes(pools, [0, 1, 2], {}, "s.yaml")
    assert list(axes) == ["data.pool", "random_seed"] and axes["random_seed"] == [0, 1, 2]
    assert [p["name"] for p in axes["data.pool"]] == ["full", "no_a", "rm"]
    assert axes["data.pool"][2]["match"]["sources"] == ["a"]
    with pytest.raises(MSBError, match="cycle"):
        resolve_pools([PoolSpec(name="x", kind="random_match", match="y"),
                       PoolSpec(name="y", kind="random_match", match="x")], "s.yaml")
    with pytest.raises(MSBError, match="matches 'nope', which is not a pool"):
        resolve_pools([PoolSpec(name="x", kind="random_match", match="nope")], "s.yaml")
    with pytest.raises(MSBError, match="listed twice"):
        resolve_pools([PoolSpec(name="x", kind="full"), PoolSpec(name="x", kind="full")], "s.yaml")
    with pytest.raises(MSBError, match="go together"):
        pool_axes(pools, [], {}, "s.yaml")


def test_run_config_without_pool_or_budget_dumps_as_before():
    cfg = RunConfig.model_validate({"data": {"name": "d", "root": "r"}, "model": {"arch": "unet"}})
    dumped = cfg.model_dump(mode="json")
    assert "pool" not in dumped["data"] and "budget" not in dumped["train"]
    with_pool = RunConfig.model_validate({"data": {"name": "d", "root": "r", "pool": {"name": "f", "kind": "full"}},
                                          "model": {"arch": "unet"}, "train": {"budget": {"unit": "steps",
                                                                                          "value": 9}}})
    d2 = with_pool.model_dump(mode="json")
    assert d2["data"]["pool"]["name"] == "f" and d2["train"]["budget"] == {"unit": "steps", "value": 9}


def test_ensure_pool_writes_pool_csv_and_reads_masks_at_native_resolution(tmp_path):
    from msb.data.schema import load_prepared_dataset
    from msb.data.synth import make_synthetic_dataset

    make_synthetic_dataset(tmp_path / "ds", n_samples=12, seed=0, size=[32, 32], n_groups=4, empty_fraction=0.5)
    ds = load_prepared_dataset(tmp_path / "ds")
    ids = ds.sample_ids
    pres = mask_presence(ds, ids)
    raw = {sid: cv2.imread(str(ds.mask_path(sid)), cv2.IMREAD_GRAYSCALE) for sid in ids}
    assert pres == {sid: ("1" if (m > 0).any() else "none") for sid, m in raw.items()}
    run = tmp_path / "run"
    run.mkdir()
    pool = _pool(name="cm", kind="count_match", match={"name": "half", "kind": "random_match",
                                                        "match": {"name": "h", "kind": "remove",
                                                                  "groups": ["video_00"]}}, strata=["empty"])
    got = ensure_pool(pool, ds, run, ids)
    table = pd.read_csv(run / "pool.csv", dtype=str, keep_default_na=False)
    assert list(table.columns) == ["sample_id", "source", "stratum"]
    assert table["sample_id"].tolist() == got == sorted(got)
    assert set(table["stratum"]) <= {"empty=empty", "empty=non-empty"}
    assert all(s == ("empty=empty" if pres[i] == "none" else "empty=non-empty")
               for i, s in zip(table["sample_id"], table["stratum"]))
    n_h = sum(1 for i in ids if ds.row(i)["group"] != "video_00")
    assert len(got) == n_h
    assert ensure_pool(pool, ds, run, ids) == got  # resume: read back
    with pytest.raises(MSBError, match="not in the run's training split"):
        read_pool_file(run / "pool.csv", ids[:3])
