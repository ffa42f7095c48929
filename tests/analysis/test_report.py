"""`msb report` and `msb reaggregate --rules/--bootstrap/--compare/--population` on a real CPU study.

The study (built once per module, ~20 s on 2 cores): synthetic data (30 images of 32 x 32 px), two U-Net
(ResNet-18, 3 encoder stages) runs that differ only by their seed, one epoch each, evaluated on the test split
with counts, predictions and metrics.parquet. Numbers in the report are checked against independent
computations from the stored counts (Dice formula, scipy's Wilcoxon)."""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

from msb.analysis.report import report as report_mod
from msb.analysis.report import report_data, report_doc
from msb.analysis.report.report import FIGURE_IDS, SECTION_IDS, build_report

REPO = Path(__file__).resolve().parents[2]


def msb(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def msb_inproc(*args: str):
    """``msb ARGS`` in-process (typer's CliRunner, stdout not a terminal, 200 columns): for the tests about what a
    command writes, not about the process (its exit status and error line are checked with :func:`msb`). Returns
    the click Result; ``returncode`` mirrors its exit code for the shared assertions."""
    from typer.testing import CliRunner

    from msb.cli.app import app

    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert r.exception is None or isinstance(r.exception, SystemExit), (r.output, r.exception)
    r.returncode = r.exit_code
    return r


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    from msb.study.pipeline import run_study

    root = tmp_path_factory.mktemp("study")
    cfg = root / "configs"
    (cfg / "datasets").mkdir(parents=True)
    (cfg / "architectures").mkdir()
    (cfg / "global.yaml").write_text((REPO / "configs" / "global.yaml").read_text())
    ds = yaml.safe_load((REPO / "configs" / "datasets" / "synthetic.yaml").read_text())
    ds["data"]["root"] = str(root / "datasets" / "synthetic")
    ds["data"]["prepare"]["options"] = {"n_samples": 30, "seed": 0, "size": [32, 32]}
    ds["data"]["input_size"] = [32, 32]
    (cfg / "datasets" / "synthetic.yaml").write_text(yaml.safe_dump(ds))
    for seed in (0, 1):
        (cfg / "architectures" / f"unet_s{seed}.yaml").write_text(yaml.safe_dump(
            {"random_seed": seed, "model": {"arch": "unet", "encoder": "resnet18", "encoder_weights": None,
                                            "params": {"encoder_depth": 3, "decoder_channels": [32, 16, 8]}}}))
    spec = {"study": "tiny", "run_root": str(root / "runs"), "datasets": ["synthetic"],
            "architectures": ["unet_s0", "unet_s1"], "overrides": {"train": {"epochs": 1, "batch_size": 8}}}
    (cfg / "study.yaml").write_text(yaml.safe_dump(spec))
    run_study(cfg / "study.yaml")
    return root / "runs" / "tiny"


def _counts(study: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p) for p in sorted(study.glob("*/evaluation/best/counts.parquet"))],
                     ignore_index=True)


def _dice(tp, fp, fn) -> np.ndarray:
    den = 2 * tp + fp + fn
    return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1), np.nan)


def test_report_template_escapes_every_text(tmp_path: Path):
    """The jinja2 template autoescapes: markup in the study name, texts, headings, notes, figure reasons and
    checklist cells appears as text, never as tags; pandas tables keep their own escaping."""
    from msb.analysis.report.contract import ChecklistItem

    doc = report_doc.ReportDoc(tmp_path)
    evil = '<script>alert("x")</script> & \'q\''
    doc.text("intro " + evil)
    doc.section("contract", "Title " + evil)
    doc.sub("sub " + evil)
    doc.text("note " + evil, "note")
    doc.frame(pd.DataFrame({"field<>": ["a<b>"], "value": [0.5]}), caption="cap " + evil)
    doc.missing_figure("overlays", "overlays", "reason " + evil)
    doc.checklist_table([ChecklistItem("item " + evil, True, "evidence " + evil)])
    out = doc.render_html("study " + evil, ["note " + evil])
    assert "<script>" not in out and "<b>" not in out
    # escaped by jinja2: title, h1, intro, h2, h3, note, figure reason, checklist item + evidence, notes list
    assert out.count("&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &#39;q&#39;") == 10
    assert "<caption>cap &lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#x27;q&#x27;</caption>" in out
    assert "&lt;b&gt;" in out and "field&lt;&gt;" in out  # the Styler table escapes its cells and headers
    assert out.startswith("<!DOCTYPE html>") and out.endswith("</section>\n</body></html>\n")
    assert '<section id="contract">' in out and '<section id="notes">' in out and '<p class="note">' in out
    assert '<td class="pass">PASS</td>' in out and "\n\n</section>" not in out.split("<h2>")[0]
    md = doc.markdown()
    assert "## Title " + evil in md and "| item " in md


