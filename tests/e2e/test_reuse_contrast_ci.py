"""The shipped CI variant of the pool-contrast protocol (configs/protocols/reuse_contrast_ci.yaml) end to end, in
process: 5 pools x 2 paired seeds on three synthetic sources, equal optimizer steps, then ``msb contrasts``.

Checked against the stored files with plain pandas/NumPy/OpenCV: one split for every run (val/test fixed), pool
sizes and strata recomputed from index.csv and the mask files, the swap, the paired seeds on one pool file, the
manifest's pool SHA-256, the optimizer steps counted by a torch optimizer hook (equal for pools of different
sizes, with different epoch counts), and one contrast value with its paired-t interval (scipy.stats.t)."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pandas as pd
import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from scipy import stats
from typer.testing import CliRunner

from msb.utils.hashing import sha256_file

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "configs" / "protocols" / "reuse_contrast_ci.yaml"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from msb.study.pipeline import run_study

    root = tmp_path_factory.mktemp("reuse")
    steps: dict[int, int] = {}

    def count(opt, args, kwargs):
        # one key per optimizer object (id() may be reused once an earlier run's optimizer is freed)
        if not hasattr(opt, "_test_step_key"):
            opt._test_step_key = len(steps)
            steps[opt._test_step_key] = 0
        steps[opt._test_step_key] += 1

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    handle = register_optimizer_step_post_hook(count)
    mp = pytest.MonkeyPatch()
    mp.chdir(root)  # the dataset config's root 'datasets/synthetic3' is prepared here, not in the source tree
    try:
        outcomes = run_study(STUDY, run_root=str(root / "runs"))
    finally:
        handle.remove()
        mp.undo()
        torch.set_num_threads(threads)
    return root, root / "runs" / "reuse_contrast_ci", outcomes, steps


def _runs(folder: Path) -> dict[tuple[str, int], Path]:
    out = {}
    for d in folder.iterdir():
        if (d / "manifest.json").is_file() and (d / "pool.csv").is_file():
            m = json.loads((d / "manifest.json").read_text())
            import yaml

            cfg = yaml.safe_load((d / "config.yaml").read_text())
            out[(m["pool"]["name"], int(cfg["random_seed"]))] = d
    return out


def test_pools_splits_and_steps(study):
    root, folder, outcomes, steps = study
    runs = _runs(folder)
    assert len(outcomes) == 10 and sorted(runs) == sorted((p, s) for p in ("full", "no_a", "random_match",
                                                                           "count_match", "swap") for s in (0, 1))
    splits = {d: (d / "split.csv").read_bytes() for d in runs.values()}
    assert len(set(splits.values())) == 1  # one split: val and test never change with the pool
    split = pd.read_csv(next(iter(runs.values())) / "split.csv", dtype=str)
    index = pd.read_csv(root / "datasets" / "synthetic3" / "index.csv", dtype=str, keep_default_na=False)
    train = set(split.loc[split["split"] == "train", "sample_id"])
    src = dict(zip(index["sample_id"], index["source"]))
    pools = {}
    for (pool, seed), d in runs.items():
        ids = pd.read_csv(d / "pool.csv", dtype=str)["sample_id"].tolist()
        pools.setdefault(pool, ids)
        assert ids == pools[pool]  # the paired seeds train on the same rows
        assert json.loads((d / "manifest.json").read_text())["pool"]["sha256"] == sha256_file(d / "pool.csv")
        assert set(ids) <= train
    assert set(pools["full"]) == train
    no_a = {i for i in train if src[i] != "syn_a"}
    assert set(pools["no_a"]) == no_a
    assert len(pools["random_match"]) == len(no_a) == len(pools["count_match"]) == len(pools["swap"])

    def empty(i: str) -> bool:
        row = index.set_index("sample_id").loc[i]
        return not (cv2.imread(str(root / "datasets" / "synthetic3" / row["mask_path"]), 0) > 0).any()

    assert sorted(map(empty, pools["count_match"])) == sorted(map(empty, no_a))
    sw = pools["swap"]
    assert not any(src[i] == "syn_b" for i in sw)
    assert sum(src[i] == "syn_a" for i in sw) == sum(src[i] == "syn_b" for i in no_a)
    assert {i for i in sw if src[i] == "syn_c"} == {i for i in no_a if src[i] == "syn_c"}
    # equal optimizer steps: every model made 4 steps (hook count), with different epoch counts
    assert sorted(steps.values()) == [4] * 10
    budgets = {k: json.loads((d / "manifest.json").read_text())["budget"] for k, d in runs.items()}
    assert {b["optimizer_steps"] for b in budgets.values()} == {4}
    n_full, n_no_a = len(train), len(no_a)
    assert budgets[("full", 0)]["epochs_run"] == -(-4 // -(-n_full // 8))
    assert budgets[("no_a", 0)]["epochs_run"] == -(-4 // -(-n_no_a // 8))
    assert budgets[("full", 0)]["epochs_run"] != budgets[("no_a", 0)]["epochs_run"]


def test_contrasts_cli_recomputed(study):
    from msb.cli.app import app

    root, folder, _, _ = study
    res = CliRunner().invoke(app, ["contrasts", str(STUDY), "--run-root", str(root / "runs")])
    assert res.exit_code == 0, res.output
    table = pd.read_csv(folder / "contrasts" / "contrasts.csv")
    assert {"paired-t over seeds", "bootstrap over images"} == set(table["interval"])
    row = table[(table["pool_a"] == "no_a") & (table["pool_b"] == "full") & (table["population"] == "all")
                & (table["interval"] == "paired-t over seeds")].iloc[0]
    runs = _runs(folder)

    def score(d: Path) -> float:
        c = pd.read_parquet(d / "evaluation" / "best" / "counts.parquet")
        den = 2 * c["tp"] + c["fp"] + c["fn"]
        return float(np.nanmean(np.where(den > 0, 2 * c["tp"] / den.where(den > 0, 1), np.nan)))

    d = np.array([score(runs[("no_a", s)]) - score(runs[("full", s)]) for s in (0, 1)])
    half = stats.t.ppf(0.975, 1) * d.std(ddof=1) / np.sqrt(2)
    assert row["mean_diff"] == pytest.approx(d.mean(), abs=1e-9)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-9)
    assert row["n_seeds"] == 2 and row["n_sources"] == 3
    other = table[(table["population"] == "other_sources")]
    assert (other["n_sources"] == 2).all()
    assert (folder / "contrasts" / "population_rho.csv").is_file()
