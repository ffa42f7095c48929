"""Epoch convention of checkpoint records and resume states: 1-based, old 0-based files converted or refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from msb.analysis.report.contract import contract_table, read_run
from msb.errors import MSBError
from msb.models.checkpoint import load_state, read_records, save_checkpoint, save_state


def _old_record(role: str, epoch: int) -> dict:
    """A record as written before the 1-based convention: 0-based epoch, no epoch_base."""
    return {"role": role, "epoch": epoch, "selection_split": "val", "metric": "dice", "value": 0.5,
            "sha256": "0" * 64, "path": f"checkpoints/{role}.pt"}


def _write_records(run_dir: Path, records: dict) -> Path:
    path = run_dir / "checkpoints" / "records.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(records))
    return path


def test_old_records_are_read_one_based(tmp_path: Path):
    """Old file: best after the 5th epoch was stored as 4, latest after the 6th as 5 -> read as 5 and 6.
    A record that already has epoch_base 1 is kept as it is."""
    _write_records(tmp_path, {"best": _old_record("best", 4), "latest": _old_record("latest", 5)})
    recs = read_records(tmp_path)
    assert (recs["best"].epoch, recs["latest"].epoch) == (5, 6)
    assert recs["best"].epoch_base == 1 and recs["best"].sha256 == "0" * 64

    _write_records(tmp_path, {"best": {**_old_record("best", 3), "epoch_base": 1},
                              "latest": _old_record("latest", 5)})
    recs = read_records(tmp_path)
    assert (recs["best"].epoch, recs["latest"].epoch) == (3, 6)


def test_saving_onto_old_records_rewrites_them_one_based(tmp_path: Path):
    """A new 'latest' after epoch 7 next to an old 'best' (stored 4 = 5th epoch): the file then holds
    best 5 and latest 7, both marked epoch_base 1."""
    path = _write_records(tmp_path, {"best": _old_record("best", 4)})
    save_checkpoint(tmp_path, "latest", {"w": torch.zeros(1)}, 7, "val", "dice", 0.25)
    raw = json.loads(path.read_text())
    assert {k: (v["epoch"], v["epoch_base"]) for k, v in raw.items()} == {"best": (5, 1), "latest": (7, 1)}
    with pytest.raises(ValueError, match="1-based"):
        save_checkpoint(tmp_path, "latest", {"w": torch.zeros(1)}, 0, "val", "dice", 0.25)


@pytest.mark.parametrize("record, message", [
    ({**_old_record("best", 4), "epoch_base": 2}, "epoch_base = 2"),
    ({**_old_record("best", 0), "epoch_base": 1}, "epoch 0"),
    ({**_old_record("best", 4), "epoch": "4"}, "epoch '4'"),
])
def test_bad_records_are_refused_naming_the_file(tmp_path: Path, record: dict, message: str):
    path = _write_records(tmp_path, {"best": record})
    with pytest.raises(MSBError, match=message) as e:
        read_records(tmp_path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_report_contract_shows_one_based_epoch_of_old_records(tmp_path: Path):
    """The report's checkpoint-policy row of an old run folder says epoch 5 for a best stored as 4."""
    (tmp_path / "config.yaml").write_text("study: t\ncheckpoint: {metric: dice}\n")
    _write_records(tmp_path, {"best": _old_record("best", 4)})
    run = read_run(tmp_path)
    assert run.records["best"]["epoch"] == 5
    table = contract_table([run])
    row = table[(table["section"] == "Checkpoint policy") & table["field"].str.startswith("best checkpoint")]
    assert row["value"].tolist() == ["epoch 5, dice = 0.5 on 'val'"]

    _write_records(tmp_path, {"best": {**_old_record("best", 4), "epoch_base": 7}})
    run = read_run(tmp_path)
    assert run.records == {} and any("epoch_base = 7" in p for p in run.problems)


def _old_state(last_index: int, best_index: int, rows: list[int]) -> dict:
    """A resume state as written before the 1-based convention (the history rows were already 1-based)."""
    return {"epoch": last_index, "best": {"value": 0.5, "epoch": best_index}, "early_stopping": {},
            "history": [{"epoch": r, "val_dice": 0.5} for r in rows], "finished": False}


def test_old_resume_state_is_converted(tmp_path: Path):
    """Old state after 3 finished epochs (index 2), best after the 2nd (index 1) -> epoch 3, best 2."""
    save_state(tmp_path, _old_state(2, 1, [1, 2, 3]))
    state = load_state(tmp_path)
    assert (state["epoch"], state["best"]["epoch"], state["epoch_base"]) == (3, 2, 1)
    assert [h["epoch"] for h in state["history"]] == [1, 2, 3]
    save_state(tmp_path, _old_state(0, -1, [1]))  # no finite value yet: best -1 -> 0 (none)
    assert load_state(tmp_path)["best"]["epoch"] == 0
    new = {**_old_state(3, 2, [1, 2, 3]), "epoch_base": 1}
    save_state(tmp_path, new)
    assert (load_state(tmp_path)["epoch"], load_state(tmp_path)["best"]["epoch"]) == (3, 2)


def test_unconvertible_old_state_is_refused(tmp_path: Path):
    """An unmarked state whose history does not match a 0-based counter cannot be read safely."""
    save_state(tmp_path, _old_state(3, 1, [1, 2, 3]))
    with pytest.raises(MSBError, match=r"train_state\.pt: .*before epochs were 1-based.*delete .*state.*"
                                       r"new run_root"):
        load_state(tmp_path)
    save_state(tmp_path, {**_old_state(2, 1, [1, 2, 3]), "epoch_base": 3})
    with pytest.raises(MSBError, match="epoch_base = 3"):
        load_state(tmp_path)