def test_report_has_every_section_figure_and_checklist_item(study: Path):
    r = msb_inproc("report", str(study), "--bootstrap", "300")
    assert r.returncode == 0, r.stdout + r.stderr
    out = study / "report"
    html = (out / "report.html").read_text(encoding="utf-8")
    for sid in SECTION_IDS:
        assert f'<section id="{sid}">' in html, sid
    sig = html.split('<section id="significance">')[1].split("</section>")[0]
    assert "Wilcoxon signed-rank" in sig and "only one system" not in sig
    for fid in FIGURE_IDS:
        m = re.search(rf'<figure id="fig-{fid}" class="fig-{fid}"><img alt="[^"]*" '
                      r'src="data:image/png;base64,([A-Za-z0-9+/=]+)">', html)
        assert m, f"figure {fid} missing or not embedded"
        assert base64.b64decode(m.group(1))[:8] == b"\x89PNG\r\n\x1a\n"
        assert (out / "figures" / f"{fid}.png").is_file() and (out / "figures" / f"{fid}.svg").is_file()
    assert "missing" not in re.findall(r'<figure [^>]*class="([^"]*)"', html)[0]
    assert not re.search(r'(src|href)="(https?:|/)', html) and "<script" not in html  # self-contained
    # contract: dataset, split policy, preprocessing, model, optimisation, checkpoint policy, decision rule
    for title in ("Dataset", "Split policy", "Preprocessing", "Model settings", "Optimisation",
                  "Checkpoint policy", "Decision rule", "Aggregation"):
        assert f"<h3>{title}</h3>" in html, title
    assert "random_seed" in html and "unet_s0-" in html and "unet_s1-" in html
    # checklist: item -> PASS/FAIL
    rows = dict(re.findall(r'<tr><td>([^<]+)</td><td class="(?:pass|fail)">(PASS|FAIL)</td>', html))
    assert rows == {"HD95 reported": "PASS", "Recall reported": "PASS", "Split protocol stated": "PASS",
                    "External test set": "FAIL", "Significance tested": "PASS",
                    "Uncertainty (confidence intervals) reported": "PASS",
                    "Checkpoint selected without the test split": "PASS"}
    assert "internal split only" in html
    # Markdown twin: every section title and every figure link resolves
    md = (out / "report.md").read_text(encoding="utf-8")
    for title in report_mod._TITLES.values():
        assert f"## {title}" in md
    links = re.findall(r"\]\((figures/[^)]+)\)", md)
    core = [link for link in links if Path(link).stem in FIGURE_IDS]  # protocol-analysis figures come on top
    assert len(core) == 2 * len(FIGURE_IDS) and all((out / link).is_file() for link in links)
    tex = (out / "tables" / "scores-dice.tex").read_text()
    assert r"\textbf{" in tex and r"\begin{tabular}" in tex

    # numbers: global-micro Dice and the Wilcoxon p-value recomputed from the stored counts
    counts = _counts(study)
    scores = pd.read_csv(out / "data" / "scores.csv")
    wil = pd.read_csv(out / "data" / "wilcoxon.csv")
    per_run = {}
    for run_id, g in counts.groupby("run_id"):
        label = run_id.removeprefix("synthetic-")
        tp, fp, fn = (int(g[c].sum()) for c in ("tp", "fp", "fn"))
        row = scores[(scores["system"] == label) & (scores["aggregation"] == "global-micro")
                     & (scores["metric"] == "dice")]
        assert row["value"].iloc[0] == pytest.approx(2 * tp / (2 * tp + fp + fn), abs=1e-12)
        assert row["ci_low"].iloc[0] <= row["value"].iloc[0] <= row["ci_high"].iloc[0]
        g = g.sort_values("image_id")
        per_run[label] = _dice(g["tp"].to_numpy(), g["fp"].to_numpy(), g["fn"].to_numpy())
    a, b = (per_run[k] for k in sorted(per_run))
    ok = ~(np.isnan(a) | np.isnan(b))
    w = wil[wil["metric"] == "dice"].iloc[0]
    assert w["n"] == ok.sum() and w["test"].startswith("Wilcoxon signed-rank")
    # the two runs differ only by their seed (initial weights, data order), so their per-image Dice differ and
    # the p-value is always checked (test_wilcoxon_of_two_different_systems_matches_scipy: more differences)
    assert (a[ok] != b[ok]).any(), (a, b)
    assert w["p_value"] == pytest.approx(stats.wilcoxon(a[ok], b[ok]).pvalue, rel=1e-12)
    assert w["statistic"] == pytest.approx(stats.wilcoxon(a[ok], b[ok]).statistic, rel=1e-12)


