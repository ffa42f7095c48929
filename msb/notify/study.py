"""Completion notifications of a study run: :func:`notify_on_completion` wraps ``run_study``.

When the wrapped call returns, a ``finished`` notification is sent; when it raises an ``Exception``, a ``failed``
one is sent and the exception propagates unchanged (``KeyboardInterrupt`` is not notified). The settings are the
study's ``notifications`` section (:class:`~msb.config.notifications_schema.NotificationsConfig`), read from the
generated run configs, or from ``global.yaml`` plus the study's overrides when the study itself cannot be
generated (a config error is a failure worth a message too).

Calls with ``worker=True`` (one of several processes sharing a distributed search) send nothing.

A failed notification never fails the study: any error while loading the settings or sending is caught and
reported as **one** warning line (through the ``log`` callable given to ``run_study``, else the ``msb.notify``
logger).
"""

from __future__ import annotations

import functools
import inspect
import logging
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, TypeVar

from msb.config.notifications_schema import NotificationsConfig
from msb.notify.send import send_notification

__all__ = ["notify_on_completion", "load_notifications", "study_payload"]

F = TypeVar("F", bound=Callable[..., Any])
_logger = logging.getLogger("msb.notify")


def load_notifications(study_path: str | Path) -> tuple[NotificationsConfig, str] | None:
    """The notification settings and study name of a study file, or None when they cannot be read."""
    try:
        from msb.config.generate import generate_runs

        runs = generate_runs(study_path, [])  # excluded architecture x size units are no error here
        if runs:
            return runs[0].config.notifications, runs[0].config.study
    except Exception:
        pass
    try:  # the study does not generate: fall back to global.yaml + the study's overrides
        from msb.config.generate import load_study
        from msb.config.layering import deep_merge, load_layer

        spec, root = load_study(study_path)
        data = load_layer(root / "global.yaml").data.get("notifications") or {}
        data = deep_merge(data, (spec.overrides or {}).get("notifications") or {})
        return NotificationsConfig.model_validate(data), spec.study
    except Exception:
        return None


def study_payload(event: str, study: str, study_path: str | Path, started: datetime, duration_s: float,
                  outcomes: Any = None, error: BaseException | None = None) -> dict[str, Any]:
    """The JSON body of a notification (also the e-mail's text).

    Keys: ``event`` (``finished``/``failed``), ``study``, ``study_file``, ``host``, ``started_at``,
    ``finished_at`` (UTC ISO 8601), ``duration_s``, ``n_runs``, ``runs`` (``[{run_id, run_dir}]``), ``error``
    (``"<Type>: <message>"`` or None), ``msb_version``.
    """
    from msb import __version__

    runs = [{"run_id": str(getattr(o, "run_id", "")), "run_dir": str(getattr(o, "run_dir", ""))}
            for o in (outcomes or [])]
    return {
        "event": event, "study": study, "study_file": str(Path(study_path).resolve()), "host": socket.gethostname(),
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "duration_s": round(duration_s, 3), "n_runs": len(runs), "runs": runs,
        "error": f"{type(error).__name__}: {error}" if error is not None else None, "msb_version": __version__,
    }


def _notify(study_path: Any, event: str, started: datetime, t0: float, outcomes: Any, error: BaseException | None,
            log: Callable[[str], None] | None) -> None:
    try:
        loaded = load_notifications(study_path)
        if loaded is None:
            return
        cfg, study = loaded
        problems = send_notification(cfg, study_payload(event, study, study_path, started, time.monotonic() - t0,
                                                        outcomes, error))
    except Exception as exc:  # never fail the study
        problems = [f"{type(exc).__name__}: {exc}"]
    if problems:
        line = (f"warning: '{event}' notification not sent ({'; '.join(problems)}); "
                f"the study itself is not affected").replace("\n", " ")
        try:
            log(line) if log is not None else _logger.warning(line)
        except Exception:
            pass


def notify_on_completion(run_study: F) -> F:
    """Decorator for ``run_study(study_path, ..., log=...)``: notify ``finished``/``failed`` (see module
    docstring). The wrapped function's signature, return value and exceptions are unchanged."""
    sig = inspect.signature(run_study)

    @functools.wraps(run_study)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind_partial(*args, **kwargs)
            study_path = next(iter(bound.arguments.values()), None)
            log = bound.arguments.get("log")
            if bound.arguments.get("worker"):  # one of several worker processes: the study is not theirs alone
                study_path = None
        except TypeError:
            study_path, log = None, None
        started, t0 = datetime.now(timezone.utc), time.monotonic()
        try:
            outcomes = run_study(*args, **kwargs)
        except Exception as exc:
            if study_path is not None:
                _notify(study_path, "failed", started, t0, None, exc, log)
            raise
        if study_path is not None:
            _notify(study_path, "finished", started, t0, outcomes, None, log)
        return outcomes

    return wrapper  # type: ignore[return-value]
