"""``msb run configs/protocols/msb_case_study_paper_ci.yaml`` end to end (issue 36): a 3-class NeoPolyp-like and a
4-class CAMUS-like synthetic set (patient groups) x 2 tiny architectures x 32 / 64 px, 3 group-aware folds, the
NeoPolyp-like folds and their strict-majority ensemble on a binary external set with the two classes united;
then one cell of each of the paper's outputs recomputed independently from the stored files: class-macro, msb
image-macro and the paper's image-macro (msb image-foreground) Dice by hand from the counts, ρ with
scipy.stats.spearmanr (Table 2), a plain NumPy fold-stratified bootstrap loop (Figure 3), the parameter count of
the network built with segmentation-models-pytorch directly (Table 3), the majority vote of the stored fold masks
(Figure 4); patient folds never split a patient."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from scipy import stats

REPO = Path(__file__).resolve().parents[2]
STUDY_FILE = REPO / "configs" / "protocols" / "msb_case_study_paper_ci.yaml"
DATASETS = ("synthetic_ci_neopolyp", "synthetic_ci_camus")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """Run the CI study in a temporary folder (datasets/ and runs/ are created there, never in the repo)."""
    work = tmp_path_factory.mktemp("paper_ci")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", COLUMNS="200",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "msb", "run", str(STUDY_FILE), "--run-root", str(work / "runs")],
                       cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print(f"msb run {STUDY_FILE.name}: {time.perf_counter() - t0:.0f} s wall")
    assert "protocol analyses (ranking_sensitivity, resolution_delta, efficiency, external_transfer) written to" \
        in r.stdout + r.stderr
    return work / "runs" / "msb_case_study_paper_ci"


def _fold_runs(study: Path) -> list[tuple[Path, str, str, int]]:
    """(run folder, dataset, architecture, input size) of every fold run, from the folder name and config.yaml."""
    out = []
    for run in sorted(study.glob("*-fold*")):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        ds, arch = run.name.split("-")[:2]
        out.append((run, ds, arch, int(cfg["data"]["input_size"][0])))
    return out


def _evals(study: Path) -> pd.DataFrame:
    """Internal test counts of every fold run, read by pandas alone."""
    return pd.concat([pd.read_parquet(run / "evaluation" / "best" / "counts.parquet").assign(ds=ds, arch=arch, size=s)
                      for run, ds, arch, s in _fold_runs(study)], ignore_index=True)


def _dice(tp, fp, fn):
    tp, fp, fn = (np.asarray(v, dtype=np.float64) for v in (tp, fp, fn))
    den = 2 * tp + fp + fn
    return np.where(den > 0, 2 * tp / np.where(den > 0, den, 1), np.nan)


def test_all_four_outputs_are_written(study: Path):
    out = study / "protocol"
    assert json.loads((out / "skipped.json").read_text())["skipped"] == {}
    for name in ("ranking_sensitivity", "resolution_delta", "efficiency", "external_transfer"):
        for suffix in (".csv", ".tex", ".md"):
            assert (out / "tables" / f"{name}{suffix}").is_file(), (name, suffix)
    for fig in ("resolution_delta", "external_transfer"):
        with Image.open(out / "figures" / f"{fig}.png") as im:
            assert min(im.info["dpi"]) >= 149.9
        assert ET.parse(out / "figures" / f"{fig}.svg").getroot().tag.endswith("svg")
    assert (study / "_study" / "exclusions.csv").read_text().strip() == "unit,dataset,architecture,input_size,reason"
    md = (out / "tables" / "ranking_sensitivity.md").read_text()
    assert "msb rule image-foreground" in md  # the paper's image-macro, named by its msb rule


@pytest.mark.parametrize("dataset,n_fg", [("synthetic_ci_neopolyp", 2), ("synthetic_ci_camus", 3)])
def test_multiclass_dice_by_hand(study: Path, dataset: str, n_fg: int):
    """Per fold run: class-macro (per class pooled over images, then the class mean) and msb image-macro (per
    class the mean over images with a defined Dice, then the class mean) equal scores.csv; per architecture x size
    (folds pooled): the paper's image-macro (classes pooled per image, then the mean over images) equals the
    ranked I value of data/ranking_sensitivity_dice.csv, and it differs from msb's image-macro."""
    d = _evals(study)
    d = d[d["ds"] == dataset]
    assert sorted(d["class_id"].unique()) == list(range(1, n_fg + 1))
    scores = pd.read_csv(study / "scores.csv")
    scores = scores[(scores["metric"] == "dice") & (scores["dataset"] == dataset)].set_index(["run_id",
                                                                                            "aggregation"])
    for rid, r in d.groupby("run_id"):
        per_class = r.groupby("class_id")[["tp", "fp", "fn"]].sum()
        cm = float(np.nanmean(_dice(per_class["tp"], per_class["fp"], per_class["fn"])))
        im = float(np.nanmean([np.nanmean(_dice(g["tp"], g["fp"], g["fn"])) for _, g in r.groupby("class_id")]))
        assert scores.loc[(rid, "class-macro"), "value"] == pytest.approx(cm)
        assert scores.loc[(rid, "image-macro"), "value"] == pytest.approx(im)
    ranked = pd.read_csv(study / "protocol" / "data" / "ranking_sensitivity_dice.csv")
    ranked = ranked[ranked["dataset"] == dataset].set_index(["architecture", "input_size"])
    differs = 0
    for (arch, size), r in d.groupby(["arch", "size"]):
        per_image = r.groupby(["fold", "image_id"])[["tp", "fp", "fn"]].sum()
        paper_i = float(np.nanmean(_dice(per_image["tp"], per_image["fp"], per_image["fn"])))
        msb_im = float(np.nanmean([np.nanmean(_dice(g["tp"], g["fp"], g["fn"])) for _, g in r.groupby("class_id")]))
        assert ranked.loc[(arch, size), "I image-foreground"] == pytest.approx(paper_i)
        differs += abs(paper_i - msb_im) > 1e-6
    assert differs > 0


