"""What every ``msb`` command shares: the rich consoles, the progress wrapper and line logger."""

from __future__ import annotations

import os
from typing import Iterable, Iterator, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

__all__ = ["console", "err_console", "state", "track", "log"]

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time



def _flag_type(self, ctx):  # typer 0.2x shows "<bool>" in the type column of plain on/off flags
    return None if getattr(self, "is_flag", False) else _display_type_rich(self, ctx)


try:  # no type label for flags in --help (they take no value); other options keep theirs
    from typer.core import TyperOption

    _display_type_rich = TyperOption.display_type_rich
    TyperOption.display_type_rich = _flag_type
except (ImportError, AttributeError):  # pragma: no cover - another typer layout: help shows what typer shows
    pass

console = Console()
err_console = Console(stderr=True)
state = {"debug": False}
T = TypeVar("T")


def track(it: Iterable[T], desc: str, total: int) -> Iterator[T]:
    """Progress over ``it``: a rich progress bar on a terminal (transient); otherwise (a pipe, a log file) one
    line per 10 % of ``total`` (:func:`msb.cli.progress.progress_lines`: done/total, items/s, ETA)."""
    if not console.is_terminal:
        from msb.cli.progress import progress_lines

        yield from progress_lines(it, desc, total, log)
        return
    with Progress(TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True) as progress:
        yield from progress.track(it, total=total, description=desc)


def log(msg: str) -> None:
    """One status line."""
    console.print(msg, highlight=False, markup=False, soft_wrap=True)  # a log line is never hard-wrapped
