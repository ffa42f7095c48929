"""``msb status``: where a study stands, from its optuna storage and its study folder only (works from a login
node while workers run; starts nothing, writes nothing).

Per unit (``_study/<unit>/spec.json``) and phase (``search``, ``cv``), the work items (:mod:`msb.study.coord`) by
state: *done* (a COMPLETE or PRUNED trial), *running* (a RUNNING trial: its worker, owner and heartbeat age),
*waiting* (a WAITING trial: not claimed yet, or re-opened / re-enqueued after its worker was killed),
*failed* (every trial of the item FAIL and none pending: a plain ``msb run`` retries it); *retries* counts the
automatic retry copies (optuna's ``failed_trial`` system attribute). A unit is *finished* when its
``_study/<unit>/manifest.json`` exists (written after the final phase).
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy
from optuna.trial import TrialState

from msb.cluster.slurm import has_password
from msb.errors import MSBError
from msb.study.coord import phase_study_name, trial_id
from msb.study.manifest import read_json
from msb.study.storage import close_storage, open_storage

__all__ = ["PhaseRow", "RunningRow", "StudyStatus", "study_status", "study_root", "status_storage_url"]


@dataclass
class PhaseRow:
    """Work items of one unit x phase by state (module docstring); ``left`` = items not done."""

    unit: str
    phase: str
    items: int
    done: int = 0
    running: int = 0
    waiting: int = 0
    failed: int = 0
    retries: int = 0
    left: int = 0


@dataclass
class RunningRow:
    """One running work item: its trial, the worker holding it (``slurm <job>_<task>`` under Slurm), the owner
    process (``host:pid:start``) and the seconds since its last heartbeat (database clock; None: no beat yet)."""

    unit: str
    phase: str
    item: int
    trial: int
    worker: str
    owner: str
    heartbeat_age_s: float | None


@dataclass
class StudyStatus:
    """:func:`study_status`'s answer: phase rows, running items, units (name -> ``finished`` / the phase in
    ``state.json`` / ``not started``) and the storage (URL without password)."""

    root: Path
    storage: str
    phases: list[PhaseRow] = field(default_factory=list)
    running: list[RunningRow] = field(default_factory=list)
    units: dict[str, str] = field(default_factory=dict)

    @property
    def left(self) -> int:
        """Work items not done, over every unit and phase."""
        return sum(p.left for p in self.phases)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``root`` as text, ``left`` included)."""
        return {"root": str(self.root), "storage": self.storage, "units": self.units, "left": self.left,
                "phases": [asdict(p) for p in self.phases], "running": [asdict(r) for r in self.running]}


def study_root(study: str | Path, run_root: str | None = None) -> tuple[Path, list[str]]:
    """The study folder ``<run_root>/<study>`` and its unit names: ``study`` is a study file (its units, started
    or not) or the study folder itself (the units that have a ``_study/<unit>/spec.json``).

    Raises:
        MSBError: neither a study file nor a folder holding ``_study/``; config errors of the study file.
    """
    p = Path(study)
    if p.is_dir():
        if not (p / "_study").is_dir():
            raise MSBError(f"{p}: not a study folder (no _study/ inside); give the study file or runs/<study>")
        return p.resolve(), sorted(s.parent.name for s in (p / "_study").glob("*/spec.json"))
    from msb.study.units import study_units

    units = study_units(p, run_root)
    if not units:
        raise MSBError(f"{p}: the study has no unit (every architecture excluded)")
    return units[0].root.resolve(), [u.name for u in units]


def status_storage_url(root: Path, storage: str | None) -> str | None:
    """The storage to read: ``storage``; else the one of the last ``msb submit`` (``_study/slurm/jobs.json``,
    when recorded without a password); else the study's SQLite file when it exists; else None (nothing started).

    Raises:
        MSBError: the last submission used a URL with a password (it is not recorded): give ``--storage``.
    """
    if storage:
        return storage
    jobs = (read_json(root / "_study" / "slurm" / "jobs.json") or {}).get("jobs") or []
    if jobs and jobs[-1].get("storage"):
        if jobs[-1].get("password"):
            raise MSBError(f"{root}: the workers use {jobs[-1]['storage']} (password not recorded); give "
                           f"--storage with the full URL")
        return str(jobs[-1]["storage"])
    db = root / "_study" / "optuna.db"
    return f"sqlite:///{db}" if db.is_file() else None


