"""The protocol analyses on a tiny hand-built study (tests/analysis/protocol/_protocol_study.py): one cell of each
table recomputed independently from the stored files (pandas reads of counts.parquet, the prediction masks,
scipy.stats.spearmanr / wilcoxon, statsmodels BH, a plain NumPy bootstrap loop with the same seed), and the files
written (CSV / LaTeX / Markdown / PNG dpi / SVG, skipped.json)."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from scipy import ndimage, stats
from statsmodels.stats.multitest import multipletests

sys.path.insert(0, str(Path(__file__).parent))
from _protocol_study import build_study  # noqa: E402

from msb.analysis.protocol import ANALYSES, write_protocol_analyses  # noqa: E402


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    s = build_study(tmp_path_factory.mktemp("proto"), n_test=7, n_ext=7)
    write_protocol_analyses(s)
    return s


def _table(study: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(study / "protocol" / "tables" / f"{name}.csv", keep_default_na=False)


def _evals(study: Path, external: bool = False) -> pd.DataFrame:
    """Every fold's counts read by pandas alone, with architecture and size from the folder and config.yaml."""
    frames = []
    pattern = "*-fold*/evaluation/external/cvc/best/counts.parquet" if external else "*-fold*/evaluation/best/counts.parquet"
    for f in sorted(study.glob(pattern)):
        run = f.parents[4] if external else f.parents[2]
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        df = pd.read_parquet(f)
        frames.append(df.assign(arch=run.name.split("-")[1], size=cfg["data"]["input_size"][0], eval_dir=str(f.parent)))
    return pd.concat(frames, ignore_index=True)


def _dice(tp, fp, fn):
    den = 2 * tp + fp + fn
    return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1), np.nan)


def test_every_analysis_written_or_skipped_with_a_reason(study):
    out = study / "protocol"
    skipped = json.loads((out / "skipped.json").read_text())["skipped"]
    assert set(skipped) == {"p2", "semi_supervised"} and "random split" in skipped["p2"]
    assert "data.labelled_fraction" in skipped["semi_supervised"]  # no labelled subset, no strategy
    for name in ("ranking_sensitivity", "resolution_delta", "efficiency", "external_transfer", "p1", "p3", "lesion",
                 "wilcoxon", "checklist"):
        for suffix in (".csv", ".tex", ".md"):
            assert (out / "tables" / f"{name}{suffix}").is_file(), (name, suffix)
    assert not [p for p in study.iterdir() if p.name.startswith(".protocol")]  # no staging folder left


def test_ranking_sensitivity_cell_matches_scipy_spearman(study):
    df = _evals(study)
    d = df[df["size"] == 192]
    g, i = {}, {}
    for arch, a in d.groupby("arch"):
        g[arch] = float(_dice(a["tp"].sum(), a["fp"].sum(), a["fn"].sum()))
        i[arch] = float(np.nanmean(_dice(a["tp"].to_numpy(), a["fp"].to_numpy(), a["fn"].to_numpy())))
    archs = sorted(g)
    rg = stats.rankdata([-g[a] for a in archs], method="min")
    ri = stats.rankdata([-i[a] for a in archs], method="min")
    row = _table(study, "ranking_sensitivity").set_index("Size").loc[192]
    assert float(row["G vs. I ρ"]) == pytest.approx(stats.spearmanr(rg, ri).statistic)
    assert row["G vs. I nΔ/N"] == f"{int((rg != ri).sum())}/{len(archs)}"
    assert row["G vs. I W"] == ("Yes" if archs[int(np.argmin(rg))] != archs[int(np.argmin(ri))] else "No")
    assert float(row["G vs. C ρ"]) == pytest.approx(1.0) and row["G vs. C nΔ/N"] == "0/3"  # one class: C = G


