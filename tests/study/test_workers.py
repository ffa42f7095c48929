"""Several `msb run --worker` processes on one optuna storage: every trial (grid point, fold) runs exactly once;
a worker killed mid-trial is recovered by the others (its trial failed and retried once). SQLite (the default
storage) and PostgreSQL (`.ci/run` starts a server on loopback; skipped with a message when none answers)."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pandas as pd
import pytest
from optuna.trial import TrialState

PG_URL = os.environ.get("MSB_TEST_POSTGRES_URL", "postgresql://msb:msb@127.0.0.1:5432/msb_test")


def _study(name: str) -> dict:
    return {"study": name, "overrides": {"train": {"epochs": 2}},
            "search": {"method": "grid", "params": {"train.optimizer.lr": [0.001, 0.002, 0.003, 0.004, 0.006, 0.008]}},
            "cross_validation": {"k": 2}}


def _wait(procs, timeout: float = 400) -> None:
    t0 = time.monotonic()
    for p in procs:
        p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))


def _check_storage(url: str, study_prefix: str, n_search: int, n_cv: int, logs: list[str]) -> None:
    from msb.study.coord import open_storage

    storage = open_storage(url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage) if s.study_name.startswith(study_prefix)]
    assert len(names) == 2, names
    for name in names:
        n_items = n_search if "/search/" in name else n_cv
        trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
        assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
        ok = Counter(t.user_attrs["item"] for t in trials if t.state == TrialState.COMPLETE)
        assert ok == Counter(range(n_items)), (name, ok)  # every item completed exactly once
        for t in trials:
            if t.state == TrialState.FAIL:  # only a killed worker's trial, retried exactly once
                assert sum(1 for r in trials if r.system_attrs.get("failed_trial") == t.number) == 1
    # no trial was run by two workers: each "search trial N" / "fold j" line appears in one log only
    lines = Counter()
    for text in logs:
        lines.update(set(re.findall(r"search trial \d+ |fold \d+/\d+ \(trial \d+\)", text)))
    assert lines and max(lines.values()) == 1, lines


def _check_runs(study_dir: Path, epochs: int = 2) -> None:
    logs = list(study_dir.glob("*/train_log.csv"))
    assert len(logs) == 6 + 2
    for log in logs:
        assert pd.read_csv(log)["epoch"].tolist() == list(range(1, epochs + 1)), log


@pytest.mark.slow
def test_two_workers_sqlite_and_recovery_of_a_killed_worker(tmp_path: Path, make_project, msb_popen):
    study = make_project(tmp_path, _study("w"))
    sdir = tmp_path / "runs" / "w"
    args = ("run", str(study), "--worker", "--heartbeat-interval", "1", "--grace-period", "20")
    victim = msb_popen(*args, log=tmp_path / "victim.log")
    t0 = time.monotonic()
    while not list(sdir.glob("*/state/train_state.pt")):
        assert victim.poll() is None and time.monotonic() - t0 < 240
        time.sleep(0.05)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait()
    workers = [msb_popen(*args, log=tmp_path / f"w{i}.log") for i in range(2)]
    _wait(workers)
    logs = [(tmp_path / f"w{i}.log").read_text() for i in range(2)]
    assert [w.returncode for w in workers] == [0, 0], logs
    assert "its process ended; re-enqueued" in "".join(logs)
    assert all(re.search(r"search trial \d+ |fold \d+/", text) for text in logs), "both workers must work"
    _check_storage(f"sqlite:///{sdir / '_study' / 'optuna.db'}", "w/", 6, 2, logs)
    _check_runs(sdir)
    assert (sdir / "_study" / "synthetic-unet_tiny" / "manifest.json").is_file()


def _postgres_reachable() -> str | None:
    try:
        import psycopg2

        psycopg2.connect(PG_URL, connect_timeout=3).close()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"


@pytest.mark.slow
def test_two_workers_postgresql(tmp_path: Path, make_project, msb_popen):
    why = _postgres_reachable()
    if why is not None:
        pytest.skip(f"no PostgreSQL server reachable locally at {PG_URL.split('@')[-1]} ({why}); .ci/run installs "
                    f"and starts one (Debian package postgresql); set MSB_TEST_POSTGRES_URL to use another")
    name = f"pg{uuid.uuid4().hex[:8]}"
    study = make_project(tmp_path, _study(name))
    args = ("run", str(study), "--worker", "--storage", PG_URL)
    workers = [msb_popen(*args, log=tmp_path / f"w{i}.log") for i in range(2)]
    _wait(workers)
    logs = [(tmp_path / f"w{i}.log").read_text() for i in range(2)]
    assert [w.returncode for w in workers] == [0, 0], logs
    assert all(re.search(r"search trial \d+ |fold \d+/", text) for text in logs), "both workers must work"
    _check_storage(PG_URL, f"{name}/", 6, 2, logs)
    _check_runs(tmp_path / "runs" / name)
    assert not (tmp_path / "runs" / name / "_study" / "optuna.db").exists()  # the RDB server held the study


def test_unreachable_storage_is_one_line_and_writes_nothing(tmp_path: Path, make_project, msb_cli):
    study = make_project(tmp_path, _study("u"))
    r = msb_cli("run", str(study), "--worker", "--storage", "postgresql://msb:secret@127.0.0.1:1/none")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "cannot open the optuna storage '127.0.0.1:1/none'" in r.stderr and "secret" not in r.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "datasets").exists()
