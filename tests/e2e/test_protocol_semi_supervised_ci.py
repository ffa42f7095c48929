"""End to end: ``msb run configs/protocols/semi_supervised_ci.yaml`` (synthetic 64 px, a few iterations per run),
then ``msb reaggregate STUDY --analyses semi_supervised``. The tables' shape follows the study's axes (methods x
labelled fractions x seeds), the methods of one fraction and seed share one labelled subset, one score is
recomputed from counts.parquet with pandas, and one paired difference and its CI with a plain NumPy bootstrap loop
(same seed; blocks of 250 replicates as msb.analysis.stats.bootstrap draws them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CI_STUDY = REPO / "configs" / "protocols" / "semi_supervised_ci.yaml"
N_BOOT, SEED = 500, 7


def _run_in_process():
    """``run_msb_in_process`` of tests/study/conftest.py (loaded by path: test folders are not packages)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_study_conftest_semi", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_msb_in_process


@pytest.fixture(scope="module")
def ci_study(tmp_path_factory) -> tuple[Path, Path, dict]:
    """The CI study run into tmp_path (dataset prepared there too); returns (study folder, analysis folder, axes)."""
    tmp = tmp_path_factory.mktemp("semi_ci")
    study = tmp / "semi_supervised_ci.yaml"
    study.write_text(yaml.safe_dump({"_base_": str(CI_STUDY), "configs_root": str(REPO / "configs"),
                                     "overrides": {"data": {"root": str(tmp / "datasets" / "synthetic")}}}))
    # both commands in-process (the same typer app as the ``msb`` command, one torch thread): the tests read
    # what they write, so no interpreter start-up and torch/timm/smp import per command
    r = _run_in_process()("run", str(study), "--run-root", str(tmp / "runs"))
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp / "analysis"
    r = _run_in_process()("reaggregate", str(tmp / "runs" / "semi_supervised_ci"), "--analyses", "semi_supervised",
                          "--out", str(out), "--bootstrap", str(N_BOOT), "--seed", str(SEED))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Paired differences method − supervised-only" in r.stdout
    return tmp / "runs" / "semi_supervised_ci", out, yaml.safe_load(CI_STUDY.read_text())["axes"]


def _runs(study: Path) -> pd.DataFrame:
    """Run folders with method, fraction and seed read from their config.yaml."""
    rows = []
    for cfg_path in sorted(study.glob("*/config.yaml")):
        cfg = yaml.safe_load(cfg_path.read_text())
        rows.append({"run": cfg_path.parent, "method": (cfg["train"].get("strategy") or {}).get("name", "supervised"),
                     "fraction": cfg["data"]["labelled_fraction"], "seed": cfg["random_seed"]})
    return pd.DataFrame(rows)


def _counts(run: Path) -> np.ndarray:
    c = pd.read_parquet(run / "evaluation" / "best" / "counts.parquet").sort_values("image_id")
    return c[["tp", "fp", "fn"]].to_numpy(dtype=float)


def _dice(x: np.ndarray) -> float:
    return 2 * x[:, 0].sum() / (2 * x[:, 0].sum() + x[:, 1].sum() + x[:, 2].sum())


def test_tables_follow_the_axes(ci_study):
    study, out, axes = ci_study
    methods = axes.get("train.strategy.name", ["supervised"])
    fractions, seeds = axes["data.labelled_fraction"], axes["random_seed"]
    runs = _runs(study)
    assert len(runs) == len(methods) * len(fractions) * len(seeds)
    scores = pd.read_csv(out / "tables" / "semi_supervised_scores.csv")
    assert len(scores) == len(runs) and set(scores["Seed"]) == set(seeds)
    assert sorted(set(scores["Labelled"])) == sorted(f"{100 * f:g} %" for f in fractions)
    paired = pd.read_csv(out / "tables" / "semi_supervised_paired.csv")
    assert len(paired) == (len(methods) - 1) * len(fractions) * len(seeds)
    summary = pd.read_csv(out / "tables" / "semi_supervised_summary.csv")
    assert len(summary) == len(methods) * len(fractions) and set(summary["Seeds"]) == {len(seeds)}
    for ext in ("png", "svg"):
        assert (out / "figures" / f"semi_supervised.{ext}").is_file()
    # each run's labelled subset: part of its training split (labelled.csv, split.csv), the same for every method
    # of one fraction and seed (so the paired runs saw the same masks), larger at the larger fraction
    subsets = {}
    for r in runs.itertuples():
        lab = pd.read_csv(r.run / "labelled.csv")
        split = pd.read_csv(r.run / "split.csv")
        assert sorted(lab["sample_id"]) == sorted(split.loc[split["split"] == "train", "sample_id"])
        subsets.setdefault((r.fraction, r.seed), set()).add(tuple(sorted(lab.loc[lab["labelled"] == 1, "sample_id"])))
    assert all(len(v) == 1 for v in subsets.values()), subsets
    for seed in seeds:
        small, big = (len(next(iter(subsets[(f, seed)]))) for f in (min(fractions), max(fractions)))
        assert 0 < small < big
    # one score recomputed from counts.parquet with pandas
    r0 = runs.iloc[0]
    row = scores[(scores["Seed"] == r0.seed) & (scores["Labelled"] == f"{100 * r0.fraction:g} %")
                 & (scores["Method"].str.lower().str.replace(" ", "_").str.startswith(r0.method[:3]))].iloc[0]
    assert float(row["Dice (global-micro)"]) == pytest.approx(_dice(_counts(r0.run)))


def test_paired_difference_numpy_bootstrap(ci_study):
    study, out, _ = ci_study
    runs = _runs(study).set_index(["method", "fraction", "seed"])
    paired = pd.read_csv(out / "tables" / "semi_supervised_paired.csv")
    row = paired.iloc[0]
    method = {"Mean teacher": "mean_teacher", "CPS": "cps"}[row["Method"]]
    fraction = float(row["Labelled"].rstrip(" %")) / 100
    a = _counts(runs.loc[(method, fraction, int(row["Seed"])), "run"])
    b = _counts(runs.loc[("supervised", fraction, int(row["Seed"])), "run"])
    n = len(a)
    rng = np.random.default_rng(SEED)
    reps = []
    for _ in range(0, N_BOOT, 250):
        reps += [_dice(a[d]) - _dice(b[d]) for d in rng.integers(0, n, size=(250, n), dtype=np.int32)]
    lo, hi = np.percentile(reps, [2.5, 97.5])
    assert float(row["Δ Dice (global-micro)"]) == pytest.approx(_dice(a) - _dice(b))
    assert float(row["Δ Dice (global-micro) CI low"]) == pytest.approx(lo)
    assert float(row["Δ Dice (global-micro) CI high"]) == pytest.approx(hi)
    assert int(row["Images"]) == n
