"""Disk-full and I/O errors as one user-facing line.

An :class:`OSError` with ``ENOSPC`` (no space left), ``EDQUOT`` (quota exceeded), ``EIO`` (I/O error) or
``EROFS`` (read-only file system) while writing a run's files is not a programming error: :func:`write_guard`
turns it into an :class:`~msb.errors.MSBError` naming the file being written and the free space on its disk
(``shutil.disk_usage``), so the CLI prints one line and exits 2. Every such write is atomic, so the previous
version of the file is still in place.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Iterator

from msb.errors import MSBError

__all__ = ["DISK_ERRNOS", "disk_error", "format_bytes", "write_guard"]

#: errno values reported as a disk problem (everything else is re-raised unchanged)
DISK_ERRNOS = frozenset(e for e in (getattr(errno, n, None) for n in ("ENOSPC", "EDQUOT", "EIO", "EROFS"))
                        if e is not None)


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units, e.g. ``'0 B'``, ``'512.0 KiB'``, ``'3.2 GiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - unreachable


def _free_space(path: Path) -> str:
    """Free space on the disk holding ``path`` (its nearest existing folder), or a note when unknown."""
    p = Path(path)
    for cand in (p, *p.parents):
        if cand.exists():
            try:
                return f"{format_bytes(shutil.disk_usage(cand).free)} free on the disk holding {cand}"
            except OSError:
                break
    return "free space unknown"


def disk_error(path: str | os.PathLike, exc: OSError, what: str = "file") -> MSBError:
    """The one-line :class:`MSBError` for a failed write of ``path`` (``what`` names the kind of file).

    The message gives the path, the error (``strerror`` and errno name), the free space on the disk and what to
    do; it says that the previous version of the file is kept (every run file is written atomically)."""
    code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
    reason = exc.strerror or str(exc)
    return MSBError(f"{path}: cannot write the {what} ({reason}, {code}); {_free_space(Path(path).parent)}; "
                    f"the previous version is kept: free space (or fix the disk) and rerun the same command "
                    f"(a training resumes from its last saved epoch)")


@contextlib.contextmanager
def write_guard(path: str | os.PathLike, what: str = "file") -> Iterator[None]:
    """Context manager: an :class:`OSError` whose errno is in :data:`DISK_ERRNOS` raised inside becomes
    :func:`disk_error` for ``path``; other exceptions pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise disk_error(path, exc, what) from exc
        raise
