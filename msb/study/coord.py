"""Coordination of study work between processes: optuna RDB storage, work items, claims, heartbeats, locks.

Work items are optuna trials. When an optuna study (one per phase: ``search``, ``cv``) is created, its
creator enqueues every work item as a ``WAITING`` trial (grid point, Hyperband slot or fold), tagged with the
user attribute ``item`` (0, 1, ...). A process *claims* an item by switching its trial from ``WAITING`` to
``RUNNING`` with the storage's compare-and-set (``BaseStorage.set_trial_state_values`` returns False when
another process won), so two processes never run the same trial, on one machine (SQLite) or many
(PostgreSQL / MySQL via ``--storage URL``).

Each claimed trial carries ``owner`` = ``host:pid:start-time`` and a heartbeat (optuna ``RDBStorage``
heartbeat table, refreshed every ``heartbeat_interval`` seconds by a daemon thread).

Recovery of a trial whose process died (``kill -9``):

- plain ``msb run`` (one process at a time): a ``RUNNING`` trial whose owner process is gone on this host (or
  whose heartbeat is older than the grace period) is *re-attached* under the same trial number, so the resumed
  study makes exactly the decisions of an uninterrupted one (Hyperband brackets depend on trial numbers);
- ``msb run --worker``: such a trial is failed (compare-and-set RUNNING -> FAIL, so only one worker wins) and
  re-enqueued as a new ``WAITING`` trial with the same item and parameters; its run folder is keyed by the
  config hash, so the retry continues the interrupted training from its last finished epoch.

A trial that raised an error is told ``FAIL``; plain ``msb run`` re-enqueues failed items when it starts.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import random
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState

from msb.errors import MSBError

__all__ = ["default_storage_url", "open_storage", "get_or_create_study", "owner_id", "owner_alive",
           "claim_next", "retry_trial", "Heartbeat", "file_lock", "items_status", "ItemsStatus",
           "phase_study_name"]

optuna.logging.set_verbosity(optuna.logging.WARNING)

FINISHED_OK = (TrialState.COMPLETE, TrialState.PRUNED)


def default_storage_url(study_root: Path) -> str:
    """``sqlite:///<study_root>/_study/optuna.db`` (absolute path)."""
    db = (Path(study_root) / "_study" / "optuna.db").resolve()
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def phase_study_name(study: str, unit: str, phase: str, spec_hash: str, instance: str = "") -> str:
    """Optuna study name of one phase of one dataset x architecture unit:
    ``<study>/<unit>/<phase>/<spec hash 8>-<instance 8>``."""
    return f"{study}/{unit}/{phase}/{spec_hash[:8]}-{instance[:8]}"


def retry_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue a ``WAITING`` copy of ``trial`` (same item, parameters and distributions), marked ``retry_of``.

    Used as optuna's stale-trial callback (called once, by the process that failed the stale trial)."""
    attrs = dict(trial.user_attrs)
    attrs.pop("owner", None)
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.WAITING, params=trial.params, distributions=trial.distributions, user_attrs=attrs,
        system_attrs={"retry_of": trial.number}))


def _with_driver(url: str) -> str:
    """``postgresql://`` / ``postgres://`` -> ``postgresql+psycopg2://`` when psycopg (v3), SQLAlchemy 2.1's
    default PostgreSQL driver, is not installed but psycopg2 is (the project's declared driver)."""
    import importlib.util

    scheme, sep, rest = url.partition("://")
    if sep and scheme in ("postgresql", "postgres"):
        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return f"postgresql+psycopg2://{rest}"
        return f"postgresql://{rest}"
    return url


