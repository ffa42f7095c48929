"""Issue 30, "the report states what ran": for a 3-fold, group-aware study the report's protocol table names
k = 3, the group column and the folds file's digest (the first 8 hex of the SHA-256 of
``_study/<unit>/folds.csv``, computed here with hashlib), and the cross-validation row reads the unit manifest
(inner selection split, include_test) instead of the config's random split it replaced."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path


def test_kfold_study_protocol_rows(make_project, tmp_path: Path):
    from msb.analysis.report.report import build_report
    from msb.study.pipeline import run_study

    spec = {"study": "cv3", "cross_validation": {"k": 3, "include_test": True, "inner_val": 0.2},
            "final": {"checkpoint": "best", "test_split": "val", "ensemble": False},
            "overrides": {"train": {"epochs": 1}}}
    study = make_project(tmp_path, spec)
    run_study(study)
    root = tmp_path / "runs" / "cv3"
    (folds,) = sorted(root.glob("_study/*/folds.csv"))
    digest = hashlib.sha256(folds.read_bytes()).hexdigest()[:8]
    res = build_report(root, tmp_path / "rep", n_boot=20, protocol={"analyses": ()})
    md = res.markdown.read_text(encoding="utf-8")
    split_row = next(ln for ln in md.splitlines() if ln.startswith("| Split policy"))
    assert "3-fold cross-validation (k = 3" in split_row and f"folds file SHA-256 {digest}" in split_row, split_row
    assert "whole groups of 'group'" in split_row and "(from the counts)" in split_row, split_row
    assert "random, whole groups" not in split_row  # the config's split, replaced by the folds, is not claimed
    cv_row = next(ln for ln in md.splitlines() if ln.startswith("| Cross-validation"))
    assert re.search(r"\bk 3\b", cv_row) and "inner_val 0.2" in cv_row and "include_test True" in cv_row, cv_row
    assert f"folds_sha256 {hashlib.sha256(folds.read_bytes()).hexdigest()[:8]}..." in cv_row, cv_row
