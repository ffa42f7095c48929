"""Issue 30: no checkpoint chosen on the split it is scored on.

(a) a CV study scoring out-of-fold predictions (``final.test_split: val``) with ``checkpoint: best`` is refused
before any training, in one line naming both keys; (b) with ``cross_validation.inner_val`` it runs, no fold's
selection split overlaps its scored fold (read back from every fold run's ``split.csv``) and the checklist item
passes; (c) a ``records.json`` claiming selection on the scored split makes that item FAIL.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from msb.analysis.report.contract import _test_selection_item, find_counts_files, find_run_dirs, read_run
from msb.config.study_spec import CrossValidationSpec
from msb.errors import MSBError
from msb.study.folds import INNER_SPLIT, assign_inner_val, fold_split, read_inner_val, write_inner_val
from msb.study.units import study_units

ITEM = "Checkpoint selected without the test split"


def _study(cv: dict, final: dict | None = None) -> dict:
    return {"study": "sel", "cross_validation": {"k": 2, "include_test": True, **cv},
            "final": final or {"checkpoint": "best", "test_split": "val", "ensemble": False}}


def test_oof_best_is_refused_on_the_cli(make_project, msb_cli, tmp_path: Path):
    study = make_project(tmp_path, _study({}))
    res = msb_cli("run", str(study))
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    msg = lines[0]
    for needle in ("final.test_split: val", "checkpoint.selection_split: val", "final.checkpoint: latest",
                   "cross_validation.inner_val", str(study)):
        assert needle in msg, msg
    assert not (tmp_path / "runs" / "sel").exists()  # refused before anything was written or trained


@pytest.mark.parametrize("cv, final, refused", [
    ({}, {"checkpoint": "both", "test_split": "val"}, True),
    ({}, {"checkpoint": "latest", "test_split": "val"}, False),
    ({"inner_val": 0.2}, {"checkpoint": "best", "test_split": "val"}, False),
    ({"include_test": False}, {"checkpoint": "best", "test_split": "test"}, False),
    (None, {"checkpoint": "best", "test_split": "val"}, True),  # no CV: the final run selects and scores on val
])
def test_refusal_at_plan_time(make_project, tmp_path: Path, cv, final, refused):
    spec = _study(cv or {}, final)
    if cv is None:
        spec.pop("cross_validation")
    study = make_project(tmp_path, spec)
    if refused:
        with pytest.raises(MSBError, match="checkpoint.selection_split: val"):
            study_units(study)
    else:
        assert study_units(study)


def test_inner_val_unset_keeps_the_spec_dump():
    """Existing study folders keep their spec hash: an unset inner_val is not dumped."""
    assert "inner_val" not in CrossValidationSpec(k=3).model_dump(mode="json")
    assert CrossValidationSpec(k=3, inner_val=0.25).model_dump(mode="json")["inner_val"] == 0.25
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError):
            CrossValidationSpec(k=3, inner_val=bad)


def _folds(n: int = 30, k: int = 3) -> pd.DataFrame:
    groups = [f"v{i // 3}" if i % 5 else "" for i in range(n)]  # groups of 3 and some ungrouped samples
    keys = [g or f"s{i}" for i, g in enumerate(groups)]
    order = {key: j for j, key in enumerate(dict.fromkeys(keys))}
    return pd.DataFrame({"sample_id": [f"id{i:02d}" for i in range(n)], "group": groups, "stratum": "",
                         "fold": [order[key] % k if i < n - 3 else -1 for i, key in enumerate(keys)]})


def test_assign_inner_val_groups_deterministic_and_persisted(tmp_path: Path):
    folds = _folds()
    a, b = assign_inner_val(folds, 0.25, seed=3), assign_inner_val(folds, 0.25, seed=3)
    pd.testing.assert_frame_equal(a, b)
    assert not a.equals(assign_inner_val(folds, 0.25, seed=4))
    write_inner_val(tmp_path / "inner_val.csv", a)
    pd.testing.assert_frame_equal(read_inner_val(tmp_path / "inner_val.csv", folds), a)
    for j in range(3):
        split = fold_split(folds, j, a)
        _check_disjoint(split, folds.set_index("sample_id")["group"], f"fold {j}")
        n_train = int(((folds["fold"] >= 0) & (folds["fold"] != j)).sum())
        assert 1 <= int((split == INNER_SPLIT).sum()) < n_train
    bad = pd.DataFrame({"fold": [0], "sample_id": [folds.loc[folds["fold"] == 0, "sample_id"].iloc[0]]})
    write_inner_val(tmp_path / "bad.csv", bad)
    with pytest.raises(MSBError, match="not a training row of fold 0"):
        read_inner_val(tmp_path / "bad.csv", folds)


def _check_disjoint(split: pd.Series, group_of: pd.Series, where: str) -> None:
    """No sample id and no group both in the selection split and the scored fold; every selection group is a
    training group of the fold (i.e. came from ``train`` rows before the carve)."""
    sel = set(split.index[split == INNER_SPLIT])
    scored = set(split.index[split == "val"])
    assert sel and scored and not sel & scored, where

    def groups(ids: set[str]) -> set[str]:
        return {f"g:{group_of[i]}" if group_of[i] else f"s:{i}" for i in ids}

    assert not groups(sel) & groups(scored), where
    assert not groups(sel) & groups(set(split.index[split == "test"])), where
    train_pool = set(split.index[(split == "train") | (split == INNER_SPLIT)])
    assert groups(sel) <= groups(train_pool), where


def test_inner_val_study_runs_without_overlap_and_passes_the_checklist(make_project, tmp_path: Path):
    from msb.study.pipeline import run_study

    study = make_project(tmp_path, _study({"inner_val": 0.2}))
    outcomes = run_study(study)
    assert len(outcomes) == 2
    root = tmp_path / "runs" / "sel"
    unit_dir = root / "_study" / "synthetic-unet_tiny"
    folds = pd.read_csv(unit_dir / "folds.csv", dtype=str, keep_default_na=False)
    group_of = folds.set_index("sample_id")["group"]
    fold_dirs = sorted(root.glob("*-fold*"))
    assert len(fold_dirs) == 2
    for d in fold_dirs:
        split = pd.read_csv(d / "split.csv", dtype=str).set_index("sample_id")["split"]
        _check_disjoint(split, group_of, d.name)
        j = json.loads((d / "fold.json").read_text())["fold"]
        fold_training = set(folds.loc[(folds["fold"] != str(j)) & (folds["fold"] != "-1"), "sample_id"])
        assert set(split.index[split == INNER_SPLIT]) <= fold_training
        assert set(split.index[split == "val"]) == set(folds.loc[folds["fold"] == str(j), "sample_id"])
        rec = json.loads((d / "checkpoints" / "records.json").read_text())
        assert rec["best"]["selection_split"] == INNER_SPLIT
        counts = pd.read_parquet(d / "evaluation" / "best" / "counts.parquet", columns=["split"])
        assert set(counts["split"]) == {"val"}
    runs = [read_run(d) for d in find_run_dirs(root)]
    counts = pd.concat([pd.read_parquet(p) for p in find_counts_files(root)], ignore_index=True)
    item = _test_selection_item(runs, counts)
    assert item.item == ITEM and item.status == "PASS", item.evidence
    # (c) one run's records.json claims selection on the split it is scored on: the item FAILs naming the run
    rec_path = fold_dirs[1] / "checkpoints" / "records.json"
    rec = json.loads(rec_path.read_text())
    rec["best"]["selection_split"] = "val"
    rec_path.write_text(json.dumps(rec))
    runs = [read_run(d) for d in find_run_dirs(root)]
    for c in (counts, None):  # from the counts rows, or from the run folders' evaluation/<role>/counts.parquet
        item = _test_selection_item(runs, c)
        assert item.status == "FAIL", item.evidence
        assert fold_dirs[1].name in item.evidence and fold_dirs[0].name not in item.evidence


def test_checklist_latest_on_its_selection_split_passes(tmp_path: Path):
    """``final.checkpoint: latest`` (a fix the refusal names) is not a selected checkpoint: PASS."""
    run = tmp_path / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("recipe: controlled\n")
    (run / "checkpoints" / "records.json").write_text(json.dumps(
        {"latest": {"role": "latest", "epoch": 1, "selection_split": "val"}}))
    counts = pd.DataFrame({"run_id": ["r"], "split": ["val"], "checkpoint_role": ["latest"],
                           "split_policy": ["kfold"]})
    assert _test_selection_item([read_run(run)], counts).status == "PASS"
    counts["checkpoint_role"] = "best"
    (run / "checkpoints" / "records.json").write_text(json.dumps(
        {"best": {"role": "best", "epoch": 1, "selection_split": "val"}}))
    assert _test_selection_item([read_run(run)], counts).status == "FAIL"
    counts["split_policy"] = "external-only"  # an external set's 'val' is not the run's own val
    assert _test_selection_item([read_run(run)], counts).status == "PASS"
