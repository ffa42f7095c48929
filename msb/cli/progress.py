"""Progress for logs (stdout not a terminal): one line per ``step`` fraction of the work, with the rate and the
estimated time left, instead of a redrawn progress bar that a log file cannot show."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

__all__ = ["progress_lines", "format_line"]

T = TypeVar("T")


def format_line(desc: str, done: int, total: int, elapsed_s: float) -> str:
    """``"<desc>: 12/40 (30 %), 3.1 it/s, ETA 9 s"``; rate = done / elapsed, ETA = (total - done) / rate
    (seconds, rounded; ``?`` before the first item or with no elapsed time)."""
    rate = done / elapsed_s if elapsed_s > 0 and done > 0 else 0.0
    eta = f"{(total - done) / rate:.0f} s" if rate > 0 else "?"
    pct = 100.0 * done / total if total else 100.0
    return f"{desc}: {done}/{total} ({pct:.0f} %), {rate:.1f} it/s, ETA {eta}"


def progress_lines(it: Iterable[T], desc: str, total: int, emit: Callable[[str], None], step: float = 0.1,
                   clock: Callable[[], float] = time.monotonic, min_interval_s: float = 5.0) -> Iterator[T]:
    """Yield from ``it`` and ``emit`` a :func:`format_line` each time another ``step`` (fraction of ``total``,
    at least one item) is done, at most one line per ``min_interval_s`` seconds, and always at the end of a
    loop that lasted longer than ``min_interval_s`` (a fast loop stays silent: its caller's summary line follows).

    Args:
        it: the work items; desc: what they are; total: their number (<= 0: no lines); emit: where lines go
        (the CLI's line logger); step: fraction between lines (default 10 %); clock: seconds (monotonic);
        min_interval_s: least seconds between two lines.
    """
    every = max(1, int(round(total * step))) if total > 0 else 0
    start = last = clock()
    done = 0
    for x in it:
        yield x
        done += 1
        if every and (done % every == 0 or done == total):
            now = clock()
            if now - last >= min_interval_s or (done == total and now - start >= min_interval_s):
                emit(format_line(desc, done, total, now - start))
                last = now