def test_patient_folds_never_split_a_patient(study: Path):
    """Every unit of a dataset has the same folds.csv; on the CAMUS-like set each patient's frames lie in one fold
    (and the held-out test patients in none)."""
    for ds in DATASETS:
        folds = {p.read_bytes() for p in (study / "_study").glob(f"{ds}-*/folds.csv")}
        assert len(folds) == 1, ds
    f = pd.read_csv(next((study / "_study").glob("synthetic_ci_camus-*/folds.csv")), keep_default_na=False)
    groups = pd.read_csv(Path(study).parents[1] / "datasets" / "synthetic_ci_camus" / "index.csv")
    f = f.merge(groups[["sample_id", "group"]], on="sample_id", suffixes=("", "_index"))
    assert sorted(set(f["fold"])) == [-1, 0, 1, 2]
    assert f.groupby("group_index")["fold"].nunique().max() == 1
    assert f["group_index"].str.startswith("patient_").all()


def test_table2_cell_matches_scipy_spearman(study: Path):
    d = _evals(study)
    d = d[(d["ds"] == "synthetic_ci_camus") & (d["size"] == 64)]
    g, c = {}, {}
    for arch, a in d.groupby("arch"):
        g[arch] = float(_dice(a["tp"].sum(), a["fp"].sum(), a["fn"].sum()))
        pc = a.groupby("class_id")[["tp", "fp", "fn"]].sum()
        c[arch] = float(np.nanmean(_dice(pc["tp"], pc["fp"], pc["fn"])))
    archs = sorted(g)
    rg = stats.rankdata([-g[a] for a in archs], method="min")
    rc = stats.rankdata([-c[a] for a in archs], method="min")
    t = pd.read_csv(study / "protocol" / "tables" / "ranking_sensitivity.csv", keep_default_na=False)
    row = t[(t["Dataset"] == "synthetic_ci_camus") & (t["Size"] == 64)].iloc[0]
    assert float(row["G vs. C ρ"]) == pytest.approx(stats.spearmanr(rg, rc).statistic)
    assert row["G vs. C nΔ/N"] == f"{int((rg != rc).sum())}/2"
    assert row["G vs. C W"] == ("Yes" if archs[int(np.argmin(rg))] != archs[int(np.argmin(rc))] else "No")


