"""End to end through the command line: msb run / evaluate / reaggregate on the synthetic default and on
real Kvasir-SEG, plus user errors (one line, exit status 2, no traceback, nothing half-written)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def msb(*args: str, cwd: Path = REPO, timeout: int = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory) -> Path:
    """A copy of the shipped configs with a tiny synthetic study (2 epochs, 48x48... rounded to 64)."""
    root = tmp_path_factory.mktemp("proj")
    cfg = root / "configs"
    (cfg / "datasets").mkdir(parents=True)
    (cfg / "architectures").mkdir()
    (cfg / "global.yaml").write_text((REPO / "configs" / "global.yaml").read_text())
    ds = yaml.safe_load((REPO / "configs" / "datasets" / "synthetic.yaml").read_text())
    ds["data"]["root"] = str(root / "datasets" / "synthetic")
    ds["data"]["prepare"]["options"] = {"n_samples": 40, "seed": 0}
    ds["data"]["input_size"] = [64, 64]
    (cfg / "datasets" / "synthetic.yaml").write_text(yaml.safe_dump(ds))
    (cfg / "architectures" / "unet_r18.yaml").write_text((REPO / "configs" / "architectures" / "unet_r18.yaml").read_text())
    study = {"study": "tiny", "run_root": str(root / "runs"), "datasets": ["synthetic"], "architectures": ["unet_r18"],
             "overrides": {"train": {"epochs": 2, "batch_size": 8}, "evaluation": {"checkpoint": "both"}}}
    (cfg / "study.yaml").write_text(yaml.safe_dump(study))
    return cfg / "study.yaml"


def test_run_evaluate_reaggregate_chain(tiny_study: Path):
    r = msb("run", str(tiny_study))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "global-micro" in r.stdout or "Dice" in r.stdout
    study_dir = tiny_study.parents[1] / "runs" / "tiny"
    run_dirs = [p for p in study_dir.iterdir() if p.is_dir()]
    assert len(run_dirs) == 1
    rd = run_dirs[0]
    for f in ["config.yaml", "config.sha256", "split.csv", "manifest.json", "train_log.csv",
              "checkpoints/best.pt", "checkpoints/latest.pt", "checkpoints/records.json",
              "evaluation/best/counts.parquet", "evaluation/latest/counts.parquet"]:
        assert (rd / f).is_file(), f
    counts = pd.read_parquet(rd / "evaluation" / "best" / "counts.parquet")
    split = pd.read_csv(rd / "split.csv")
    n_test = int((split["split"] == "test").sum())
    assert len(counts) == n_test and n_test > 0
    assert set(counts["checkpoint_role"]) == {"best"} and (counts["config_hash"] ==
                                                          (rd / "config.sha256").read_text().strip()).all()
    assert ((counts.tp + counts.fp + counts.fn + counts.tn) == counts.height * counts.width).all()
    assert len(list((rd / "evaluation" / "best" / "predictions").glob("*.npz"))) == n_test
    assert (study_dir / "scores.csv").is_file()

    # rerun = resume: nothing trained or evaluated again
    r2 = msb("run", str(tiny_study))
    assert r2.returncode == 0, r2.stderr
    assert "already finished" in r2.stdout and "already done" in r2.stdout

    # reaggregate from stored counts alone
    out = tiny_study.parent / "scores_out"
    r3 = msb("reaggregate", str(study_dir), "--out", str(out))
    assert r3.returncode == 0, r3.stderr
    scores = pd.read_csv(out / "scores.csv")
    assert set(scores["aggregation"]) == {"global-micro", "image-macro", "class-macro"}
    assert set(scores["checkpoint_role"]) == {"best", "latest"}


def test_user_errors_are_one_line(tmp_path: Path, tiny_study: Path):
    bad = tmp_path / "configs"
    bad.mkdir()
    (bad / "global.yaml").write_text("train: {epochz: 3}\n")
    (bad / "study.yaml").write_text("study: x\ndatasets: [a]\narchitectures: [b]\n")
    r = msb("generate", str(bad / "study.yaml"))
    assert r.returncode == 2
    err = r.stderr.strip()
    assert "Traceback" not in err and "global.yaml" in err and "train.epochz" in err and "train.epochs" in err
    r = msb("evaluate", str(tmp_path / "nope"))
    assert r.returncode == 2 and "nope: no such folder" in r.stderr and "Traceback" not in r.stderr
    (tmp_path / "empty").mkdir()
    r = msb("evaluate", str(tmp_path / "empty"))
    assert r.returncode == 2 and "not a run folder (no config.yaml)" in r.stderr
    r = msb("nosuchcommand")
    assert r.returncode == 2 and "No such command" in r.stderr and "Traceback" not in r.stderr
    r = msb("reaggregate", str(tmp_path / "missing.parquet"))
    assert r.returncode == 2 and "missing.parquet" in r.stderr
    r = msb("--debug", "reaggregate", str(tmp_path / "missing.parquet"))
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.slow
def test_kvasir_ci_variant(shared_dir: Path, tmp_path: Path):
    """The CI variant of configs/studies/kvasir_unet_cpu.yaml: converter + chain + artifacts on real data."""
    if not (shared_dir / "data" / "kvasir-seg" / "images").is_dir():
        pytest.skip("../shared/data/kvasir-seg not found")
    r = msb("run", "configs/studies/kvasir_unet_ci.yaml", "--run-root", str(tmp_path / "runs"))
    assert r.returncode == 0, r.stdout + r.stderr
    counts_files = list((tmp_path / "runs" / "kvasir_unet_ci").glob("*/evaluation/best/counts.parquet"))
    assert len(counts_files) == 1
    df = pd.read_parquet(counts_files[0])
    assert len(df) == 16 and set(df["dataset"]) == {"kvasir_seg"}
    # native resolution: Kvasir images are at least 332 px wide
    assert (df["width"] >= 332).all() and (df["reference"] > 0).all()
    metrics = counts_files[0].parent / "metrics.parquet"
    assert metrics.is_file() and len(pd.read_parquet(metrics)) == 16


def test_ctrl_c_exits_130_and_rerun_resumes(tiny_study: Path, tmp_path: Path):
    """SIGINT during training: 'aborted', exit status 130; the rerun continues from the last finished epoch."""
    import signal
    import time

    study = yaml.safe_load(tiny_study.read_text())
    study.update({"study": "interrupt", "run_root": str(tmp_path / "runs"),
                  "overrides": {"train": {"epochs": 50, "batch_size": 8}}})
    path = tiny_study.parent / "interrupt.yaml"
    path.write_text(yaml.safe_dump(study))
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.Popen([sys.executable, "-m", "msb", "run", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list((tmp_path / "runs").glob("interrupt/*/state/train_state.pt")):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    assert "aborted" in err and "Traceback" not in err
    log_lines = (next((tmp_path / "runs").glob("interrupt/*/train_log.csv"))).read_text().splitlines()
    done = len(log_lines) - 1
    assert 1 <= done < 50
    # the rerun resumes (the same config: the epoch budget is part of the hash); stop it quickly again
    proc = subprocess.Popen([sys.executable, "-m", "msb", "run", str(path)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while len(next((tmp_path / "runs").glob("interrupt/*/train_log.csv")).read_text().splitlines()) - 1 <= done:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130
    # train_log.csv is written just before the resume state, so the state may lag the log by one epoch
    assert f"resuming from epoch {done + 1}" in out or f"resuming from epoch {done}" in out