def open_storage(url: str, heartbeat_interval: int = 30, grace_period: int = 120) -> optuna.storages.RDBStorage:
    """An optuna ``RDBStorage`` with heartbeats (stale trials are failed and retried by :func:`retry_trial`).

    SQLite URLs get a 120 s lock timeout (several processes share one file).

    Raises:
        MSBError: the database cannot be reached or opened (the message names the URL without its password).
    """
    kwargs: dict[str, Any] = {"heartbeat_interval": heartbeat_interval, "grace_period": grace_period}
    import inspect

    sig = inspect.signature(optuna.storages.RDBStorage.__init__).parameters
    cb_key = "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in sig else "failed_trial_callback"
    kwargs[cb_key] = retry_trial
    url = _with_driver(url)
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        engine_kwargs = {"connect_args": {"timeout": 120}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    last: Exception | None = None
    for attempt in range(4):  # workers starting together on a fresh database race to create optuna's tables
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as exc:  # table-creation race
            last = exc
            time.sleep(0.5 + attempt + random.random())
        except Exception as exc:  # noqa: BLE001 - driver/connection errors vary by backend
            last = exc
            break
    safe = url.split("@")[-1] if "@" in url else url
    first = str(last).strip().splitlines()[0] if last is not None and str(last).strip() else ""
    raise MSBError(f"cannot open the optuna storage '{safe}' ({type(last).__name__}: {first}); check --storage "
                   f"(e.g. postgresql://user:pass@host/db) and that the server is reachable")


def get_or_create_study(storage: optuna.storages.BaseStorage, name: str, direction: str,
                        items: list[dict[str, Any]], sampler: optuna.samplers.BaseSampler | None = None,
                        pruner: optuna.pruners.BasePruner | None = None, wait_s: float = 60.0) -> optuna.Study:
    """Create the optuna study ``name`` and enqueue ``items`` (one ``WAITING`` trial each, user attributes
    ``item=i`` plus the item's mapping), or load it when it exists.

    Only the creator enqueues; it then sets the study attribute ``enqueued``. A process that loads a study
    without ``enqueued`` waits up to ``wait_s`` s for it and then enqueues the missing items itself (the creator
    died in between).
    """
    try:
        study = optuna.create_study(storage=storage, study_name=name, direction=direction, sampler=sampler,
                                    pruner=pruner, load_if_exists=False)
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        created = False
    if created:
        for i, it in enumerate(items):
            study.enqueue_trial({}, user_attrs={"item": i, **it})
        study.set_user_attr("enqueued", len(items))
        return study
    deadline = time.monotonic() + wait_s
    while "enqueued" not in study.user_attrs and time.monotonic() < deadline:
        time.sleep(0.5)
    if "enqueued" not in study.user_attrs:
        have = {t.user_attrs.get("item") for t in study.get_trials(deepcopy=False)}
        for i, it in enumerate(items):
            if i not in have:
                study.enqueue_trial({}, user_attrs={"item": i, **it})
        study.set_user_attr("enqueued", len(items))
    return study


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "?"


def owner_id() -> str:
    """``host:pid:start`` of this process (``start`` = /proc start time, ``?`` where unavailable)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def owner_alive(owner: str | None) -> bool | None:
    """Whether the process ``owner`` still runs: True/False on this host, None when it is another host's (or
    unknown)."""
    if not owner:
        return None
    try:
        host, pid_s, start = owner.rsplit(":", 2)
        pid = int(pid_s)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start == "?" or _start_time(pid) == start


def _trials(study: optuna.Study, states: tuple[TrialState, ...]) -> list[FrozenTrial]:
    return sorted(study.get_trials(deepcopy=False, states=states), key=lambda t: t.number)


def claim_next(study: optuna.Study, exclusive: bool, reseed: Callable[[int], None] | None = None,
               log: Callable[[str], None] = lambda _m: None) -> optuna.trial.Trial | None:
    """Claim the next work item of ``study``, or return None when nothing is claimable now.

    Order: (1) a ``RUNNING`` trial whose owner died on this host: re-attached when ``exclusive`` (plain
    ``msb run``), else failed and re-enqueued; (2) stale trials (heartbeat older than the grace period) are
    failed and re-enqueued (optuna ``fail_stale_trials``); (3) the ``WAITING`` trial with the smallest number,
    by compare-and-set. ``reseed(trial_number)`` runs before the trial object is built (the sampler draws its
    relative parameters then). The claimed trial's ``owner`` attribute is set to this process.
    """
    storage = study._storage
    for t in _trials(study, (TrialState.RUNNING,)):
        alive = owner_alive(t.user_attrs.get("owner"))
        if "owner" not in t.user_attrs and t.datetime_start is not None:  # died between claim and tagging
            grace = getattr(storage, "grace_period", None) or 120
            if (datetime.datetime.now() - t.datetime_start).total_seconds() > grace:
                alive = False
        if alive is False:
            if exclusive:
                log(f"re-attaching trial {t.number} (item {t.user_attrs.get('item')}) of {study.study_name}: "
                    f"its process ended")
                return _attach(study, t, reseed)
            try:
                if storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL):
                    log(f"trial {t.number} of {study.study_name}: its process ended; re-enqueued")
                    retry_trial(study, storage.get_trial(t._trial_id))
            except optuna.exceptions.UpdateFinishedTrialError:
                pass
    with contextlib.suppress(Exception), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    for t in _trials(study, (TrialState.WAITING,)):
        try:
            if not storage.set_trial_state_values(t._trial_id, state=TrialState.RUNNING):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
        return _attach(study, t, reseed)
    return None


def _attach(study: optuna.Study, t: FrozenTrial, reseed: Callable[[int], None] | None) -> optuna.trial.Trial:
    if reseed is not None:
        reseed(t.number)
    trial = optuna.trial.Trial(study, t._trial_id)
    trial.set_user_attr("owner", owner_id())
    study._storage.record_heartbeat(t._trial_id)  # type: ignore[attr-defined]
    return trial


class Heartbeat:
    """Context manager: a daemon thread calling ``storage.record_heartbeat(trial_id)`` every ``interval`` s."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int, interval: float) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, max(float(interval), 0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self.storage.record_heartbeat(self.trial_id)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@contextlib.contextmanager
def file_lock(path: str | Path) -> Iterator[None]:
    """Exclusive advisory lock (``fcntl.flock``) on ``path`` (created if needed) for the ``with`` block.

    Serialises work on one folder between processes of one machine (and of several machines where the shared
    file system supports ``flock``, e.g. NFSv4). Released automatically when the process dies.
    """
    import fcntl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class ItemsStatus:
    """Status of the work items of one phase study (see :func:`items_status`)."""

    def __init__(self, n_items: int, done: dict[int, FrozenTrial], pending: set[int], failed: dict[int, FrozenTrial]):
        self.n_items, self.done, self.pending, self.failed = n_items, done, pending, failed

    @property
    def complete(self) -> bool:
        """Every item finished (COMPLETE or PRUNED)."""
        return len(self.done) == self.n_items


def items_status(study: optuna.Study, n_items: int) -> ItemsStatus:
    """Per item: its finished trial (COMPLETE/PRUNED, the first one), whether a trial of it is WAITING/RUNNING,
    or its failed trial (every trial of it FAIL and none pending)."""
    done: dict[int, FrozenTrial] = {}
    pending: set[int] = set()
    failed: dict[int, FrozenTrial] = {}
    for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number):
        item = t.user_attrs.get("item")
        if item is None:
            continue
        if t.state in FINISHED_OK:
            done.setdefault(item, t)
        elif t.state in (TrialState.WAITING, TrialState.RUNNING):
            pending.add(item)
        elif t.state == TrialState.FAIL:
            failed[item] = t
    failed = {i: t for i, t in failed.items() if i not in done and i not in pending}
    pending -= set(done)
    return ItemsStatus(n_items, done, pending, failed)