def test_figure3_interval_matches_a_numpy_bootstrap_loop(study: Path):
    """ΔDSC 64 - 32 of unet_tiny on the NeoPolyp-like set: units (fold, image), counts summed over the classes."""
    n_boot, seed = 200, 0
    u = _evals(study)
    u = u[(u["ds"] == "synthetic_ci_neopolyp") & (u["arch"] == "unet_tiny")]
    per = u.groupby(["size", "fold", "image_id"], sort=True)[["tp", "fp", "fn"]].sum()
    small, big = per.loc[32], per.loc[64].loc[per.loc[32].index]
    s, b = small.to_numpy(), big.to_numpy()
    folds = small.index.get_level_values("fold").to_numpy()
    pos = [np.flatnonzero(folds == f) for f in np.unique(folds)]
    rng = np.random.default_rng(seed)  # blocks of (at most) 250 replicates, one draw per fold and block
    reps = []
    for start in range(0, n_boot, 250):
        nb = min(250, n_boot - start)
        draws = [p[rng.integers(0, len(p), size=(nb, len(p)), dtype=np.int32)] for p in pos]
        for r in range(nb):
            units = np.concatenate([dr[r] for dr in draws])
            reps.append(float(_dice(*b[units].sum(0)) - _dice(*s[units].sum(0))))
    lo, hi = np.percentile(reps, [2.5, 97.5])
    t = pd.read_csv(study / "protocol" / "tables" / "resolution_delta.csv")
    row = t[(t["Dataset"] == "synthetic_ci_neopolyp") & (t["Architecture"] == "unet_tiny")].iloc[0]
    assert float(row["ΔDSC (pp)"]) == pytest.approx(100 * float(_dice(*b.sum(0)) - _dice(*s.sum(0))))
    assert float(row["CI low (pp)"]) == pytest.approx(100 * lo)
    assert float(row["CI high (pp)"]) == pytest.approx(100 * hi)
    assert int(row["Units"]) == len(small) and int(row["Folds"]) == 3


def test_table3_parameter_count_from_the_model(study: Path):
    """Param (M) of unet_tiny = the smp network with 2 output classes (efficiency_num_classes: 2, as the paper
    timed a NeoPolyp checkpoint); both sizes measured."""
    import segmentation_models_pytorch as smp

    net = smp.Unet(encoder_name="tu-mobilenetv3_small_050", encoder_weights=None, classes=2,
                   decoder_channels=[16, 8, 8, 8, 8])
    t = pd.read_csv(study / "protocol" / "tables" / "efficiency.csv").set_index("Architecture")
    assert float(t.loc["unet_tiny", "Param (M)"]) == pytest.approx(sum(p.numel() for p in net.parameters()) / 1e6)
    for size in (32, 64):
        assert float(t.loc["unet_tiny", f"{size}×{size} TP (img/s)"]) == pytest.approx(
            1000.0 / float(t.loc["unet_tiny", f"{size}×{size} Latency (ms)"]))


def test_figure4_ensemble_from_the_stored_fold_masks(study: Path):
    """The NeoPolyp-like folds' external predictions are stored merged (one class, id 1); the strict-majority vote
    of the three stored fold masks gives the table's ensemble Dice; the CAMUS-like units have no external set."""
    folds = [run for run, ds, arch, size in _fold_runs(study)
             if ds == "synthetic_ci_neopolyp" and arch == "unet_mnv3s075" and size == 64]
    assert len(folds) == 3
    assert not any((run / "evaluation" / "external").exists() for run, ds, *_ in _fold_runs(study)
                   if ds == "synthetic_ci_camus")
    pred_dir = Path("evaluation/external/synthetic_ci_ext/best/predictions")
    names = sorted(p.name for p in (folds[0] / pred_dir).glob("*.npz"))
    assert len(names) == 10
    tp = fp = fn = 0
    for name in names:
        zs = [np.load(run / pred_dir / name) for run in folds]
        assert all(z["pred"].shape[0] == 1 and list(z["class_ids"]) == [1] for z in zs)
        ens = 2 * np.sum([z["pred"].astype(bool) for z in zs], axis=0) > len(zs)  # 2 of 3
        ref = zs[0]["ref"].astype(bool)
        tp, fp, fn = tp + (ens & ref).sum(), fp + (ens & ~ref).sum(), fn + (~ens & ref).sum()
    t = pd.read_csv(study / "protocol" / "tables" / "external_transfer.csv", keep_default_na=False)
    row = t[(t["Architecture"] == "unet_mnv3s075") & (t["Size"].astype(str) == "64")].iloc[0]
    assert str(row["Folds K"]) == "3"
    assert float(row["Ensemble DSC"]) == pytest.approx(2 * tp / (2 * tp + fp + fn))
