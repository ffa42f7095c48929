"""A grid-search + 3-fold study end to end (in process): trial selection, fold runs and their splits, counts
per fold, strict-majority ensemble (recomputed here from the stored fold predictions), external set,
manifests, resume without retraining, and refusal of a changed spec."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msb.errors import MSBError
from msb.study.pipeline import run_study
from msb.utils.hashing import sha256_file

STUDY = {
    "study": "grid",
    "search": {"method": "grid", "params": {"train.optimizer.lr": [0.001, 0.01]}},
    "cross_validation": {"k": 3, "group_column": "group", "stratify": "empty_mask"},
    "final": {"checkpoint": "best", "test_split": "test",
              "external": [{"dataset": "synth_ext", "name": "ext", "class_map": {"polyp": ["polyp"]}}]},
}


@pytest.fixture(scope="module")
def grid_study(tmp_path_factory, make_project):
    root = tmp_path_factory.mktemp("grid")
    study = make_project(root, STUDY)
    logs: list[str] = []
    outcomes = run_study(study, log=logs.append)
    return root, study, outcomes, logs


def _unit(root: Path) -> Path:
    return root / "runs" / "grid" / "_study" / "synthetic-unet_tiny"


def test_search_selects_best_trial(grid_study):
    root, _, _, _ = grid_study
    sel = json.loads((_unit(root) / "selected.json").read_text())
    assert [t["state"] for t in sel["trials"]] == ["COMPLETE", "COMPLETE"]
    # independent: best epoch value of each trial's own train_log.csv
    best = {}
    for t in sel["trials"]:
        log = pd.read_csv(root / "runs" / "grid" / t["run_id"] / "train_log.csv")
        best[t["number"]] = log["val_dice"].max()
        assert t["value"] == pytest.approx(best[t["number"]])
        assert not (root / "runs" / "grid" / t["run_id"] / "evaluation").exists()  # trials never see the test split
        assert (root / "runs" / "grid" / t["run_id"] / "manifest.json").is_file()
    assert sel["best_trial"] == max(best, key=lambda n: (best[n], -n))
    assert sel["params"] == sel["trials"][sel["best_trial"]]["params"]


def test_fold_runs_splits_and_counts(grid_study):
    root, _, outcomes, _ = grid_study
    unit = _unit(root)
    sel = json.loads((unit / "selected.json").read_text())
    folds = pd.read_csv(unit / "folds.csv", keep_default_na=False)
    test_ids = set(folds.loc[folds["fold"] == -1, "sample_id"])
    assert (folds[folds["fold"] >= 0].groupby("group")["fold"].nunique() == 1).all()
    for k in range(3):
        d = root / "runs" / "grid" / f"{sel['final_run_id']}-fold{k}"
        split = pd.read_csv(d / "split.csv").merge(folds, on="sample_id")
        assert (split.loc[split["fold"] == k, "split"] == "val").all()
        assert (split.loc[(split["fold"] >= 0) & (split["fold"] != k), "split"] == "train").all()
        assert (split.loc[split["fold"] == -1, "split"] == "test").all()
        assert json.loads((d / "fold.json").read_text())["fold"] == k
        c = pd.read_parquet(d / "evaluation" / "best" / "counts.parquet")
        assert set(c["fold"]) == {k} and set(c["image_id"]) == test_ids and set(c["split"]) == {"test"}
        e = pd.read_parquet(d / "evaluation" / "external" / "ext" / "best" / "counts.parquet")
        assert set(e["fold"]) == {k} and set(e["dataset"]) == {"ext"} and len(e) == 6
        m = json.loads((d / "manifest.json").read_text())
        assert m["fold"] == k and m["folds_sha256"] == sha256_file(unit / "folds.csv")
        assert m["split_sha256"] == sha256_file(d / "split.csv")
        assert m["config_hash"] == (d / "config.sha256").read_text().strip() == sel["final_config_hash"]
    counts = [p for o in outcomes for p in o.counts_paths]
    assert len(counts) == 3 * 2 + 2  # (test + external) per fold, + 2 ensembles


@pytest.mark.parametrize("where", ["test", "ext"])
def test_ensemble_is_strict_majority_of_stored_fold_predictions(grid_study, where):
    root, _, _, _ = grid_study
    sel = json.loads((_unit(root) / "selected.json").read_text())
    rid = sel["final_run_id"]
    sub = Path("evaluation") / ("best" if where == "test" else "external/ext/best")
    ens = pd.read_parquet(root / "runs" / "grid" / f"{rid}-ensemble" / sub / "counts.parquet").set_index("image_id")
    assert set(ens["fold"]) == {-1} and set(ens["run_id"]) == {f"{rid}-ensemble"}
    assert set(ens["model"]) == {"unet-ensemble3"}
    for sid in ens.index:
        preds, ref = [], None
        for k in range(3):
            with np.load(root / "runs" / "grid" / f"{rid}-fold{k}" / sub / "predictions" / f"{sid}.npz") as z:
                preds.append(z["pred"][0])
                ref = z["ref"][0]
        votes = np.sum(preds, axis=0)
        maj = votes >= 2  # K = 3: more than half = at least 2
        assert ens.loc[sid, "tp"] == int((maj & ref).sum())
        assert ens.loc[sid, "fp"] == int((maj & ~ref).sum())
        assert ens.loc[sid, "fn"] == int((~maj & ref).sum())


def test_unit_manifest(grid_study):
    root, _, _, _ = grid_study
    m = json.loads((_unit(root) / "manifest.json").read_text())
    assert m["cross_validation"]["folds_sha256"] == sha256_file(_unit(root) / "folds.csv")
    assert [r["fold"] for r in m["runs"]] == [0, 1, 2]
    for r in m["runs"]:
        rec = json.loads((root / "runs" / "grid" / r["run_id"] / "checkpoints" / "records.json").read_text())
        assert r["checkpoints"] == {k: v["sha256"] for k, v in rec.items()}
        assert r["checkpoints"]["best"] == sha256_file(root / "runs" / "grid" / r["run_id"] / "checkpoints" / "best.pt")
    assert m["ensemble"]["model"] == "unet-ensemble3" and len(m["external"]) == 1
    assert m["external"][0]["index_sha256"] == sha256_file(root / "datasets" / "synth_ext" / "index.csv")
    assert {"torch", "optuna", "scikit-learn"} <= set(m["versions"]) and m["device"] == "cpu"
    top = json.loads((root / "runs" / "grid" / "_study" / "manifest.json").read_text())
    assert top["units"]["synthetic-unet_tiny"]["sha256"] == sha256_file(_unit(root) / "manifest.json")


def test_rerun_resumes_without_work(grid_study):
    root, study, outcomes, _ = grid_study
    logs = sorted((root / "runs" / "grid").glob("*/train_log.csv"))
    before = {p: p.stat().st_mtime_ns for p in logs}
    lines: list[str] = []
    again = run_study(study, log=lines.append)
    assert {p: p.stat().st_mtime_ns for p in logs} == before
    assert not [ln for ln in lines if "training unet" in ln or "evaluated '" in ln]
    assert [p for o in again for p in o.counts_paths] == [p for o in outcomes for p in o.counts_paths]


def test_changed_spec_is_refused(grid_study, make_project):
    root, study, _, _ = grid_study
    changed = make_project(root, {**STUDY, "cross_validation": {"k": 2}})
    with pytest.raises(MSBError, match=r"spec.json: this study folder was started with other"):
        run_study(changed)
    make_project(root, STUDY)  # restore for other tests


def test_too_many_folds_fail_before_any_training(tmp_path, make_project):
    """k = 50 > 8 groups: the error names the study file and the group count, nothing is trained or recorded,
    and the same folder runs once k is fixed (no stale spec.json blocks it)."""
    study = make_project(tmp_path, {**STUDY, "cross_validation": {"k": 50, "group_column": "group"}})
    with pytest.raises(MSBError, match=r"study\.yaml: 50-fold cross-validation needs at least 50 groups"):
        run_study(study)
    unit = tmp_path / "runs" / "grid" / "_study" / "synthetic-unet_tiny"
    assert not (unit / "spec.json").exists() and not (unit / "folds.csv").exists()
    assert not list((tmp_path / "runs" / "grid").glob("*/checkpoints"))
    fixed = make_project(tmp_path, {**STUDY, "search": None, "cross_validation": {"k": 2, "group_column": "group"},
                                    "final": {"checkpoint": "best", "test_split": "test"}})
    outcomes = run_study(fixed)
    assert sorted(o.run_id.rsplit("-", 1)[-1] for o in outcomes if "fold" in o.run_id) == ["fold0", "fold1"]


def test_study_kept_outside_the_configs_tree_runs_and_names_its_root(tmp_path, make_project, msb_cli):
    """`msb run ~/somewhere/study.yaml` from a project folder: ./configs of the working directory is the root,
    and the run says so; the plain study trains and evaluates as from inside configs/."""
    import pandas as pd

    project = tmp_path / "project"
    inside = make_project(project, {"study": "outside"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    study = elsewhere / "study.yaml"
    study.write_text(inside.read_text())
    inside.unlink()
    r = msb_cli("run", str(study), cwd=project)
    assert r.returncode == 0, r.stderr
    root = (project / "configs").resolve()
    assert f"configs root: {root} (./configs of the working directory)" in " ".join(r.stdout.split())
    counts = list((project / "runs" / "outside").glob("*/evaluation/best/counts.parquet"))
    assert len(counts) == 1 and pd.read_parquet(counts[0])["dataset"].unique().tolist() == ["synthetic"]


def test_second_plain_run_of_a_study_is_refused_or_waits(tmp_path, make_project, msb_cli, msb_popen):
    """One plain `msb run` per study folder: a second one names the holder and exits 2 without writing; with
    --wait it queues and then finishes."""
    import time

    from msb.study.coord import owner_id
    from msb.study.units import study_lock

    study = make_project(tmp_path, {"study": "locked"})
    root = tmp_path / "runs" / "locked"
    with study_lock(root):
        r = msb_cli("run", str(study))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        msg = " ".join(r.stderr.split())
        assert "another msb process is working on this study: process " + owner_id() in msg and "--wait" in msg
        assert sorted(p.name for p in root.iterdir()) == ["_study"]  # no run folder was started
        waiting = msb_popen("run", str(study), "--wait", log=tmp_path / "wait.log")
        t0 = time.monotonic()
        while "waiting for the other msb process" not in (tmp_path / "wait.log").read_text():
            assert waiting.poll() is None and time.monotonic() - t0 < 120
            time.sleep(0.1)
    assert waiting.wait(timeout=300) == 0
    assert len(list(root.glob("*/evaluation/best/counts.parquet"))) == 1


@pytest.mark.slow
def test_sigterm_during_a_search_trial_resumes_it_under_its_number(tmp_path, make_project, msb_cli, msb_popen):
    """SIGTERM (like Ctrl-C) mid-trial: the 'terminated (SIGTERM)' line, exit 143 (128 + SIGTERM's 15), the trial is
    re-opened (WAITING, not FAIL, no copy); the rerun finishes with trials 0 and 1 only, as an uninterrupted
    study."""
    import json
    import signal
    import time

    import optuna

    study = make_project(tmp_path, {"study": "term", "overrides": {"train": {"epochs": 2}},
                                    "search": {"method": "grid", "params": {"train.optimizer.lr": [0.001, 0.002]}}})
    sdir = tmp_path / "runs" / "term"
    proc = msb_popen("run", str(study), log=tmp_path / "term.log")
    t0 = time.monotonic()
    while not list(sdir.glob("*/state/train_state.pt")):
        assert proc.poll() is None and time.monotonic() - t0 < 240
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM == 143, (tmp_path / "term.log").read_text()
    assert "terminated (SIGTERM)" in (tmp_path / "term.log").read_text() and "run the same command again" in (
        tmp_path / "term.log").read_text()
    url = f"sqlite:///{sdir / '_study' / 'optuna.db'}"
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(url)]
    states = [(t.number, t.state.name) for t in optuna.load_study(study_name=name, storage=url).get_trials()]
    assert states == [(0, "WAITING"), (1, "WAITING")]
    r = msb_cli("run", str(study))
    assert r.returncode == 0, r.stderr
    sel = json.loads((sdir / "_study" / "synthetic-unet_tiny" / "selected.json").read_text())
    assert [(t["number"], t["state"]) for t in sel["trials"]] == [(0, "COMPLETE"), (1, "COMPLETE")]


def test_evaluate_and_metrics_wait_for_no_plain_run_of_the_study(tmp_path, make_project, msb_cli):
    """`msb evaluate RUN` / `msb metrics RUN` while a plain `msb run` of the same study holds it: one line naming
    the holder, exit 2, nothing written."""
    from msb.study.units import study_lock

    study = make_project(tmp_path, {"study": "busy"})
    assert msb_cli("run", str(study)).returncode == 0
    root = tmp_path / "runs" / "busy"
    (run,) = [d for d in root.iterdir() if (d / "config.yaml").is_file()]
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with study_lock(root):
        for args in (("evaluate", str(run), "--checkpoint", "best", "--force"), ("metrics", str(run))):
            r = msb_cli(*args)
            assert r.returncode == 2 and "another msb process is working on this study" in r.stderr, r.stderr
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
