"""ReuScope's local-versus-distant removal end to end (configs/protocols/reuse_local_ci.yaml), in process:
a stand-in audit pairs table, pools remove_neighbours / remove_distant x 2 paired seeds on three synthetic sources,
then ``msb contrasts``. Checked with plain pandas/NumPy against the stored files: the pools' rows (pool.csv) from
the split and the pairs, and one difference-in-differences value with its paired-t interval (scipy.stats.t)
recomputed from the runs' counts.parquet."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from scipy import stats
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "configs" / "protocols" / "reuse_local_ci.yaml"


def _image_dice(c: pd.DataFrame) -> pd.Series:
    """Image-macro building block: per image the mean Dice over its classes with a defined Dice (0/0 left out)."""
    den = 2 * c["tp"] + c["fp"] + c["fn"]
    c = c.assign(dice=np.where(den > 0, 2 * c["tp"] / den.where(den > 0, 1), np.nan))
    return c.groupby("image_id")["dice"].mean()


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    from msb.config.generate import generate_runs
    from msb.data.prepare import ensure_dataset
    from msb.data.splits import resolve_splits
    from msb.study.pipeline import run_study

    root = tmp_path_factory.mktemp("local")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)  # datasets/synthetic3 and audit/pairs.csv live here, not in the source tree
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = generate_runs(STUDY)[0].config
        ds = ensure_dataset(cfg)
        s = cfg.data.split
        split = resolve_splits(ds.index, s.mode, s.val_fraction, s.test_fraction, s.seed, s.group_column)
        train = sorted(str(k) for k, v in split.items() if v == "train")
        test = sorted(str(k) for k, v in split.items() if v == "test")
        exposed = test[:4]  # each paired with two training frames; plus an unconfirmed and a train-train pair
        rows = [(e, train[2 * k], "true") for k, e in enumerate(exposed)]
        rows += [(train[2 * k + 1], e, "True") for k, e in enumerate(exposed)]
        rows += [(test[5], train[20], "false"), (train[21], train[22], "true")]
        (root / "audit").mkdir()
        pd.DataFrame(rows, columns=["sample_id_a", "sample_id_b", "confirmed"]).to_csv(root / "audit" / "pairs.csv",
                                                                                      index=False)
        run_study(STUDY, run_root=str(root / "runs"))
        res = CliRunner().invoke(__import__("msb.cli.app", fromlist=["app"]).app,
                                 ["contrasts", str(STUDY), "--run-root", str(root / "runs"), "--format", "csv"])
    finally:
        mp.undo()
        torch.set_num_threads(threads)
    return root / "runs" / "reuse_local_ci", train, test, exposed, res


def _runs(folder: Path) -> dict[tuple[str, int], Path]:
    out = {}
    for d in folder.iterdir():
        if (d / "pool.csv").is_file():
            cfg = yaml.safe_load((d / "config.yaml").read_text())
            out[(cfg["data"]["pool"]["name"], int(cfg["random_seed"]))] = d
    return out


def test_pools_remove_the_neighbours_or_as_many_distant_rows(study):
    folder, train, test, exposed, _ = study
    runs = _runs(folder)
    assert sorted(runs) == [("distant", 0), ("distant", 1), ("local", 0), ("local", 1)]
    neighbours = set(train[:8])  # train[2k] and train[2k+1] for the 4 exposed frames
    local = pd.read_csv(runs[("local", 0)] / "pool.csv", dtype=str)["sample_id"].tolist()
    assert local == sorted(set(train) - neighbours)
    for seed in (0, 1):
        assert (runs[("local", seed)] / "split.csv").read_bytes() == (runs[("local", 0)] / "split.csv").read_bytes()
        dist = set(pd.read_csv(runs[("distant", seed)] / "pool.csv", dtype=str)["sample_id"])
        gone = set(train) - dist
        assert len(gone) == 8 and not gone & neighbours  # as many rows, none of them a neighbour
    m = json.loads((runs[("local", 0)] / "manifest.json").read_text())
    assert m["pool"]["name"] == "local" and m["prepare_sha256"]  # the merged dataset records its preparation


def test_difference_in_differences_recomputed_from_the_counts(study):
    folder, train, test, exposed, res = study
    assert res.exit_code == 0, res.output
    row = pd.read_csv(folder / "contrasts" / "local_distant.csv").iloc[0]
    assert row["label"] == "exploratory" and row["n_exposed"] == 4 and row["n_unflagged"] == 4
    assert "EXPLORATORY" in (folder / "contrasts" / "local_distant.md").read_text()
    runs = _runs(folder)
    counts = {k: pd.read_parquet(d / "evaluation" / "best" / "counts.parquet") for k, d in runs.items()}
    c0 = counts[("local", 0)]
    assert c0["class_id"].nunique() == 1
    empty = (c0.groupby("image_id")[["tp", "fn"]].sum().sum(axis=1) == 0)
    # matched unflagged: per stratum (empty / non-empty, sorted) as many as exposed, default_rng(0) draw
    rng = np.random.default_rng(0)
    unflagged = []
    for stratum in sorted({"empty" if empty[e] else "non-empty" for e in exposed}):
        k = sum(1 for e in exposed if ("empty" if empty[e] else "non-empty") == stratum)
        cand = sorted(i for i in empty.index if i not in exposed and ("empty" if empty[i] else "non-empty") == stratum)
        unflagged += [cand[j] for j in rng.choice(len(cand), size=k, replace=False)]

    def score(pool: str, seed: int, ids: list[str]) -> float:
        return float(np.nanmean(_image_dice(counts[(pool, seed)]).loc[ids]))

    d = np.array([(score("local", s, exposed) - score("distant", s, exposed))
                  - (score("local", s, unflagged) - score("distant", s, unflagged)) for s in (0, 1)])
    half = stats.t.ppf(0.975, 1) * d.std(ddof=1) / np.sqrt(2)
    assert row["did"] == pytest.approx(d.mean(), abs=1e-9)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((d.mean() - half, d.mean() + half), abs=1e-9)
    assert row["n_negative"] == int((d < 0).sum()) and row["n_seeds"] == 2
