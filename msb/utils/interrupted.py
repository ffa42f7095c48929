"""Remove what interrupted writes left in a run folder (temporary files, staging folders).

An atomic write (:mod:`msb.utils.atomic`) that is killed (``kill -9``, power cut) before its final rename
leaves its temporary file or staging folder beside the destination; nothing reads them, but they can be
large (a ``.latest.pt.*`` holds a whole checkpoint). :func:`clean_interrupted_writes` removes them on the
next start of work on that run folder. It touches only names of the patterns :mod:`msb.utils.atomic` makes,
and only those older than the moment this process loaded its writers
(:data:`msb.utils.atomic.WRITERS_LOADED_AT`), so a write in progress in this process is never touched:

- temporary files ``.<name>.<8 random characters><suffix of name>`` (e.g. ``.latest.pt.k2x8a0qe.pt``,
  ``.train_state.pt.*``, ``.counts.parquet.*``, ``.<sample>.npz.*``): deleted;
- staging folders ``.<name>.staging-<8>`` (a new evaluation that was never swapped in) and the staging
  folders ``.predictions.<8>`` of older ensemble code: deleted;
- set-aside folders ``.<name>.old-<8>/<name>`` (:func:`~msb.utils.atomic.replace_dir` killed between its two
  renames): the old folder is put back when ``<name>`` is missing, then the set-aside folder is deleted.

Two processes must not work on one run folder at the same time (the study lock sees to that); this
module relies on it.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Callable

from msb.utils.atomic import WRITERS_LOADED_AT

__all__ = ["is_temp_file_name", "clean_interrupted_writes"]

_RAND = r"[a-z0-9_]{8}"
_TEMP_FILE = re.compile(rf"^\.(?P<target>.+)\.{_RAND}(?P<suffix>(?:\.[^.]*)?)$")
_STAGING_DIR = re.compile(rf"^\.(?P<target>.+)\.staging-{_RAND}$")
_OLD_DIR = re.compile(rf"^\.(?P<target>.+)\.old-{_RAND}$")
_LEGACY_PRED_STAGING = re.compile(rf"^\.predictions\.{_RAND}$")


def is_temp_file_name(name: str) -> bool:
    """True when ``name`` is a temporary file name of :func:`msb.utils.atomic.atomic_path`.

    That is ``.<target>.<8 random characters><suffix>`` where ``<suffix>`` is the target's own suffix
    (``.latest.pt.k2x8a0qe.pt``; ``.train_state.sha256.abcd1234.sha256``).
    """
    m = _TEMP_FILE.match(name)
    if not m:
        return False
    return m.group("suffix") == Path(m.group("target")).suffix


def _older(path: Path, before: float) -> bool:
    try:
        return path.lstat().st_mtime < before
    except FileNotFoundError:
        return False


def clean_interrupted_writes(folder: str | os.PathLike, log: Callable[[str], None] | None = None,
                             before: float | None = None) -> list[Path]:
    """Remove leftovers of interrupted atomic writes anywhere under ``folder`` (module docstring).

    Args:
        folder: a run folder (or any folder written by msb); nothing happens when it does not exist.
        log: called once with a one-line summary when something was removed or restored.
        before: only leftovers modified before this time (seconds since the epoch) are touched; default
            :data:`msb.utils.atomic.WRITERS_LOADED_AT` (this process's writers cannot have made them).

    Returns:
        The paths removed (a restored set-aside folder is listed under its set-aside name).
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    before = WRITERS_LOADED_AT if before is None else before
    removed: list[Path] = []
    restored: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        for name in list(dirnames):
            p = here / name
            if p.is_symlink():
                dirnames.remove(name)
                continue
            old = _OLD_DIR.match(name)
            if old or _STAGING_DIR.match(name) or _LEGACY_PRED_STAGING.match(name):
                dirnames.remove(name)  # never descend into a leftover
                if not _older(p, before):
                    continue
                if old:
                    target = old.group("target")
                    inner = p / target
                    if not (here / target).exists() and inner.is_dir():
                        os.replace(inner, here / target)
                        restored.append(here / target)
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
        for name in filenames:
            p = here / name
            if is_temp_file_name(name) and not p.is_symlink() and _older(p, before):
                try:
                    p.unlink()
                except FileNotFoundError:
                    continue
                removed.append(p)
    if log is not None and (removed or restored):
        shown = ", ".join(str(p.relative_to(folder)) for p in removed[:4]) + (" ..." if len(removed) > 4 else "")
        msg = f"[{folder.name}] removed {len(removed)} leftover(s) of interrupted writes ({shown})"
        if restored:
            msg += "; put back " + ", ".join(str(p.relative_to(folder)) for p in restored)
        log(msg)
    return removed
