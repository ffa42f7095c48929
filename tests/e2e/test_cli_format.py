"""`--format table|csv|json|markdown` of the result tables: csv by default when stdout is not a terminal (no
table wrapped mid-word in a pipe), values equal to the Dice computed by hand from the stored counts."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "analysis"))
from test_report import _two_system_study  # noqa: E402


def _msb(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="80")
    env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def test_reaggregate_formats_when_piped(tmp_path: Path):
    rng = np.random.default_rng(2)
    ref = rng.integers(30, 300, 6)
    tp = np.floor(ref * rng.uniform(0.3, 0.95, (2, 6))).astype(np.int64)
    fp = rng.integers(0, 60, (2, 6))
    a, b = (np.stack([tp[k], fp[k], ref - tp[k]], 1) for k in (0, 1))
    study = _two_system_study(tmp_path, a, b)
    expected = {f"ds-sys{n}": 2 * c[:, 0].sum() / (2 * c[:, 0].sum() + c[:, 1].sum() + c[:, 2].sum())
                for n, c in (("A", a), ("B", b))}

    r = _msb("reaggregate", str(study))  # stdout is a pipe: csv
    assert r.returncode == 0, r.stderr
    csv = pd.read_csv(io.StringIO(r.stdout))
    assert len(csv) == 2 and "│" not in r.stdout
    for run_id, v in expected.items():
        assert csv.loc[csv["run_id"] == run_id, "dice_global-micro"].iloc[0] == pytest.approx(v, rel=1e-12)

    r = _msb("reaggregate", str(study), "--format", "json")
    rows = {d["run_id"]: d for d in json.loads(r.stdout)}
    assert rows["ds-sysB"]["dice_global-micro"] == pytest.approx(expected["ds-sysB"], rel=1e-12)

    r = _msb("reaggregate", str(study), "--format", "markdown")
    lines = r.stdout.splitlines()
    assert lines[0] == "**Scores**" and all(ln.startswith("|") for ln in lines[2:6])

    r = _msb("reaggregate", str(study), "--format", "xml")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: --format must be one of table, csv, json, markdown, not 'xml'"]


def test_help_shows_no_bool_type_on_flags():
    r = _msb("run", "--help")
    assert r.returncode == 0 and "--worker" in r.stdout and "--wait" in r.stdout
    assert "<bool>" not in r.stdout and "<str>" in r.stdout  # value options keep their type


def test_models_lists_the_architecture_configs():
    """In-process (typer's CliRunner; the catalogue's content is checked here, a real piped ``msb models`` process
    in tests/e2e/test_cli_formats_pipes.py)."""
    import yaml
    from typer.testing import CliRunner

    from msb.cli.app import app

    r = CliRunner().invoke(app, ["models", "--format", "csv", "--configs", str(REPO / "configs")])
    assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)
    shown = pd.read_csv(io.StringIO(r.stdout.split("registry adapters:")[0])).set_index("config")
    names = sorted(p.stem for p in (REPO / "configs" / "architectures").glob("*.yaml"))
    assert sorted(shown.index) == names
    unet = yaml.safe_load((REPO / "configs" / "architectures" / "unet_r18.yaml").read_text())["model"]
    assert (shown.loc["unet_r18", "adapter"], shown.loc["unet_r18", "encoder"]) == (unet["arch"], unet["encoder"])
    b2 = yaml.safe_load((REPO / "configs" / "architectures" / "segformer_b2.yaml").read_text())
    assert shown.loc["segformer_b0", "input_size"] == "x".join(map(str, b2["data"]["input_size"]))  # via _base_
