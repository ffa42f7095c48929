"""``prepare.json``: how a prepared dataset was made, written beside ``index.csv`` by every converter path.

:func:`msb.data.converters.prepare_dataset` (``msb data prepare``, ``data.prepare`` of a dataset config,
``msb data merge``) and ``msb data synth`` open a :func:`recording`; the mask writers
(:func:`msb.data.converters._common.write_samples`, :func:`msb.data.converters.folder.convert_pairs`) report
each mask with :func:`record_mask`; :func:`msb.data.converters.staged_output` writes the record into the staging
folder just before the folder is renamed onto the output, so ``prepare.json`` exists exactly when the dataset
does (an error leaves neither).

Fields of ``prepare.json`` (format 1; no time stamp, so two identical preparations give the same bytes):

* ``msb_version``; ``converter`` (registered name); ``options``: every converter option, defaults filled in
  (``overwrite`` left out; values JSON-encoded, mapping keys as strings);
* ``source``: ``path`` (absolute; ``null`` for generated datasets), ``origin`` (the URL or archive it was
  extracted from, else ``null``), ``n_files`` and ``file_list_sha256`` = SHA-256 of the UTF-8 lines
  ``<relative POSIX path>\\t<size in bytes>\\n`` of every regular file under the source, sorted by path (names
  and sizes, not contents: cheap on large sources, changes when a file is added, removed, renamed or resized);
* ``threshold``: the binarisation threshold in effect (``value > threshold`` -> foreground), ``null`` when
  masks keep their values;
* ``groups``: ``{"file", "sha256", "id_column", "group_column"}`` of the groups CSV, or ``null``;
* ``mask_pixels``: ``n_files``, ``n_pixels``, ``n_changed`` (pixels whose written value differs from the source
  value, the converter's definition, e.g. a value-7 pixel set to 0 by ``threshold=127``) and
  ``changed_per_file`` (``masks/<id>.png`` -> changed pixels, every file with at least one; files not listed
  changed none).

:func:`prepare_digest` (SHA-256 of the file's bytes) is what run manifests record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text

PREPARE_FILE = "prepare.json"
FORMAT = 1

__all__ = ["PREPARE_FILE", "recording", "record_mask", "write_record", "read_prepare", "prepare_digest",
           "file_list_digest", "describe"]


@dataclass
class _Recorder:
    converter: str
    source: str | None
    options: dict[str, Any]
    origin: str | None = None
    changed: dict[str, int] = field(default_factory=dict)
    n_files: int = 0
    n_pixels: int = 0
    n_changed: int = 0


_ACTIVE: ContextVar[_Recorder | None] = ContextVar("msb_prepare_recorder", default=None)
_ORIGIN: ContextVar[str | None] = ContextVar("msb_prepare_origin", default=None)


@contextlib.contextmanager
def recording(converter: str, source: str | os.PathLike | None, options: dict[str, Any]) -> Iterator[None]:
    """Record the preparation of one dataset (nested recordings, e.g. the parts of a merge, are separate).

    Args:
        converter: registered converter name.
        source: the local source folder/file given to the converter, or None.
        options: the converter options in effect (defaults filled in).
    """
    token = _ACTIVE.set(_Recorder(converter, None if source is None else str(source), dict(options),
                                  origin=_ORIGIN.get()))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


@contextlib.contextmanager
def origin(given: str | None) -> Iterator[None]:
    """Mark the source as extracted from ``given`` (a URL or archive) for the recordings inside."""
    token = _ORIGIN.set(given)
    try:
        yield
    finally:
        _ORIGIN.reset(token)


def record_mask(mask_rel: str, n_changed: int, n_pixels: int) -> None:
    """Count one written mask (its path relative to the dataset, changed and total pixels); no-op outside
    :func:`recording`."""
    rec = _ACTIVE.get()
    if rec is None:
        return
    rec.n_files += 1
    rec.n_pixels += int(n_pixels)
    rec.n_changed += int(n_changed)
    if n_changed:
        rec.changed[mask_rel] = int(n_changed)


def file_list_digest(source: str | os.PathLike) -> tuple[int, str]:
    """``(number of files, SHA-256)`` of the file list of a folder (or of one file), see the module docstring.

    Raises:
        MSBError: the source cannot be listed.
    """
    root = Path(source)
    h = hashlib.sha256()
    try:
        if root.is_file():
            files = [(root.name, root.stat().st_size)]
        else:
            files = sorted((p.relative_to(root).as_posix(), p.stat().st_size)
                           for p in root.rglob("*") if p.is_file())
    except OSError as e:
        raise MSBError(f"{root}: cannot list the source files for {PREPARE_FILE} ({e}).") from e
    for rel, size in files:
        h.update(f"{rel}\t{size}\n".encode("utf-8"))
    return len(files), h.hexdigest()


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        raise MSBError(f"{path}: cannot read the groups file for {PREPARE_FILE} ({e}).") from e


def build_record(rec: _Recorder) -> dict[str, Any]:
    """The ``prepare.json`` object of a recording (module docstring)."""
    from msb import __version__

    opts = {k: v for k, v in rec.options.items() if k != "overwrite"}
    source = None
    if rec.source is not None:
        n, digest = file_list_digest(rec.source)
        source = {"path": str(Path(rec.source).absolute()), "origin": rec.origin, "n_files": n,
                  "file_list_sha256": digest}
    groups = None
    if opts.get("groups_csv"):
        g = Path(opts["groups_csv"])
        groups = {"file": str(g.absolute()), "sha256": _sha256(g), "id_column": opts.get("group_id_column"),
                  "group_column": opts.get("group_column", "group")}
    return {"format": FORMAT, "msb_version": __version__, "converter": rec.converter, "source": source,
            "threshold": opts.get("threshold"), "groups": groups, "options": _jsonable(opts),
            "mask_pixels": {"n_files": rec.n_files, "n_pixels": rec.n_pixels, "n_changed": rec.n_changed,
                            "changed_per_file": dict(sorted(rec.changed.items()))}}


def write_record(folder: str | os.PathLike) -> Path | None:
    """Write ``prepare.json`` of the active recording into ``folder`` (atomically); None outside a recording."""
    rec = _ACTIVE.get()
    if rec is None:
        return None
    path = Path(folder) / PREPARE_FILE
    atomic_write_text(path, json.dumps(build_record(rec), indent=2) + "\n")
    return path


def read_prepare(root: str | os.PathLike) -> dict[str, Any] | None:
    """The ``prepare.json`` of a prepared dataset, or None when it has none (prepared by an older msb, by hand).

    Raises:
        MSBError: the file is not a JSON object (naming it).
    """
    path = Path(root) / PREPARE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise MSBError(f"{path}: not readable as JSON ({e}); prepare the dataset again with msb data prepare.") from e
    if not isinstance(data, dict):
        raise MSBError(f"{path}: expected a JSON object; prepare the dataset again with msb data prepare.")
    return data


def prepare_digest(root: str | os.PathLike) -> str | None:
    """SHA-256 of the dataset's ``prepare.json`` bytes, or None without one."""
    path = Path(root) / PREPARE_FILE
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def describe(root: str | os.PathLike, max_files: int = 5) -> list[str]:
    """Lines for ``msb data validate``: converter, source, threshold, groups, changed pixels, version, digest."""
    data = read_prepare(root)
    if data is None:
        return [f"no {PREPARE_FILE}: how this dataset was made is not recorded (prepared by hand or an msb older "
                f"than this record)"]
    src = data.get("source") or {}
    lines = [f"{PREPARE_FILE} (sha256 {prepare_digest(root)}): converter {data.get('converter')!r}, "
             f"msb {data.get('msb_version')}"]
    if src:
        lines.append(f"  source: {src.get('path')}" + (f" (from {src['origin']})" if src.get("origin") else "")
                     + f", {src.get('n_files')} file(s), file list sha256 {src.get('file_list_sha256')}")
    else:
        lines.append("  source: none (generated, or merged from the prepared datasets in options.parts)")
    thr = data.get("threshold")
    lines.append("  threshold: " + ("none (mask values kept)" if thr is None else f"value > {thr} -> foreground"))
    g = data.get("groups")
    lines.append("  groups: " + ("none" if not g else f"{g.get('file')} (sha256 {g.get('sha256')}, column "
                                                     f"{g.get('group_column')!r})"))
    m = data.get("mask_pixels") or {}
    per = m.get("changed_per_file") or {}
    shown = ", ".join(f"{k}: {v}" for k, v in list(per.items())[:max_files])
    more = f", ... and {len(per) - max_files} more" if len(per) > max_files else ""
    lines.append(f"  changed mask pixels: {m.get('n_changed', 0):,} of {m.get('n_pixels', 0):,} in "
                 f"{len(per)} of {m.get('n_files', 0)} file(s)" + (f" ({shown}{more})" if per else ""))
    return lines
