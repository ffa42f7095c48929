"""``data.require_audit``: a run audits its actual split before training and refuses to train when a required
relation crosses it (one line naming the check, its counts and the audit folder); a clean split trains and the
audit is reused (digest-matched) by the next run on the same split.

Synthetic dataset (conftest.py): 24 frames in 8 groups (``group`` column). Expected crossing counts are recomputed
here from the run's ``split.csv`` and the dataset's ``index.csv`` with plain pandas.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from msb.config.schema import DataConfig
from msb.errors import AuditFailed
from msb.study.pipeline import run_study


def crossing_groups(run_dir: Path, dataset: Path) -> tuple[int, int]:
    split = pd.read_csv(run_dir / "split.csv", dtype=str)
    idx = pd.read_csv(dataset / "index.csv", dtype=str, keep_default_na=False)[["sample_id", "group"]]
    m = split.merge(idx, on="sample_id")
    m = m[m["group"] != ""]
    sizes = m.groupby("group").size()
    sides = m.groupby("group")["split"].nunique()
    return int((sides[sizes >= 2] >= 2).sum()), int((sizes >= 2).sum())


def test_require_audit_refuses_an_ungrouped_split(tmp_path: Path, make_project) -> None:
    study = make_project(tmp_path, {"study": "gate", "overrides": {"data": {
        "require_audit": ["crossing-group"], "split": {"group_column": None}}}})
    logs: list[str] = []
    with pytest.raises(AuditFailed) as e:
        run_study(study, log=logs.append)
    msg = str(e.value)
    (run_dir,) = [p.parent for p in (tmp_path / "runs" / "gate").glob("*/split.csv")]
    n_cross, n_groups = crossing_groups(run_dir, tmp_path / "datasets" / "synthetic")
    assert n_groups == 8 and n_cross >= 1
    assert msg.startswith(f"data.require_audit: refusing to train, FAIL — {n_cross} of 8 shared-group groups cross "
                          f"the split")
    assert "[crossing-group]" in msg and "\n" not in msg
    (audit,) = (tmp_path / "runs" / "gate" / "audits").iterdir()
    assert f"audit folder {audit}" in msg
    v = json.loads((audit / "verdict.json").read_text())
    assert v["status"] == "FAIL" and v["failed"] == ["crossing-group"] and len(v["digest"]) == 64
    assert not list(run_dir.glob("checkpoints/*"))  # nothing trained


def test_require_audit_clean_split_trains_and_reuses_the_audit(tmp_path: Path, make_project) -> None:
    study = make_project(tmp_path, {"study": "gate", "overrides": {"data": {
        "require_audit": ["crossing-group", "crossing-identical"]}}})  # dataset default: group_column: group
    logs: list[str] = []
    run_study(study, log=logs.append)
    (run_dir,) = [p.parent for p in (tmp_path / "runs" / "gate").glob("*/split.csv")]
    assert crossing_groups(run_dir, tmp_path / "datasets" / "synthetic") == (0, 8)
    (audit,) = (tmp_path / "runs" / "gate" / "audits").iterdir()
    assert json.loads((audit / "verdict.json").read_text())["status"] == "PASS"
    assert any("audit verdict: PASS — 0 of 8 shared-group groups cross the split" in m and str(audit) in m
               and "(cached)" not in m for m in logs)
    assert list((run_dir / "checkpoints").glob("*.pt"))
    from msb.audit.gate import gated_audit

    verdict, folder, reused = gated_audit(tmp_path / "datasets" / "synthetic", run_dir / "split.csv",
                                          ["crossing-group"], tmp_path / "runs" / "gate" / "audits")
    assert reused and folder == audit and verdict["status"] == "PASS"


def test_require_audit_is_left_out_of_the_dump_while_unset() -> None:
    assert "require_audit" not in DataConfig(name="x", root="r").model_dump()
    d = DataConfig(name="x", root="r", require_audit=["crossing-near-duplicate"]).model_dump()
    assert d["require_audit"] == ["crossing-near-duplicate"]
    with pytest.raises(ValueError, match="crossing-identical"):
        DataConfig(name="x", root="r", require_audit=["crossing-everything"])
