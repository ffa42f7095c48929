"""Every command and sub-command of ``msb`` prints its help and exits 0 (a help text with rich markup in it,
such as ``[/<role>]``, once crashed ``msb metrics --help``), and the command line's entry points all work."""

from __future__ import annotations

import subprocess
import sys

import typer
from typer.testing import CliRunner

from msb.cli.app import app


def _paths(cmd, prefix=()):  # every leaf and group of the click tree under ``cmd``
    yield prefix
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _paths(sub, (*prefix, name))


def test_every_command_prints_its_help():
    root = typer.main.get_command(app)
    paths = list(_paths(root))
    names = {p[0] for p in paths if p}
    assert {"generate", "run", "evaluate", "reaggregate", "profile", "report", "explain", "audit", "metrics",
            "score", "contrasts", "models", "data", "weights"} <= names
    runner = CliRunner()
    for p in paths:
        r = runner.invoke(app, [*p, "--help"])
        assert r.exit_code == 0, (p, r.output[-500:], r.exception)
        assert "Usage:" in r.output, p


def test_python_dash_m_msb_and_the_console_script_agree():
    a = subprocess.run([sys.executable, "-m", "msb", "--help"], capture_output=True, text=True, timeout=120)
    b = subprocess.run([sys.executable, "-c", "import sys; sys.argv = ['msb', '--help']; from msb.cli import main; "
                                              "main()"], capture_output=True, text=True, timeout=120)
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    def body(s: str) -> list[str]:  # the usage line names the program differently
        return [ln for ln in s.splitlines() if "Usage:" not in ln]

    assert body(a.stdout) == body(b.stdout) and "run" in a.stdout


def test_error_line_keeps_square_brackets(tmp_path):
    # an MSBError whose text holds "[...]" (a check name, a path) is printed as text, not eaten as rich markup
    missing = tmp_path / "no[crossing-group]" / "counts.parquet"
    r = subprocess.run([sys.executable, "-m", "msb", "reaggregate", str(missing)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and str(missing) in r.stderr, r.stderr
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
