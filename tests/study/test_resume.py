"""Kill -9 and resume: a Hyperband + 2-fold study (with an external set) is killed twice in a subprocess (during
the search, then after the first fold's first epoch), rerun to completion, and must equal an uninterrupted
study: same trial parameters, states and values, same folds, same counts (every fold, the ensemble, the
external set), same checkpoint SHA-256s."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

STUDY = {
    "study": "hb",
    "overrides": {"train": {"epochs": 2}},
    "search": {"method": "hyperband", "n_trials": 3, "min_epochs": 1, "reduction_factor": 2,
               "sampler": {"name": "tpe", "seed": 3},
               "params": {"train.optimizer.lr": {"type": "float", "low": 0.0005, "high": 0.02, "log": True},
                          "model.params.decoder_channels": [[16, 8, 8, 8, 8], [8, 8, 8, 8, 8]]}},
    "cross_validation": {"k": 2},
    "final": {"external": [{"dataset": "synth_ext"}]},
}


def _kill_when(proc, pattern: str, where: Path, timeout: float = 240) -> Path:
    """SIGKILL ``proc`` as soon as a file matching ``pattern`` exists below ``where``; return that file."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        hits = sorted(where.glob(pattern)) if where.is_dir() else []
        if hits:
            assert proc.poll() is None, "the study finished before it could be killed"
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            return hits[0]
        if proc.poll() is not None:
            raise AssertionError(f"msb run ended (rc {proc.returncode}) before {pattern} appeared")
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"timeout waiting for {pattern}")


def _results(study_dir: Path) -> dict:
    out = {"folds": (study_dir / "_study" / "synthetic-unet_tiny" / "folds.csv").read_bytes()}
    sel = json.loads((study_dir / "_study" / "synthetic-unet_tiny" / "selected.json").read_text())
    out["trials"] = [(t["number"], t["state"], t["value"], t["params"], t["run_id"]) for t in sel["trials"]]
    out["best"] = (sel["best_trial"], sel["final_run_id"])
    out["counts"] = {str(p.relative_to(study_dir)): pd.read_parquet(p).sort_values(["image_id", "class_id"])
                     .reset_index(drop=True) for p in sorted(study_dir.rglob("counts.parquet"))}
    return out


@pytest.mark.slow
def test_kill_and_resume_equals_uninterrupted(tmp_path: Path, make_project, msb_cli, msb_popen):
    data = tmp_path / "data"
    a = make_project(tmp_path / "a", STUDY, data_root=data)
    b = make_project(tmp_path / "b", STUDY, data_root=data)
    r = msb_cli("run", str(a))
    assert r.returncode == 0, r.stdout + r.stderr
    ref = _results(tmp_path / "a" / "runs" / "hb")

    bdir = tmp_path / "b" / "runs" / "hb"
    p = msb_popen("run", str(b), log=tmp_path / "b1.log")
    first = _kill_when(p, "*/state/train_state.pt", bdir)  # a search trial, after its first epoch
    assert "-fold" not in str(first)
    p = msb_popen("run", str(b), log=tmp_path / "b2.log")
    _kill_when(p, "*-fold0/state/train_state.pt", bdir)  # the first fold, after its first epoch
    assert not (bdir / "_study" / "synthetic-unet_tiny" / "manifest.json").exists()
    r = msb_cli("run", str(b))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "re-attaching trial" in r.stdout or "re-attaching trial" in (tmp_path / "b2.log").read_text()

    got = _results(bdir)
    assert got["folds"] == ref["folds"]
    assert got["trials"] == ref["trials"] and got["best"] == ref["best"]
    assert set(got["counts"]) == set(ref["counts"])
    assert len(ref["counts"]) == 2 * 2 + 2  # (test + external) x 2 folds + 2 ensembles
    for key, df in ref["counts"].items():
        # checkpoint_sha256 hashes the file bytes, and torch.save embeds the (random) temporary file name of the
        # atomic write in the archive, so equal weights give different file hashes: compare the weights instead
        pd.testing.assert_frame_equal(got["counts"][key].drop(columns="checkpoint_sha256"),
                                      df.drop(columns="checkpoint_sha256"), check_exact=True)
    for ck in sorted((tmp_path / "a" / "runs" / "hb").glob("*/checkpoints/*.pt")):
        wa = torch.load(ck, weights_only=False)["model"]
        wb = torch.load(bdir / ck.relative_to(tmp_path / "a" / "runs" / "hb"), weights_only=False)["model"]
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), ck
    # every fold's training log has each epoch once (no epoch trained twice after the kill)
    for log in bdir.glob("*-fold*/train_log.csv"):
        assert pd.read_csv(log)["epoch"].tolist() == [1, 2]
