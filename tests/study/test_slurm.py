"""`msb submit` / `msb status` against a real Slurm (a one-node cluster started by `.ci/slurm.sh`, which `.ci/run`
calls) and the PostgreSQL server `.ci/run` starts; the tests that need them skip with a message when none
answers. The script, the `--slurm` pairs and the refusals that need no cluster are tested without one."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

from msb.errors import MSBError

REPO = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("MSB_TEST_POSTGRES_URL", "postgresql://msb:msb@127.0.0.1:5432/msb_test")


def _study(name: str, epochs: int = 2, **cluster) -> dict:
    return {"study": name, "overrides": {"train": {"epochs": epochs}},
            "search": {"method": "grid", "params": {"train.optimizer.lr": [0.001, 0.002]}},
            "cross_validation": {"k": 2},
            "cluster": {"partition": "debug", "setup": f"export PYTHONPATH={REPO}", **cluster}}


def _no_slurm() -> str | None:
    """Why no Slurm can be used here (None: the partition `debug` is up with a usable node)."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "sbatch/sinfo not on PATH"
    try:
        r = subprocess.run(["sinfo", "-h", "-p", "debug", "-o", "%a %T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo failed ({type(exc).__name__})"
    if r.returncode != 0 or not re.search(r"^up (idle|mixed|allocated)", r.stdout, re.M):
        return f"sinfo: {(r.stdout + r.stderr).strip()[:120] or 'no answer'}"
    return None


def _no_postgres() -> str | None:
    try:
        import psycopg2

        psycopg2.connect(PG_URL, connect_timeout=3).close()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


def _need_slurm(postgres: bool = False) -> None:
    why = _no_slurm()
    if why is not None:
        pytest.skip(f"no Slurm cluster answers ({why}); .ci/run starts a one-node cluster with .ci/slurm.sh "
                    f"(Debian packages slurm-wlm, munge)")
    if postgres and (why := _no_postgres()) is not None:
        pytest.skip(f"no PostgreSQL server reachable at {PG_URL.split('@')[-1]} ({why}); .ci/run starts one")


def _squeue(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%i %T"], capture_output=True, text=True).stdout


def _job_state(task: str) -> str:
    out = subprocess.run(["scontrol", "show", "job", task], capture_output=True, text=True).stdout
    m = re.search(r"JobState=(\S+)", out)
    return m.group(1) if m else "?"


# ---- without a cluster ------------------------------------------------------------------------------------------

def test_dry_run_script_layers_and_requeue(tmp_path: Path, make_project):
    from msb.cluster.slurm import submit

    study = make_project(tmp_path, _study("d", time="30"))
    (study.parent / "global.yaml").write_text((study.parent / "global.yaml").read_text()
                                              + "cluster: {partition: big, mem: 8G, sbatch: ['--constraint=a']}\n")
    res = submit(study, PG_URL, 3, ["cpus_per_task=4", "sbatch=--exclusive", "time=1-00:00:00"], dry_run=True,
                 requeue=True)
    text = res.script.read_text()
    sb = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    logs = tmp_path / "runs" / "d" / "_study" / "logs"
    # global.yaml (partition big, mem, one line) < study's cluster: (partition debug, time 30) < --slurm
    assert sb == ["#SBATCH --job-name=msb-d", "#SBATCH --array=0-2", f"#SBATCH --output={logs}/worker-%A_%a.log",
                  "#SBATCH --open-mode=append", "#SBATCH --partition=debug", "#SBATCH --time=1-00:00:00",
                  "#SBATCH --mem=8G", "#SBATCH --cpus-per-task=4", "#SBATCH --requeue", f"#SBATCH --chdir={Path.cwd()}",
                  "#SBATCH --constraint=a", "#SBATCH --exclusive"]
    assert f"export PYTHONPATH={REPO}\n" in text and "export OMP_NUM_THREADS=4 " in text
    assert text.rstrip().splitlines()[-1].endswith(
        f"-m msb run {study} --worker --heartbeat-interval 30 --grace-period 120 --storage {PG_URL}")
    assert oct(res.script.stat().st_mode & 0o777) == "0o600" and res.job_id is None and logs.is_dir()
    assert not (res.script.parent / "jobs.json").exists()  # nothing submitted, nothing recorded


def test_bad_input_without_cluster(tmp_path: Path, make_project, msb_cli):
    study = make_project(tmp_path, _study("b"))
    for args, msg in [(["--slurm", "partitoin=debug"], "--slurm 'partitoin=debug': unknown key 'partitoin'"),
                      (["--workers", "2"], "the default storage (SQLite in the study folder) with 2 workers is "
                                           "refused"),
                      (["--workers", "2", "--storage", f"sqlite:///{tmp_path}/o.db"], "SQLite on a shared file "
                                                                                      "system is not safe")]:
        r = msb_cli("submit", str(study), *args, cwd=tmp_path)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and msg in lines[0], (args, r.stderr)
    assert not (tmp_path / "runs").exists()  # refused before anything is written


def test_slurm_pairs():
    from msb.cluster.slurm import check_storage, parse_slurm_args

    assert parse_slurm_args(["gpus-per-task=2", "time=12:00:00", "sbatch=--a=b", "sbatch=--c"]) == {
        "gpus_per_task": 2, "time": "12:00:00", "sbatch": ["--a=b", "--c"]}
    for bad in (["partition"], ["cpus_per_task=two"], ["nodes=2"]):
        with pytest.raises(MSBError):
            parse_slurm_args(bad)
    check_storage(None, 1)  # one worker on SQLite is allowed
    with pytest.raises(MSBError, match="at least 1"):
        check_storage(PG_URL, 0)


def test_status_counts_items_by_state(tmp_path: Path, monkeypatch):
    # a hand-made phase study on SQLite: item 0 done, 1 running (this process, in Slurm task 7_1), 2 failed by an
    # error, 3 failed and re-enqueued once (heartbeat rule), 4 waiting
    from msb.cluster.status import study_status
    from msb.study import coord

    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    root = tmp_path / "runs" / "st"
    spec = {"spec_hash": "a" * 64, "instance": "b" * 32, "study": "st", "search": {"method": "grid"},
            "cross_validation": None}
    for unit in ("ds-arch", "ds-other"):
        (root / "_study" / unit).mkdir(parents=True)
    (root / "_study" / "ds-arch" / "spec.json").write_text(json.dumps(spec))
    (root / "_study" / "ds-arch" / "state.json").write_text(json.dumps({"phase": "search"}))
    storage = coord.open_storage(f"sqlite:///{root / '_study' / 'optuna.db'}", heartbeat_interval=1)
    name = coord.phase_study_name("st", "ds-arch", "search", spec["spec_hash"], spec["instance"])
    study = coord.get_or_create_study(storage, name, "maximize", [{} for _ in range(5)])
    trials = [coord.claim_next(study, storage, exclusive=False) for _ in range(4)]
    study.tell(trials[0], 1.0)
    study.tell(trials[2], state=TrialState.FAIL)
    study.tell(trials[3], state=TrialState.FAIL)
    storage.get_heartbeat_stale_trial_callback()(study, coord.frozen_trial(study, 3))
    coord.close_storage(storage)
    st = study_status(root)  # the study folder; the storage: its optuna.db
    assert st.units == {"ds-arch": "search"} and st.storage.endswith("_study/optuna.db")
    p = st.phases[0]
    assert (p.unit, p.phase, p.items, p.done, p.running, p.waiting, p.failed, p.retries, p.left) == \
        ("ds-arch", "search", 5, 1, 1, 2, 1, 1, 4)
    (r,) = st.running
    assert (r.item, r.trial, r.worker, r.owner) == (1, 1, "slurm 7_1", coord.owner_id())
    assert r.heartbeat_age_s is not None and 0 <= r.heartbeat_age_s < 30
    # without --storage: the URL of the last msb submit when it was recorded (no password), else a clear refusal
    from msb.cluster.status import status_storage_url

    jobs = root / "_study" / "slurm" / "jobs.json"
    jobs.parent.mkdir(parents=True)
    jobs.write_text(json.dumps({"jobs": [{"storage": "postgresql://u@h/db", "password": False}]}))
    assert status_storage_url(root, None) == "postgresql://u@h/db"
    assert status_storage_url(root, "sqlite:///x.db") == "sqlite:///x.db"
    jobs.write_text(json.dumps({"jobs": [{"storage": "postgresql://u:***@h/db", "password": True}]}))
    with pytest.raises(MSBError, match="password not recorded"):
        status_storage_url(root, None)


# ---- a real Slurm ---------------------------------------------------------------------------------------------


def test_partition_refused_by_slurm(tmp_path: Path, make_project, msb_cli):
    _need_slurm()
    study = make_project(tmp_path, _study("p"))
    r = msb_cli("submit", str(study), "--slurm", "partition=nosuchpart", cwd=tmp_path)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: sbatch refused the job: invalid partition specified: nosuchpart")
    assert not list((tmp_path / "runs" / "p" / "_study" / "slurm").glob("*"))  # no script, no record left


def _items(url: str, prefix: str) -> dict[str, list]:
    from msb.study.coord import open_storage

    storage = open_storage(url)
    out = {}
    for s in optuna.get_all_study_summaries(storage):
        if s.study_name.startswith(prefix):
            out[s.study_name.split("/")[2]] = optuna.load_study(study_name=s.study_name,
                                                                storage=storage).get_trials(deepcopy=False)
    return out


def _results(study_dir: Path) -> dict:
    sel = json.loads((study_dir / "_study" / "synthetic-unet_tiny" / "selected.json").read_text())
    return {"trials": [(t["number"], t["state"], t["value"], t["params"], t["run_id"]) for t in sel["trials"]],
            "counts": {str(p.relative_to(study_dir)): pd.read_parquet(p).drop(columns="checkpoint_sha256")
                       .sort_values(["image_id", "class_id"]).reset_index(drop=True)
                       for p in sorted(study_dir.rglob("counts.parquet"))}}


@pytest.mark.slow
def test_job_array_of_two_workers_scancel_status_and_plain_run_equal(tmp_path: Path, make_project, msb_cli,
                                                                     msb_popen):
    _need_slurm(postgres=True)
    from msb.cluster.status import study_status

    name = f"sl{uuid.uuid4().hex[:8]}"
    spec = _study(name, epochs=5, heartbeat_interval=1, grace_period=30)
    data = tmp_path / "data"
    study = make_project(tmp_path / "a", spec, data_root=data)
    plain = make_project(tmp_path / "b", spec, data_root=data)  # same run ids: compared with a plain msb run
    sdir = tmp_path / "a" / "runs" / name
    r = msb_cli("submit", str(study), "--storage", PG_URL, "--workers", "2", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    job = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"\d+", job) and f"squeue -j {job}" in r.stdout
    try:
        # both workers run a trial, each with a heartbeat younger than 3 intervals
        t0 = time.monotonic()
        while True:
            st = study_status(sdir, PG_URL) if (sdir / "_study").is_dir() else None
            # a trial just asked for shows worker "-" until its worker has written its name: wait for both names
            if st is not None and {f"slurm {job}_0", f"slurm {job}_1"} <= {r.worker for r in st.running}:
                break
            assert time.monotonic() - t0 < 180, (_squeue(job), st and st.as_dict())
            time.sleep(0.2)
        assert sorted(r.worker for r in st.running) == [f"slurm {job}_0", f"slurm {job}_1"]
        # fresh: beaten within the last few intervals (1 s), far from stale (grace period 30 s)
        assert all(r.heartbeat_age_s is not None and r.heartbeat_age_s < 10 for r in st.running), st.as_dict()
        assert [(p.phase, p.items, p.done + p.running + p.waiting) for p in st.phases] == [("search", 2, 2)]
        ref = msb_popen("run", str(plain), log=tmp_path / "plain.log", cwd=tmp_path)  # data prepared by now
        # scancel worker 1 after the first epoch of its trial (mid-trial)
        victim = next(r for r in st.running if r.worker.endswith("_1"))
        logs = sdir / "_study" / "logs"
        while True:
            m = re.search(rf"search trial {victim.trial} .* -> (\S+)", (logs / f"worker-{job}_1.log").read_text())
            if m and (sdir / m.group(1) / "state" / "train_state.pt").is_file():
                break
            assert time.monotonic() - t0 < 240, (victim, _squeue(job))
            time.sleep(0.05)
        again = study_status(sdir, PG_URL)  # the beats go on while the trials train
        assert all(r.heartbeat_age_s is not None and r.heartbeat_age_s < 10 for r in again.running), again.as_dict()
        subprocess.run(["scancel", f"{job}_1"], check=True)
        while _squeue(job).strip():
            assert time.monotonic() - t0 < 400, _squeue(job)
            time.sleep(0.5)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    w0, w1 = ((logs / f"worker-{job}_{i}.log").read_text() for i in (0, 1))
    assert _job_state(f"{job}_1") == "CANCELLED" and _job_state(f"{job}_0") == "COMPLETED", (w0, w1)
    # the killed worker re-opened its trial; worker 0 continued it (same number) and finished the study
    assert f"interrupted; trial {victim.trial} is re-opened" in w1, w1
    assert f"search trial {victim.trial} " in w0 and "ensemble of 2 folds" in w0, w0
    trials = _items(PG_URL, f"{name}/")
    assert sorted(trials) == ["cv", "search"]
    for phase, ts in trials.items():  # every item completed exactly once, nothing left, nothing failed
        assert Counter(t.user_attrs["item"] for t in ts if t.state == TrialState.COMPLETE) == Counter(range(2))
        assert not [t for t in ts if t.state != TrialState.COMPLETE], phase
    # the killed trial trained once more from its saved epoch: each epoch appears once in its log
    for log in sdir.glob("*/train_log.csv"):
        assert pd.read_csv(log)["epoch"].tolist() == [1, 2, 3, 4, 5], log
    r = msb_cli("status", str(study), "--storage", PG_URL, "--format", "json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert st["left"] == 0 and st["running"] == [] and st["units"] == {"synthetic-unet_tiny": "finished"}
    assert [(p["phase"], p["items"], p["done"], p["failed"]) for p in st["phases"]] == [("search", 2, 2, 0),
                                                                                      ("cv", 2, 2, 0)]
    assert ref.wait(timeout=400) == 0, (tmp_path / "plain.log").read_text()
    got, want = _results(sdir), _results(tmp_path / "b" / "runs" / name)
    assert got["trials"] == want["trials"]
    assert set(got["counts"]) == set(want["counts"]) and len(want["counts"]) == 2 + 1  # 2 folds + ensemble
    for key, df in want["counts"].items():
        pd.testing.assert_frame_equal(got["counts"][key], df, check_exact=True)
