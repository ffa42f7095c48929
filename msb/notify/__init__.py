"""Completion notifications (webhook JSON POST, SMTP e-mail) for ``msb run``; see ``docs/notifications.md``."""

from msb.notify.send import send_notification
from msb.notify.study import load_notifications, notify_on_completion, study_payload

__all__ = ["send_notification", "notify_on_completion", "load_notifications", "study_payload"]