def _per_image_dice(counts: pd.DataFrame) -> pd.DataFrame:
    """Per-image Dice (one class) of every system, by hand with pandas: rows image_id, columns system."""
    c = counts.assign(system=counts["run_id"].str.removeprefix("synthetic-"))
    den = 2 * c["tp"] + c["fp"] + c["fn"]
    c["dice"] = 2 * c["tp"] / den.where(den > 0)
    return c.pivot(index="image_id", columns="system", values="dice")


def test_report_figures_plot_the_counts_and_boundary_matches_metrics(study: Path, tmp_path: Path, monkeypatch):
    """The figures' plotted values (read back from their artists by ``figures.figure_data`` when the report
    saves them) equal per-image Dice computed with pandas from the stored counts and HD95 from the stored
    metrics tables; the boundary section equals the metrics tables' image means, medians and NaN counts."""
    from msb.analysis.report.figures import figure_data

    plotted: dict[str, pd.DataFrame] = {}
    save = report_doc.save_figure

    def capture(fig, stem):  # records what was drawn, then saves as usual
        plotted[Path(stem).name] = figure_data(fig)
        return save(fig, stem)

    monkeypatch.setattr(report_doc, "save_figure", capture)
    res = build_report(study, tmp_path / "rep", n_boot=100, seed=3)
    data = res.out_dir / "data"
    dice = _per_image_dice(_counts(study))
    labels = sorted(dice.columns)
    assert len(labels) == 2
    image_macro = dice.mean()  # pandas skips NaN: the image-macro Dice of a one-class system
    scores = pd.read_csv(data / "scores.csv")

    # score distributions: every defined per-image Dice as a point, the image-macro Dice with its CI
    fig = plotted["score-distributions"]
    for lab in labels:
        pts = fig[(fig["series"] == lab) & (fig["kind"] == "point")]["y"].sort_values().to_numpy()
        np.testing.assert_allclose(pts, np.sort(dice[lab].dropna().to_numpy()), rtol=0, atol=1e-12)
        est = fig[(fig["series"] == lab) & (fig["kind"] == "estimate")].iloc[0]
        ci = scores[(scores["system"] == lab) & (scores["aggregation"] == "image-macro")
                    & (scores["metric"] == "dice")].iloc[0]
        assert est["y"] == pytest.approx(image_macro[lab], abs=1e-12)
        assert (est["low"], est["high"]) == pytest.approx((ci["ci_low"], ci["ci_high"]), abs=1e-12)
        assert est["low"] < est["y"] < est["high"]

    # paired differences: per-image a - b on the images where both are defined; the image-macro difference
    fig = plotted["paired-differences"]
    a, b = labels
    both = dice[[a, b]].dropna()
    pair = f"{a} − {b}"
    assert set(fig["series"]) == {pair}
    pts = fig[fig["kind"] == "point"]["x"].sort_values().to_numpy()
    np.testing.assert_allclose(pts, np.sort((both[a] - both[b]).to_numpy()), rtol=0, atol=1e-12)
    est = fig[fig["kind"] == "estimate"].iloc[0]
    diff = pd.read_csv(data / "paired-differences.csv")
    diff = diff[diff["aggregation"] == "image-macro"].iloc[0]
    assert est["x"] == pytest.approx(image_macro[a] - image_macro[b], abs=1e-12)
    assert (est["low"], est["high"]) == pytest.approx((diff["ci_low"], diff["ci_high"]), abs=1e-12)

    # ranking changes: rank 1 = higher Dice, or lower mean HD95
    metrics = pd.concat([pd.read_parquet(p) for p in sorted(study.glob("*/evaluation/best/metrics.parquet"))])
    metrics["system"] = metrics["run_id"].str.removeprefix("synthetic-")
    counts = _counts(study).assign(system=lambda d: d["run_id"].str.removeprefix("synthetic-"))
    pooled = counts.groupby("system")[["tp", "fp", "fn"]].sum()
    by_rule = {"global-micro/dice": 2 * pooled["tp"] / (2 * pooled["tp"] + pooled["fp"] + pooled["fn"]),
               "image-macro/dice": image_macro}
    by_rule["class-macro/dice"] = by_rule["global-micro/dice"]  # one class
    fig = plotted["ranking-changes"]
    for label, values in by_rule.items():
        best = values.idxmax()
        shown = fig[fig["label"] == label].set_index("series")["y"]
        assert shown.to_dict() == {lab: 1.0 if lab == best else 2.0 for lab in labels}, label
    hd_mean = metrics.groupby("system")["hd95"].mean()
    shown = fig[fig["label"] == "image-macro/hd95"].set_index("series")["y"]
    assert shown.to_dict() == {lab: 1.0 if lab == hd_mean.idxmin() else 2.0 for lab in labels}

    # Dice vs HD95: one point per image with both values defined
    fig = plotted["dice-vs-hd95"]
    for lab in labels:
        m = metrics[metrics["system"] == lab].set_index("image_id")["hd95"]
        joined = pd.DataFrame({"dice": dice[lab], "hd95": m}).dropna().sort_values(["dice", "hd95"])
        pts = fig[fig["series"] == lab].sort_values(["x", "y"])
        assert len(pts) == len(joined) > 0
        np.testing.assert_allclose(pts[["x", "y"]].to_numpy(), joined.to_numpy(), rtol=0, atol=1e-12)

    # boundary section: image means over the images with a value, medians, images without a value
    boundary = pd.read_csv(data / "boundary.csv")
    html = res.html.read_text(encoding="utf-8")
    section = html.split('<section id="boundary">')[1].split("</section>")[0]
    cols = ["hd95", "assd", "nsd_tau1px", "nsd_tau2px", "nsd_tau5px"]
    assert sorted(set(boundary["metric"])) == sorted(cols)
    for lab in labels:
        m = metrics[metrics["system"] == lab]
        for col in cols:
            row = boundary[(boundary["system"] == lab) & (boundary["metric"] == col)].iloc[0]
            assert row["value"] == pytest.approx(m[col].mean(), rel=1e-12, abs=1e-12), (lab, col)
            assert row["median"] == pytest.approx(m[col].median(), rel=1e-12, abs=1e-12), (lab, col)
            assert row["n_excluded"] == m[col].isna().sum() and row["n_images"] == len(m)
            assert f"{m[col].mean():.4f}" in section, (lab, col)


