"""The ``semi_supervised`` protocol analysis on a hand-built study (tests/analysis/protocol/_semi_study.py): Dice and
IoU computed by hand from the known shifts of the predictions, HD95 with medpy on the masks, the card's values
with its literal formula (``np.percentile(np.max(cdist(...), axis=1), 95)``), one paired difference and its CI
with a plain NumPy bootstrap loop on counts.parquet read by pandas, the figure's plotted values, the files."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from scipy.spatial.distance import cdist

sys.path.insert(0, str(Path(__file__).parent))
import _semi_study as ss  # noqa: E402
from _protocol_study import build_study  # noqa: E402

from msb.analysis.report.figures import figure_data  # noqa: E402
from msb.analysis.protocol import AnalysisSkipped, load_study, run_analyses, write_protocol_analyses  # noqa: E402
from msb.analysis.protocol.semi_supervised import (paired_vs_supervised, run_settings,  # noqa: E402
                                                   semi_supervised_scores)


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    s = ss.build_semi_study(tmp_path_factory.mktemp("semi"))
    write_protocol_analyses(s, ["semi_supervised"], n_boot=500, seed=3)
    return s


def _table(study: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(study / "protocol" / "tables" / f"{name}.csv", keep_default_na=False)


def _by_hand(method: str, fraction: float, seed: int) -> dict[str, float]:
    """Dice/IoU of one run from the shifts alone: TP = 8 (8 - k), FP = FN = 8 k on images 0..6."""
    k = np.array([ss.shift(method, fraction, seed, i) for i in range(ss.N_TEST - 1)], dtype=float)
    return {"dice_gm": (8 - k).sum() / (8 * len(k)), "iou_gm": (8 - k).sum() / (8 + k).sum(),
            "dice_im": float(np.mean((8 - k) / 8)), "iou_im": float(np.mean((8 - k) / (8 + k)))}


def test_scores_by_hand_medpy_and_card_formula(study):
    from medpy.metric.binary import hd95

    t = _table(study, "semi_supervised_scores")
    assert len(t) == 12 and sorted(set(t["Method"])) == ["CPS", "Mean teacher", "Supervised only"]
    assert sorted(set(t["Labelled"])) == ["10 %", "30 %"] and set(t["Images"]) == {8}
    assert set(t.loc[t["Method"] == "CPS", "Test-time rule"]) == {"average"}  # as recorded in the counts
    row = t[(t["Method"] == "Mean teacher") & (t["Labelled"] == "30 %") & (t["Seed"] == 1)].iloc[0]
    hand = _by_hand("mean_teacher", 0.3, 1)
    assert float(row["Dice (global-micro)"]) == pytest.approx(hand["dice_gm"])
    assert float(row["IoU (global-micro)"]) == pytest.approx(hand["iou_gm"])
    assert float(row["Dice (image-macro)"]) == pytest.approx(hand["dice_im"])  # image 7: both empty, excluded
    assert float(row["IoU (image-macro)"]) == pytest.approx(hand["iou_im"])
    preds = [ss.pred_mask("mean_teacher", 0.3, 1, i) for i in range(ss.N_TEST - 1)]
    refs = [ss.ref_mask(i) for i in range(ss.N_TEST - 1)]
    assert float(row["HD95 (medpy, px)"]) == pytest.approx(np.mean([hd95(p, r) for p, r in zip(preds, refs)]))
    card = [np.percentile(np.max(cdist(np.argwhere(p), np.argwhere(r)), axis=1), 95) for p, r in zip(preds, refs)]
    assert float(row['card "HD95" as written (px)']) == pytest.approx(np.mean(card))
    assert float(row["card Dice as written"]) == pytest.approx(hand["dice_im"])  # same formula, no smoothing
    assert int(row["card HD95 refused"]) == 1  # image 7: the card's code crashes on the empty masks


def test_paired_difference_numpy_bootstrap(study):
    """Δ global-micro Dice (CPS − supervised-only at 10 %, seed 0) and its CI from counts.parquet with a NumPy loop
    (default_rng(3), blocks of 250 replicates of 8 image draws, as msb.analysis.stats.bootstrap draws them)."""
    def counts(m):
        c = pd.read_parquet(study / ss.run_id(m, 0.1, 0) / "evaluation" / "best" / "counts.parquet")
        return c.sort_values("image_id")[["tp", "fp", "fn"]].to_numpy(dtype=float)

    a, b = counts("cps"), counts("supervised")

    def dice(x):
        return 2 * x[:, 0].sum() / (2 * x[:, 0].sum() + x[:, 1].sum() + x[:, 2].sum())

    rng = np.random.default_rng(3)
    reps = []
    for _ in range(0, 500, 250):
        draws = rng.integers(0, 8, size=(250, 8), dtype=np.int32)
        reps += [dice(a[d]) - dice(b[d]) for d in draws]
    lo, hi = np.percentile(reps, [2.5, 97.5])
    t = _table(study, "semi_supervised_paired")
    assert len(t) == 8 and set(t["Method"]) == {"CPS", "Mean teacher"}
    row = t[(t["Method"] == "CPS") & (t["Labelled"] == "10 %") & (t["Seed"] == 0)].iloc[0]
    hand = _by_hand("cps", 0.1, 0)["dice_gm"] - _by_hand("supervised", 0.1, 0)["dice_gm"]
    assert float(row["Δ Dice (global-micro)"]) == pytest.approx(hand)
    assert float(row["Δ Dice (global-micro) CI low"]) == pytest.approx(lo)
    assert float(row["Δ Dice (global-micro) CI high"]) == pytest.approx(hi)
    md = (study / "protocol" / "tables" / "semi_supervised_paired.md").read_text()
    assert "500 image-level paired bootstrap replicates (seed 3" in md


def test_summary_and_figure_values(study):
    s = _table(study, "semi_supervised_summary")
    row = s[(s["Method"] == "Supervised only") & (s["Labelled"] == "30 %")].iloc[0]
    vals = [_by_hand("supervised", 0.3, seed)["dice_gm"] for seed in ss.SEEDS]
    assert int(row["Seeds"]) == 2
    assert float(row["Dice (global-micro)"]) == pytest.approx(np.mean(vals))
    assert float(row["Dice (global-micro) SD"]) == pytest.approx(np.std(vals, ddof=1))
    art = load_study(study, exclude=(study / "protocol",))
    out, skipped = run_analyses(art, ["semi_supervised"], {"n_boot": 250})
    assert not skipped
    (name, fig, _), = out["semi_supervised"].figures
    fd = figure_data(fig)
    pts = fd[fd["series"] == "ds/test@24 / supervised"]
    assert len(pts) == 6  # 2 fractions x 3 panels
    first = pts.iloc[:2]  # Dice panel, fractions 10 % and 30 % in order
    assert first["y"].iloc[1] == pytest.approx(np.mean(vals))
    assert first["high"].iloc[1] - first["y"].iloc[1] == pytest.approx(np.std(vals, ddof=1))
    for stem in ("semi_supervised",):
        with Image.open(study / "protocol" / "figures" / f"{stem}.png") as im:
            assert min(im.info["dpi"]) >= 149.9
        assert ET.parse(study / "protocol" / "figures" / f"{stem}.svg").getroot().tag.endswith("svg")
    tex = (study / "protocol" / "tables" / "semi_supervised_scores.tex").read_text()
    assert tex.startswith("\\begin{table}") and "\\toprule" in tex


def test_rules_labels_missing_baseline_and_skip(tmp_path):
    # a method evaluated under two test-time rules: the rule is part of its label, never pooled
    s = ss.build_semi_study(tmp_path / "a", methods=("supervised", "mean_teacher"), fractions=(0.1,), seeds=(0,),
                            metrics=False)
    extra = ss.build_semi_study(tmp_path / "b", methods=("mean_teacher",), fractions=(0.1,), seeds=(0,),
                                rules={"mean_teacher": "student"}, metrics=False)
    (extra / ss.run_id("mean_teacher", 0.1, 0)).rename(s / "mt-student-run")
    art = load_study(s)
    scores = semi_supervised_scores(art.counts, art.metrics, art.runs)
    assert sorted(scores["method_label"]) == ["mean_teacher [average]", "mean_teacher [student]", "supervised"]
    assert scores["hd95"].isna().all() and (scores["n_card_hd95_refused"] == -1).all()  # no metrics.parquet
    # no supervised run of that fraction: a note, no pair
    s2 = ss.build_semi_study(tmp_path / "c", methods=("cps",), fractions=(0.3,), seeds=(1,), metrics=False)
    art2 = load_study(s2)
    paired, notes = paired_vs_supervised(art2.counts, None, art2.runs)
    assert paired.empty and "no supervised-only run" in notes[0]
    # a study without labelled fractions or strategies: skipped with its reason
    plain = build_study(tmp_path / "d", archs=("unet",), sizes=(128,), external=False, metrics=False, profile=False)
    with pytest.raises(AnalysisSkipped, match="data.labelled_fraction"):
        semi_supervised_scores(load_study(plain).counts)


def test_run_settings_from_config_or_variant():
    assert run_settings({"data": {"labelled_fraction": 0.3}}) == {"method": "supervised", "labelled_fraction": 0.3,
                                                                  "declared": True}
    assert run_settings(None, 'data.labelled_fraction=0.1;train.strategy.name="cps"') == {
        "method": "cps", "labelled_fraction": 0.1, "declared": True}
    lab = pd.DataFrame({"sample_id": ["a", "b", "c", "d"], "labelled": [1, 0, 0, 0]})
    assert run_settings({"data": {"labelled_ids": "ids.csv"}}, "", lab)["labelled_fraction"] == 0.25
    assert run_settings({"data": {}})["declared"] is False


def test_report_section(tmp_path):
    """`msb report` shows the analysis in its protocol section (tables with ids, the figure, data files)."""
    from msb.analysis.report.report import build_report

    s = ss.build_semi_study(tmp_path, methods=("supervised", "cps"), fractions=(0.1,), seeds=(0, 1), metrics=False)
    res = build_report(s, tmp_path / "rep", n_boot=0, protocol={"analyses": ["semi_supervised"], "n_boot": 250})
    html = res.html.read_text(encoding="utf-8")
    for t in ("scores", "summary", "paired"):
        assert f'id="protocol-semi_supervised_{t}"' in html
        assert (res.out_dir / "tables" / f"semi_supervised_{t}.tex").is_file()
    assert "Semi-supervised protocol" in html and (res.out_dir / "figures" / "semi_supervised.svg").is_file()
