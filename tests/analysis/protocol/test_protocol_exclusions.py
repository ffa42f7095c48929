"""Recorded exclusions (``_study/exclusions.csv`` written by ``msb run``) reach the resolution analysis: the
excluded architecture x size is named with its reason, and the architecture is left out of the ΔDSC table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from _protocol_study import build_study  # noqa: E402

from msb.analysis.protocol import write_protocol_analyses  # noqa: E402


def test_excluded_pair_is_named_in_the_resolution_notes(tmp_path: Path):
    study = build_study(tmp_path, skip={("segf", 192)}, metrics=False, profile=False, external=False)
    (study / "_study").mkdir(exist_ok=True)
    (study / "_study" / "exclusions.csv").write_text(
        "unit,dataset,architecture,input_size,reason\n"
        "kv-segf-input_size192x192,kv,segf,192,out of GPU memory during epoch 1: segformer at 192x192 px\n")
    write_protocol_analyses(study, ["resolution_delta"])
    notes = json.loads((study / "protocol" / "skipped.json").read_text())["notes"]["resolution_delta"]
    assert "segf at 192 px excluded by the study: out of GPU memory during epoch 1: segformer at 192x192 px" in notes
    assert any("segf unmatched, no counts at 192 px" in n for n in notes)
    table = pd.read_csv(study / "protocol" / "tables" / "resolution_delta.csv")
    assert "segf" not in set(table["Architecture"]) and len(table) >= 1
    tidy_notes = pd.read_csv(study / "protocol" / "data" / "resolution_delta_notes.csv")["note"].tolist()
    assert tidy_notes == notes


def test_external_only_rows_go_with_the_training_protocol():
    """External-set rows (split_policy external-only) beside one k-fold protocol are one protocol; two training
    protocols are still refused."""
    import pytest

    from msb.analysis.protocol.inputs import check_one_protocol
    from msb.errors import MSBError

    ok = pd.DataFrame({"split_policy": ["kfold(k=3,folds=3479856d)", "external-only", "external-only"]})
    check_one_protocol(ok, "Wilcoxon tests")
    bad = pd.DataFrame({"split_policy": ["kfold(k=3,folds=3479856d)", "fixed", "external-only"]})
    with pytest.raises(MSBError, match=r"different split protocols \['fixed', 'kfold\(k=3,folds=3479856d\)'\]"):
        check_one_protocol(bad, "Wilcoxon tests")
