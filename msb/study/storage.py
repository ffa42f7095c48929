"""The optuna RDB storage of a study: opening it (race-free schema creation, heartbeats, the stale-trial retry
callback), closing it. Work items on it: :mod:`msb.study.coord`.
"""

from __future__ import annotations

import contextlib
import copy
import random
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial

from msb.errors import MSBError
from msb.utils.locks import file_lock

__all__ = ["MAX_RETRY", "RetryWithoutOwner", "retries_used", "default_storage_url", "open_storage", "close_storage"]

optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_RETRY = 3
"""Retries of one item after stale-heartbeat / dead-owner failures (a trial that keeps killing its worker is
not retried for ever); a plain ``msb run`` retries failed items again when it starts."""


def default_storage_url(study_root: Path) -> str:
    """``sqlite:///<study_root>/_study/optuna.db`` (absolute path; the folder is created)."""
    db = (Path(study_root) / "_study" / "optuna.db").resolve()
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


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


class RetryWithoutOwner:
    """``RetryHeartbeatStaleTrialCallback(max_retry)`` whose copy does not inherit the dead process's ``owner``
    and ``worker`` user attributes (the copy's claimer sets its own; until then the copy must not look owned by the dead one)."""

    def __init__(self, max_retry: int | None) -> None:
        with warnings.catch_warnings():  # marked experimental (not deprecated) by optuna
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            self._callback = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry)
        self.max_retry = max_retry

    def __call__(self, study: optuna.Study, trial: FrozenTrial, fresh_budget: bool = False) -> None:
        t = copy.deepcopy(trial)
        t.user_attrs = {k: v for k, v in trial.user_attrs.items() if k not in ("owner", "worker")}
        if fresh_budget:  # a user's rerun: the automatic retries start counting again
            t.system_attrs = {k: v for k, v in trial.system_attrs.items() if k not in ("retry_history", "failed_trial")}
        self._callback(study, t)


def retries_used(trial: FrozenTrial) -> int:
    """Automatic retries already made of ``trial``'s item (length of optuna's ``retry_history``)."""
    return len(trial.system_attrs.get("retry_history", []))


def _sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` URL (None for other URLs and in-memory SQLite)."""
    if not url.startswith("sqlite:///") or url in ("sqlite:///", "sqlite:///:memory:"):
        return None
    return Path(url[len("sqlite:///"):])


def _schema_race(exc: BaseException) -> bool:
    """Whether ``exc`` is a lost race to create optuna's tables (another process created them first)."""
    if isinstance(exc, (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError)):
        return True
    text = f"{exc} {getattr(exc, '__cause__', '') or ''}".lower()
    return "already exists" in text or "duplicate" in text


def open_storage(url: str, heartbeat_interval: int = 30, grace_period: int = 120) -> optuna.storages.RDBStorage:
    """An optuna ``RDBStorage`` with heartbeats; stale trials are retried by
    ``RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)``.

    Args:
        url: SQLAlchemy URL (``sqlite:///...``, ``postgresql://user:pass@host/db``). SQLite gets a 120 s lock
            timeout (several processes share one file).
        heartbeat_interval, grace_period: seconds between beats / before a silent trial is stale.

    Raises:
        MSBError: the database cannot be reached or opened (the message names the URL without its password).
    """
    url = _with_driver(url)
    engine_kwargs: dict[str, Any] = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else \
        {"pool_pre_ping": True}
    last: Exception | None = None
    # workers starting together on a fresh database race to create optuna's tables: on SQLite the schema is
    # created under a lock file beside the database; on a server, a lost race is retried
    db = _sqlite_path(url)
    lock = file_lock(db.with_name(db.name + ".schema.lock")) if db is not None else contextlib.nullcontext()
    for attempt in range(4):
        try:
            with lock, warnings.catch_warnings():  # heartbeat arguments are marked experimental by optuna
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(
                    url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval,
                    grace_period=grace_period,
                    heartbeat_stale_trial_callback=RetryWithoutOwner(MAX_RETRY))
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError,
                optuna.exceptions.StorageInternalError) as exc:
            last = exc
            if not _schema_race(exc):
                break
            time.sleep(0.5 + attempt + random.random())
        except Exception as exc:  # noqa: BLE001 - driver/connection errors vary by backend
            last = exc
            break
    safe = url.split("@")[-1] if "@" in url else url
    first = str(last).strip().splitlines()[0] if last is not None and str(last).strip() else ""
    raise MSBError(f"cannot open the optuna storage '{safe}' ({type(last).__name__}: {first}); check --storage "
                   f"(e.g. postgresql://user:pass@host/db) and that the server is reachable")


def close_storage(storage: optuna.storages.RDBStorage) -> None:
    """Release the storage's session and connection pool (public ``remove_session`` and ``engine``)."""
    storage.remove_session()
    storage.engine.dispose()
