"""``remove_neighbours`` / ``remove_distant`` pools (ReuScope step four) from a hand-made pairs table: which
training rows go, that the distant control drops as many rows per stratum and none of them a neighbour, and the
refusals. Expected sets are written out by hand from the table below."""

from __future__ import annotations

import pandas as pd
import pytest

from msb.config.pools_schema import PoolConfig
from msb.data.neighbours import read_pairs, training_neighbours
from msb.data.pools import build_pool
from msb.errors import MSBError

TRAIN = [f"t{i:02d}" for i in range(20)]
SOURCE = {t: ("a" if i < 10 else "b") for i, t in enumerate(TRAIN)}
GROUP = {t: f"g{t}" for t in TRAIN}
PRESENCE = {t: ("none" if i % 5 == 0 else "1") for i, t in enumerate(TRAIN)}


def _pairs(tmp_path):
    p = tmp_path / "pairs.csv"
    pd.DataFrame({
        "sample_id_a": ["e1", "t03", "e2", "e3", "t01", "e4", "t07"],
        "sample_id_b": ["t00", "e1", "t12", "t15", "t02", "t09", "t08"],  # t01-t02, t07-t08: both training
        "confirmed": ["true", "True", "1", "false", "true", "0", "yes"],  # e3-t15 and e4-t09 not confirmed
    }).to_csv(p, index=False)
    return p


def _build(pool: dict) -> list[str]:
    return build_pool(PoolConfig.model_validate(pool), TRAIN, SOURCE, GROUP, lambda: PRESENCE)


def test_neighbours_from_confirmed_crossing_pairs(tmp_path):
    pairs = read_pairs(_pairs(tmp_path))
    assert len(pairs) == 5
    assert training_neighbours(pairs, TRAIN) == {"e1": {"t00", "t03"}, "e2": {"t12"}}
    local = {"name": "local", "kind": "remove_neighbours", "pairs_file": str(_pairs(tmp_path))}
    assert _build(local) == sorted(set(TRAIN) - {"t00", "t03", "t12"})
    # removed: t00 (a, empty), t03 (a, non-empty), t12 (b, non-empty)
    for strata, seed in (([], 0), (["source", "empty"], 0), (["source", "empty"], 3)):
        dist = _build({"name": "distant", "kind": "remove_distant", "match": local, "strata": strata, "seed": seed})
        gone = set(TRAIN) - set(dist)
        assert len(gone) == 3 and not gone & {"t00", "t03", "t12"}
        if strata:
            assert sorted((SOURCE[g], PRESENCE[g] == "none") for g in gone) == [("a", False), ("a", True),
                                                                              ("b", False)]
    assert _build({"name": "d", "kind": "remove_distant", "match": local, "seed": 1}) == \
        _build({"name": "d", "kind": "remove_distant", "match": local, "seed": 1})  # seeded


def test_refusals(tmp_path):
    with pytest.raises(ValueError, match="needs pairs_file"):
        PoolConfig.model_validate({"name": "x", "kind": "remove_neighbours"})
    with pytest.raises(ValueError, match="needs 'match'"):
        PoolConfig.model_validate({"name": "x", "kind": "remove_distant"})
    with pytest.raises(ValueError, match="pairs_file belongs to kind remove_neighbours"):
        PoolConfig.model_validate({"name": "x", "kind": "full", "pairs_file": "p.csv"})
    with pytest.raises(MSBError, match="must be a remove_neighbours pool"):
        _build({"name": "d", "kind": "remove_distant", "match": {"name": "full", "kind": "remove", "sources": ["a"]}})
    empty = tmp_path / "none.csv"
    pd.DataFrame({"sample_id_a": ["t01"], "sample_id_b": ["t02"]}).to_csv(empty, index=False)
    with pytest.raises(MSBError, match="no evaluation frame has a close training match"):
        _build({"name": "l", "kind": "remove_neighbours", "pairs_file": str(empty)})
    with pytest.raises(MSBError, match="pairs file not found"):
        _build({"name": "l", "kind": "remove_neighbours", "pairs_file": str(tmp_path / "nope.csv")})
