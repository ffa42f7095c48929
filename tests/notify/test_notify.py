"""Completion notifications: webhook against a loopback http.server, e-mail against a loopback aiosmtpd sink,
and the run_study hook (finished/failed; a failed notification never fails the study: one warning line)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
import yaml

from msb.config.notifications_schema import NotificationsConfig
from msb.errors import MSBError
from msb.notify import notify_on_completion, send_notification

REPO = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------ loopback sinks
class _Hook:
    """A loopback HTTP server on 127.0.0.1 recording POSTed JSON bodies; answers ``status``."""

    def __init__(self, status: int = 204) -> None:
        received = self.received = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                n = int(self.headers["Content-Length"])
                received.append((self.headers["Content-Type"], json.loads(self.rfile.read(n))))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *a):  # keep test output quiet
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook():
    h = _Hook()
    yield h
    h.close()


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def smtp_sink():
    """aiosmtpd on 127.0.0.1 storing every message; AUTH allowed without TLS (loopback only) and recorded."""
    from aiosmtpd.controller import Controller
    from aiosmtpd.smtp import AuthResult

    class Sink:
        def __init__(self) -> None:
            self.messages = []
            self.logins = []

        async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd API)
            self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), envelope.content.decode()))
            return "250 OK"

    sink = Sink()

    def authenticator(server, session, envelope, mechanism, auth_data):
        sink.logins.append((auth_data.login.decode(), auth_data.password.decode()))
        return AuthResult(success=True)

    ctl = Controller(sink, hostname="127.0.0.1", port=_closed_port(), authenticator=authenticator,
                     auth_require_tls=False)
    ctl.start()
    sink.port = ctl.port
    yield sink
    ctl.stop()


def _payload(event: str = "finished") -> dict:
    return {"event": event, "study": "s", "n_runs": 2, "duration_s": 90.0,
            "runs": [{"run_id": "a", "run_dir": "runs/s/a"}], "error": None}


# ---------------------------------------------------------------------------------------------- channels
def test_webhook_posts_json(hook):
    cfg = NotificationsConfig(enabled=True, webhook={"url": hook.url})
    assert send_notification(cfg, _payload()) == []
    assert hook.received == [("application/json", _payload())]


def test_nothing_sent_when_disabled_or_event_not_listed(hook):
    assert send_notification(NotificationsConfig(enabled=False, webhook={"url": hook.url}), _payload()) == []
    cfg = NotificationsConfig(enabled=True, events=["failed"], webhook={"url": hook.url})
    assert send_notification(cfg, _payload("finished")) == []
    assert hook.received == []


def test_webhook_failures_are_reported_not_raised():
    bad = _Hook(status=500)
    try:
        problems = send_notification(NotificationsConfig(enabled=True, webhook={"url": bad.url}), _payload())
    finally:
        bad.close()
    assert len(problems) == 1 and "500" in problems[0]
    url = f"http://127.0.0.1:{_closed_port()}/x"
    problems = send_notification(NotificationsConfig(enabled=True, webhook={"url": url, "timeout_s": 2}),
                                 _payload())
    assert len(problems) == 1 and problems[0].startswith(f"webhook {url}: URLError")


def test_email_through_loopback_smtp_with_credentials_from_env(smtp_sink, monkeypatch):
    monkeypatch.setenv("T_MSB_USER", "alice")
    monkeypatch.setenv("T_MSB_PASS", "s3cret")
    cfg = NotificationsConfig(enabled=True, email={
        "host": "127.0.0.1", "port": smtp_sink.port, "security": "none", "sender": "msb@example.org",
        "recipients": ["a@example.org", "b@example.org"], "username_env": "T_MSB_USER",
        "password_env": "T_MSB_PASS"})
    assert send_notification(cfg, _payload()) == []
    assert smtp_sink.logins == [("alice", "s3cret")]
    (sender, rcpts, content), = smtp_sink.messages
    assert sender == "msb@example.org" and rcpts == ["a@example.org", "b@example.org"]
    assert "Subject: [msb] study 's' finished (2 runs, 1.5 min)" in content
    assert "runs/s/a" in content


def test_email_missing_credential_variable(smtp_sink, monkeypatch):
    monkeypatch.delenv("T_MSB_NOPE", raising=False)
    cfg = NotificationsConfig(enabled=True, email={
        "host": "127.0.0.1", "port": smtp_sink.port, "security": "none", "sender": "m@x.org",
        "recipients": ["a@x.org"], "username_env": "T_MSB_NOPE"})
    problems = send_notification(cfg, _payload())
    assert len(problems) == 1 and "T_MSB_NOPE" in problems[0] and "is not set" in problems[0]
    assert smtp_sink.messages == []


# ----------------------------------------------------------------------------------------- run_study hook
def _study(tmp_path: Path, notifications: dict, data_root: str) -> Path:
    cfg = tmp_path / "configs"
    (cfg / "datasets").mkdir(parents=True)
    (cfg / "architectures").mkdir()
    glob = yaml.safe_load((REPO / "configs" / "global.yaml").read_text())
    glob["notifications"] = notifications
    (cfg / "global.yaml").write_text(yaml.safe_dump(glob))
    (cfg / "datasets" / "toy.yaml").write_text(yaml.safe_dump({"data": {"name": "toy", "root": data_root}}))
    (cfg / "architectures" / "unet_r18.yaml").write_text((REPO / "configs" / "architectures" / "unet_r18.yaml")
                                                          .read_text())
    study = {"study": "notif", "run_root": str(tmp_path / "runs"), "datasets": ["toy"],
             "architectures": ["unet_r18"]}
    (cfg / "study.yaml").write_text(yaml.safe_dump(study))
    return cfg / "study.yaml"


def test_run_study_failure_is_notified_and_still_raised(tmp_path: Path, hook):
    """A study whose dataset folder does not exist fails in run_study; the webhook gets 'failed' with the error,
    and the MSBError reaches the caller unchanged."""
    from msb.study.pipeline import run_study

    study = _study(tmp_path, {"enabled": True, "webhook": {"url": hook.url}}, str(tmp_path / "no_data"))
    lines = []
    with pytest.raises(MSBError, match="holds no index.csv"):
        run_study(study, log=lines.append)
    (_, body), = hook.received
    assert body["event"] == "failed" and body["study"] == "notif" and body["n_runs"] == 0
    assert body["error"].startswith("MSBError: ") and "index.csv" in body["error"]
    assert body["study_file"] == str(study.resolve())
    assert not any(line.startswith("warning:") for line in lines)


def test_failed_notification_never_fails_the_study(tmp_path: Path):
    """Webhook on a closed port: the study's own outcome (here: its MSBError; below: a return value) is unchanged
    and exactly one warning line is logged."""
    from msb.study.pipeline import run_study

    url = f"http://127.0.0.1:{_closed_port()}/x"
    study = _study(tmp_path, {"enabled": True, "webhook": {"url": url, "timeout_s": 2}}, str(tmp_path / "no"))
    lines = []
    with pytest.raises(MSBError, match="holds no index.csv"):
        run_study(study, log=lines.append)
    warnings = [ln for ln in lines if ln.startswith("warning:")]
    assert len(warnings) == 1 and "'failed' notification not sent" in warnings[0] and url in warnings[0]

    @notify_on_completion
    def fake_run_study(study_path, track=None, log=None):
        return ["outcome"]

    lines.clear()
    assert fake_run_study(study, log=lines.append) == ["outcome"]
    assert len(lines) == 1 and "'finished' notification not sent" in lines[0]


def test_finished_is_notified_with_runs(tmp_path: Path, hook):
    class Outcome:
        run_id, run_dir = "r1", tmp_path / "runs" / "notif" / "r1"

    @notify_on_completion
    def fake_run_study(study_path, track=None, log=None, worker=False):
        return [Outcome()]

    study = _study(tmp_path, {"enabled": True, "events": ["finished"], "webhook": {"url": hook.url}}, "x")
    fake_run_study(study)
    fake_run_study(study, worker=True)  # a worker of a shared search sends nothing
    (_, body), = hook.received
    assert body["event"] == "finished" and body["runs"] == [{"run_id": "r1", "run_dir": str(Outcome.run_dir)}]
    assert body["n_runs"] == 1 and body["duration_s"] >= 0 and body["error"] is None


def test_notifications_do_not_change_the_run_config_or_its_hash(tmp_path: Path):
    from msb.config.generate import generate_runs, run_config_to_yaml

    a = generate_runs(_study(tmp_path / "a", {"enabled": False}, "x"))[0]
    b = generate_runs(_study(tmp_path / "b", {"enabled": True, "webhook": {"url": "https://h.example/x"}}, "x"))[0]
    assert b.config.notifications.enabled and b.config.notifications.webhook.url == "https://h.example/x"
    assert a.config_hash == b.config_hash
    dumped = run_config_to_yaml(b.config)
    assert "notifications" not in yaml.safe_load(dumped) and "h.example" not in dumped


def test_bad_notification_keys_name_the_file(tmp_path: Path):
    from msb.config.generate import generate_runs

    with pytest.raises(MSBError, match=r"global.yaml: unknown key 'notifications.webhok'"):
        generate_runs(_study(tmp_path, {"enabled": True, "webhok": {"url": "http://x"}}, "x"))
    with pytest.raises(MSBError, match="notifications.webhook.url"):
        generate_runs(_study(tmp_path / "2", {"enabled": True, "webhook": {"url": "ftp://x"}}, "x"))