def test_resolution_delta_cell_matches_a_plain_numpy_bootstrap_loop(study):
    df = _evals(study)
    u = df[df["arch"] == "unet"]
    small = u[u["size"] == 128].sort_values(["fold", "image_id"])
    big = u[u["size"] == 192].set_index(["fold", "image_id"]).loc[list(zip(small["fold"], small["image_id"]))]
    s = small[["tp", "fp", "fn"]].to_numpy()
    b = big[["tp", "fp", "fn"]].to_numpy()
    folds = small["fold"].to_numpy()
    pos = [np.flatnonzero(folds == f) for f in np.unique(folds)]
    rng = np.random.default_rng(0)  # same seed; blocks of 250 replicates, one draw per fold and block
    reps = []
    for start in range(0, 1000, 250):
        draws = [p[rng.integers(0, len(p), size=(250, len(p)), dtype=np.int32)] for p in pos]
        for r in range(250):
            units = np.concatenate([dr[r] for dr in draws])
            ts, tb = s[units].sum(0), b[units].sum(0)
            reps.append(float(_dice(tb[0], tb[1], tb[2]) - _dice(ts[0], ts[1], ts[2])))
    lo, hi = np.percentile(reps, [2.5, 97.5])
    point = float(_dice(*b.sum(0)) - _dice(*s.sum(0)))
    row = _table(study, "resolution_delta").set_index("Architecture").loc["unet"]
    assert float(row["ΔDSC (pp)"]) == pytest.approx(100 * point)
    assert float(row["CI low (pp)"]) == pytest.approx(100 * lo) and float(row["CI high (pp)"]) == pytest.approx(100 * hi)
    assert int(row["Units"]) == 14 and int(row["Folds"]) == 2
    md = (study / "protocol" / "tables" / "resolution_delta.md").read_text()
    assert "1000 paired fold-stratified bootstrap replicates" in md and "seed 0" in md


def test_p1_cell_from_the_prediction_masks(study):
    dice, rec = [], []
    for f in sorted(study.glob("kv-unet-*-fold*/evaluation/external/cvc/best/predictions/*.npz")):
        run = f.parents[5]
        if yaml.safe_load((run / "config.yaml").read_text())["data"]["input_size"][0] != 128:
            continue
        z = np.load(f)
        p, r = z["pred"][0], z["ref"][0]
        dice.append(2 * (p & r).sum() / (p.sum() + r.sum()))
        rec.append((p & r).sum() / r.sum())
    hd = pd.concat([pd.read_parquet(m) for m in study.glob("kv-unet-*-fold*/evaluation/external/cvc/best/metrics.parquet")
                    if "fold" in m.parents[4].name and yaml.safe_load((m.parents[4] / "config.yaml").read_text())
                    ["data"]["input_size"][0] == 128])
    row = _table(study, "p1").set_index("Model").loc["unet (128)"]
    assert len(dice) == 14
    assert float(row["cvc Dice"]) == pytest.approx(np.mean(dice))
    assert float(row["cvc Rec"]) == pytest.approx(np.mean(rec))
    assert float(row["cvc HD95"]) == pytest.approx(hd["hd95"].mean())


def test_wilcoxon_cell_matches_scipy_and_statsmodels_bh(study):
    df = _evals(study)
    kv = df.assign(dice=_dice(df["tp"], df["fp"], df["fn"]))
    met = pd.concat([pd.read_parquet(Path(d) / "metrics.parquet").assign(eval_dir=d) for d in sorted(set(df["eval_dir"]))])
    kv = kv.merge(met[["eval_dir", "image_id", "hd95"]], on=["eval_dir", "image_id"])
    models = sorted({(a, s) for a, s in zip(kv["arch"], kv["size"])})
    # every fold model predicts the same 7 test images: one unit per image, the mean over the 2 folds
    vec = {m: kv[(kv["arch"] == m[0]) & (kv["size"] == m[1])].groupby("image_id")[["dice", "hd95"]].mean()
           for m in models}
    ps, cells = [], {}
    for i, a in enumerate(models):
        for b in models[i + 1:]:
            for metric in ("dice", "hd95"):
                x, y = vec[a][metric].to_numpy(), vec[b][metric].to_numpy()
                p = stats.wilcoxon(x, y).pvalue
                ps.append(p)
                cells[(a, b, metric)] = (p, len(ps) - 1, x - y)
    adj = multipletests(ps, method="fdr_bh")[1]
    t = _table(study, "wilcoxon")
    row = t[(t["Test set"] == "kv") & (t["Model A"] == "pvt (128)") & (t["Model B"] == "unet (128)")
            & (t["Metric"] == "dice")].iloc[0]
    p, k, d = cells[(("pvt", 128), ("unet", 128), "dice")]
    nz = d[d != 0]
    ranks = stats.rankdata(np.abs(nz))
    rb = (ranks[nz > 0].sum() - ranks[nz < 0].sum()) / ranks.sum()
    assert float(row["p"]) == pytest.approx(p) and float(row["p (BH)"]) == pytest.approx(adj[k])
    assert float(row["Rank-biserial r"]) == pytest.approx(rb)
    assert float(row["Mean diff (A−B)"]) == pytest.approx(d.mean()) and int(row["n"]) == 7
    assert row["Values A"] == row["Values B"] == "mean over folds (2)"
    assert float(row["CI low"]) <= d.mean() <= float(row["CI high"])


