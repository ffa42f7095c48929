"""CI smoke test of the benchmark scripts (``scripts/bench_*.py --quick``).

Each script is run as ``make bench`` runs it (a subprocess, tiny sizes) and must exit 0; its JSON rows must
show every side timed and the value check passed: ours equal to the competitors' values, which come from
independent implementations (a plain NumPy loop and ``scipy.stats.bootstrap``; a pandas groupby script;
NumPy ``bitwise_count`` and ``faiss`` range search; medpy and MONAI for HD95/NSD). The metrics benchmark
(torch + MONAI import), the evaluation and the training benchmark (they train a U-Net) are marked slow.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(script: str, tmp_path: Path, *extra: str) -> list[dict]:
    out = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--quick", "--json", str(out), *extra],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = json.loads(out.read_text())
    for row in rows:
        assert row["equal"], row
        assert "ours" in row["sides"] and len(row["sides"]) >= 2, row
        assert row["ratio"] > 0
    return rows


def test_bench_analysis_quick(tmp_path: Path) -> None:
    rows = _run("bench_analysis.py", tmp_path)
    works = [r["work"] for r in rows]
    assert any("global-micro" in w for w in works) and any("image-macro" in w for w in works)
    assert any(w.startswith("reaggregate") for w in works)
    assert any(w.startswith("rank distributions") for w in works) and any(w.startswith("calibration") for w in works)
    boot = [r for r in rows if r["work"].startswith("bootstrap")]
    assert all({"plain NumPy loop", "scipy.stats.bootstrap"} <= set(r["sides"]) for r in boot)


def test_bench_audit_quick(tmp_path: Path) -> None:
    rows = _run("bench_audit.py", tmp_path)
    search = rows[0]
    assert "NumPy bitwise_count chunks" in search["sides"]
    assert search["check"].startswith("500 pairs")  # 5,000 hashes: every 10th planted copy, none by chance


@pytest.mark.slow  # imports torch + MONAI (~10 s) and runs MONAI's HD95 on real pairs
def test_bench_metrics_quick(tmp_path: Path, shared_dir: Path) -> None:
    rows = _run("bench_metrics.py", tmp_path)
    assert len(rows) == 2 and all("medpy hd95" in r["sides"] for r in rows)


@pytest.mark.slow  # trains a U-Net for one epoch, then evaluates 16 images twice
def test_bench_eval_quick(tmp_path: Path) -> None:
    rows = _run("bench_eval.py", tmp_path)
    assert rows[0]["check"].startswith("16 of 16 ")
    assert "identical TP/FP/FN (exact) in 16 (0 differing" in rows[0]["check"]  # bit-identical forward


@pytest.mark.slow
def test_bench_train_quick(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_train.py"), "--quick"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "value check: images per epoch, trainer 16, bare loop 16: EQUAL" in p.stdout


def test_reaggregate_path_does_not_import_torch() -> None:
    code = ("import sys; import msb.cli; from msb.analysis.counts import aggregate, counts_io, rules; "
            "from msb.analysis.stats import bootstrap; "
            "import msb.audit.search; print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"