def _two_system_study(root: Path, a: np.ndarray, b: np.ndarray) -> Path:
    """A study folder with two runs whose per-image counts are written by hand (one class, 64 x 64 images)."""
    from msb.evaluation.counts import counts_rows, write_counts

    study = root / "runs" / "pair"
    for name, counts in (("sysA", a), ("sysB", b)):
        run_id = f"ds-{name}"
        rd = study / run_id
        rd.mkdir(parents=True)
        (rd / "config.yaml").write_text(yaml.safe_dump(
            {"study": "pair", "random_seed": 0, "data": {"name": "ds", "root": str(root / "nowhere")},
             "model": {"arch": "unet", "encoder": name}, "evaluation": {"threshold": 0.5}}))
        tp, fp, fn = (counts[:, k:k + 1].astype(np.int64) for k in range(3))
        c = {"tp": tp, "fp": fp, "fn": fn, "tn": 4096 - tp - fp - fn, "intersection": tp, "reference": tp + fn,
             "predicted": tp + fp, "union": tp + fp + fn}
        ctx = dict(dataset="ds", split="test", fold=-1, run_id=run_id, model="unet", checkpoint_role="best",
                   checkpoint_sha256="a" * 64, config_hash="b" * 64, threshold=0.5, threshold_on="probability")
        df = counts_rows(ctx, c, image_ids=[f"img{i:02d}" for i in range(len(counts))], class_ids=[1],
                         class_names=["lesion"], heights=64, widths=64)
        write_counts(df, rd / "evaluation" / "best" / "counts.parquet")
    return study


