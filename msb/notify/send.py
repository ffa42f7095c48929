"""Sending one notification: a JSON POST to a webhook and/or an e-mail through SMTP (standard library only).

:func:`send_notification` never raises: each channel's failure (connection refused, timeout, HTTP error
status, SMTP error, a missing credential variable) is returned as one line of text, so that the caller can log
it and carry on (a failed notification must never fail the study).
"""

from __future__ import annotations

import json
import os
import smtplib
import ssl
import urllib.error
import urllib.request
from email.message import EmailMessage
from typing import Any

from msb.config.notifications_schema import EmailConfig, NotificationsConfig, WebhookConfig

__all__ = ["send_notification", "post_webhook", "send_email", "format_subject", "format_body"]


def format_subject(payload: dict[str, Any]) -> str:
    """``[msb] study '<study>' finished (3 runs, 12.5 min)`` or ``... failed: <error>`` (one line)."""
    head = f"[msb] study '{payload.get('study', '?')}' {payload.get('event', '?')}"
    if payload.get("event") == "failed":
        err = str(payload.get("error", "")).splitlines()[0] if payload.get("error") else ""
        return f"{head}: {err[:150]}" if err else head
    return f"{head} ({payload.get('n_runs', 0)} runs, {payload.get('duration_s', 0) / 60:.1f} min)"


def format_body(payload: dict[str, Any]) -> str:
    """Plain-text e-mail body: one ``key: value`` line per field, then the run folders."""
    lines = [f"{k}: {v}" for k, v in payload.items() if k != "runs"]
    runs = payload.get("runs") or []
    if runs:
        lines.append("runs:")
        lines += [f"  {r.get('run_id')}  {r.get('run_dir')}" for r in runs]
    return "\n".join(lines) + "\n"


def post_webhook(cfg: WebhookConfig, payload: dict[str, Any]) -> None:
    """POST ``payload`` as JSON (UTF-8) to ``cfg.url``. Raises ``urllib.error.URLError``/``OSError`` or
    ``RuntimeError`` for a non-2xx status."""
    data = json.dumps(payload, default=str).encode("utf-8")
    req = urllib.request.Request(cfg.url, data=data, method="POST",
                                 headers={"Content-Type": "application/json", "User-Agent": "msb-notify"})
    with urllib.request.urlopen(req, timeout=cfg.timeout_s) as resp:  # noqa: S310 (URL checked: http/https)
        status = resp.status
    if not 200 <= status < 300:
        raise RuntimeError(f"HTTP status {status}")


def send_email(cfg: EmailConfig, payload: dict[str, Any]) -> None:
    """Send the notification e-mail. Raises ``smtplib.SMTPException``/``OSError`` or ``RuntimeError`` (a named
    credential variable is not set)."""
    user = password = None
    if cfg.username_env:
        user = os.environ.get(cfg.username_env)
        password = os.environ.get(cfg.password_env) if cfg.password_env else None
        if user is None or (cfg.password_env and password is None):
            missing = cfg.username_env if user is None else cfg.password_env
            raise RuntimeError(f"environment variable {missing} (notifications.email) is not set")
    msg = EmailMessage()
    msg["Subject"] = format_subject(payload)
    msg["From"] = cfg.sender
    msg["To"] = ", ".join(cfg.recipients)
    msg.set_content(format_body(payload))
    if cfg.security == "ssl":
        server: smtplib.SMTP = smtplib.SMTP_SSL(cfg.host, cfg.port, timeout=cfg.timeout_s,
                                                context=ssl.create_default_context())
    else:
        server = smtplib.SMTP(cfg.host, cfg.port, timeout=cfg.timeout_s)
    with server:
        if cfg.security == "starttls":
            server.starttls(context=ssl.create_default_context())
        if user is not None:
            server.login(user, password or "")
        server.send_message(msg)


def send_notification(cfg: NotificationsConfig, payload: dict[str, Any]) -> list[str]:
    """Send ``payload`` (``event`` = ``finished``/``failed``) on every configured channel, if ``cfg.enabled``
    and the event is in ``cfg.events``.

    Returns:
        One line per channel that failed (``"webhook <url>: <error>"``, ``"e-mail via <host>:<port>: <error>"``);
        empty when everything was sent or nothing was due. Never raises.
    """
    if not cfg.enabled or payload.get("event") not in cfg.events:
        return []
    problems = []
    if cfg.webhook is not None:
        try:
            post_webhook(cfg.webhook, payload)
        except Exception as exc:  # never fail the study
            problems.append(f"webhook {cfg.webhook.url}: {type(exc).__name__}: {exc}".splitlines()[0])
    if cfg.email is not None:
        try:
            send_email(cfg.email, payload)
        except Exception as exc:  # never fail the study
            problems.append(f"e-mail via {cfg.email.host}:{cfg.email.port}: {type(exc).__name__}: {exc}"
                            .splitlines()[0])
    return problems
