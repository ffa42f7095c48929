"""Coordination of study work between processes, on optuna's public API: work items, claims, heartbeats,
retries (opening the storage: :mod:`msb.study.storage`; file locks: :mod:`msb.utils.locks`).

Work items are optuna trials. When an optuna study (one per phase: ``search``, ``cv``) is created, its creator
enqueues every work item with ``Study.enqueue_trial`` (grid point, Hyperband slot or fold), tagged with the user
attribute ``item`` (0, 1, ...). A process *claims* the next item with ``Study.ask()``, which pops the ``WAITING``
trial with the smallest number.

Guarantees and where they come from:

- **One claim per trial.** On PostgreSQL/MySQL the storage locks the trial row (``SELECT ... FOR UPDATE``) while
  ``ask()`` moves it from ``WAITING`` to ``RUNNING``, so exactly one process wins. SQLite has no row lock and
  optuna gives no such guarantee there, so every claim additionally holds a :func:`file_lock` in the study
  folder (``_study/<unit>/locks/claim-<phase>.lock``), which serialises claims of processes sharing that folder.
- **A lease per trial.** Optuna writes heartbeats only inside ``Study.optimize``; under ask/tell the pipeline owns
  the lease: :class:`Heartbeat` calls ``RDBStorage.record_heartbeat`` every ``heartbeat_interval`` seconds while a
  trial runs, and every claim first calls ``optuna.storages.fail_stale_trials``, which fails trials whose last
  beat is older than ``grace_period`` and hands each to the storage's stale-trial callback,
  ``optuna.storages.RetryHeartbeatStaleTrialCallback``: one ``WAITING`` copy (same item, parameters and user
  attributes; system attributes ``failed_trial`` / ``retry_history``).
- **Fast recovery on one machine.** Each claimed trial carries ``owner`` = ``host:pid:start-time``. A ``RUNNING``
  trial whose owner process is gone on this host is recovered at once, without waiting for the grace period:

  - plain ``msb run`` (``exclusive``): the trial is *re-opened* under the same number (``RUNNING -> WAITING``
    through ``BaseStorage.set_trial_state_values``, then claimed by ``ask()``), so a resumed study makes exactly
    the decisions of an uninterrupted one: Hyperband's bracket and the sampler seed are functions of the trial
    number. Optuna has no public call that re-opens a trial; this is the one place we drive the storage
    interface directly, and ``tests/study/test_coord.py`` fails without it;
  - ``msb run --worker``: the trial is told ``FAIL`` (``Study.tell``; only one process can win, the others get
    an error because the trial is finished) and the winner hands it to the retry callback.

A trial whose work raised an error is told ``FAIL``; plain ``msb run`` re-enqueues failed items when it starts.
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import FrozenTrial, TrialState

from msb.errors import MSBError
from msb.study.storage import (MAX_RETRY, RetryWithoutOwner, close_storage, default_storage_url, open_storage,
                               retries_used)
from msb.utils.locks import file_lock

__all__ = ["default_storage_url", "open_storage", "close_storage", "get_or_create_study", "owner_id", "worker_label",
           "owner_alive", "claim_next", "retry_failed", "Heartbeat", "file_lock", "items_status", "ItemsStatus",
           "phase_study_name", "trial_id", "frozen_trial", "work_loop", "MAX_RETRY", "retries_used", "reopen"]

FINISHED_OK = (TrialState.COMPLETE, TrialState.PRUNED)


def phase_study_name(study: str, unit: str, phase: str, spec_hash: str, instance: str = "") -> str:
    """Optuna study name of one phase of one dataset x architecture unit:
    ``<study>/<unit>/<phase>/<spec hash 8>-<instance 8>``."""
    return f"{study}/{unit}/{phase}/{spec_hash[:8]}-{instance[:8]}"


def get_or_create_study(storage: optuna.storages.BaseStorage, name: str, direction: str,
                        items: list[dict[str, Any]], sampler: optuna.samplers.BaseSampler | None = None,
                        pruner: optuna.pruners.BasePruner | None = None, wait_s: float = 60.0) -> optuna.Study:
    """Create the optuna study ``name`` and enqueue ``items`` (``Study.enqueue_trial``: one ``WAITING`` trial
    each, user attributes ``item=i`` plus the item's mapping), or load it when it exists.

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
    if not created:
        deadline = time.monotonic() + wait_s
        while "enqueued" not in study.user_attrs and time.monotonic() < deadline:
            time.sleep(0.5)
        if "enqueued" in study.user_attrs:
            return study
    have = {t.user_attrs.get("item") for t in study.get_trials(deepcopy=False)}
    for i, it in enumerate(items):
        if i not in have:
            study.enqueue_trial({}, user_attrs={"item": i, **it})
    study.set_user_attr("enqueued", len(items))
    return study


def trial_id(storage: optuna.storages.BaseStorage, study: optuna.Study, number: int) -> int:
    """Storage id of trial ``number`` of ``study`` (public storage look-ups; needed for heartbeats)."""
    return storage.get_trial_id_from_study_id_trial_number(storage.get_study_id_from_name(study.study_name), number)


def frozen_trial(study: optuna.Study, number: int) -> FrozenTrial:
    """The stored state of trial ``number`` (fresh from the storage). Raises ``KeyError`` if absent."""
    for t in study.get_trials(deepcopy=False):
        if t.number == number:
            return t
    raise KeyError(number)


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "?"


def owner_id() -> str:
    """``host:pid:start`` of this process (``start`` = /proc start time, ``?`` where unavailable)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_start_time(os.getpid())}"


def worker_label() -> str:
    """``slurm <array job>_<task>`` (or ``slurm <job>``) inside a Slurm job, from its environment; else ``""``."""
    array, task, job = (os.environ.get(k) for k in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID"))
    if array and task:
        return f"slurm {array}_{task}"
    return f"slurm {job}" if job else ""


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


def reopen(study: optuna.Study, storage: optuna.storages.BaseStorage, number: int) -> bool:
    """Put the ``RUNNING`` trial ``number`` back to ``WAITING`` so that the next claim (``ask()`` pops the smallest
    number first) continues it under the same number (module docstring: why the number matters).

    Returns:
        False when the trial had finished meanwhile (nothing changed).
    """
    try:
        storage.set_trial_state_values(trial_id(storage, study, number), state=TrialState.WAITING)
        return True
    except optuna.exceptions.UpdateFinishedTrialError:
        return False


def retry_failed(study: optuna.Study, trial: FrozenTrial) -> None:
    """Enqueue one ``WAITING`` copy of the failed ``trial`` (optuna's retry callback without a limit, and the
    automatic-retry budget starts again: a user's rerun asks for it)."""
    RetryWithoutOwner(None)(study, trial, fresh_budget=True)


def _dead(t: FrozenTrial, grace_s: float) -> bool:
    alive = owner_alive(t.user_attrs.get("owner"))
    if "owner" not in t.user_attrs and t.datetime_start is not None:  # died between claim and tagging
        if (datetime.datetime.now() - t.datetime_start).total_seconds() > grace_s:
            alive = False
    return alive is False


def claim_next(study: optuna.Study, storage: optuna.storages.RDBStorage, exclusive: bool,
               reseed: Callable[[int], None] | None = None, log: Callable[[str], None] = lambda _m: None
               ) -> optuna.trial.Trial | None:
    """Claim the next work item of ``study`` (module docstring), or return None when nothing is claimable now.

    Call it under the phase's claim :func:`file_lock`. Order: (1) ``RUNNING`` trials whose owner died on this
    host are re-opened (``exclusive``) or failed and retried; (2) ``optuna.storages.fail_stale_trials``;
    (3) ``Study.ask()`` claims the ``WAITING`` trial with the smallest number; it gets a first heartbeat,
    ``owner`` = this process, and ``reseed(number)`` runs (the sampler draws at suggest time, after this).
    """
    grace = float(getattr(storage, "grace_period", None) or 120)  # RDBStorage(grace_period=...)
    callback = storage.get_heartbeat_stale_trial_callback()
    for t in sorted(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)), key=lambda t: t.number):
        if not _dead(t, grace):
            continue
        if exclusive:
            log(f"re-attaching trial {t.number} (item {t.user_attrs.get('item')}) of {study.study_name}: "
                f"its process ended")
            reopen(study, storage, t.number)  # False: finished meanwhile (plain run mixed with workers)
            continue
        try:
            study.tell(t.number, state=TrialState.FAIL)
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another process failed (or finished) it first
        if retries_used(t) >= MAX_RETRY:
            log(f"trial {t.number} of {study.study_name}: its process ended; not retried ({MAX_RETRY} automatic "
                f"retries used; a plain 'msb run' retries it)")
            continue
        log(f"trial {t.number} of {study.study_name}: its process ended; re-enqueued")
        if callback is not None:
            callback(study, frozen_trial(study, t.number))
    with warnings.catch_warnings():  # fail_stale_trials is marked experimental (not deprecated) by optuna
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    if not study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        return None
    with warnings.catch_warnings():  # "heartbeat is supposed to be used with optimize": we beat ourselves
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed", category=UserWarning)
        trial = study.ask()
    try:
        storage.record_heartbeat(trial_id(storage, study, trial.number))  # the lease starts now
        if "item" not in trial.user_attrs:  # another machine took the last WAITING trial between look and ask
            trial.set_user_attr("note", "asked when no work item was left; not a work item")
            study.tell(trial, state=TrialState.FAIL)
            return None
        trial.set_user_attr("owner", owner_id())
        trial.set_user_attr("worker", worker_label())  # msb status shows it; "" outside Slurm
        if reseed is not None:  # parameters are drawn at suggest time, after this: the draw depends on n only
            reseed(trial.number)
    except BaseException:
        try:
            study.tell(trial, state=TrialState.FAIL)
        except Exception as exc:  # noqa: BLE001 - the first error is the one to show
            log(f"could not mark trial {trial.number} failed ({type(exc).__name__}); its heartbeat will expire")
        raise
    return trial


