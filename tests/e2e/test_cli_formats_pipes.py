"""Issue 30, "output that fits pipes": every command that prints a result table writes CSV when stdout is a pipe
(stdout pure data, status lines on stderr) and the same values with ``--format json``; ``msb weights list`` lists
every shipped architecture config; a missing path is named as missing; the LEGACY six-metric Markdown table keeps
one line per row.

Cheap inputs only: counts written by hand, the planted audit dataset, a 32 px profile, and one module-scoped
2-epoch tiny run (about 30 s) for the commands that need a checkpoint or stored predictions.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_C = _load("_study_conftest_pipes", REPO / "tests" / "study" / "conftest.py")
STUDY: dict[str, Any] = {"study": "s", "overrides": {"train": {"epochs": 2}}}


def _msb(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """``python -m msb ARGS`` with stdout and stderr pipes (not a terminal), 80 columns."""
    env = dict(_C.msb_env(), COLUMNS="80")
    env.pop("FORCE_COLOR", None)
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def _same_cell(a, b) -> bool:
    missing = (lambda v: v is None or (isinstance(v, float) and math.isnan(v)))
    if missing(a) or missing(b):
        return missing(a) and missing(b)
    if isinstance(a, (int, float, np.number)) and isinstance(b, (int, float, np.number)):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=1e-15)
    return str(a) == str(b)


def _csv_and_json(*args: str, cwd: Path = REPO, unstable: tuple[str, ...] = (),
                  runs: list | None = None) -> pd.DataFrame:
    """Run ``msb ARGS`` piped (default format: csv) and with ``--format json``; both exit 0, stdout parses, and
    they hold the same columns, rows and values (numbers equal; ``unstable`` columns, e.g. timings, only
    present). Returns the CSV frame; the piped (csv) CompletedProcess is appended to ``runs`` when given."""
    r = _msb(*args, cwd=cwd)
    if runs is not None:
        runs.append(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "│" not in r.stdout and "┃" not in r.stdout  # no rich box table in a pipe
    csv = pd.read_csv(io.StringIO(r.stdout))
    rj = _msb(*args, "--format", "json", cwd=cwd)
    assert rj.returncode == 0, rj.stdout + rj.stderr
    records = json.loads(rj.stdout)  # the whole stdout is one JSON document: no status line in it
    assert isinstance(records, list) and len(records) == len(csv) > 0
    assert list(records[0]) == list(csv.columns)
    for k, rec in enumerate(records):
        for col in csv.columns:
            if col not in unstable:
                assert _same_cell(csv[col].iloc[k], rec[col]), (k, col, csv[col].iloc[k], rec[col])
    return csv


def _scores_check(csv: pd.DataFrame) -> None:
    assert {"n_images", "dice_global-micro", "dice_image-macro", "iou_global-micro"} <= set(csv.columns)
    assert csv["dice_global-micro"].dtype.kind == "f"  # raw numbers, not formatted strings


# --------------------------------------------------------------------------------------------- no training


def test_weights_list_every_shipped_config(tmp_path: Path):
    configs = sorted(p.stem for p in (REPO / "configs" / "architectures").glob("*.yaml"))
    csv = _csv_and_json("weights", "list", "--configs", "configs", "--cache", str(tmp_path / "hf"))
    # one row per published file; at least one row per config, and exactly one for a config without weights
    assert sorted(csv["config"].unique()) == configs
    none = csv[csv["repo / file"].str.startswith("none published")]
    assert "unet_mnv3s075" in set(none["config"]) and none["config"].is_unique
    assert set(csv.loc[~csv["config"].isin(none["config"]), "library"]) <= {"timm", "smp"}


def test_models_stdout_is_pure_data():
    runs: list = []
    csv = _csv_and_json("models", runs=runs)  # the piped run of `msb models` is checked for its stderr too
    (r,) = runs
    assert r.returncode == 0 and "registry adapters:" in r.stderr and "registry adapters:" not in r.stdout
    assert sorted(csv["config"]) == sorted(p.stem for p in (REPO / "configs" / "architectures").glob("*.yaml"))


def test_profile_formats(tmp_path: Path):
    csv = _csv_and_json("profile", "--arch", "unet_tiny", "--input-size", "32", "--warmup", "0", "--timed-passes",
                        "1", "--repeats", "1", "--out", str(tmp_path / "prof"),
                        unstable=("latency ms (median)", "latency ms (SD)", "images/s", "peak MiB"))
    assert list(csv.columns) == ["model", "input", "precision", "params (M)", "GMACs", "GMACs attention",
                                 "GMACs calflops", "latency ms (median)", "latency ms (SD)", "images/s", "peak MiB", "status"]
    assert csv["input"].tolist() == ["32x32"] and csv["params (M)"].dtype.kind == "f"


def _pool_study(root: Path) -> Path:
    """A study folder of pool runs (pools a, b; seeds 0, 1) with hand-written counts (6 images, one class)."""
    from msb.evaluation.counts import counts_rows, write_counts

    rng = np.random.default_rng(5)
    study = root / "runs" / "pools"
    for pool in ("a", "b"):
        for seed in (0, 1):
            rd = study / f"{pool}{seed}"
            rd.mkdir(parents=True)
            (rd / "config.yaml").write_text(yaml.safe_dump({"study": "pools", "random_seed": seed,
                                                            "data": {"name": "ds", "pool": {"name": pool}}}))
            tp = rng.integers(20, 80, (6, 1)).astype(np.int64)
            fp, fn = (rng.integers(0, 30, (6, 1)).astype(np.int64) for _ in range(2))
            c = {"tp": tp, "fp": fp, "fn": fn, "tn": 4096 - tp - fp - fn, "intersection": tp, "reference": tp + fn,
                 "predicted": tp + fp, "union": tp + fp + fn}
            ctx = dict(dataset="ds", split="test", fold=-1, run_id=rd.name, model="unet", checkpoint_role="best",
                       checkpoint_sha256="a" * 64, config_hash="b" * 64, threshold=0.5, threshold_on="probability")
            write_counts(counts_rows(ctx, c, image_ids=[f"i{k}" for k in range(6)], class_ids=[1],
                                     class_names=["lesion"], heights=64, widths=64),
                         rd / "evaluation" / "best" / "counts.parquet")
    return study


def test_contrasts_formats(tmp_path: Path):
    study = _pool_study(tmp_path)
    csv = _csv_and_json("contrasts", str(study), "--pair", "a:b", "--n-boot", "20", "--out", str(tmp_path / "c"))
    written = pd.read_csv(tmp_path / "c" / "contrasts.csv")
    assert list(csv.columns) == list(written.columns) and len(csv) == len(written)
    assert csv["mean_diff"].to_numpy() == pytest.approx(written["mean_diff"].to_numpy(), rel=1e-12)


def test_audit_census_formats(tmp_path: Path):
    planted = _load("_audit_conftest_pipes", REPO / "tests" / "audit" / "conftest.py").build_planted(tmp_path / "ds")
    csv = _csv_and_json("audit", str(planted), "--out", str(tmp_path / "audit"))
    assert csv.columns[0] == "relation" and "crossing rows denominator" in csv.columns
    assert csv["crossing rows denominator"].dtype.kind in "if"  # numbers, not "count / denominator" strings


@pytest.mark.parametrize("args", [("reaggregate",), ("reaggregate", "--rules", "all"), ("metrics",),
                                  ("evaluate",), ("audit",), ("report",), ("explain", "--images", "x")])
def test_a_missing_path_is_named(tmp_path: Path, args: tuple[str, ...]):
    missing = tmp_path / "no" / "such" / "folder"
    r = _msb(args[0], str(missing), *args[1:])
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and str(missing) in lines[0], r.stderr
    if args[0] == "reaggregate":
        assert "does not exist" in lines[0] and "counts file not found" not in lines[0]


# ----------------------------------------------------------------------------------- one tiny trained run


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A project root holding one trained and evaluated 2-epoch run (runs/s/<run>); ``msb run`` in-process (the
    tests below pipe the commands that read the run, not the training)."""
    root = tmp_path_factory.mktemp("pipes")
    study = _C.write_project(root, STUDY, data_root=root / "data")
    r = _C.run_msb_in_process("run", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    return root


def _run_dir(root: Path) -> Path:
    runs = [d for d in (root / "runs" / "s").iterdir() if d.is_dir() and not d.name.startswith(("_", "."))]
    assert len(runs) == 1, runs
    return runs[0]


def test_evaluate_formats(trained: Path):
    run = _run_dir(trained)
    csv = _csv_and_json("evaluate", str(run), "--force")
    _scores_check(csv)
    stored = pd.read_parquet(run / "evaluation" / "best" / "counts.parquet")
    tp, fp, fn = (int(stored[c].sum()) for c in ("tp", "fp", "fn"))
    assert csv["dice_global-micro"].iloc[0] == pytest.approx(2 * tp / (2 * tp + fp + fn), rel=1e-12)


def test_metrics_formats(trained: Path):
    run = _run_dir(trained)
    csv = _csv_and_json("metrics", str(run))
    assert csv.columns[0] == "metrics_file" and {"metric", "value"} <= set(csv.columns)
    assert any(str(m).startswith("hd95_") for m in csv["metric"])


def test_explain_formats(trained: Path, tmp_path: Path):
    run = _run_dir(trained)
    image = str(pd.read_parquet(run / "evaluation" / "best" / "counts.parquet")["image_id"].iloc[0])
    csv = _csv_and_json("explain", str(run), "--images", image, "--device", "cpu", "--out", str(tmp_path / "x"))
    assert list(csv.columns) == ["model_group", "image_id", "run", "class_name", "target_region", "image_split",
                                 "cam_mean", "pred_area_px"]
    assert image in csv["image_id"].astype(str).tolist()


def test_score_formats_and_legacy_markdown_rows_whole(trained: Path, tmp_path: Path):
    """The dataset's own masks scored as binary predictions (Dice 1); ``--legacy`` Markdown rows are one line."""
    ds = trained / "data" / "synthetic"
    index = pd.read_csv(ds / "index.csv")
    pred = tmp_path / "pred"
    pred.mkdir()
    for sid, mask in zip(index["sample_id"], index["mask_path"]):
        (pred / f"{sid}.png").write_bytes((ds / mask).read_bytes())
    args = ("score", str(pred), "--dataset", str(ds), "--semantics", "binary")
    csv = _csv_and_json(*args, "--out", str(tmp_path / "scored"), "--force")
    _scores_check(csv)
    assert csv["dice_global-micro"].iloc[0] == pytest.approx(1.0)
    for fmt in ("markdown", "table"):
        r = _msb(*args, "--legacy", "--out", str(tmp_path / f"legacy_{fmt}"), "--format", fmt)
        assert r.returncode == 0, r.stdout + r.stderr
        rows = [ln for ln in r.stdout.splitlines() if ln.startswith("|")]
        assert rows and all(ln.rstrip().endswith("|") for ln in rows), r.stdout
        assert max(len(ln) for ln in rows) > 80 or fmt == "markdown"  # wider than the terminal, still one line