def test_wilcoxon_of_two_different_systems_matches_scipy(tmp_path: Path):
    """Two systems written by hand that differ on 11 of 14 images (one tie at zero difference, one image
    undefined for both: empty reference and prediction, two images identical): the report's Wilcoxon row equals
    scipy.stats.wilcoxon on the paired per-image Dice of the defined images."""
    rng = np.random.default_rng(5)
    ref = rng.integers(30, 300, 14)
    tp_a = np.floor(ref * rng.uniform(0.6, 0.95, 14)).astype(np.int64)
    tp_b = np.floor(ref * rng.uniform(0.3, 0.9, 14)).astype(np.int64)
    fp_a, fp_b = rng.integers(0, 60, 14), rng.integers(0, 60, 14)
    tp_b[:2], fp_b[:2] = tp_a[:2], fp_a[:2]  # images 0, 1: identical predictions (zero difference)
    ref[13] = tp_a[13] = tp_b[13] = fp_a[13] = fp_b[13] = 0  # image 13: Dice undefined (0/0) for both
    a = np.stack([tp_a, fp_a, ref - tp_a], axis=1)
    b = np.stack([tp_b, fp_b, ref - tp_b], axis=1)
    study = _two_system_study(tmp_path, a, b)
    res = build_report(study, tmp_path / "rep", n_boot=0)
    wil = pd.read_csv(res.out_dir / "data" / "wilcoxon.csv")
    w = wil[wil["metric"] == "dice"].iloc[0]
    da = 2 * tp_a[:13] / (2 * tp_a[:13] + fp_a[:13] + ref[:13] - tp_a[:13])
    db = 2 * tp_b[:13] / (2 * tp_b[:13] + fp_b[:13] + ref[:13] - tp_b[:13])
    assert (da != db).sum() == 11
    expected = stats.wilcoxon(da, db)  # scipy's default zero_method="wilcox" drops the two zero differences
    assert (w["system_a"], w["system_b"], w["n"]) == ("sysA", "sysB", 13)
    assert w["p_value"] == pytest.approx(expected.pvalue, rel=1e-12)
    assert w["statistic"] == pytest.approx(expected.statistic, rel=1e-12)
    assert 0 < w["p_value"] < 1
    html = res.html.read_text(encoding="utf-8")
    sig = html.split('<section id="significance">')[1].split("</section>")[0]
    assert f"{expected.pvalue:.4g}" in sig


def test_reaggregate_extended_options(study: Path, tmp_path: Path):
    out = tmp_path / "scores"
    r = msb_inproc("reaggregate", str(study), "--rules", "all", "--bootstrap", "200", "--compare", "--population",
            "source:synthetic", "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Ranking sensitivity" in r.stdout and "Paired tests" in r.stdout
    scores = pd.read_csv(out / "scores.csv")
    assert {"ci_low", "ci_high", "ci_level", "n_boot"} <= set(scores.columns)
    assert {"image-class-mean", "image-foreground", "pooled-foreground", "pooled-class:polyp"} <= set(
        scores["aggregation"])
    assert (scores["ci_low"] <= scores["value"] + 1e-12).all() and (scores["n_boot"] == 200).all()
    pops = pd.read_csv(out / "populations.csv")
    np.testing.assert_allclose(pops["value_subset"], pops["value_all"])  # the population is every image
    for name in ("wilcoxon", "paired_differences", "ranking_sensitivity"):
        assert len(pd.read_csv(out / f"{name}.csv")) > 0
    # without the new options the command behaves as before (basic rules, no CI columns)
    r = msb_inproc("reaggregate", str(study), "--out", str(tmp_path / "plain"))
    assert r.returncode == 0, r.stderr
    plain = pd.read_csv(tmp_path / "plain" / "scores.csv")
    assert "ci_low" not in plain.columns and set(plain["aggregation"]) == {"global-micro", "image-macro",
                                                                           "class-macro"}


def test_user_errors_are_one_line_and_write_nothing(study: Path, tmp_path: Path):
    from msb.analysis.stats.compare import run_extended
    from msb.analysis.stats.populations import parse_population
    from msb.errors import MSBError

    empty = tmp_path / "empty"
    empty.mkdir()
    r = msb("report", str(empty))
    assert r.returncode == 2 and "no run folder" in r.stderr and "Traceback" not in r.stderr
    assert list(empty.iterdir()) == []
    out = tmp_path / "rep"
    r = msb("report", str(study), "--out", str(out), "--bootstrap", "-1")
    assert r.returncode == 2 and "non-negative" in r.stderr and "Traceback" not in r.stderr
    r = msb("reaggregate", str(study), "--rules", "image-macr", "--out", str(out))
    assert r.returncode == 2 and "image-macr" in r.stderr and "Traceback" not in r.stderr
    # the same checks in-process (no interpreter start-up per case)
    with pytest.raises(MSBError, match="expected source:A,B"):
        parse_population("source:")
    with pytest.raises(MSBError, match="unknown system definition 'arch'"):
        build_report(study, out, system_by="arch")
    with pytest.raises(MSBError, match="none.txt: id list file not found"):
        run_extended(_counts(study), ["run_id"], None, [f"ids:{tmp_path / 'none.txt'}"], 10, True, 0, "run", out,
                     print, print)
    with pytest.raises(MSBError, match="matches no count row"):
        run_extended(_counts(study), ["run_id"], None, ["source:elsewhere"], 10, False, 0, "run", out, print, print)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


def test_failed_report_leaves_the_previous_one(study: Path, tmp_path: Path, monkeypatch):
    out = tmp_path / "rep"
    build_report(study, out, n_boot=20)
    before = (out / "report.html").read_bytes()

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report_doc, "save_figure", boom)  # figures are written by the report document
    with pytest.raises(RuntimeError, match="disk full"):
        build_report(study, out, n_boot=20)
    assert (out / "report.html").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # no temporary folder left


