"""Threshold analysis on a quickstart-like tiny run: the threshold is chosen on stored selection-split maps, and the
test counts of the new evaluation role equal re-thresholding the stored test probabilities by hand; msb run's
leaderboard ranks it beside the declared threshold, with the verdict line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import pandas as pd

from msb.config.layering import load_yaml
from msb.config.schema import RunConfig
from msb.data.splits import read_split_file
from msb.engine.runner import ensure_dataset
from msb.evaluation.evaluator import ExternalTarget, evaluate_checkpoint


def _store_selection_maps(run_dir):
    """Evaluate the run's best checkpoint on its own selection split into evaluation/selection/best (the way a
    user keeps selection-split maps today: the run's dataset as an external target)."""
    cfg = RunConfig.model_validate(load_yaml(run_dir / "config.yaml"))
    ds = ensure_dataset(cfg)
    split = read_split_file(run_dir / "split.csv")
    ids = [s for s, sp in split.items() if sp == cfg.checkpoint.selection_split]
    ext = ExternalTarget(ds, cfg.data.name, cfg.checkpoint.selection_split, ids,
                         {c.class_id: (c.class_id,) for c in ds.foreground_classes},
                         run_dir / "evaluation" / "selection" / "best")
    evaluate_checkpoint(run_dir, cfg, ds, "best", run_dir.name, (run_dir / "config.sha256").read_text().strip(),
                        external=ext)


@pytest.mark.slow
def test_threshold_role_counts_equal_hand_rethresholding(tmp_path, make_project, msb_cli):
    study = make_project(tmp_path, {"study": "thr", "architectures": ["unet_tiny", "unet_tiny"],
                                    "overrides": {"evaluation": {"compute_metrics": False}}})
    study.write_text(study.read_text().replace("- unet_tiny\n- unet_tiny\n", "- unet_tiny\n"))
    res = msb_cli("run", str(study))
    assert res.returncode == 0, res.stderr[-2000:]
    run_dir = next((tmp_path / "runs" / "thr").glob("*/config.yaml")).parent
    _store_selection_maps(run_dir)
    res = msb_cli("reaggregate", str(tmp_path / "runs" / "thr"), "--analyses", "threshold,calibration")
    assert res.returncode == 0, res.stderr[-2000:]
    info = json.loads((run_dir / "evaluation" / "best-threshold" / "threshold.json").read_text())
    t = info["chosen_threshold"]
    # the choice by hand: image-macro Dice of the stored selection maps at every threshold of the grid
    sel = sorted((run_dir / "evaluation" / "selection" / "best" / "predictions").glob("*.npz"))
    best, best_t = -1.0, None
    for th in sorted(set(info["grid"]), key=lambda x: (abs(x - 0.5), x)):
        d = []
        for f in sel:
            with np.load(f) as z:
                p, r = z["prob"][0] / 255.0 >= th, z["ref"][0]
            den = 2 * (p & r).sum() + (p & ~r).sum() + (~p & r).sum()
            if den:
                d.append(2 * (p & r).sum() / den)
        if np.mean(d) > best + 1e-15:
            best, best_t = np.mean(d), th
    assert t == best_t
    new = pd.read_parquet(run_dir / "evaluation" / "best-threshold" / "counts.parquet").set_index("image_id")
    assert set(new["checkpoint_role"]) == {"best-threshold"} and set(new["threshold"]) == {t}
    for f in sorted((run_dir / "evaluation" / "best" / "predictions").glob("*.npz")):
        with np.load(f) as z:
            p, r = z["prob"][0] / 255.0 >= t, z["ref"][0]
        row = new.loc[f.stem]
        assert (row["tp"], row["fp"], row["fn"], row["tn"]) == ((p & r).sum(), (p & ~r).sum(), (~p & r).sum(),
                                                                (~p & ~r).sum())
    summary = pd.read_csv(tmp_path / "runs" / "thr" / "posthoc" / "threshold.csv")
    assert summary["chosen_threshold"].iloc[0] == t and summary["selection_split"].iloc[0] == "val"
    # the new role is an evaluation like any other: plain reaggregate scores it, the leaderboard ranks it
    res = msb_cli("reaggregate", str(tmp_path / "runs" / "thr"))
    assert res.returncode == 0 and "best-threshold" in res.stdout
    from msb.analysis.counts.counts_io import read_counts
    from msb.analysis.report.leaderboard import study_leaderboards

    lb = {(b.dataset, b.split): b for b in study_leaderboards(read_counts([tmp_path / "runs" / "thr"]))}
    assert lb[("synthetic", "test")].verdict.startswith("Verdict: ")
    assert "image bootstrap replicates (image-macro Dice, higher is better)" in lb[("synthetic", "test")].verdict
    assert set(lb[("synthetic", "test")].ranks["system"]) == {f"{run_dir.name.split('-', 1)[1]}@best",
                                                              f"{run_dir.name.split('-', 1)[1]}@best-threshold"}