def _heartbeats(storage: optuna.storages.RDBStorage, ids: list[int]) -> dict[int, float]:
    """Seconds since the last heartbeat of each trial id (database clock, as optuna compares them)."""
    if not ids:
        return {}
    table = sqlalchemy.Table("trial_heartbeats", sqlalchemy.MetaData(), autoload_with=storage.engine)
    with storage.engine.connect() as conn:
        now = conn.execute(sqlalchemy.select(sqlalchemy.func.now())).scalar()
        rows = conn.execute(sqlalchemy.select(table.c.trial_id, table.c.heartbeat)
                            .where(table.c.trial_id.in_(ids))).all()
    if isinstance(now, str):  # SQLite returns CURRENT_TIMESTAMP as text
        now = datetime.datetime.fromisoformat(now)
    now = now.replace(tzinfo=None)
    return {int(i): max(0.0, (now - hb.replace(tzinfo=None)).total_seconds()) for i, hb in rows}


def _phase(storage: optuna.storages.RDBStorage, name: str, unit: str, phase: str,
           out: StudyStatus) -> None:
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return  # this phase has not started
    trials = study.get_trials(deepcopy=False)
    n_items = int(study.user_attrs.get("enqueued", 0)) or len({t.user_attrs.get("item") for t in trials} - {None})
    row = PhaseRow(unit, phase, n_items)
    by_item: dict[int, list[Any]] = {}
    for t in trials:
        if t.user_attrs.get("item") is not None:
            by_item.setdefault(int(t.user_attrs["item"]), []).append(t)
        row.retries += "failed_trial" in t.system_attrs
    running = []
    for item in range(n_items):
        states = [t.state for t in by_item.get(item, [])]
        if TrialState.COMPLETE in states or TrialState.PRUNED in states:
            row.done += 1
        elif TrialState.RUNNING in states:
            row.running += 1
            t = next(t for t in by_item[item] if t.state == TrialState.RUNNING)
            running.append((item, t))
        elif TrialState.WAITING in states:
            row.waiting += 1
        elif states:
            row.failed += 1
        else:
            row.waiting += 1  # not enqueued yet (its creator is enqueueing)
    row.left = n_items - row.done
    ids = {t.number: trial_id(storage, study, t.number) for _, t in running}
    ages = _heartbeats(storage, list(ids.values()))
    for item, t in running:
        out.running.append(RunningRow(unit, phase, item, t.number, str(t.user_attrs.get("worker") or "-"),
                                      str(t.user_attrs.get("owner", "?")), ages.get(ids[t.number])))
    out.phases.append(row)


def study_status(study: str | Path, storage: str | None = None, run_root: str | None = None) -> StudyStatus:
    """Where a study stands (module docstring).

    Args:
        study: the study file, or the study folder ``<run_root>/<study>``.
        storage: the optuna storage URL the workers use (default: :func:`status_storage_url`).
        run_root: overrides the study file's ``run_root``.

    Raises:
        MSBError: no study folder; the storage cannot be opened.
    """
    from msb.study.manifest import safe_url

    root, names = study_root(study, run_root)
    url = status_storage_url(root, storage) if root.is_dir() else storage
    out = StudyStatus(root, (safe_url(url) if has_password(url) else url) if url else "-")
    specs = {n: read_json(root / "_study" / n / "spec.json") for n in names}
    for n in names:
        if (root / "_study" / n / "manifest.json").is_file():
            out.units[n] = "finished"
        else:
            out.units[n] = str((read_json(root / "_study" / n / "state.json") or {}).get("phase", "not started"))
    if url is None or not any(specs.values()):
        return out
    st = open_storage(url)
    try:
        for n in names:
            spec = specs[n]
            if not spec:
                continue
            search = spec.get("search") or {}
            phases = (["search"] if search and search.get("method", "grid") != "none" else []) + \
                (["cv"] if spec.get("cross_validation") else [])
            for phase in phases:
                _phase(st, phase_study_name(spec["study"], n, phase, spec["spec_hash"], spec["instance"]), n,
                       phase, out)
    finally:
        close_storage(st)
    return out
