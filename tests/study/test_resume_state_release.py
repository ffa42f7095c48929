"""Issue 30, disk: a finished run's resume state keeps no weights (unless ``checkpoint.keep_resume_state``), a
rerun still skips the finished training (weights unchanged), and ``msb run`` prints the study's disk use, which
equals the bytes of the files below the study folder (os.walk, computed here independently)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import torch

from msb.models.checkpoint import load_state


def _study(root: Path, make_project, keep: bool | None) -> Path:
    over = {"train": {"epochs": 2}}
    if keep is not None:
        over["checkpoint"] = {"keep_resume_state": keep}
    return make_project(root, {"study": "d", "overrides": over}, data_root=root / "data")


def _run_dir(root: Path) -> Path:
    (rd,) = [d for d in (root / "runs" / "d").iterdir() if d.is_dir() and not d.name.startswith("_")]
    return rd


def test_finished_run_releases_its_resume_state_and_still_skips(tmp_path: Path, make_project, msb_cli):
    study = _study(tmp_path, make_project, None)
    r = msb_cli("run", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    rd = _run_dir(tmp_path)
    state = load_state(rd)
    assert state["finished"] is True and state["epoch"] == 2 and len(state["history"]) == 2
    assert "model" not in state and "optimizer" not in state  # weights live in checkpoints/ only
    size = (rd / "state" / "train_state.pt").stat().st_size
    ckpt = (rd / "checkpoints" / "latest.pt").stat().st_size
    assert size < ckpt / 10, (size, ckpt)
    total = sum((Path(d) / f).stat().st_size for d, _, fs in os.walk(tmp_path / "runs" / "d") for f in fs)
    m = re.search(r"disk: \S+ holds ([\d,.]+) MB", r.stdout + r.stderr)
    assert m and abs(float(m.group(1).replace(",", "")) - total / 1e6) < 0.15, (m, total)
    digest = hashlib.sha256((rd / "checkpoints" / "latest.pt").read_bytes()).hexdigest()
    r2 = msb_cli("run", str(study))
    assert r2.returncode == 0 and "training already finished, skipped" in r2.stdout + r2.stderr
    assert hashlib.sha256((rd / "checkpoints" / "latest.pt").read_bytes()).hexdigest() == digest


def test_keep_resume_state_keeps_the_weights(tmp_path: Path, make_project, msb_cli):
    r = msb_cli("run", str(_study(tmp_path, make_project, True)))
    assert r.returncode == 0, r.stdout + r.stderr
    rd = _run_dir(tmp_path)
    state = load_state(rd)
    best = torch.load(rd / "checkpoints" / "latest.pt", weights_only=True)["model"]
    assert state["finished"] and all(torch.equal(state["model"][k], best[k]) for k in best)


def test_generated_folders_are_listed_once_and_fail_no_check(tmp_path: Path, make_project, msb_cli):
    """`msb generate` beside an evaluated run (a preview of a changed config): the report lists the
    config-only folder once as "generated, not run" and no checklist item fails because of it."""
    import yaml

    study = _study(tmp_path, make_project, None)
    assert msb_cli("run", str(study)).returncode == 0
    spec = yaml.safe_load(study.read_text())
    spec["overrides"]["train"]["epochs"] = 3  # another config hash: another run folder
    study.write_text(yaml.safe_dump(spec))
    g = msb_cli("generate", str(study))
    assert g.returncode == 0 and "config-only run folder(s)" in g.stdout + g.stderr and "rm -r" in g.stdout + g.stderr
    new = [d for d in (tmp_path / "runs" / "d").iterdir() if d.is_dir() and not d.name.startswith("_")
           and not (d / "evaluation").exists()]
    assert len(new) == 1
    r = msb_cli("report", str(tmp_path / "runs" / "d"), "--analyses", "none", "--bootstrap", "50")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert out.count("generated, not run") == 1 and new[0].name in out
    fails = [ln for ln in out.splitlines() if ln.startswith("FAIL")]
    assert not [ln for ln in fails if new[0].name in ln or "split.csv missing" in ln], fails
