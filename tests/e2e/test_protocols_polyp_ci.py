"""The polyp audit's protocol studies P1-P3 end to end on their CI variants (configs/protocols/polyp_p*_ci.yaml):
``msb run`` from an empty working folder (the generated PraNet-layout datasets are prepared there on first use),
then the protocol analyses (``msb reaggregate --analyses``), and one cell of every table recomputed here from the
stored files with plain pandas/NumPy/SciPy/statsmodels: Dice and recall from ``counts.parquet``, HD95 and NSD
means from ``metrics.parquet``, lesion any-overlap counts from the prediction masks (scipy.ndimage.label),
a Wilcoxon p-value (scipy.stats.wilcoxon) and its BH adjustment (statsmodels multipletests), P2's mean ± SD over
seeds and its flips, and the checklist's evidence."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import ndimage, stats
from statsmodels.stats.multitest import multipletests

REPO = Path(__file__).resolve().parents[2]
PROTOCOLS = REPO / "configs" / "protocols"
MODELS = ("segformer_b0 (32)", "unet_r18 (32)")
EXTERNAL = ("CVC-ColonDB", "ETIS-LaribPolypDB", "CVC-300")
TIMES: dict[str, float] = {}


#: (study, analyses) in the order they run
STUDIES = (("polyp_p1_ci", "p1,lesion,wilcoxon,checklist"), ("polyp_p2_ci", "p2,checklist"),
           ("polyp_p3_ci", "p3,lesion,wilcoxon,checklist"))
#: One Python process runs every CLI call in turn (``msb run`` then ``msb reaggregate --analyses``, through the
#: same typer app as the ``msb`` command), so torch/timm/smp are imported once, not six times; it prints the
#: seconds each study took.
DRIVER = """
import json, sys, time
from msb.cli.app import app
times = {}
for study, analyses in json.loads(sys.argv[1]):
    t0 = time.perf_counter()
    for args in (["run", sys.argv[2] + "/" + study + ".yaml", "--run-root", "runs"],
                 ["reaggregate", "runs/" + study, "--analyses", analyses, "--bootstrap", "200"]):
        try:
            app(args, standalone_mode=False)
        except SystemExit as e:
            if e.code:
                raise
    times[study] = time.perf_counter() - t0
