"""Threshold analysis through the ordinary pipeline: a tiny study whose ``analyses:`` names ``threshold`` makes
``msb run`` keep selection-split maps (``evaluation/selection/<role>/``, in no leaderboard) and write the
``best-threshold`` evaluation; the threshold equals a hand argmax over the stored selection maps and the new role's
test counts equal re-thresholding the stored test probabilities by hand. Without the selection maps,
``msb reaggregate --analyses threshold`` names the ``msb evaluate ... --selection`` command that stores them."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest


def _hand_dice(files, th):
    """Image-macro Dice (images with an empty reference and prediction left out) of maps thresholded at th."""
    d = []
    for f in files:
        with np.load(f) as z:
            p, r = z["prob"][0] / 255.0 >= th, z["ref"][0]
        den = 2 * (p & r).sum() + (p & ~r).sum() + (~p & r).sum()
        if den:
            d.append(2 * (p & r).sum() / den)
    return float(np.mean(d))


@pytest.mark.slow
def test_threshold_analysis_from_msb_run(tmp_path, make_project, msb_cli):
    study = make_project(tmp_path, {"study": "thr", "analyses": {"names": ["threshold"]}})
    res = msb_cli("run", str(study))
    assert res.returncode == 0, res.stderr[-2000:]
    sdir = tmp_path / "runs" / "thr"
    run_dir = next(sdir.glob("*/config.yaml")).parent
    sel_dir = run_dir / "evaluation" / "selection" / "best"
    split = pd.read_csv(run_dir / "split.csv")
    sel = sorted((sel_dir / "predictions").glob("*.npz"))
    assert [f.stem for f in sel] == sorted(split.loc[split["split"] == "val", "sample_id"].astype(str))
    assert set(pd.read_parquet(sel_dir / "counts.parquet")["split"]) == {"val"}
    info = json.loads((run_dir / "evaluation" / "best-threshold" / "threshold.json").read_text())
    t = info["chosen_threshold"]
    assert info["selection_folder"] == "evaluation/selection/best" and info["declared_threshold"] == 0.5
    # the choice by hand: the grid threshold with the highest selection-split Dice, ties to the one nearest 0.5
    best, best_t = -1.0, None
    for th in sorted(set(info["grid"]), key=lambda x: (abs(x - 0.5), x)):
        v = _hand_dice(sel, th)
        if v > best + 1e-15:
            best, best_t = v, th
    assert t == best_t
    new = pd.read_parquet(run_dir / "evaluation" / "best-threshold" / "counts.parquet").set_index("image_id")
    assert set(new["checkpoint_role"]) == {"best-threshold"} and set(new["threshold"]) == {t}
    test = sorted((run_dir / "evaluation" / "best" / "predictions").glob("*.npz"))
    assert sorted(new.index) == [f.stem for f in test]
    for f in test:
        with np.load(f) as z:
            p, r = z["prob"][0] / 255.0 >= t, z["ref"][0]
        row = new.loc[f.stem]
        assert (row["tp"], row["fp"], row["fn"], row["tn"]) == ((p & r).sum(), (p & ~r).sum(), (~p & r).sum(),
                                                                (~p & ~r).sum())
    summary = pd.read_csv(sdir / "posthoc" / "threshold.csv")
    assert summary["chosen_threshold"].iloc[0] == t and summary["selection_split"].iloc[0] == "val"
    assert summary["test_dice_chosen"].iloc[0] == pytest.approx(_hand_dice(test, t), abs=1e-12)
    # the selection-split counts enter no study table: the scores and every folder search hold the test split only
    from msb.analysis.counts.counts_io import read_counts

    assert set(read_counts([sdir])["split"]) == {"test"}
    assert set(pd.read_csv(sdir / "scores.csv")["split"]) == {"test"}
    # a run without the selection maps: reaggregate names the command that stores them; that command restores them
    shutil.rmtree(sel_dir.parent)
    shutil.rmtree(run_dir / "evaluation" / "best-threshold")
    res = msb_cli("reaggregate", str(sdir), "--analyses", "threshold")
    assert res.returncode == 0, res.stderr[-2000:]
    line = next(x for x in (res.stdout + res.stderr).splitlines() if "store them with: msb evaluate" in x)
    cmd = line.split("store them with: ", 1)[1].split()
    assert cmd[:2] == ["msb", "evaluate"] and cmd[-1] == "--selection"
    assert not (run_dir / "evaluation" / "best-threshold").exists()
    assert "selection split 'val'" in json.loads((sdir / "posthoc" / "skipped.json").read_text())["threshold"]
    res = msb_cli(*cmd[1:])
    assert res.returncode == 0, res.stderr[-2000:]
    res = msb_cli("reaggregate", str(sdir), "--analyses", "threshold")
    assert res.returncode == 0, res.stderr[-2000:]
    again = json.loads((run_dir / "evaluation" / "best-threshold" / "threshold.json").read_text())
    assert again["chosen_threshold"] == t
