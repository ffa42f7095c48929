"""``--source URL|ZIP|DIR``: turn a download link or an archive into a temporary folder for a converter.

* ``http://`` / ``https://`` URL: streamed with :mod:`urllib.request` to a temporary file (the SHA-256 and size
  are recorded; a body shorter than its ``Content-Length`` is an error), then treated as an archive;
* ``.zip`` (any file :func:`zipfile.is_zipfile` accepts) or tar archive (``.tar``, ``.tar.gz``, ...): extracted
  into a temporary folder. Members with absolute paths or ``..`` components are refused (no writes outside the
  folder); ``__MACOSX/`` entries are skipped; tar members go through the ``"data"`` extraction filter;
* an existing folder is used as is.

After extraction the folder is *descended* while it holds exactly one visible entry and that entry is a folder
(``Kvasir-SEG.zip`` -> ``Kvasir-SEG/``), so ``--source`` may point at the official zips directly. Temporary
files are deleted when the ``with`` block ends, whatever happens. No network access happens unless the user
passes a URL.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from msb.data.converters import ConversionReport, prepare_dataset
from msb.errors import MSBError

_CHUNK = 1 << 20


def is_url(source: str) -> bool:
    """True for ``http://`` and ``https://`` strings."""
    return str(source).lower().startswith(("http://", "https://"))


def download(url: str, dest: Path, timeout: float = 60.0) -> tuple[int, str]:
    """Stream ``url`` into the file ``dest``.

    Returns:
        ``(number of bytes, hex SHA-256)``.

    Raises:
        MSBError: HTTP error status, unreachable host, time-out, or a body shorter than ``Content-Length``
            (``dest`` is removed).
    """
    h = hashlib.sha256()
    n = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(dest, "wb") as f:  # noqa: S310 (user URL)
            expected = resp.headers.get("Content-Length")
            while True:
                block = resp.read(_CHUNK)
                if not block:
                    break
                f.write(block)
                h.update(block)
                n += len(block)
    except urllib.error.HTTPError as e:
        dest.unlink(missing_ok=True)
        raise MSBError(f"download of {url} failed: HTTP {e.code} {e.reason}. Check the URL (or download it "
                       f"yourself and pass the file with --source).") from e
    except (urllib.error.URLError, OSError, TimeoutError) as e:
        dest.unlink(missing_ok=True)
        reason = getattr(e, "reason", e)
        raise MSBError(f"download of {url} failed: {reason}. Check the URL and your network connection (or "
                       f"download it yourself and pass the file with --source).") from e
    if expected is not None and expected.isdigit() and int(expected) != n:
        dest.unlink(missing_ok=True)
        raise MSBError(f"download of {url} is incomplete: got {n} of {int(expected)} bytes. Try again.")
    return n, h.hexdigest()


def _check_member(name: str, archive: Path) -> None:
    p = PurePosixPath(name.replace("\\", "/"))
    if p.is_absolute() or ".." in p.parts or (p.parts and p.parts[0].endswith(":")):
        raise MSBError(f"{archive}: archive member {name!r} would be written outside the extraction folder; "
                       f"refusing to extract this archive.")


def extract_archive(archive: Path, dest: Path) -> None:
    """Extract a ZIP or tar ``archive`` into ``dest`` safely (see module docstring).

    Raises:
        MSBError: not a ZIP/tar file, corrupt archive, or an unsafe member path.
    """
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                members = [m for m in zf.infolist() if not m.filename.startswith("__MACOSX/")]
                for m in members:
                    _check_member(m.filename, archive)
                zf.extractall(dest, members=members)
            return
        if tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                for m in tf.getmembers():
                    _check_member(m.name, archive)
                tf.extractall(dest, filter="data")
            return
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError) as e:
        raise MSBError(f"{archive}: cannot extract the archive ({e}). Download it again.") from e
    raise MSBError(f"{archive}: not a ZIP or tar archive; --source takes a folder, a .zip/.tar(.gz) file or an "
                   f"http(s) URL of one.")


def descend_single_folder(folder: Path) -> Path:
    """Follow ``folder`` down while it holds exactly one visible entry that is a folder."""
    while True:
        entries = [p for p in folder.iterdir() if not p.name.startswith(".") and p.name != "__MACOSX"]
        if len(entries) == 1 and entries[0].is_dir():
            folder = entries[0]
        else:
            return folder


@contextlib.contextmanager
def materialised_source(source: str | None, timeout: float = 60.0) -> Iterator[tuple[Path | None, list[str]]]:
    """Yield a folder for ``source`` (URL, archive or folder) and provenance notes; clean up afterwards.

    Args:
        source: ``None`` (converters that need no source), a folder, an archive file or an http(s) URL.
        timeout: network time-out in seconds (URL only).

    Yields:
        ``(folder or None, notes)``; notes name the URL/archive with its size and SHA-256.

    Raises:
        MSBError: missing path, download failure, not an archive, unsafe archive.
    """
    if source is None:
        yield None, []
        return
    text = str(source)
    if not is_url(text):
        path = Path(text).expanduser()
        if path.is_dir():
            yield path, []
            return
        if not path.is_file():
            raise MSBError(f"--source {text}: no such folder or file (give a folder, a .zip/.tar file or an "
                           f"http(s) URL).")
    tmp = Path(tempfile.mkdtemp(prefix="msb-source-"))
    try:
        notes = []
        if is_url(text):
            name = PurePosixPath(urllib.parse.urlparse(text).path).name or "download"
            archive = tmp / f"download-{name}"
            n, digest = download(text, archive, timeout)
            notes.append(f"source downloaded from {text}: {n:,} bytes, sha256 {digest}")
        else:
            archive = Path(text).expanduser()
            h = hashlib.sha256()
            with open(archive, "rb") as f:
                for block in iter(lambda: f.read(_CHUNK), b""):
                    h.update(block)
            notes.append(f"source archive {archive}: {archive.stat().st_size:,} bytes, sha256 {h.hexdigest()}")
        extracted = tmp / "extracted"
        extracted.mkdir()
        extract_archive(archive, extracted)
        if archive.parent == tmp:
            archive.unlink()
        folder = descend_single_folder(extracted)
        notes.append("extracted to a temporary folder (deleted after conversion)")
        yield folder, notes
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_from_source(name: str, source: str | None, out: str | Path, timeout: float = 60.0,
                        **options: Any) -> ConversionReport:
    """:func:`msb.data.converters.prepare_dataset` with ``source`` given as a folder, archive or URL.

    The provenance notes (URL or archive, size, SHA-256) are appended to the report's notes.

    Raises:
        MSBError: as :func:`materialised_source` and :func:`msb.data.converters.prepare_dataset`.
    """
    from msb.data.converters.provenance import origin

    with materialised_source(source, timeout=timeout) as (folder, notes):
        fetched = source is not None and folder is not None and Path(str(source)).expanduser() != Path(folder)
        with origin(str(source) if fetched else None):  # prepare.json names the URL / archive
            report = prepare_dataset(name, str(folder) if folder is not None else None, out, **options)
    report.notes.extend(notes)
    return report


__all__ = ["materialised_source", "prepare_from_source", "download", "extract_archive", "is_url",
           "descend_single_folder"]