print("TIMES " + json.dumps(times))
"""


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> dict[str, Path]:
    """The three CI studies run in one working folder (datasets/ prepared once there, runs/<study>/)."""
    import json

    work = tmp_path_factory.mktemp("polyp_protocols")
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", COLUMNS="200",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(STUDIES), str(PROTOCOLS)], cwd=work, env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"protocol studies failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    TIMES.update(json.loads(r.stdout.split("TIMES ", 1)[1].splitlines()[0]))
    return {name: work / "runs" / name for name, _ in STUDIES}


@pytest.fixture(scope="module")
def p1(studies) -> Path:
    return studies["polyp_p1_ci"]


@pytest.fixture(scope="module")
def p2(studies) -> Path:
    return studies["polyp_p2_ci"]


@pytest.fixture(scope="module")
def p3(studies) -> Path:
    return studies["polyp_p3_ci"]


def _table(study: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(study / "protocol" / "tables" / f"{name}.csv", keep_default_na=False)


def _eval_dir(study: Path, arch: str, external: str | None = None) -> Path:
    (run,) = [p for p in study.glob(f"pranet_seen_ci-{arch}-*") if (p / "config.yaml").is_file()]
    return run / "evaluation" / ("external/" + external if external else "") / "best"


def _per_image(counts: pd.DataFrame) -> pd.DataFrame:
    """Per-image Dice and recall (one class), NaN where undefined, from the raw pixel counts."""
    tp, fp, fn = (counts[c].to_numpy(np.float64) for c in ("tp", "fp", "fn"))
    with np.errstate(invalid="ignore", divide="ignore"):
        dice = np.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), np.nan)
        rec = np.where(tp + fn > 0, tp / (tp + fn), np.nan)
    return counts.assign(dice=dice, recall=rec)


# ------------------------------------------------------------------------------------------------ P1
def test_p1_table_shape_and_cells_from_the_counts(p1):
    t = _table(p1, "p1").set_index("Model")
    sets = ["Kvasir (pranet_seen_ci)", "CVC-ClinicDB (pranet_seen_ci)", *EXTERNAL]
    assert sorted(t.index) == sorted(MODELS)
    assert sorted(t.columns) == sorted(f"{s} {m}" for s in sets for m in ("Dice", "Rec", "HD95"))
    ext = _per_image(pd.read_parquet(_eval_dir(p1, "unet_r18", "CVC-ColonDB") / "counts.parquet"))
    assert len(ext) == 4 and set(ext["split_policy"]) == {"external-only"}
    assert float(t.loc["unet_r18 (32)", "CVC-ColonDB Dice"]) == pytest.approx(np.nanmean(ext["dice"]))
    internal = _per_image(pd.read_parquet(_eval_dir(p1, "segformer_b0") / "counts.parquet"))
    assert set(internal["split_policy"]) == {"fixed"} and set(internal["source"]) == {"Kvasir", "CVC-ClinicDB"}
    kv = internal[internal["source"] == "Kvasir"]
    assert float(t.loc["segformer_b0 (32)", "Kvasir (pranet_seen_ci) Rec"]) == pytest.approx(np.nanmean(kv["recall"]))
    met = pd.read_parquet(_eval_dir(p1, "unet_r18", "ETIS-LaribPolypDB") / "metrics.parquet")
    assert float(t.loc["unet_r18 (32)", "ETIS-LaribPolypDB HD95"]) == pytest.approx(met["hd95"].mean())
    for f in ("p1.tex", "p1.md"):
        assert "CVC-ColonDB" in (p1 / "protocol" / "tables" / f).read_text()


def _components(mask: np.ndarray) -> tuple[np.ndarray, int]:
    return ndimage.label(mask, structure=np.ones((3, 3), int))


def test_p1_lesion_any_overlap_from_the_prediction_masks(p1):
    for model, arch in zip(MODELS, ("segformer_b0", "unet_r18")):
        hit_ref = n_ref = hit_pred = n_pred = 0
        dirs = [_eval_dir(p1, arch)] + [_eval_dir(p1, arch, e) for e in EXTERNAL]
        n_img = 0
        for d in dirs:
            for f in sorted((d / "predictions").glob("*.npz")):
                with np.load(f) as z:
                    pred, ref = z["pred"].any(axis=0), z["ref"].any(axis=0)
                n_img += 1
                lr, kr = _components(ref)
                lp, kp = _components(pred)
                hit_ref += sum(bool(pred[lr == i].any()) for i in range(1, kr + 1))
                hit_pred += sum(bool(ref[lp == i].any()) for i in range(1, kp + 1))
                n_ref, n_pred = n_ref + kr, n_pred + kp
        assert n_img == 20
        row = _table(p1, "lesion").set_index("Model").loc[model]
        assert float(row["any-overlap Sens"]) == pytest.approx(hit_ref / n_ref)
        assert float(row["any-overlap Prec"]) == pytest.approx(hit_pred / n_pred)
    curve = pd.read_csv(p1 / "protocol" / "data" / "lesion_iou_curve.csv")
    assert sorted(curve["iou_threshold"].round(2).unique()) == [round(0.10 + 0.05 * i, 2) for i in range(14)]
    at_half = curve[(curve["iou_threshold"].round(2) == 0.5) & (curve["architecture"] == "unet_r18")].iloc[0]
    row = _table(p1, "lesion").set_index("Model").loc["unet_r18 (32)"]
    assert float(row["IoU≥0.5 Sens"]) == pytest.approx(at_half["sensitivity"])
    for ext in ("png", "svg"):
        assert (p1 / "protocol" / "figures" / f"lesion_iou_curve.{ext}").stat().st_size > 0


def _dice_hd(study: Path, arch: str, external: str) -> pd.DataFrame:
    d = _eval_dir(study, arch, external)
    c = _per_image(pd.read_parquet(d / "counts.parquet"))
    m = pd.read_parquet(d / "metrics.parquet")[["image_id", "hd95"]]
    return c.merge(m, on="image_id").sort_values("image_id")


def test_p1_wilcoxon_p_value_bh_and_effect_size(p1):
    a, b = _dice_hd(p1, "segformer_b0", "CVC-ColonDB"), _dice_hd(p1, "unet_r18", "CVC-ColonDB")
    assert list(a["image_id"]) == list(b["image_id"])
    ps = [stats.wilcoxon(a[m].to_numpy(), b[m].to_numpy()).pvalue for m in ("dice", "hd95")]
    adj = multipletests(ps, method="fdr_bh")[1]
    t = _table(p1, "wilcoxon")
    row = t[(t["Test set"] == "CVC-ColonDB") & (t["Model A"] == MODELS[0]) & (t["Model B"] == MODELS[1])
            & (t["Metric"] == "dice")].iloc[0]
    d = a["dice"].to_numpy() - b["dice"].to_numpy()
    nz = d[d != 0]
    r = stats.rankdata(np.abs(nz))
    assert float(row["p"]) == pytest.approx(ps[0]) and float(row["p (BH)"]) == pytest.approx(adj[0])
    assert float(row["Rank-biserial r"]) == pytest.approx((r[nz > 0].sum() - r[nz < 0].sum()) / r.sum())
    assert float(row["Mean diff (A−B)"]) == pytest.approx(d.mean()) and int(row["n"]) == 4
    assert float(row["CI low"]) <= d.mean() <= float(row["CI high"])
    assert set(t["Test set"]) == {"pranet_seen_ci", *EXTERNAL} and len(t) == 4 * 2
    assert "200 replicates" in (p1 / "protocol" / "tables" / "wilcoxon.md").read_text()


def test_p1_checklist_from_the_artifacts(p1):
    t = _table(p1, "checklist")
    assert list(t["#"].astype(str)) == ["1", "2", "3", "4", "5"]
    n_eval = len(list(p1.glob("*/evaluation/**/counts.parquet")))
    assert n_eval == 2 * 4 and len(list(p1.glob("*/evaluation/**/metrics.parquet"))) == n_eval
    assert list(t["Status"]) == ["PASS"] * 5
    assert f"{n_eval}/{n_eval} evaluation(s)" in t.loc[0, "Evidence"] and "'fixed'" in t.loc[2, "Evidence"]


# ------------------------------------------------------------------------------------------------ P2
def test_p2_mean_sd_over_seeds_and_flips(p2):
    per_seed = {}
    for run in sorted(p.parent for p in p2.glob("*/config.yaml")):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        seed = cfg["data"]["split"]["seed"]
        c = _per_image(pd.read_parquet(run / "evaluation" / "best" / "counts.parquet"))
        assert set(c["split_policy"]) == {f"random(seed={seed},val=0.1,test=0.2,group=group)"}
        assert set(c["variant"]) == {f"data.split.seed={seed}"}
        m = pd.read_parquet(run / "evaluation" / "best" / "metrics.parquet")
        arch = cfg["model"]["arch"]
        per_seed[(arch, seed)] = (np.nanmean(c["dice"]), m["hd95"].mean())
    assert sorted(per_seed) == [(a, s) for a in ("segformer", "unet") for s in (0, 1, 2)]
    t = _table(p2, "p2").set_index("Model")
    assert list(t.columns) == ["mDice", "mDice SD", "mHD95 (px)", "mHD95 SD", "Seeds", "Flips with next"]
    means = {}
    for model, arch in zip(MODELS, ("segformer", "unet")):
        dice = np.array([per_seed[(arch, s)][0] for s in (0, 1, 2)])
        hd = np.array([per_seed[(arch, s)][1] for s in (0, 1, 2)])
        means[model] = dice
        assert float(t.loc[model, "mDice"]) == pytest.approx(dice.mean())
        assert float(t.loc[model, "mDice SD"]) == pytest.approx(dice.std(ddof=1))
        assert float(t.loc[model, "mHD95 (px)"]) == pytest.approx(hd.mean())
        assert float(t.loc[model, "mHD95 SD"]) == pytest.approx(hd.std(ddof=1)) and int(t.loc[model, "Seeds"]) == 3
    first, second = t.index[0], t.index[1]  # best mean Dice first
    assert means[first].mean() >= means[second].mean()
    swapped = [s for s in (0, 1, 2) if means[first][s] < means[second][s]]
    expect = f"yes (seed {', '.join(map(str, swapped))})" if swapped else "no"
    assert t.loc[first, "Flips with next"] == expect and t.loc[second, "Flips with next"] == ""
    seeds = pd.read_csv(p2 / "protocol" / "data" / "p2_per_seed.csv")
    assert sorted(seeds["seed"].unique()) == [0, 1, 2] and set(seeds["n_images"]) == {6}


def test_p2_checklist_flags_the_missing_external_set(p2):
    t = _table(p2, "checklist")
    assert list(t["Status"]) == ["PASS", "PASS", "PASS", "FAIL", "PASS"]
    assert "seed=0" in t.loc[2, "Evidence"] and "seed=2" in t.loc[2, "Evidence"]


# ------------------------------------------------------------------------------------------------ P3
def test_p3_pooled_and_per_centre_from_counts_and_metrics(p3):
    pooled = _table(p3, "p3").set_index("Model")
    centres = _table(p3, "p3_centres")
    assert list(pooled.columns) == ["Images", "Dice", "Recall", "HD95", "NSD"]
    assert sorted(centres["Centre"].unique()) == sorted(EXTERNAL) and len(centres) == 2 * 3
    frames = [_dice_hd(p3, "unet_r18", e).merge(
        pd.read_parquet(_eval_dir(p3, "unet_r18", e) / "metrics.parquet")[["image_id", "nsd_tau3px"]], on="image_id")
        for e in EXTERNAL]
    allx = pd.concat(frames, ignore_index=True)
    row = pooled.loc["unet_r18 (32)"]
    assert int(row["Images"]) == 12
    assert float(row["Dice"]) == pytest.approx(np.nanmean(allx["dice"]))
    assert float(row["Recall"]) == pytest.approx(np.nanmean(allx["recall"]))
    assert float(row["HD95"]) == pytest.approx(allx["hd95"].mean())
    assert float(row["NSD"]) == pytest.approx(allx["nsd_tau3px"].mean())
    etis = allx[allx["source"] == "ETIS-LaribPolypDB"]
    c = centres[(centres["Model"] == "unet_r18 (32)") & (centres["Centre"] == "ETIS-LaribPolypDB")].iloc[0]
    assert int(c["Images"]) == 4 and float(c["Recall"]) == pytest.approx(np.nanmean(etis["recall"]))
    assert "nsd_tau3px" in (p3 / "protocol" / "tables" / "p3.md").read_text()
    assert set(_table(p3, "checklist")["Status"]) == {"PASS"}


def test_each_study_within_the_ci_budget(studies):
    """Each study (run + analyses, one process) under the issue's 3-minute limit (aim: < 60 s on 2 idle cores)."""
    assert set(TIMES) == set(studies)
    assert max(TIMES.values()) < 180, TIMES
