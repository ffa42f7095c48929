"""The ``msb`` command line (typer + rich): the app, ``--debug`` and the error handling.

Each command group lives in its own module of :mod:`msb.cli` and brings its own (unnamed) ``typer.Typer``, which
this module merges into :data:`app` in the order ``msb --help`` lists them. A user error
(:class:`msb.errors.MSBError`: bad config, bad data, missing file) prints one line ``error: ...`` and exits with
status 2; ``msb --debug ...`` shows the traceback instead.
"""

from __future__ import annotations

import signal
import sys

import typer
from rich.markup import escape

from msb.cli import (audit, checkpoints, contrasts, data, evaluate, explain, metrics, models, profile, reaggregate, report, run, score,
                     weights)
from msb.cli.common import err_console, state as _state
from msb.errors import MSBError

__all__ = ["app", "main", "SIGTERM_EXIT", "SIGTERM_MESSAGE"]

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="MedSegBenchmarker: configuration-driven, raw-count-first segmentation benchmarks.")
for _group in (run, evaluate, reaggregate, profile, report, explain, audit, metrics, score, contrasts, models):
    app.add_typer(_group.app)  # unnamed: its commands become top-level commands
app.add_typer(data.app, name="data")
app.add_typer(weights.app, name="weights")
app.add_typer(checkpoints.app, name="checkpoints")


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors.")) -> None:
    _state["debug"] = debug


def _click_exception_types() -> tuple[type[BaseException], ...]:
    """Usage-error classes: click's, and the private click copy that recent typer releases ship."""
    types: list[type[BaseException]] = []
    try:
        import click

        types.append(click.ClickException)
    except ImportError:  # pragma: no cover - typer without click
        pass
    try:
        from typer._click.exceptions import ClickException as TyperClickException

        types.append(TyperClickException)
    except ImportError:
        pass
    return tuple(types)


_TERMINATED: dict[str, int] = {}
#: Exit status after SIGTERM (128 + 15, the shell convention) and its message.
SIGTERM_EXIT = 143
SIGTERM_MESSAGE = ("terminated (SIGTERM): stopped like Ctrl-C; finished epochs, runs and evaluations are saved "
                   "(resume state, checkpoints); run the same command again to continue")


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    _TERMINATED["signal"] = signum
    raise KeyboardInterrupt(f"signal {signum}")


def _interrupted() -> None:
    """Print the interruption message and exit: 143 after SIGTERM, 130 after Ctrl-C."""
    if _TERMINATED:
        err_console.print(SIGTERM_MESSAGE, highlight=False, soft_wrap=True)
        sys.exit(SIGTERM_EXIT)
    err_console.print("aborted")
    sys.exit(130)


def main() -> None:
    """Console-script entry point.

    A :class:`MSBError` prints one line and exits 2; a usage error (unknown command/option, bad value) prints
    click's short usage message and exits 2; Ctrl-C prints ``aborted`` and exits 130; SIGTERM is handled the
    same way (a study re-opens its running trial, the resume state is kept) but prints
    :data:`SIGTERM_MESSAGE` and exits 143 (a rerun of ``msb run`` resumes). ``msb --debug ...``
    re-raises errors with their traceback.
    """
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        rc = app(standalone_mode=False)
    except MSBError as exc:
        if _state["debug"]:
            raise
        err_console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)  # [..] is text
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except _click_exception_types() as exc:
        exc.show()  # type: ignore[attr-defined]
        sys.exit(getattr(exc, "exit_code", 2))
    if isinstance(rc, int) and rc != 0:  # typer returns the code of an interrupted command instead of raising
        if rc == 130:
            _interrupted()
        sys.exit(rc)


if __name__ == "__main__":
    main()
