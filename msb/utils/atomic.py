"""Atomic file writes: write to a temporary file in the target folder, then ``os.replace``.

A reader never sees a half-written file, and an error while writing leaves the previous file (or no
file) in place. Whole folders (an evaluation, a prepared dataset) are written into a staging folder beside
the destination (:func:`staging_dir`) and swapped in by :func:`replace_dir`.

Names of what an interrupted write (``kill -9``, power cut) can leave behind, all beside the destination
``<name>``: temporary files ``.<name>.<8 random characters><suffix of name>`` (:func:`atomic_path`),
staging folders ``.<name>.staging-<8>`` (:func:`staging_dir`) and set-aside folders ``.<name>.old-<8>``
(:func:`replace_dir`). :mod:`msb.utils.interrupted` removes them on the next start of work on a run folder.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from msb.utils.fault_points import fault_point

#: Wall-clock time at which this process loaded the atomic writers: every temporary file or staging folder
#: this process creates is younger, so :mod:`msb.utils.interrupted` only removes older ones (left by a
#: process that was killed).
WRITERS_LOADED_AT: float = time.time()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it onto ``path``, on error delete it.

    Args:
        path: final destination. Its parent folder is created if needed.
        suffix: suffix for the temporary file (defaults to the destination's suffix, so that writers
            that infer the format from the extension, e.g. ``np.savez`` or ``cv2.imwrite``, still work).

    Yields:
        Path of the temporary file to write.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix if suffix is not None else path.suffix,
                               dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        if tmp_path.exists():  # mkstemp creates 0600; give the file the usual umask-based mode
            os.chmod(tmp_path, 0o666 & ~current_umask())
        fault_point(f"atomic.{path.name}")
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def staging_dir(dst: str | os.PathLike) -> Path:
    """Create and return an empty staging folder ``.<dst name>.staging-<random>`` beside ``dst``.

    Write the complete new content of ``dst`` into it, then :func:`replace_dir` it onto ``dst``; on error
    delete it (``shutil.rmtree``). The folder gets the usual umask-based mode (``mkdtemp`` makes it private).
    """
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".{dst.name}.staging-", dir=dst.parent))
    os.chmod(path, 0o777 & ~current_umask())
    return path


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap the paths ``a`` and ``b`` atomically (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns False (nothing changed) where the call is unavailable (other systems, old C library, a file
    system without exchange support); raises ``OSError`` on any other failure.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def replace_dir(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Move the complete folder ``src`` onto ``dst`` (a sibling), replacing an existing ``dst``.

    On Linux the two folders are exchanged in one atomic step (``renameat2(RENAME_EXCHANGE)``), then the old
    content (now at ``src``) is deleted: a ``kill -9`` at any moment leaves either the old or the new folder at
    ``dst``, and at most a leftover ``src`` that :mod:`msb.utils.interrupted` removes. Elsewhere the old
    ``dst`` is first renamed aside (``.<name>.old-<random>/<name>``), then ``src`` renamed into place, then the
    old one deleted; if the second rename fails the old folder is put back, and a process killed between the
    two renames leaves the old folder aside, which :func:`msb.utils.interrupted.clean_interrupted_writes`
    puts back. A reader never sees a half-written folder.
    """
    src, dst = Path(src), Path(dst)
    if not dst.exists():
        os.replace(src, dst)
        return
    if _exchange(src, dst):
        shutil.rmtree(src, ignore_errors=True)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
    os.replace(dst, old / dst.name)
    try:
        fault_point("replace_dir.moved_aside")
        os.replace(src, dst)
    except BaseException:
        os.replace(old / dst.name, dst)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def current_umask() -> int:
    """The process umask (read without changing it)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_with(path: str | os.PathLike, writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` and atomically move the result to ``path``."""
    with atomic_path(path) as tmp:
        writer(tmp)