class Heartbeat:
    """Context manager: a daemon thread calling ``storage.record_heartbeat(trial_id)`` every ``interval`` s.

    A failed beat (e.g. a database hiccup) is retried at the next interval; the grace period (several
    intervals) absorbs single misses."""

    def __init__(self, storage: optuna.storages.RDBStorage, trial_id: int, interval: float,
                 log: Callable[[str], None] = lambda _m: None) -> None:
        self.storage, self.trial_id, self.interval = storage, trial_id, max(float(interval), 0.1)
        self.log = log
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.storage.record_heartbeat(self.trial_id)
            except Exception as exc:  # noqa: BLE001 - optuna wraps DB errors (StorageInternalError); keep beating
                self.log(f"heartbeat of trial id {self.trial_id} failed ({type(exc).__name__}); retrying")

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class ItemsStatus:
    """Status of the work items of one phase study (see :func:`items_status`)."""

    def __init__(self, n_items: int, done: dict[int, FrozenTrial], pending: set[int], failed: dict[int, FrozenTrial]):
        self.n_items, self.done, self.pending, self.failed = n_items, done, pending, failed

    @property
    def complete(self) -> bool:
        """Every item finished (COMPLETE or PRUNED)."""
        return len(self.done) == self.n_items

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready summary (item numbers per status)."""
        return {"n_items": self.n_items, "done": sorted(self.done), "pending": sorted(self.pending),
                "failed": sorted(self.failed)}


def items_status(study: optuna.Study, n_items: int) -> ItemsStatus:
    """Per item: its finished trial (COMPLETE/PRUNED, the first one), whether a trial of it is WAITING/RUNNING,
    or its failed trial (every trial of it FAIL and none pending). Trials without ``item`` are ignored."""
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


def work_loop(study: optuna.Study, storage: optuna.storages.RDBStorage, n_items: int, label: str,
              work: Callable[[optuna.trial.Trial], None], *, claim_lock: Path, exclusive: bool,
              heartbeat_interval: float, poll_s: float, on_status: Callable[[ItemsStatus], None] = lambda _s: None,
              reseed: Callable[[int], None] | None = None, log: Callable[[str], None] = lambda _m: None
              ) -> ItemsStatus:
    """Claim and run work items of ``study`` until every item is finished.

    Args:
        study, storage: the phase study and its storage; n_items: number of enqueued items.
        label: ``[unit] phase`` for messages; work: runs one claimed trial and tells it (raises on error).
        claim_lock: lock file serialising claims (SQLite has no row locks); exclusive: plain ``msb run``
            (re-attach dead trials, retry failed items first); heartbeat_interval: seconds between beats;
        poll_s: seconds between looks while other processes run the remaining items;
        on_status: called with the status before every claim (e.g. to write ``state.json``).

    Returns:
        The final :class:`ItemsStatus` (complete).

    Raises:
        MSBError: items failed and none is pending; the error of ``work`` (its trial is told FAIL first).
    """
    if exclusive:
        for item, t in items_status(study, n_items).failed.items():
            log(f"{label} item {item} (trial {t.number}) failed before; retrying it")
            retry_failed(study, t)
    waited = False
    while True:
        st = items_status(study, n_items)
        on_status(st)
        if st.complete:
            return st
        if st.failed and not st.pending:
            raise MSBError(f"{label}: work item(s) {sorted(st.failed)} failed (trial(s) "
                           f"{[t.number for t in st.failed.values()]} of optuna study {study.study_name!r}; an "
                           f"error, or a killed worker after {MAX_RETRY} automatic retries); see the log of the "
                           f"worker that ran it, then rerun 'msb run' (without --worker) to retry")
        with file_lock(claim_lock):
            trial = claim_next(study, storage, exclusive, reseed, log)
        if trial is None:
            if not waited:
                log(f"{label}: waiting for {len(st.pending)} item(s) run by other processes")
                waited = True
            time.sleep(poll_s)
            continue
        waited = False
        with Heartbeat(storage, trial_id(storage, study, trial.number), heartbeat_interval, log):
            try:
                work(trial)
            except KeyboardInterrupt:  # Ctrl-C: continue it later under the same number, as after kill -9
                if reopen(study, storage, trial.number):
                    log(f"{label}: interrupted; trial {trial.number} is re-opened and continues on the next run")
                raise
            except BaseException:
                try:
                    study.tell(trial, state=TrialState.FAIL)
                except Exception as tell_exc:  # noqa: BLE001 - the work's own error is the one to show
                    log(f"{label}: could not mark trial {trial.number} failed ({type(tell_exc).__name__}); "
                        f"its heartbeat will expire")
                raise
