"""Schema of the optional ``notifications`` section (completion notifications of ``msb run``).

Set in ``configs/global.yaml`` (or a study's ``overrides``); see ``docs/notifications.md``. The section is
**excluded from the run config's dump and hash** (``RunConfig.notifications`` has ``exclude=True``): where a
message goes does not change what a run computes, and URLs or addresses are not copied into every run folder.
Credentials are never written in YAML: ``username_env``/``password_env`` name environment variables.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from msb.config.strict import StrictModel

__all__ = ["WebhookConfig", "EmailConfig", "NotificationsConfig"]


_Strict = StrictModel


class WebhookConfig(_Strict):
    """JSON POST to ``url`` (``http://`` or ``https://``) with ``Content-Type: application/json``.

    ``timeout_s``: seconds before the attempt is abandoned (a failed notification never fails the study).
    """

    url: str
    timeout_s: float = Field(10.0, gt=0)

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("webhook url must start with http:// or https://")
        return v


class EmailConfig(_Strict):
    """E-mail through an SMTP server (Python ``smtplib``).

    ``security``: ``starttls`` (upgrade a plain connection, usual on port 587), ``ssl`` (TLS from the start,
    port 465) or ``none`` (plain; loopback or trusted relays only). ``username_env``/``password_env``: names of
    environment variables holding the login (no login when ``username_env`` is unset).
    """

    host: str
    port: int = Field(587, gt=0, lt=65536)
    sender: str
    recipients: list[str] = Field(min_length=1)
    security: Literal["starttls", "ssl", "none"] = "starttls"
    username_env: Optional[str] = None
    password_env: Optional[str] = None
    timeout_s: float = Field(10.0, gt=0)


class NotificationsConfig(_Strict):
    """When and where to send a message about a finished or failed study.

    ``events``: any of ``finished``, ``failed`` (named ``events``, not ``on``: YAML 1.1 reads a bare ``on`` key
    as the boolean true). Nothing is sent unless ``enabled`` is true and a ``webhook`` or ``email`` is set.
    """

    enabled: bool = False
    events: list[Literal["finished", "failed"]] = Field(default_factory=lambda: ["finished", "failed"])
    webhook: Optional[WebhookConfig] = None
    email: Optional[EmailConfig] = None
