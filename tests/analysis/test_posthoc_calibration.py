"""Calibration from stored probability maps (ECE against hand computations and known calibration, pooled Brier
against sklearn on the stored arrays), the post-hoc CSV files, and rank stability across seeds against a hand
ranking. The study folders are written by the test (prediction files + counts), no model is run."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import brier_score_loss

from msb.analysis.report.posthoc_run import write_posthoc_analyses
from msb.analysis.stats.calibration import calibration_values, level_histograms, reliability_table
from msb.analysis.stats.rank_stability import seed_stability
from msb.config.analysis_schema import AnalysisConfig
from msb.evaluation.artifacts import write_prediction_file
from msb.evaluation.counts import compute_confusion_counts, counts_rows, write_counts


def _ece_by_hand(p: np.ndarray, y: np.ndarray, bins: int = 15) -> float:
    """Guo et al. 2017, eq. 3, pixel by pixel (p in [0, 1], y in {0, 1})."""
    b = np.minimum(np.floor(p * bins).astype(int), bins - 1)
    total = 0.0
    for k in range(bins):
        m = b == k
        if m.any():
            total += m.sum() / p.size * abs(y[m].mean() - p[m].mean())
    return total


def test_ece_hand_values_known_calibration():
    rng = np.random.default_rng(0)
    # p = 0.9 everywhere on a 50 % foreground: ECE = |0.5 - 0.9| = 0.4 (0.9 is stored as 230/255)
    prob = np.full((1, 64, 64), round(0.9 * 255), np.uint8)
    ref = np.zeros((1, 64, 64), bool)
    ref[:, :32] = True
    v = calibration_values(*level_histograms(prob, ref))
    assert v["ece"][0] == pytest.approx(230 / 255 - 0.5, abs=1e-12)
    assert v["ece"][0] == pytest.approx(0.4, abs=0.5 / 255)
    assert v["mce"][0] == pytest.approx(230 / 255 - 0.5, abs=1e-12)
    # a perfectly calibrated map (y ~ Bernoulli(p)): ECE ~ 0 within sampling error, and equal to the hand ECE
    prob = rng.integers(0, 256, (1, 400, 400)).astype(np.uint8)
    ref = rng.random(prob.shape) < prob / 255.0
    v = calibration_values(*level_histograms(prob, ref))
    assert v["ece"][0] < 0.005
    assert v["ece"][0] == pytest.approx(_ece_by_hand(prob.ravel() / 255.0, ref.ravel()), abs=1e-12)
    # a miscalibrated map (p^2 true frequency): hand ECE, Brier, reliability gaps
    ref = rng.random(prob.shape) < (prob / 255.0) ** 2
    v = calibration_values(*level_histograms(prob, ref))
    p = prob.ravel() / 255.0
    assert v["ece"][0] == pytest.approx(_ece_by_hand(p, ref.ravel()), abs=1e-12) and v["ece"][0] > 0.1
    assert v["brier"][0] == pytest.approx(brier_score_loss(ref.ravel(), p), abs=1e-12)
    rel = reliability_table(*(h[0] for h in level_histograms(prob, ref)))
    b = np.minimum(np.floor(p * 15).astype(int), 14)
    assert rel["frequency"].iloc[3] == pytest.approx(ref.ravel()[b == 3].mean(), abs=1e-12)
    assert rel["mean_prob"].iloc[3] == pytest.approx(p[b == 3].mean(), abs=1e-12)


def _study(root: Path, quality: dict[str, float], n: int = 8, seed: int = 0) -> Path:
    """A study folder with one run per system: evaluation/best/{predictions/*.npz with prob, counts.parquet}."""
    rng = np.random.default_rng(seed)
    refs = [np.zeros((1, 24, 24), bool) for _ in range(n)]
    for k, r in enumerate(refs):
        r[0, 4 + k % 5: 14 + k % 7, 3:12 + k] = True
    study = root / "study"
    for name, q in quality.items():
        run = study / f"d-{name}-0000000{len(name)}"
        ev = run / "evaluation" / "best"
        (ev / "predictions").mkdir(parents=True)
        (run / "config.yaml").write_text("data: {name: d}\nevaluation: {threshold: 0.5}\n")
        frames = []
        for k, ref in enumerate(refs):
            p = np.clip(np.where(ref, q, 1 - q) + rng.normal(0, 0.2, ref.shape), 0, 1)
            pu8 = np.round(p * 255).astype(np.uint8)
            pred = p >= 0.5
            write_prediction_file(ev / "predictions", f"img{k}", pred, ref, (1.0, 1.0), np.array([1]), pu8)
            ctx = {"dataset": "d", "split": "test", "fold": -1, "run_id": run.name, "model": name,
                   "checkpoint_role": "best", "checkpoint_sha256": "0" * 64, "config_hash": "1" * 64,
                   "threshold": 0.5, "threshold_on": "probability"}
            frames.append(counts_rows(ctx, compute_confusion_counts(pred[None], ref[None]), image_ids=[f"img{k}"],
                                      class_ids=[1], class_names=["fg"], heights=24, widths=24))
        write_counts(pd.concat(frames, ignore_index=True), ev / "counts.parquet")
    return study


def test_posthoc_tables_pooled_brier_equals_sklearn(tmp_path):
    study = _study(tmp_path, {"good": 0.8, "poor": 0.6})
    st = AnalysisConfig(bootstrap=200, seed=3)
    written = write_posthoc_analyses(study, ["rank_stability", "calibration"], st)
    names = {p.name for p in written}
    assert {"calibration.csv", "calibration.tex", "calibration.md", "rank_stability_bootstrap.csv",
            "calibration_images.csv", "skipped.json"} <= names
    cal = pd.read_csv(study / "posthoc" / "calibration.csv").set_index("system")
    assert {"ece", "brier", "mce", "ece_low", "ece_high", "brier_low", "brier_high"} <= set(cal.columns)
    for name in ("good", "poor"):
        files = sorted((study / f"d-{name}-0000000{len(name)}" / "evaluation" / "best" / "predictions").glob("*.npz"))
        probs, refs = [], []
        for f in files:
            with np.load(f) as z:
                probs.append(z["prob"][0].ravel() / 255.0)
                refs.append(z["ref"][0].ravel())
        p, y = np.concatenate(probs), np.concatenate(refs)
        label = cal.index[cal.index.str.startswith(name)][0]
        assert cal.at[label, "brier"] == pytest.approx(brier_score_loss(y, p), abs=1e-12)
        assert cal.at[label, "ece"] == pytest.approx(_ece_by_hand(p, y), abs=1e-12)
        assert cal.at[label, "brier_low"] <= cal.at[label, "brier"] <= cal.at[label, "brier_high"]
        per = pd.read_csv(study / "posthoc" / "calibration_images.csv")
        per = per[per["system"] == label].set_index("image_id")
        with np.load(files[0]) as z:
            assert per.at[files[0].stem, "brier"] == pytest.approx(
                brier_score_loss(z["ref"][0].ravel(), z["prob"][0].ravel() / 255.0), abs=1e-12)
    ranks = pd.read_csv(study / "posthoc" / "rank_stability_bootstrap.csv")
    assert "rank1_share" in ranks.columns and ranks["rank1_share"].between(0, 1).all()
    assert ranks["n_boot"].iloc[0] == 200


def test_seed_stability_matches_hand_ranking():
    rng = np.random.default_rng(4)
    rows = []
    vals = {}
    for model, seed in itertools.product(("a", "b", "c"), (0, 1, 2)):
        tp = rng.integers(10, 90, 6)
        fp, fn = rng.integers(0, 40, 6), rng.integers(0, 40, 6)
        vals[(model, seed)] = np.mean(2 * tp / (2 * tp + fp + fn))
        rows.append(pd.DataFrame({"dataset": "d", "split": "test", "fold": -1, "run_id": f"{model}{seed}",
                                  "model": model, "checkpoint_role": "best", "image_id": [f"i{k}" for k in range(6)],
                                  "class_id": 1, "class_name": "fg", "threshold": 0.5, "threshold_on": "probability",
                                  "seed": seed, "variant": f"random_seed={seed}", "tp": tp, "fp": fp, "fn": fn}))
    rankings, systems, pairs = seed_stability(pd.concat(rows, ignore_index=True))
    s = systems.set_index("system")
    for m in "abc":
        v = np.array([vals[(m, k)] for k in range(3)])
        wins = sum(all(vals[(m, k)] > vals[(o, k)] for o in "abc" if o != m) for k in range(3))
        assert s.at[m, "mean"] == pytest.approx(v.mean(), abs=1e-12)
        assert s.at[m, "sd"] == pytest.approx(v.std(ddof=1), abs=1e-12)
        assert s.at[m, "rank1_share"] == pytest.approx(wins / 3)
    for r in pairs.itertuples():
        ahead = sum(vals[(r.system_a, k)] > vals[(r.system_b, k)] for k in range(3))
        assert (r.a_ahead, r.changes_order) == (ahead, 0 < ahead < 3)
    assert len(rankings) == 9


def test_analysis_names_split_between_posthoc_and_protocol():
    from msb.analysis.report.posthoc_run import split_analysis_names
    from msb.errors import MSBError

    assert split_analysis_names("rank_stability,p1,calibration") == (["rank_stability", "calibration"], "p1")
    assert split_analysis_names(["threshold"]) == (["threshold"], None)
    assert split_analysis_names("all") == ([], "all")  # `all` keeps meaning every protocol analysis
    with pytest.raises(MSBError, match="unknown post-hoc analysis"):
        write_posthoc_analyses(Path("."), ["calibrate"])
