"""The ``merge`` converter (msb.data.converters.merge): sources, ids, groups, byte-equal files, the seeded
group-aware limit, and refusals (different classes, bad parts), checked against the parts' own index files."""

from __future__ import annotations

import filecmp

import pandas as pd
import pytest

from msb.data.converters import prepare_dataset
from msb.data.schema import load_prepared_dataset
from msb.data.synth import make_synthetic_dataset
from msb.errors import MSBError


def test_merge_two_parts(tmp_path):
    make_synthetic_dataset(tmp_path / "b", n_samples=6, seed=3, size=[32, 32], n_groups=3)
    parts = [{"name": "a", "converter": "synthetic", "options": {"n_samples": 10, "seed": 0, "size": [32, 32],
                                                                  "n_groups": 5}, "limit": 4},
             {"name": "b", "root": str(tmp_path / "b")}]
    rep = prepare_dataset("merge", None, tmp_path / "out", parts=parts, seed=1)
    ds = load_prepared_dataset(tmp_path / "out", check_files=True)
    idx = ds.index
    b = pd.read_csv(tmp_path / "b" / "index.csv", dtype=str, keep_default_na=False)
    assert rep.n_samples == len(idx)
    assert set(idx["source"]) == {"a", "b"} and (idx["split"] == "").all()
    rows_b = idx[idx["source"] == "b"]
    assert sorted(rows_b["sample_id"]) == sorted("b__" + b["sample_id"])
    assert sorted(rows_b["group"]) == sorted("b:" + b["group"])
    for r in rows_b.itertuples():
        orig = b.set_index("sample_id").loc[r.sample_id.split("__", 1)[1]]
        assert filecmp.cmp(tmp_path / "out" / r.image_path, tmp_path / "b" / orig["image_path"], shallow=False)
    # limit 4 of 10 frames in 5 groups of 2: whole groups until >= 4 -> exactly 2 groups, 4 frames
    rows_a = idx[idx["source"] == "a"]
    assert len(rows_a) == 4 and rows_a["group"].nunique() == 2
    assert rows_a.groupby("group").size().tolist() == [2, 2]
    assert [c.name for c in ds.classes] == ["background", "polyp"]


def test_merge_refusals(tmp_path):
    make_synthetic_dataset(tmp_path / "a", n_samples=4, seed=0, size=[32, 32])
    make_synthetic_dataset(tmp_path / "b", n_samples=4, seed=1, size=[32, 32])
    cls = tmp_path / "b" / "classes.csv"
    cls.write_text(cls.read_text().replace("polyp", "lesion"))
    with pytest.raises(MSBError, match="part 'b' .* has classes"):
        prepare_dataset("merge", None, tmp_path / "out", parts=[{"name": "a", "root": str(tmp_path / "a")},
                                                               {"name": "b", "root": str(tmp_path / "b")}])
    assert not (tmp_path / "out").exists()
    with pytest.raises(MSBError, match="at least two"):
        prepare_dataset("merge", None, tmp_path / "out", parts=[{"name": "a", "root": str(tmp_path / "a")}])
    with pytest.raises(MSBError, match="repeat"):
        prepare_dataset("merge", None, tmp_path / "out", parts=[{"name": "a", "root": str(tmp_path / "a")}] * 2)
    with pytest.raises(MSBError, match="either 'root'"):
        prepare_dataset("merge", None, tmp_path / "out", parts=[{"name": "a"}, {"name": "b", "root": "x"}])
    assert not list(tmp_path.glob(".out.*"))  # no temporary folder left behind
