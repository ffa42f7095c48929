"""``digests.json``: SHA-256 of every file of a folder, written by the writer after the files it covers.

Layout (JSON)::

    {"format": "msb-digests", "version": 1, "algorithm": "sha256",
     "regenerate": "msb evaluate runs/s/r --checkpoint best --force",
     "files": {"counts.parquet": "<hex>", "predictions/a.npz": "<hex>", ...}}

Keys of ``files`` are POSIX paths relative to the folder. ``regenerate`` is the command that writes the folder
again; readers name it when a file does not match. The writer hashes the files it has just written (in its
staging folder, before anyone can read them) and writes ``digests.json`` atomically *after* them; a reader
checks a file against it before use and refuses a mismatch. A digest is never recomputed from the file it
guards to make a mismatch go away: the remedy is to regenerate the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text
from msb.utils.hashing import sha256_file

__all__ = ["DIGESTS_FILENAME", "Digests", "compute_digests", "write_digests", "read_digests", "check_digest",
           "set_digest", "drop_digest"]

#: File name of the digests of a folder.
DIGESTS_FILENAME = "digests.json"

_FORMAT = "msb-digests"
_VERSION = 1


@dataclass(frozen=True)
class Digests:
    """A folder's ``digests.json``.

    Attributes:
        folder: the folder it covers.
        files: relative POSIX path -> hex SHA-256.
        regenerate: the command that writes the folder again (may be empty).
    """

    folder: Path
    files: dict[str, str]
    regenerate: str

    @property
    def path(self) -> Path:
        """``folder/digests.json``."""
        return self.folder / DIGESTS_FILENAME


def compute_digests(folder: str | os.PathLike, rel_paths: Iterable[str]) -> dict[str, str]:
    """SHA-256 of each ``folder/<rel>`` (``rel`` POSIX, relative), sorted by path."""
    folder = Path(folder)
    return {rel: sha256_file(folder / rel) for rel in sorted(rel_paths)}


def write_digests(folder: str | os.PathLike, files: dict[str, str], regenerate: str) -> Path:
    """Write ``folder/digests.json`` atomically with ``files`` (relative path -> SHA-256) and ``regenerate``.

    Call it after every covered file is written and closed; see :func:`compute_digests`.
    """
    path = Path(folder) / DIGESTS_FILENAME
    atomic_write_text(path, json.dumps({"format": _FORMAT, "version": _VERSION, "algorithm": "sha256",
                                        "regenerate": regenerate, "files": dict(sorted(files.items()))},
                                       indent=1))
    return path


def read_digests(folder: str | os.PathLike, hint: str = "") -> Digests | None:
    """Read ``folder/digests.json``; None when the folder has none (written before digests existed).

    Args:
        folder: the covered folder.
        hint: the regenerate command named when the file itself is damaged.

    Raises:
        MSBError: the file is unreadable, not JSON, or not a digests file (one line naming it and ``hint``).
    """
    folder = Path(folder)
    path = folder / DIGESTS_FILENAME
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        ok = (isinstance(raw, dict) and raw.get("format") == _FORMAT and isinstance(raw.get("files"), dict)
              and all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in raw["files"].items()))
    except (OSError, ValueError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise MSBError(f"{path}: damaged digests file (not the JSON msb writes); the folder's files cannot be "
                       f"verified; regenerate the folder" + (f": {hint}" if hint else ""))
    if int(raw.get("version", 0)) > _VERSION:
        raise MSBError(f"{path}: digests version {raw.get('version')} is newer than this msb reads "
                       f"({_VERSION}); upgrade msb")
    return Digests(folder, dict(raw["files"]), str(raw.get("regenerate") or ""))


def check_digest(digests: Digests, rel: str, hint: str = "", data: bytes | None = None) -> None:
    """Refuse ``digests.folder/rel`` unless its SHA-256 equals the recorded one.

    Args:
        digests: the folder's digests.
        rel: relative POSIX path of the file.
        hint: regenerate command (default: the one recorded in ``digests.json``).
        data: the file's bytes when the caller has read them already (hashed instead of re-reading).

    Raises:
        MSBError: one line naming the file and the command that regenerates it: the file is missing, not
            listed in ``digests.json``, or its SHA-256 differs.
    """
    import hashlib

    hint = hint or digests.regenerate or "regenerate the folder"
    path = digests.folder / rel
    expected = digests.files.get(rel)
    if expected is None:
        raise MSBError(f"{path}: not listed in {digests.path} (added after the folder was written); "
                       f"regenerate it with: {hint}")
    if data is None:
        if not path.is_file():
            raise MSBError(f"{path}: missing (listed in {digests.path}); regenerate it with: {hint}")
        got = sha256_file(path)
    else:
        got = hashlib.sha256(data).hexdigest()
    if got != expected:
        raise MSBError(f"{path}: SHA-256 {got[:12]}... differs from {expected[:12]}... recorded in {digests.path} "
                       f"(the file was changed or damaged after it was written); regenerate it with: {hint}")


def set_digest(folder: str | os.PathLike, rel: str, sha256: str) -> None:
    """Record ``rel``'s SHA-256 (computed by the writer of ``rel``) in an existing ``folder/digests.json``.

    Does nothing when the folder has no ``digests.json`` (an old folder stays unverified).
    """
    d = read_digests(folder)
    if d is None:
        return
    write_digests(d.folder, {**d.files, rel: sha256}, d.regenerate)


def drop_digest(folder: str | os.PathLike, rel: str) -> None:
    """Remove ``rel`` from ``folder/digests.json`` (before ``rel`` is rewritten); no-op without the file."""
    d = read_digests(folder)
    if d is None or rel not in d.files:
        return
    write_digests(d.folder, {k: v for k, v in d.files.items() if k != rel}, d.regenerate)
