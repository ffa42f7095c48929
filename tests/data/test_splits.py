"""Splits: fixed and seeded (group-aware) random splits, split files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msb.data.splits import read_split_file, resolve_splits, write_split_file
from msb.errors import MSBError
from msb.utils.hashing import sha256_file


def make_index(n: int = 50, groups: list[str] | None = None, split: list[str] | None = None) -> pd.DataFrame:
    return pd.DataFrame({
        "sample_id": [f"s{i:03d}" for i in range(n)],
        "split": split if split is not None else [""] * n,
        "group": groups if groups is not None else [""] * n,
    })


def test_fixed_uses_split_column() -> None:
    idx = make_index(6, split=["train", "train", "val", "test", "train", "test"])
    s = resolve_splits(idx, "fixed")
    assert s.index.tolist() == idx["sample_id"].tolist() and s.name == "split"
    assert s.tolist() == ["train", "train", "val", "test", "train", "test"]


def test_fixed_rejects_empty_or_invalid_rows() -> None:
    idx = make_index(5, split=["train", "", "val", "bogus", "test"])
    with pytest.raises(MSBError) as e:
        resolve_splits(idx, "fixed", index_file="data/index.csv")
    msg = str(e.value)
    assert "data/index.csv" in msg and "2 row(s)" in msg
    assert "line 3 (sample_id 's001': '')" in msg and "line 5 (sample_id 's003': 'bogus')" in msg
    assert "use split mode 'random'" in msg


def test_fixed_requires_every_split() -> None:
    idx = make_index(4, split=["train", "train", "test", "test"])
    with pytest.raises(MSBError, match=r"split\(s\) \['val'\] would be empty \(train=2, val=0, test=2\)"):
        resolve_splits(idx, "fixed")


def test_random_exact_counts_and_deterministic() -> None:
    idx = make_index(50)
    a = resolve_splits(idx, "random", 0.2, 0.1, seed=7)
    b = resolve_splits(idx, "random", 0.2, 0.1, seed=7)
    c = resolve_splits(idx, "random", 0.2, 0.1, seed=8)
    assert a.equals(b) and not a.equals(c)
    assert a.value_counts().to_dict() == {"train": 35, "val": 10, "test": 5}
    # independent of the row order
    shuffled = idx.sample(frac=1.0, random_state=0)
    d = resolve_splits(shuffled, "random", 0.2, 0.1, seed=7)
    assert d.sort_index().equals(a.sort_index())


def test_random_group_aware() -> None:
    rng = np.random.default_rng(0)
    groups = [f"p{int(g):02d}" for g in rng.integers(0, 20, 200)]
    idx = make_index(200, groups=groups)
    s = resolve_splits(idx, "random", 0.2, 0.2, seed=1, group_column="group")
    per_group = pd.DataFrame({"g": groups, "s": s.to_numpy()}).groupby("g")["s"].nunique()
    assert per_group.max() == 1  # every group in one split
    counts = s.value_counts()
    assert set(counts.index) == {"train", "val", "test"}
    assert abs(counts["test"] - 40) <= 15 and abs(counts["val"] - 40) <= 15
    # without grouping the same index gives exact counts and splits groups
    s2 = resolve_splits(idx, "random", 0.2, 0.2, seed=1)
    assert s2.value_counts().to_dict() == {"train": 120, "val": 40, "test": 40}


def test_empty_group_cells_are_singletons() -> None:
    groups = ["a"] * 10 + [""] * 10
    idx = make_index(20, groups=groups)
    s = resolve_splits(idx, "random", 0.25, 0.25, seed=0, group_column="group")
    assert s.iloc[:10].nunique() == 1
    assert s.value_counts().sum() == 20 and set(s) == {"train", "val", "test"}


@pytest.mark.parametrize("kwargs,match", [
    ({"val_fraction": 0.0}, r"val_fraction must be a number in \(0, 1\)"),
    ({"test_fraction": 1.0}, r"test_fraction must be a number in \(0, 1\)"),
    ({"val_fraction": 0.5, "test_fraction": 0.5}, "leaves no training data"),
    ({"mode": "kfold"}, "unknown split mode 'kfold'"),
    ({"group_column": "patient"}, "group column 'patient' not found"),
])
def test_random_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.2, "seed": 0} | kwargs
    with pytest.raises(MSBError, match=match):
        resolve_splits(make_index(20), **args)


def test_too_few_groups() -> None:
    idx = make_index(10, groups=["a"] * 5 + ["b"] * 5)
    with pytest.raises(MSBError, match="only 2 groups to split"):
        resolve_splits(idx, "random", 0.2, 0.2, 0, group_column="group")


def test_small_fraction_still_non_empty() -> None:
    # round(10 * 0.01) = 0 but each split keeps at least one unit
    s = resolve_splits(make_index(10), "random", 0.01, 0.01, seed=0)
    assert s.value_counts().to_dict() == {"train": 8, "val": 1, "test": 1}


def test_split_file_roundtrip(tmp_path: Path) -> None:
    s = resolve_splits(make_index(30), "random", 0.2, 0.2, seed=3)
    path = tmp_path / "run" / "split.csv"
    digest = write_split_file(path, s)
    assert digest == sha256_file(path) and len(digest) == 64
    text = path.read_text()
    assert text.startswith("sample_id,split\ns000,") and text.endswith("\n") and "\r" not in text
    back = read_split_file(path, known_ids=[f"s{i:03d}" for i in range(30)])
    assert back.equals(s)
    assert write_split_file(tmp_path / "again.csv", back) == digest
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["split.csv"]


def test_write_split_file_rejects_bad_values(tmp_path: Path) -> None:
    s = pd.Series(["train", "dev"], index=pd.Index(["a", "b"], name="sample_id"), name="split")
    with pytest.raises(MSBError, match=r"invalid split value\(s\) 'b': 'dev'"):
        write_split_file(tmp_path / "split.csv", s)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text,match", [
    ("id,split\na,train\n", "header must be 'sample_id,split'"),
    ("sample_id,split\na,train\nb,dev\n", r"line 3 \(sample_id 'b'\): split 'dev' is not train/val/test"),
    ("sample_id,split\na,train\na,test\n", "line 3: duplicate sample_id 'a'"),
    ("sample_id,split\na,train\nzz,test\n", "line 3: sample_id 'zz' is not in the dataset"),
])
def test_read_split_file_errors(tmp_path: Path, text: str, match: str) -> None:
    p = tmp_path / "split.csv"
    p.write_text(text)
    with pytest.raises(MSBError, match=match) as e:
        read_split_file(p, known_ids=["a", "b"])
    assert str(p) in str(e.value)
    with pytest.raises(MSBError, match="not found"):
        read_split_file(tmp_path / "none.csv")