def test_lesion_cell_any_overlap_from_components(study):
    tp = n_ref = hit_pred = n_pred = 0
    eight = ndimage.generate_binary_structure(2, 2)
    for f in sorted(study.glob("kv-segf-*-fold*/evaluation/**/predictions/*.npz")):
        run = next(p for p in f.parents if p.name.startswith("kv-segf-"))
        if yaml.safe_load((run / "config.yaml").read_text())["data"]["input_size"][0] != 192:
            continue
        z = np.load(f)
        p, r = z["pred"][0], z["ref"][0]
        lr, nr = ndimage.label(r, eight)
        lp, npred = ndimage.label(p, eight)
        tp += sum(bool(p[lr == k].any()) for k in range(1, nr + 1))
        hit_pred += sum(bool(r[lp == k].any()) for k in range(1, npred + 1))
        n_ref, n_pred = n_ref + nr, n_pred + npred
    row = _table(study, "lesion").set_index("Model").loc["segf (192)"]
    sens, prec = tp / n_ref, hit_pred / n_pred
    assert float(row["any-overlap Sens"]) == pytest.approx(sens)
    assert float(row["any-overlap Prec"]) == pytest.approx(prec)
    assert float(row["any-overlap F1"]) == pytest.approx(2 * sens * prec / (sens + prec))
    curve = pd.read_csv(study / "protocol" / "data" / "lesion_iou_curve.csv")
    assert sorted(set(curve["iou_threshold"].round(2))) == [round(0.1 + 0.05 * i, 2) for i in range(14)]


def test_external_transfer_ensemble_cell_from_fold_masks(study):
    folds = sorted(study.glob("kv-segf-*-fold*/"))
    folds = [f for f in folds if yaml.safe_load((f / "config.yaml").read_text())["data"]["input_size"][0] == 192]
    tp = fp = fn = 0
    for k in range(7):
        preds = [np.load(f / "evaluation/external/cvc/best/predictions" / f"e{k}.npz")["pred"][0] for f in folds]
        ref = np.load(folds[0] / "evaluation/external/cvc/best/predictions" / f"e{k}.npz")["ref"][0]
        ens = 2 * np.sum(preds, axis=0) > len(preds)
        tp, fp, fn = tp + (ens & ref).sum(), fp + (ens & ~ref).sum(), fn + (~ens & ref).sum()
    t = _table(study, "external_transfer")
    row = t[(t["Architecture"] == "segf") & (t["Size"].astype(str) == "192")].iloc[0]
    assert float(row["Ensemble DSC"]) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert float(row["Ensemble Recall"]) == pytest.approx(tp / (tp + fn)) and str(row["Folds K"]) == "2"


def test_efficiency_cell_and_checklist(study):
    prof = pd.read_parquet(study / "profile" / "profile_cpu.parquet")
    p = prof[(prof["model"] == "segf") & (prof["input_h"] == 192)].iloc[0]
    row = _table(study, "efficiency").set_index("Architecture").loc["segf"]
    assert float(row["192×192 GMACs"]) == pytest.approx(p["gmacs"])
    assert float(row["192×192 PM (GiB)"]) == pytest.approx(p["peak_mem_delta_mib"] / 1024)
    assert f"{p['latency_ms_median']:.2f} ± {p['latency_ms_sd']:.2f}" in (
        study / "protocol" / "tables" / "efficiency.md").read_text()
    chk = _table(study, "checklist")
    assert list(chk["Status"]) == ["PASS"] * 5 and len(chk) == 5


def test_file_formats(study):
    out = study / "protocol"
    tex = (out / "tables" / "ranking_sensitivity.tex").read_text()
    assert tex.startswith("\\begin{table}") and "\\toprule" in tex and "\\multicolumn{3}{c}{G vs. I}" in tex
    md = (out / "tables" / "ranking_sensitivity.md").read_text().splitlines()
    header = [c.strip() for c in md[2].strip("|").split("|")]
    assert header == list(_table(study, "ranking_sensitivity").columns)
    for fig in ("resolution_delta", "external_transfer", "lesion_iou_curve"):
        with Image.open(out / "figures" / f"{fig}.png") as im:
            assert min(im.info["dpi"]) >= 149.9
        assert ET.parse(out / "figures" / f"{fig}.svg").getroot().tag.endswith("svg")


def test_registry_names():
    assert list(ANALYSES) == ["ranking_sensitivity", "resolution_delta", "efficiency", "external_transfer", "p1",
                              "p2", "p3", "lesion", "wilcoxon", "checklist", "semi_supervised"]