def test_overlays_on_grey_when_the_dataset_is_absent(study: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setattr(report_data, "resolve_data_root", lambda run: None)  # used by the overlay grid
    res = build_report(study, tmp_path / "rep", n_boot=0)
    assert any("grey background" in n for n in res.notes)
    html = res.html.read_text(encoding="utf-8")
    assert "grey background" in html and 'id="fig-overlays"' in html
    item = {i.item: i for i in res.checklist}["Uncertainty (confidence intervals) reported"]
    assert not item.passed and "0 replicates" in item.evidence


def _fake_kfold_study(root: Path) -> Path:
    """3 configurations x 2 folds (run ids <dataset>-<arch>-<hash8>, fold 0/1), 2 classes, 2 sources,
    no predictions, no metrics.parquet, no split.csv: the report must still be complete."""
    from msb.evaluation.counts import counts_rows, write_counts

    rng = np.random.default_rng(0)
    study = root / "runs" / "kf"
    images = [f"img{i:02d}" for i in range(12)]
    for arch, quality in (("archA", 0.9), ("archB", 0.7), ("archC", 0.5)):
        for fold in (0, 1):
            run_id = f"ds-{arch}-{rng.integers(0, 16**8):08x}"
            rd = study / run_id
            rd.mkdir(parents=True)
            (rd / "config.yaml").write_text(yaml.safe_dump(
                {"study": "kf", "random_seed": 0, "data": {"name": "ds", "root": str(root / "nowhere"),
                                                           "split": {"mode": "random", "seed": 0}},
                 "model": {"arch": "unet", "encoder": arch}, "evaluation": {"threshold": 0.5}}))
            ids = images[fold::2]
            ref = rng.integers(20, 200, (len(ids), 2))
            tp = np.floor(ref * rng.uniform(quality - 0.3, quality, ref.shape)).astype(np.int64)
            fp = rng.integers(0, 40, ref.shape)
            c = {"tp": tp, "fp": fp, "fn": ref - tp, "tn": 4096 - ref - fp}
            c.update(intersection=c["tp"], reference=ref, predicted=tp + fp, union=ref + fp)
            ctx = dict(dataset="ds", split="test", fold=fold, run_id=run_id, model="unet", checkpoint_role="best",
                       checkpoint_sha256="a" * 64, config_hash="b" * 64, threshold=0.5, threshold_on="probability")
            df = counts_rows(ctx, c, image_ids=ids, class_ids=[1, 2], class_names=["tumour", "organ"],
                             heights=64, widths=64, sources=["siteA" if int(i[3:]) < 6 else "siteB" for i in ids])
            write_counts(df, rd / "evaluation" / "best" / "counts.parquet")
    return study


def test_report_on_kfold_multiclass_study_without_predictions(tmp_path: Path):
    study = _fake_kfold_study(tmp_path)
    res = build_report(study, n_boot=100)
    html = res.html.read_text(encoding="utf-8")
    for sid in SECTION_IDS:
        assert f'<section id="{sid}">' in html
    # the two folds of each configuration form one system; fold-wise summary and Friedman are shown
    scores = pd.read_csv(res.out_dir / "data" / "scores.csv")
    assert sorted(set(scores["system"])) == ["archA", "archB", "archC"]
    assert (scores["n_images"] == 12).all()
    folds = pd.read_csv(res.out_dir / "data" / "folds.csv")
    assert (folds["n_folds"] == 2).all() and len(folds) == 3 * 3 * 2
    assert "Friedman chi-square" in html and "Nemenyi" in html
    pops = pd.read_csv(res.out_dir / "data" / "populations.csv")
    assert set(pops["population"]) == {"source=siteA", "source=siteB"}
    assert set(pops["n_images_subset"]) == {6}
    # Friedman p-value from the counts: per image, mean over the 2 classes of 2TP / (2TP + FP + FN)
    counts = pd.concat([pd.read_parquet(p) for p in study.glob("*/evaluation/best/counts.parquet")])
    counts["system"] = counts["run_id"].str.split("-").str[1]
    counts["dice"] = 2 * counts["tp"] / (2 * counts["tp"] + counts["fp"] + counts["fn"])
    per_img = counts.groupby(["system", "image_id"])["dice"].mean().unstack("system")
    p = stats.friedmanchisquare(*[per_img[k].to_numpy() for k in ("archA", "archB", "archC")]).pvalue
    assert f"p = {p:.4g}" in html
    # absent artifacts are stated, not faked
    assert 'class="fig-dice-vs-hd95 missing"' in html
    assert any("no stored prediction for 12 cell(s)" in n for n in res.notes)
    assert 'class="fig-overlays missing"' in html
    checks = {i.item: i.passed for i in res.checklist}
    assert checks["HD95 reported"] is False and checks["Split protocol stated"] is False
    assert checks["Significance tested"] is True


def test_boundary_metrics_of_different_conventions_are_left_out(study: Path, tmp_path: Path):
    """One system's metrics recomputed under medpy, the other's under MetricsReloaded: the report neither averages
    nor compares their HD95 (the boundary section of that block is left out, a note names the conventions)."""
    copy = tmp_path / "tiny"
    shutil.copytree(study, copy, ignore=shutil.ignore_patterns("report"))
    files = sorted(copy.glob("*/evaluation/best/metrics.parquet"))
    assert len(files) == 2
    m = pd.read_parquet(files[0])
    assert set(m["hd_convention"]) == {"metrics_reloaded"}
    m.assign(hd_convention="medpy").to_parquet(files[0])
    # as `msb metrics` does after recomputing a table: record the new file's digest
    from msb.utils.digests import set_digest
    from msb.utils.hashing import sha256_file

    set_digest(files[0].parent, "metrics.parquet", sha256_file(files[0]))
    res = build_report(copy, tmp_path / "rep", n_boot=0)
    note = [n for n in res.notes if "boundary metrics left out" in n]
    assert len(note) == 1 and "hd_convention=medpy" in note[0] and "hd_convention=metrics_reloaded" in note[0]
    ok = build_report(study, tmp_path / "rep_ok", n_boot=0)  # control: one convention, no such note
    assert not [n for n in ok.notes if "boundary metrics left out" in n]


@pytest.mark.parametrize("fault", ["missing_prediction", "edited_metrics"])
def test_report_refuses_predictions_or_metrics_that_do_not_match_the_counts(study: Path, tmp_path: Path, fault):
    from msb.errors import MSBError

    copy = tmp_path / "tiny"
    shutil.copytree(study, copy, ignore=shutil.ignore_patterns("report"))
    ev = sorted(copy.glob("*/evaluation/best"))[0]
    if fault == "missing_prediction":
        victim = sorted((ev / "predictions").glob("*.npz"))[0]
        victim.unlink()
        match = rf"1 of \d+ image\(s\) of counts.parquet have no prediction file \({victim.stem}\)"
    else:
        m = pd.read_parquet(ev / "metrics.parquet")
        m.assign(hd95=m["hd95"] * 0.5).to_parquet(ev / "metrics.parquet")
        match = r"metrics.parquet: SHA-256 .* differs"
    with pytest.raises(MSBError, match=match):
        build_report(copy, tmp_path / "rep", n_boot=0)
    assert not (tmp_path / "rep").exists()
