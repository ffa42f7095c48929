"""``msb metrics`` on an external evaluation (``evaluation/external/<name>`` and one role below it) and on a fold
ensemble folder, after a tiny 2-fold study with an external set. The run configs ask for the medpy HD
convention, so every HD95 of two non-empty masks must equal ``medpy.metric.binary.hd95`` on the stored
prediction and reference (``pred``, ``ref``, ``spacing`` of each ``predictions/<id>.npz``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msb.errors import MSBError
from msb.evaluation.metrics_target import resolve_metrics_target
from msb.study.pipeline import run_study
from msb.utils.digests import read_digests
from msb.utils.hashing import sha256_file

STUDY = {
    "study": "mt",
    "cross_validation": {"k": 2, "group_column": "group"},
    "final": {"checkpoint": "best", "test_split": "test",
              "external": [{"dataset": "synth_ext", "name": "ext", "class_map": {"polyp": ["polyp"]}}]},
    "overrides": {"evaluation": {"compute_metrics": False, "metrics": {"hd_convention": "medpy"}}},
}


@pytest.fixture(scope="module")
def cv_study(tmp_path_factory, make_project):
    root = tmp_path_factory.mktemp("mt")
    run_study(make_project(root, STUDY, n_samples=20, ext_samples=5), log=lambda _: None)
    sdir = root / "runs" / "mt"
    folds = sorted(d for d in sdir.iterdir() if (d / "fold.json").is_file())
    (ens,) = [d for d in sdir.iterdir() if d.name.endswith("-ensemble")]
    assert len(folds) == 2 and not list(sdir.rglob("metrics.parquet"))
    return root, folds, ens


def _check_hd95_against_medpy(eval_dir: Path) -> int:
    """Every non-empty pair's HD95 in ``eval_dir/metrics.parquet`` = medpy's on the stored npz; the digest is
    recorded. Returns the number of pairs checked."""
    from medpy.metric.binary import hd95

    m = pd.read_parquet(eval_dir / "metrics.parquet")
    counts = pd.read_parquet(eval_dir / "counts.parquet")
    assert sorted(m["image_id"]) == sorted(counts["image_id"]) and set(m["hd_convention"]) == {"medpy"}
    assert read_digests(eval_dir).files["metrics.parquet"] == sha256_file(eval_dir / "metrics.parquet")
    n = 0
    for row in m.itertuples():
        with np.load(eval_dir / "predictions" / f"{row.image_id}.npz") as z:
            c = list(z["class_ids"]).index(row.class_id)
            pred, ref, spacing = z["pred"][c], z["ref"][c], tuple(z["spacing"])
        if pred.any() and ref.any():
            assert row.hd95 == pytest.approx(hd95(pred, ref, voxelspacing=spacing), rel=1e-9, abs=1e-9)
            n += 1
        else:
            assert row.empty_case != "none"
    return n


def _metrics_in_process(target: Path) -> str:
    """``msb metrics TARGET`` through the typer app in this process (no interpreter start-up); its output."""
    from typer.testing import CliRunner

    from msb.cli.app import app

    r = CliRunner().invoke(app, ["metrics", str(target)])
    assert r.exit_code == 0, (r.output, r.exception)
    return r.output


def test_metrics_on_external_set_and_one_role(cv_study):
    _, folds, _ = cv_study
    ext = folds[0] / "evaluation" / "external" / "ext"
    _metrics_in_process(ext)
    assert sorted(p.relative_to(folds[0]) for p in folds[0].rglob("metrics.parquet")) == [
        Path("evaluation/external/ext/best/metrics.parquet")]  # only the external set, not the test split
    n = _check_hd95_against_medpy(ext / "best")
    _metrics_in_process(folds[1] / "evaluation" / "external" / "ext" / "best")
    n += _check_hd95_against_medpy(folds[1] / "evaluation" / "external" / "ext" / "best")
    assert n >= 3


def test_metrics_on_ensemble_folder(cv_study):
    _, folds, ens = cv_study
    assert "hd95" in _metrics_in_process(ens)  # the summary tables are printed
    written = sorted(p.parent.relative_to(ens) for p in ens.rglob("metrics.parquet"))
    assert written == [Path("evaluation/best"), Path("evaluation/external/ext/best")]
    assert sum(_check_hd95_against_medpy(ens / d) for d in written) >= 3
    m = pd.read_parquet(ens / "evaluation" / "best" / "metrics.parquet")
    assert set(m["model"]) == {"unet-ensemble2"} and set(m["fold"]) == {-1}


def test_metrics_target_resolution_and_refusals(cv_study, tmp_path):
    _, folds, ens = cv_study
    t = resolve_metrics_target(ens / "evaluation" / "external")
    assert t.kind == "ensemble" and t.config_file == folds[0] / "config.yaml"
    assert t.eval_dirs == (ens / "evaluation" / "external" / "ext" / "best",)
    t = resolve_metrics_target(folds[1])
    assert t.kind == "run" and [d.relative_to(folds[1]).as_posix() for d in t.eval_dirs] == [
        "evaluation/best", "evaluation/external/ext/best"]
    with pytest.raises(MSBError, match=r"not a run folder \(no config.yaml\), not an ensemble folder"):
        resolve_metrics_target(tmp_path)
    with pytest.raises(MSBError, match=r"checkpoints: inside .*fold0 but not under its evaluation/ folder"):
        resolve_metrics_target(folds[0] / "checkpoints")
