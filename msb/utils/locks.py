"""File locks between processes (``filelock``)."""

from __future__ import annotations

from pathlib import Path

import filelock

__all__ = ["file_lock"]


def file_lock(path: str | Path) -> filelock.BaseFileLock:
    """Exclusive advisory lock on ``path`` (``filelock.FileLock``, ``flock`` on POSIX; the folder is created),
    for a ``with`` block. Serialises work on one folder between processes of one machine (and of several
    machines where the shared file system supports ``flock``, e.g. NFSv4); released when the process dies."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return filelock.FileLock(str(path), thread_local=False)
