"""``msb run configs/protocols/msb_case_study_ci.yaml`` end to end (issue 12): 2 tiny architectures x input sizes
32 and 64 px x 3 folds, 1 epoch, an external synthetic set, a few-pass CPU profile; then one cell of every
case-study table recomputed independently from the stored files: pandas reads of the fold counts, scipy.stats
spearmanr for ρ (a), a plain NumPy paired fold-stratified bootstrap loop with the printed seed for one ΔDSC
interval (b), the parameter count of the same network built with segmentation-models-pytorch directly and the
profile table (c), the strict-majority vote of the stored fold masks for the ensemble (d), and the matched folds
(one folds.csv for both sizes, one split policy string)."""

from __future__ import annotations

import importlib.util
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from scipy import stats

REPO = Path(__file__).resolve().parents[2]
STUDY_FILE = REPO / "configs" / "protocols" / "msb_case_study_ci.yaml"


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """Run the CI study in a temporary folder (datasets/ and runs/ are created there, never in the repo)."""
    work = tmp_path_factory.mktemp("case_study_ci")
    # in-process (the same typer app as the ``msb`` command, one torch thread, working folder ``work``): the tests
    # read what the run writes, so no interpreter start-up and torch/timm/smp import
    spec = importlib.util.spec_from_file_location("_study_conftest_case", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    r = mod.run_msb_in_process("run", str(STUDY_FILE), "--run-root", str(work / "runs"), cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "protocol analyses (ranking_sensitivity, resolution_delta, efficiency, external_transfer, checklist) " \
           "written to" in r.stdout + r.stderr
    return work / "runs" / "msb_case_study_ci"


def _table(study: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(study / "protocol" / "tables" / f"{name}.csv", keep_default_na=False)


def _fold_runs(study: Path) -> list[tuple[Path, str, int]]:
    """(run folder, architecture, input size) of every fold run, from the folder name and config.yaml."""
    out = []
    for run in sorted(study.glob("*-fold*")):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        out.append((run, run.name.split("-")[1], int(cfg["data"]["input_size"][0])))
    return out


def _evals(study: Path) -> pd.DataFrame:
    """Internal test counts of every fold run, read by pandas alone."""
    frames = [pd.read_parquet(run / "evaluation" / "best" / "counts.parquet").assign(arch=arch, size=size)
              for run, arch, size in _fold_runs(study)]
    return pd.concat(frames, ignore_index=True)


def _dice(tp, fp, fn):
    tp, fp, fn = (np.asarray(v, dtype=np.float64) for v in (tp, fp, fn))
    den = 2 * tp + fp + fn
    return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1), np.nan)


def test_every_case_study_table_and_figure(study: Path):
    out = study / "protocol"
    assert json.loads((out / "skipped.json").read_text())["skipped"] == {}
    for name in ("ranking_sensitivity", "resolution_delta", "efficiency", "external_transfer", "checklist"):
        for suffix in (".csv", ".tex", ".md"):
            assert (out / "tables" / f"{name}{suffix}").is_file(), (name, suffix)
    for fig in ("resolution_delta", "external_transfer"):
        with Image.open(out / "figures" / f"{fig}.png") as im:
            assert min(im.info["dpi"]) >= 149.9
        assert ET.parse(out / "figures" / f"{fig}.svg").getroot().tag.endswith("svg")
    chk = _table(study, "checklist")
    assert len(chk) == 5
    assert chk.set_index("#").loc[4, "Status"] == "PASS"  # the external set
    assert chk.set_index("#").loc[3, "Status"] == "PASS"  # k-fold + external-only is one protocol, not a mix


def test_input_sizes_share_their_folds(study: Path):
    folds = {p.parent.name: p.read_bytes() for p in (study / "_study").glob("*/folds.csv")}
    assert sorted(folds) == ["synthetic_ci-unet_mnv3s075-input_size32x32", "synthetic_ci-unet_mnv3s075-input_size64x64",
                             "synthetic_ci-unet_tiny-input_size32x32", "synthetic_ci-unet_tiny-input_size64x64"]
    assert len(set(folds.values())) == 1
    f = pd.read_csv(next((study / "_study").glob("*/folds.csv")), keep_default_na=False)
    assert sorted(set(f["fold"])) == [-1, 0, 1, 2]
    for g, block in f[f["fold"] >= 0].groupby("group"):  # group-aware: one video stays in one fold
        assert block["fold"].nunique() == 1, g
    df = _evals(study)
    pol = df.groupby("size")["split_policy"].unique()
    assert len(pol[32]) == 1 and list(pol[32]) == list(pol[64]) and pol[32][0].startswith("kfold(k=3,folds=")
    import hashlib

    sha8 = hashlib.sha256(next(iter(folds.values()))).hexdigest()[:8]
    assert pol[32][0] == f"kfold(k=3,folds={sha8})"
    assert (study / "_study" / "exclusions.csv").read_text().strip() == "unit,dataset,architecture,input_size,reason"


def test_ranking_sensitivity_cell_matches_scipy_spearman(study: Path):
    d = _evals(study)
    d = d[d["size"] == 64]
    g, i = {}, {}
    for arch, a in d.groupby("arch"):
        g[arch] = float(_dice(a["tp"].sum(), a["fp"].sum(), a["fn"].sum()))
        i[arch] = float(np.nanmean(_dice(a["tp"], a["fp"], a["fn"])))
    archs = sorted(g)
    rg = stats.rankdata([-g[a] for a in archs], method="min")
    ri = stats.rankdata([-i[a] for a in archs], method="min")
    row = _table(study, "ranking_sensitivity").set_index("Size").loc[64]
    rho = stats.spearmanr(rg, ri).statistic
    assert float(row["G vs. I ρ"]) == pytest.approx(rho)
    assert row["G vs. I nΔ/N"] == f"{int((rg != ri).sum())}/2"
    assert row["G vs. I W"] == ("Yes" if archs[int(np.argmin(rg))] != archs[int(np.argmin(ri))] else "No")


def test_resolution_delta_interval_matches_a_numpy_bootstrap_loop(study: Path):
    n_boot, seed = 200, 0  # the study file's analyses.n_boot and seed, printed in the caption
    md = (study / "protocol" / "tables" / "resolution_delta.md").read_text()
    assert f"{n_boot} paired fold-stratified bootstrap replicates" in md and f"seed {seed}" in md
    u = _evals(study)
    u = u[u["arch"] == "unet_tiny"]
    small = u[u["size"] == 32].sort_values(["fold", "image_id"])
    big = u[u["size"] == 64].set_index(["fold", "image_id"]).loc[list(zip(small["fold"], small["image_id"]))]
    s, b = small[["tp", "fp", "fn"]].to_numpy(), big[["tp", "fp", "fn"]].to_numpy()
    folds = small["fold"].to_numpy()
    pos = [np.flatnonzero(folds == f) for f in np.unique(folds)]
    rng = np.random.default_rng(seed)  # blocks of (at most) 250 replicates, one draw per fold and block
    reps = []
    for start in range(0, n_boot, 250):
        nb = min(250, n_boot - start)
        draws = [p[rng.integers(0, len(p), size=(nb, len(p)), dtype=np.int32)] for p in pos]
        for r in range(nb):
            units = np.concatenate([dr[r] for dr in draws])
            ts, tb = s[units].sum(0), b[units].sum(0)
            reps.append(float(_dice(*tb) - _dice(*ts)))
    lo, hi = np.percentile(reps, [2.5, 97.5])
    row = _table(study, "resolution_delta").set_index("Architecture").loc["unet_tiny"]
    assert float(row["ΔDSC (pp)"]) == pytest.approx(100 * float(_dice(*b.sum(0)) - _dice(*s.sum(0))))
    assert float(row["CI low (pp)"]) == pytest.approx(100 * lo) and float(row["CI high (pp)"]) == pytest.approx(100 * hi)
    assert int(row["Units"]) == len(small) and int(row["Folds"]) == 3


def test_efficiency_cell_from_smp_and_the_profile(study: Path):
    import segmentation_models_pytorch as smp

    net = smp.Unet(encoder_name="tu-mobilenetv3_small_050", encoder_weights=None, classes=1,
                   decoder_channels=[16, 8, 8, 8, 8])
    n_params = sum(p.numel() for p in net.parameters())
    row = _table(study, "efficiency").set_index("Architecture").loc["unet_tiny"]
    assert float(row["Param (M)"]) == pytest.approx(n_params / 1e6)
    prof = pd.read_parquet(study / "profile" / "profile_cpu.parquet")
    p = prof[(prof["arch"] == "unet") & (prof["encoder"] == "tu-mobilenetv3_small_050") & (prof["input_h"] == 64)]
    p = p.iloc[0]
    assert int(p["warmup"]) == 1 and int(p["timed_passes"]) == 2 and int(p["repeats"]) == 2
    assert float(row["64×64 Latency (ms)"]) == pytest.approx(float(np.median(json.loads(p["latency_ms_repeats"]))
                                                                   if isinstance(p["latency_ms_repeats"], str)
                                                                   else np.median(p["latency_ms_repeats"])))
    assert float(row["64×64 TP (img/s)"]) == pytest.approx(1000.0 / float(row["64×64 Latency (ms)"]))


def test_external_transfer_ensemble_cell_from_the_fold_masks(study: Path):
    folds = [run for run, arch, size in _fold_runs(study) if arch == "unet_mnv3s075" and size == 32]
    assert len(folds) == 3
    pred_dir = Path("evaluation/external/synthetic_ci_ext/best/predictions")
    names = sorted(p.name for p in (folds[0] / pred_dir).glob("*.npz"))
    assert len(names) == 10
    tp = fp = fn = 0
    fold_dice = []
    for k, run in enumerate(folds):
        t = f_ = n_ = 0
        for name in names:
            z = np.load(run / pred_dir / name)
            p, r = z["pred"].astype(bool), z["ref"].astype(bool)
            t, f_, n_ = t + (p & r).sum(), f_ + (p & ~r).sum(), n_ + (~p & r).sum()
        fold_dice.append(2 * t / (2 * t + f_ + n_))
    for name in names:
        preds = [np.load(run / pred_dir / name)["pred"].astype(bool) for run in folds]
        ref = np.load(folds[0] / pred_dir / name)["ref"].astype(bool)
        ens = 2 * np.sum(preds, axis=0) > len(preds)  # strict majority: 2 of 3
        tp, fp, fn = tp + (ens & ref).sum(), fp + (ens & ~ref).sum(), fn + (~ens & ref).sum()
    t = _table(study, "external_transfer")
    row = t[(t["Architecture"] == "unet_mnv3s075") & (t["Size"].astype(str) == "32")].iloc[0]
    assert str(row["Folds K"]) == "3"
    assert float(row["Ensemble DSC"]) == pytest.approx(2 * tp / (2 * tp + fp + fn))
    assert float(row["Ensemble Recall"]) == pytest.approx(tp / (tp + fn))
    md = (study / "protocol" / "tables" / "external_transfer.md").read_text()
    mean, sd = float(np.mean(fold_dice)), float(np.std(fold_dice, ddof=1))
    assert f"{mean:.3f} ± {sd:.3f}" in md
