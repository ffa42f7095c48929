"""Progress and logging hooks passed down from the CLI to long loops.

Library code never prints progress itself: it receives a ``track(iterable, description, total)`` wrapper
(the CLI passes a rich progress bar) and a ``log(message)`` callable; the defaults below do nothing.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, TypeVar

__all__ = ["Tracker", "Logger", "no_track", "no_log"]

T = TypeVar("T")
#: ``track(iterable, description, total) -> iterator`` over the same items.
Tracker = Callable[[Iterable[T], str, int], Iterator[T]]
#: ``log(message)``: one status line.
Logger = Callable[[str], None]


def no_track(it: Iterable[T], desc: str, total: int) -> Iterator[T]:
    """Iterate without showing progress."""
    return iter(it)


def no_log(msg: str) -> None:
    """Discard a status line."""
