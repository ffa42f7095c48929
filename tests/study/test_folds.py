"""Group-aware K-fold assignment: groups never cross folds, balanced sizes, seeded reproducibility,
stratification, persistence in folds.csv, and user errors."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from msb.data.schema import load_prepared_dataset
from msb.errors import MSBError
from msb.study import crossval, pipeline, units
from msb.study.folds import assign_folds, empty_mask_strata, fold_split, read_folds, write_folds


def _index(sizes: list[int], prefix: str = "g") -> pd.DataFrame:
    rows = []
    for g, n in enumerate(sizes):
        for i in range(n):
            rows.append({"sample_id": f"s{g:02d}_{i}", "group": f"{prefix}{g}"})
    return pd.DataFrame(rows)


def test_groups_never_cross_folds_and_sizes_are_balanced():
    """Groups of 5, 4, 3, 3, 2, 1 samples into 3 folds, largest first to the lightest fold:
    5->A, 4->B, 3->C, 3->C (6), 2->B (6), 1->A (6): every fold holds 6 samples, whatever the tie order."""
    idx = _index([5, 4, 3, 3, 2, 1])
    for seed in (0, 1, 2):
        f = assign_folds(idx, idx["sample_id"], 3, "group", seed=seed)
        assert (f.groupby("group")["fold"].nunique() == 1).all()
        assert sorted(f["fold"].value_counts().tolist()) == [6, 6, 6]
        assert list(f["sample_id"]) == list(idx["sample_id"])  # index row order kept


def test_pool_and_held_out_samples():
    idx = _index([2] * 8)
    pool = idx["sample_id"][idx["group"] != "g7"]
    f = assign_folds(idx, pool, 2, "group", seed=0)
    assert (f.loc[f["group"] == "g7", "fold"] == -1).all()
    assert set(f.loc[f["group"] != "g7", "fold"]) == {0, 1}
    s = fold_split(f, 1)
    assert (s[f["sample_id"][f["fold"] == 1]] == "val").all()
    assert (s[f["sample_id"][f["fold"] == 0]] == "train").all()
    assert (s[f["sample_id"][f["fold"] == -1]] == "test").all()


def test_seed_reproducibility_and_row_order_independence():
    idx = _index([2] * 9)  # all groups tie: the seed decides
    a = assign_folds(idx, idx["sample_id"], 3, "group", seed=5)
    b = assign_folds(idx.iloc[::-1].reset_index(drop=True), idx["sample_id"], 3, "group", seed=5)
    assert a.set_index("sample_id")["fold"].equals(b.set_index("sample_id")["fold"].loc[a["sample_id"]])
    c = assign_folds(idx, idx["sample_id"], 3, "group", seed=6)
    assert not a["fold"].equals(c["fold"])


def test_empty_group_cells_are_singletons_and_no_group_column():
    idx = _index([3, 3])
    idx.loc[idx["sample_id"].str.startswith("s01"), "group"] = ""
    f = assign_folds(idx, idx["sample_id"], 2, "group", seed=0)
    g0 = f[f["group"] == "g0"]["fold"]
    assert g0.nunique() == 1
    f2 = assign_folds(idx, idx["sample_id"], 3, None, seed=0)  # 6 singleton groups
    assert sorted(f2["fold"].value_counts().tolist()) == [2, 2, 2]


def test_stratified_group_kfold_balances_strata():
    """12 pure groups of 2 samples, 6 'empty' and 6 'non-empty': 3 folds of 2 + 2 groups are achievable and
    StratifiedGroupKFold finds them."""
    idx = _index([2] * 12)
    strata = pd.Series({s: ("empty" if int(s[1:3]) % 2 else "non-empty") for s in idx["sample_id"]})
    f = assign_folds(idx, idx["sample_id"], 3, "group", strata=strata, seed=0)
    assert (f.groupby("group")["fold"].nunique() == 1).all()
    tab = pd.crosstab(f["fold"], f["stratum"])
    assert (tab["empty"] == 4).all() and (tab["non-empty"] == 4).all()


def test_empty_mask_strata(tmp_path: Path):
    from msb.data.synth import make_synthetic_dataset

    make_synthetic_dataset(tmp_path / "d", n_samples=8, size=(16, 16), seed=0, empty_fraction=0.25)
    ds = load_prepared_dataset(tmp_path / "d")
    s = empty_mask_strata(ds, ds.index["sample_id"])
    from msb.data.schema import read_mask

    truth = {sid: ("non-empty" if (read_mask(ds.mask_path(sid)) > 0).any() else "empty") for sid in ds.index["sample_id"]}
    assert s.to_dict() == truth and list(s.values).count("empty") == 2


def test_errors():
    idx = _index([2, 2])
    with pytest.raises(MSBError, match=r"3-fold cross-validation needs at least 3 groups .* found 2"):
        assign_folds(idx, idx["sample_id"], 3, "group")
    with pytest.raises(MSBError, match="group_column 'patient' is not a column"):
        assign_folds(idx, idx["sample_id"], 2, "patient")
    with pytest.raises(MSBError, match="k must be an integer >= 2"):
        assign_folds(idx, idx["sample_id"], 1, "group")


def test_read_folds_errors(tmp_path: Path):
    p = tmp_path / "folds.csv"
    p.write_text("sample_id,group,stratum,fold\na,g,,0\nb,g,,x\n")
    with pytest.raises(MSBError, match=r"line 3: fold 'x'"):
        read_folds(p)
    p.write_text("sample_id,fold\na,0\n")
    with pytest.raises(MSBError, match="header must be"):
        read_folds(p)
    idx = _index([1, 1])
    write_folds(p, assign_folds(idx, idx["sample_id"], 2, "group"))
    assert list(read_folds(p, known_ids=idx["sample_id"])["fold"].sort_values()) == [0, 1]
    with pytest.raises(MSBError, match="differ from the dataset"):
        read_folds(p, known_ids=["other"])


def test_study_folds_persisted_reused_and_reproduced(make_project, tmp_path: Path):
    """folds.csv is written once per study, reused as is on resume, and redrawn identically from the seed."""
    study = make_project(tmp_path, {"study": "f", "cross_validation": {"k": 3, "stratify": "empty_mask"}})
    u = units.study_units(study)[0]
    u.state_dir.mkdir(parents=True)
    from msb.data.prepare import ensure_dataset

    ds = ensure_dataset(u.cfg)
    folds, sha = crossval.ensure_folds(u, ds, lambda m: None)
    path = u.state_dir / "folds.csv"
    first = path.read_bytes()
    # test samples = the run config's own test split, held out of every fold
    split = pd.read_csv(u.state_dir / "split.csv").set_index("sample_id")["split"]
    assert set(folds.loc[folds["fold"] == -1, "sample_id"]) == set(split[split == "test"].index)
    assert (folds[folds["fold"] >= 0].groupby("group")["fold"].nunique() == 1).all()
    # reused: an edited file is taken as is (not recomputed)
    edited = folds.copy()
    edited.loc[edited["fold"] >= 0, "fold"] = (edited.loc[edited["fold"] >= 0, "fold"] + 1) % 3
    write_folds(path, edited)
    again, sha2 = crossval.ensure_folds(u, ds, lambda m: None)
    assert again["fold"].tolist() == edited["fold"].tolist() and sha2 != sha
    # reproduced from the seed after deletion
    path.unlink()
    crossval.ensure_folds(u, ds, lambda m: None)
    assert path.read_bytes() == first


def test_study_with_too_many_folds_fails_before_training(make_project, tmp_path: Path):
    study = make_project(tmp_path, {"study": "bad", "cross_validation": {"k": 20}})
    with pytest.raises(MSBError, match=r"20-fold cross-validation needs at least 20 groups"):
        pipeline.run_study(study)
    sdir = tmp_path / "runs" / "bad"
    assert not (sdir / "_study" / "synthetic-unet_tiny" / "folds.csv").exists()
    assert not list(sdir.glob("*-fold*")) and not [p for p in sdir.rglob(".*") if p.is_file()]
