"""The report's first screen (summary + checklist), identical systems, the critical-difference diagram, the
training curves and the console leaderboard of `msb run`, on studies whose counts are written by hand (no
training; a few seconds). Expected values come from numpy / scipy on the same counts and from Demšar's table."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from msb.analysis.report import report_doc
from msb.analysis.report.report import build_report

sys.path.insert(0, str(Path(__file__).parent))
from test_report import _fake_kfold_study, _two_system_study  # noqa: E402


def _pair_counts(seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = rng.integers(30, 300, 14)
    tp_a = np.floor(ref * rng.uniform(0.6, 0.95, 14)).astype(np.int64)
    tp_b = np.floor(ref * rng.uniform(0.3, 0.9, 14)).astype(np.int64)
    fp_a, fp_b = rng.integers(0, 60, 14), rng.integers(0, 60, 14)
    ref[13] = tp_a[13] = tp_b[13] = fp_a[13] = fp_b[13] = 0  # image 13: Dice 0/0 for both
    return np.stack([tp_a, fp_a, ref - tp_a], 1), np.stack([tp_b, fp_b, ref - tp_b], 1)


def _image_dice(c: np.ndarray) -> np.ndarray:
    den = 2 * c[:, 0] + c[:, 1] + c[:, 2]
    return np.where(den > 0, 2 * c[:, 0] / np.where(den > 0, den, 1), np.nan)


def test_summary_leaderboard_and_paired_test_match_the_counts(tmp_path: Path):
    a, b = _pair_counts()
    res = build_report(_two_system_study(tmp_path, a, b), tmp_path / "rep", n_boot=300)
    html = res.html.read_text(encoding="utf-8")
    # summary and checklist first and open; every other section collapsed
    order = [s.split('"')[0] for s in html.split('<section id="')[1:]]
    assert order[:3] == ["intro", "summary", "checklist"], order
    summary = html.split('<section id="summary">')[1].split("</section>")[0]
    assert "<details>" not in summary and html.count("<details>") >= 8
    for field in ("Datasets", "Split policy", "Checkpoint rule", "Test-time rule", "Aggregation rule"):
        assert f">{field}</td>" in summary, field
    da, db = _image_dice(a), _image_dice(b)
    lb = pd.read_csv(res.out_dir / "data" / "leaderboard.csv")
    best, other = ("sysA", "sysB") if np.nanmean(da) > np.nanmean(db) else ("sysB", "sysA")
    assert list(lb["system"]) == [best, other] and list(lb["rank"]) == [1, 2]
    cell = dict(zip(lb["system"], lb["image-macro Dice [95% CI]"]))
    assert cell["sysA"].startswith(f"{np.nanmean(da):.3f} [") and cell["sysB"].startswith(f"{np.nanmean(db):.3f} [")
    gm_a = 2 * a[:, 0].sum() / (2 * a[:, 0].sum() + a[:, 1].sum() + a[:, 2].sum())
    assert dict(zip(lb["system"], lb["global-micro Dice [95% CI]"]))["sysA"].startswith(f"{gm_a:.3f} [")
    assert (lb["images"] == 14).all()
    ok = ~np.isnan(da)
    w = stats.wilcoxon(da[ok], db[ok])
    assert f"Wilcoxon signed-rank p = {w.pvalue:.3g}, BH-adjusted p = {w.pvalue:.3g}" in summary
    assert f"n = {int(ok.sum())} images" in summary and "rank-biserial r = " in summary
    # the tidy score table is a CSV link, not an inline table
    assert '<a href="data/scores.csv" download>All scores (tidy)' in html
    assert (res.out_dir / "data" / "scores.csv").is_file()
    # the console leaderboard of `msb run` shows the same table
    from msb.analysis.counts.counts_io import read_counts
    from msb.analysis.report.leaderboard import study_leaderboards
    from msb.config.analysis_schema import AnalysisConfig

    (board,) = study_leaderboards(read_counts(sorted(res.out_dir.parent.glob("runs/pair/*/evaluation/best/"
                                                                                "counts.parquet"))), AnalysisConfig(bootstrap=300))
    pd.testing.assert_frame_equal(board.table.astype(str), lb.astype(str))


def test_identical_systems_are_named_once_and_not_tested(tmp_path: Path):
    a, _ = _pair_counts()
    res = build_report(_two_system_study(tmp_path, a, a.copy()), tmp_path / "rep", n_boot=100)
    ident = pd.read_csv(res.out_dir / "data" / "identical-systems.csv")
    assert ident[["kept", "identical"]].values.tolist() == [["sysA", "sysB"]]
    assert ident["reason"].iloc[0].startswith("same checkpoint SHA-256 aaaaaaaaaaaa")
    lb = pd.read_csv(res.out_dir / "data" / "leaderboard.csv")
    assert list(lb["system"]) == ["sysA"]
    item = {i.item: i for i in res.checklist}["Significance tested"]
    n_defined = int((~np.isnan(_image_dice(a))).sum())
    assert n_defined == 13
    assert item.status == "N/A" and not item.applicable
    assert item.evidence == "not testable: all 13 paired differences are zero (sysB = sysA)"
    html = res.html.read_text(encoding="utf-8")
    assert '<td class="na">N/A</td>' in html and "sysB is identical to sysA" in html
    assert "FAIL</td><td>not testable" not in html


def test_demsar_critical_difference_and_cd_diagram(tmp_path: Path, monkeypatch):
    from msb.analysis.report.figures import figure_data
    from msb.analysis.report.figures_study import nemenyi_cd

    # Demšar (2006), Table 5(a): q_0.05 of the two-tailed Nemenyi test for k = 2..10
    q = {2: 1.960, 3: 2.343, 4: 2.569, 5: 2.728, 6: 2.850, 7: 2.949, 8: 3.031, 9: 3.102, 10: 3.164}
    for k, qk in q.items():
        assert nemenyi_cd(k, 30) == pytest.approx(qk * np.sqrt(k * (k + 1) / (6 * 30)), abs=1e-3)

    plotted = {}
    save = report_doc.save_figure

    def capture(fig, stem):
        plotted[Path(stem).name] = figure_data(fig)
        return save(fig, stem)

    monkeypatch.setattr(report_doc, "save_figure", capture)
    study = _fake_kfold_study(tmp_path)
    res = build_report(study, tmp_path / "rep", n_boot=50)
    summary = res.html.read_text(encoding="utf-8").split('<section id="summary">')[1].split("</section>")[0]
    assert 'id="fig-cd-diagram"' in summary
    counts = pd.concat([pd.read_parquet(p) for p in study.glob("*/evaluation/best/counts.parquet")])
    counts["system"] = counts["run_id"].str.split("-").str[1]
    counts["dice"] = 2 * counts["tp"] / (2 * counts["tp"] + counts["fp"] + counts["fn"])
    per_img = counts.groupby(["system", "image_id"])["dice"].mean().unstack("system")
    mean_ranks = pd.Series(stats.rankdata(-per_img.to_numpy(), axis=1).mean(axis=0), index=per_img.columns)
    fig = plotted["cd-diagram"].set_index("series")["x"]
    for s in ("archA", "archB", "archC"):
        assert fig[s] == pytest.approx(mean_ranks[s], abs=1e-12)


def test_training_curves_plot_train_log(tmp_path: Path, monkeypatch):
    from msb.analysis.report.figures import figure_data

    a, b = _pair_counts()
    study = _two_system_study(tmp_path, a, b)
    logs = {}
    for k, rd in enumerate(sorted(p for p in study.iterdir() if p.is_dir())):
        logs[rd.name] = pd.DataFrame({"epoch": [1, 2, 3], "train_loss": [1.0, 0.7 - 0.1 * k, 0.5],
                                      "val_loss": [1.2, 0.9, 0.8 + 0.05 * k], "val_dice": [0.4, 0.6, 0.7 - 0.2 * k]})
        logs[rd.name].to_csv(rd / "train_log.csv", index=False)
    plotted = {}
    save = report_doc.save_figure
    monkeypatch.setattr(report_doc, "save_figure",
                        lambda fig, stem: (plotted.__setitem__(Path(stem).name, figure_data(fig)), save(fig, stem))[1])
    res = build_report(study, tmp_path / "rep", n_boot=0)
    fig = plotted["training-curves"]
    for rid, df in logs.items():
        for col in ("train_loss", "val_loss", "val_dice"):
            pts = fig[fig["series"] == f"{rid}/{col}"][["x", "y"]].to_numpy()
            np.testing.assert_allclose(pts, df[["epoch", col]].to_numpy(dtype=float), rtol=0, atol=0)
    assert (res.out_dir / "figures" / "training-curves.svg").is_file()
    from PIL import Image

    with Image.open(res.out_dir / "figures" / "training-curves.png") as im:
        assert round(im.info["dpi"][0]) >= 150
