"""Atomic file writes: write to a temporary file in the target folder, then ``os.replace``.

A reader never sees a half-written file, and an error while writing leaves the previous file (or no
file) in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterator


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
        os.replace(tmp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


def replace_dir(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Move the complete folder ``src`` onto ``dst`` (a sibling), replacing an existing ``dst``.

    The old ``dst`` is first renamed aside, then ``src`` renamed into place, then the old one deleted; if the
    second rename fails the old folder is put back. A reader never sees a half-written folder.
    """
    src, dst = Path(src), Path(dst)
    if not dst.exists():
        os.replace(src, dst)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old-", dir=dst.parent))
    os.replace(dst, old / dst.name)
    try:
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
