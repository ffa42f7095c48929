"""Issue 30, "one statistics setting": the console leaderboard of `msb run`, `msb reaggregate --compare` and
`msb report` give identical CIs and p-values for one study under one setting (`<study>/_study/analysis.json`,
written by `msb run` from the `analysis` section of global.yaml), and changing the setting changes all three.
The study's counts are written by hand (three systems, one class); the reference values are scipy's Wilcoxon
test with a hand-written Benjamini-Hochberg adjustment."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

REPO = Path(__file__).resolve().parents[2]


def _study(root: Path) -> Path:
    from msb.evaluation.counts import counts_rows, write_counts

    rng = np.random.default_rng(11)
    n = 16
    ref = rng.integers(40, 300, n)
    study = root / "runs" / "three"
    for k, (name, lo, hi) in enumerate((("sysA", 0.7, 0.95), ("sysB", 0.5, 0.9), ("sysC", 0.3, 0.8))):
        tp = np.floor(ref * rng.uniform(lo, hi, n)).astype(np.int64)
        fp = rng.integers(0, 50, n)
        run_id = f"ds-{name}"
        rd = study / run_id
        rd.mkdir(parents=True)
        (rd / "config.yaml").write_text(yaml.safe_dump(
            {"study": "three", "random_seed": 0, "data": {"name": "ds", "root": str(root / "nowhere")},
             "model": {"arch": "unet", "encoder": name}, "evaluation": {"threshold": 0.5}}))
        tp_, fp_, fn_ = tp[:, None], fp[:, None], (ref - tp)[:, None]
        c = {"tp": tp_, "fp": fp_, "fn": fn_, "tn": 4096 - tp_ - fp_ - fn_, "intersection": tp_,
             "reference": tp_ + fn_, "predicted": tp_ + fp_, "union": tp_ + fp_ + fn_}
        ctx = dict(dataset="ds", split="test", fold=-1, run_id=run_id, model="unet", checkpoint_role="best",
                   checkpoint_sha256=str(k) * 64, config_hash="b" * 64, threshold=0.5, threshold_on="probability")
        write_counts(counts_rows(ctx, c, image_ids=[f"img{i:02d}" for i in range(n)], class_ids=[1],
                                 class_names=["lesion"], heights=64, widths=64),
                     rd / "evaluation" / "best" / "counts.parquet")
    return study


def _msb(*args: str):
    """``msb ARGS`` in-process (typer's CliRunner: no interpreter start-up per call); exit status 0 asserted.
    Returns the click Result (``.stdout``: what the command printed on stdout)."""
    from typer.testing import CliRunner

    from msb.cli.app import app

    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert r.exit_code == 0 and r.exception is None, (r.output, r.exception)
    return r


def _three_ways(study: Path, tmp: Path, tag: str):
    """(leaderboard lines, compare wilcoxon + differences, report wilcoxon + differences)."""
    from msb.analysis.counts.counts_io import read_counts
    from msb.analysis.report.leaderboard import study_leaderboards
    from msb.analysis.stats.setting import find_setting

    setting, _ = find_setting([study])
    (board,) = study_leaderboards(read_counts(sorted(study.glob("*/evaluation/best/counts.parquet"))), setting)
    _msb("reaggregate", str(study), "--compare", "--out", str(tmp / f"cmp-{tag}"), "--format", "csv")
    rep = _msb("report", str(study), "--out", str(tmp / f"rep-{tag}"), "--analyses", "none")
    cw = pd.read_csv(tmp / f"cmp-{tag}" / "wilcoxon.csv")
    cd = pd.read_csv(tmp / f"cmp-{tag}" / "paired_differences.csv")
    rw = pd.read_csv(tmp / f"rep-{tag}" / "data" / "wilcoxon.csv")
    rd = pd.read_csv(tmp / f"rep-{tag}" / "data" / "paired-differences.csv")
    return board, (cw, cd), (rw, rd), rep.stdout


def test_console_compare_and_report_agree_and_follow_the_setting(tmp_path: Path):
    from msb.analysis.stats.setting import write_setting
    from msb.config.analysis_schema import AnalysisConfig

    study = _study(tmp_path)
    write_setting(study, AnalysisConfig(bootstrap=300, seed=4))
    board, (cw, cd), (rw, rd), rep_out = _three_ways(study, tmp_path, "a")

    # p-values: the Dice family (3 pairs), identical in compare and report, and equal to scipy + BH by hand
    key = ["system_a", "system_b"]
    cdice = cw[cw["metric"] == "dice"].sort_values(key).reset_index(drop=True)
    rdice = rw[rw["metric"] == "dice"].sort_values(key).reset_index(drop=True)
    assert len(cdice) == 3
    pd.testing.assert_frame_equal(cdice[key + ["p_value", "p_adjusted"]], rdice[key + ["p_value", "p_adjusted"]],
                                  check_exact=True)
    assert set(cdice["correction"]) == set(rdice["correction"]) == {"Benjamini-Hochberg (m=3)"}
    counts = pd.concat([pd.read_parquet(p) for p in sorted(study.glob("*/evaluation/best/counts.parquet"))])
    dice = {m: (2 * g.tp / (2 * g.tp + g.fp + g.fn)).to_numpy() for m, g in counts.groupby("run_id")}
    p = np.array([stats.wilcoxon(dice[f"ds-{a}"], dice[f"ds-{b}"]).pvalue for a, b in cdice[key].to_numpy()])
    order = np.argsort(p)
    bh = np.minimum.accumulate((p[order] * 3 / np.arange(1, 4))[::-1])[::-1]
    expected = np.empty(3)
    expected[order] = np.minimum(bh, 1)
    np.testing.assert_allclose(cdice["p_adjusted"], expected, rtol=1e-12)

    # CIs of the image-macro differences: identical (exact floats) in compare and report
    im = lambda d: d[d["aggregation"] == "image-macro"].sort_values(key).reset_index(drop=True)  # noqa: E731
    pd.testing.assert_frame_equal(im(cd)[key + ["difference", "ci_low", "ci_high"]],
                                  im(rd)[key + ["difference", "ci_low", "ci_high"]], check_exact=True)
    # ... and as the console prints them: "Dice A − B = d [lo, hi]" and its BH-adjusted p
    text = "\n".join(board.lines)
    for r in im(cd).itertuples():
        assert f"{r.difference:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" in text, (r, text)
    first = cdice.sort_values("p_adjusted").iloc[0]
    assert f"BH-adjusted p = {first.p_adjusted:.2g}" in text or f"{first.p_adjusted:.3g}" in text, text
    assert "300 percentile bootstrap replicates, level 0.95, seed 4; BH" in rep_out
    # the verdict and the rank distribution: the same sentence and numbers under the console leaderboard and in
    # the report (same replicates, level and seed)
    md = (tmp_path / "rep-a" / "report.md").read_text(encoding="utf-8")
    assert board.verdict.startswith("Verdict: ") and f"of 300 image bootstrap replicates" in board.verdict
    assert board.verdict in md
    ranks = pd.read_csv(tmp_path / "rep-a" / "data" / "rank_stability_bootstrap.csv")
    pd.testing.assert_series_equal(ranks["rank1_share"], board.ranks["rank1_share"], check_exact=True)

    # another setting: all three change together
    write_setting(study, AnalysisConfig(bootstrap=200, seed=9))
    board2, (cw2, cd2), (rw2, rd2), _ = _three_ways(study, tmp_path, "b")
    pd.testing.assert_frame_equal(im(cd2)[["ci_low", "ci_high"]], im(rd2)[["ci_low", "ci_high"]], check_exact=True)
    assert not im(cd2)[["ci_low", "ci_high"]].equals(im(cd)[["ci_low", "ci_high"]])
    text2 = "\n".join(board2.lines)
    for r in im(cd2).itertuples():
        assert f"{r.difference:.3f} [{r.ci_low:.3f}, {r.ci_high:.3f}]" in text2


def test_study_setting_comes_from_global_yaml_and_is_not_hashed(tmp_path: Path):
    import importlib.util

    from msb.config.generate import generate_runs
    from msb.study.analyses import study_setting

    spec = importlib.util.spec_from_file_location("_study_conftest_setting", REPO / "tests/study/conftest.py")
    conf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conf)
    study = conf.write_project(tmp_path, {"study": "s"}, data_root=tmp_path / "data")
    before = [r.config_hash for r in generate_runs(study, [])]
    assert study_setting(study).bootstrap == 1000  # the default (= the shipped global.yaml)
    g = tmp_path / "configs" / "global.yaml"
    cfg = yaml.safe_load(g.read_text())
    cfg["analysis"] = {"bootstrap": 250, "seed": 3, "test_family": ["dice", "iou"]}
    g.write_text(yaml.safe_dump(cfg))
    st = study_setting(study)
    assert (st.bootstrap, st.seed, st.test_family) == (250, 3, ["dice", "iou"])
    assert "250 percentile bootstrap replicates, level 0.95, seed 3; BH over 6 tests: image-macro Dice, IoU" \
        == st.describe(6)
    assert [r.config_hash for r in generate_runs(study, [])] == before  # not part of the run config hash
    shipped = yaml.safe_load((REPO / "configs" / "global.yaml").read_text())["analysis"]
    from msb.config.analysis_schema import AnalysisConfig

    assert AnalysisConfig.model_validate(shipped) == AnalysisConfig()  # defaults = the shipped file
    cfg["analysis"] = {"test_family": ["hd95"]}
    g.write_text(yaml.safe_dump(cfg))
    with pytest.raises(Exception, match="test_family"):
        study_setting(study)
