"""Fixtures for the study tests: a throw-away project (configs + tiny synthetic datasets), a CLI runner.

Training settings are tiny (32x32 synthetic frames, a ~0.3 M-parameter U-Net with a MobileNetV3-small-0.5
encoder, 1-2 epochs) and every training process uses one thread: on a shared 2-core machine several
OpenMP threads per process make CPU training tens of times slower.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]

TINY_ARCH = {"model": {"arch": "unet", "encoder": "tu-mobilenetv3_small_050", "encoder_weights": None,
                       "params": {"decoder_channels": [16, 8, 8, 8, 8]}}}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """In-process training with one thread (restored after the module)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def write_project(root: Path, study: dict[str, Any], n_samples: int = 24, ext_samples: int = 6,
                  data_root: Path | None = None) -> Path:
    """Write ``root/configs`` (global, datasets ``synthetic`` and ``synth_ext``, architecture ``unet_tiny``) and
    the study file ``root/configs/study.yaml`` (``run_root`` = ``root/runs`` unless given). Returns the study
    file. Datasets are prepared on first use under ``data_root`` (default ``root/datasets``); two projects that
    share ``data_root`` generate the same run configs and run ids."""
    data_root = data_root or root / "datasets"
    cfg = root / "configs"
    (cfg / "datasets").mkdir(parents=True, exist_ok=True)
    (cfg / "architectures").mkdir(exist_ok=True)
    (cfg / "global.yaml").write_text((REPO / "configs" / "global.yaml").read_text())
    (cfg / "datasets" / "synthetic.yaml").write_text(yaml.safe_dump({"data": {
        "name": "synthetic", "root": str(data_root / "synthetic"),
        "prepare": {"converter": "synthetic",
                    "options": {"n_samples": n_samples, "seed": 0, "size": [32, 32], "n_groups": 8,
                                "empty_fraction": 0.25}},
        "split": {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.25, "seed": 0, "group_column": "group"},
        "input_size": [32, 32]}}))
    (cfg / "datasets" / "synth_ext.yaml").write_text(yaml.safe_dump({"data": {
        "name": "synth_ext", "root": str(data_root / "synth_ext"),
        "prepare": {"converter": "synthetic", "options": {"n_samples": ext_samples, "seed": 7, "size": [40, 40]}}}}))
    (cfg / "architectures" / "unet_tiny.yaml").write_text(yaml.safe_dump(TINY_ARCH))
    study = {"run_root": str(root / "runs"), "datasets": ["synthetic"], "architectures": ["unet_tiny"], **study}
    study.setdefault("overrides", {})
    ov = study["overrides"]
    ov.setdefault("full_determinism", True)
    ov.setdefault("train", {}).update({k: v for k, v in {"epochs": 1, "batch_size": 8, "device": "cpu"}.items()
                                       if k not in ov["train"]})
    ov.setdefault("evaluation", {}).setdefault("compute_metrics", False)
    path = cfg / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def make_project() -> Callable[..., Path]:
    """:func:`write_project`."""
    return write_project


def msb_env() -> dict[str, str]:
    """Environment of ``msb`` subprocesses: offline, one thread, wide console."""
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", COLUMNS="200",
                PYTHONUNBUFFERED="1")


def run_msb(*args: str, timeout: int = 600, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m msb ARGS`` (captured)."""
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=cwd, env=msb_env(), capture_output=True,
                          text=True, timeout=timeout)


def run_msb_in_process(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``msb ARGS`` in this process (typer's CliRunner through the same typer app as the ``msb`` command; one torch
    thread as :func:`msb_env` gives a subprocess; working folder ``cwd`` during the call), for fixtures that only
    need what a command writes (a trained run), not the process: no interpreter start-up and no torch/timm/smp
    import per call. Returns a CompletedProcess (returncode = the exit code; 1 with the traceback on stderr when
    the command raised)."""
    import traceback

    from typer.testing import CliRunner

    from msb.cli.app import app

    n, before = torch.get_num_threads(), Path.cwd()
    torch.set_num_threads(1)
    try:
        os.chdir(cwd)
        r = CliRunner().invoke(app, list(args), env={"HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    finally:
        os.chdir(before)
        torch.set_num_threads(n)
    err = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        err += "".join(traceback.format_exception(r.exception))
    return subprocess.CompletedProcess(["msb", *args], r.exit_code, r.stdout, err)


def popen_msb(*args: str, log: Path, cwd: Path = REPO) -> subprocess.Popen:
    """Start ``python -m msb ARGS`` in the background, stdout+stderr to ``log``."""
    f = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "msb", *args], cwd=cwd, env=msb_env(), stdout=f,
                            stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def msb_cli() -> Callable[..., subprocess.CompletedProcess]:
    """:func:`run_msb`."""
    return run_msb


@pytest.fixture(scope="session")
def msb_popen() -> Callable[..., subprocess.Popen]:
    """:func:`popen_msb`."""
    return popen_msb
