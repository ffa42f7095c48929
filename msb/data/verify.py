"""Full check of a prepared dataset's files, at native resolution, before anything is trained on them.

:func:`verify_files` decodes every image and mask file of the given samples from the source files (never the
resized cache): the file structure is checked (:func:`check_decodable`: PNG chunk checksums and the end
marker, so a truncated PNG is refused even where a decoder would quietly return its pixels), images are decoded
as training reads them, and every mask value is checked against ``classes.csv`` at the native resolution, so
the message gives the true pixel count of a bad value (a 1-px value survives nowhere else: resizing to the
training size can drop it).

A file that passed is recorded in ``<cache_dir>/verified.json`` by (size, mtime) and, for masks, the SHA-256
of ``classes.csv``; a second run checks only files that changed (it costs one ``stat`` per file).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import numpy as np
from PIL import Image, UnidentifiedImageError

from msb.data.classes import _problem_list
from msb.data.readers import mask_to_label_map, read_image, read_mask
from msb.data.schema import PreparedDataset
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text
from msb.utils.hashing import sha256_file
from msb.utils.io_errors import write_guard
from msb.utils.progress import Tracker, no_track

__all__ = ["VERIFY_VERSION", "check_decodable", "verify_files", "verified_record_path"]

#: bump when the checks change, so that files recorded as verified by older checks are checked again
VERIFY_VERSION = 1


def check_decodable(path: str | Path, kind: str) -> np.ndarray:
    """Decode ``path`` fully and return its pixels; raise :class:`MSBError` naming ``path`` when the file's
    structure is damaged (PIL ``verify``: for PNG every chunk checksum and the end marker, so a truncated file is
    refused) or it does not decode.

    Args:
        path: the file.
        kind: ``image`` (decoded as training reads it, :func:`~msb.data.readers.read_image`) or ``mask``
            (:func:`~msb.data.readers.read_mask`).

    Returns:
        The decoded array (RGB image or raw mask values).
    """
    path = Path(path)
    try:
        with Image.open(path) as im:
            im.verify()
    except FileNotFoundError as e:
        raise MSBError(f"{path}: {kind} file not found. Fix index.csv or re-run `msb data prepare`.") from e
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as e:
        raise MSBError(f"{path}: damaged or truncated {kind} file ({e}). Replace the file or re-run "
                       f"`msb data prepare`.") from e
    return read_image(path) if kind == "image" else read_mask(path)


def verified_record_path(ds: PreparedDataset, cache_dir: str | Path | None = None) -> Path:
    """``<cache_dir>/verified.json`` (default cache folder ``<dataset root>/.msb_cache``, as the cache)."""
    return (Path(cache_dir) if cache_dir is not None else ds.root / ".msb_cache") / "verified.json"


def _load_record(path: Path) -> dict[str, list]:
    """The verified-files record, or {} when absent or unreadable (it is only ever a shortcut)."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return raw.get("files", {}) if isinstance(raw, dict) and raw.get("version") == VERIFY_VERSION else {}


def verify_files(ds: PreparedDataset, sample_ids: Iterable[str] | None = None, cache_dir: str | Path | None = None,
                 track: Tracker = no_track, use_record: bool = True) -> int:
    """Check the image and mask files of ``sample_ids`` (default: every sample) at native resolution.

    Args:
        ds: the prepared dataset.
        sample_ids: samples to check (default all).
        cache_dir: folder of ``verified.json`` (see :func:`verified_record_path`).
        track: progress wrapper.
        use_record: skip files recorded as verified and unchanged, and record the ones that pass; False checks
            every file and writes nothing (``msb data validate``).

    Returns:
        The number of files decoded (0 when every file was already verified).

    Raises:
        MSBError: one line listing up to 10 problems (file, bad value and its pixel count at native
            resolution, or why it does not decode) and their total count; or a disk-full error writing the record.
    """
    ids = [str(s) for s in (ds.sample_ids if sample_ids is None else sample_ids)]
    record_path = verified_record_path(ds, cache_dir)
    record = _load_record(record_path) if use_record else {}
    classes_sha = sha256_file(ds.root / "classes.csv")
    todo: list[tuple[str, Path, str, list]] = []
    for sid in ids:
        for kind, path in (("image", ds.image_path(sid)), ("mask", ds.mask_path(sid))):
            key = path.relative_to(ds.root).as_posix() if path.is_relative_to(ds.root) else str(path)
            try:
                st = os.stat(path)
                stamp = [kind, st.st_size, st.st_mtime_ns, classes_sha if kind == "mask" else ""]
            except OSError:
                stamp = [kind, -1, -1, ""]
            if record.get(key) != stamp:
                todo.append((key, path, kind, stamp))
    if not todo:
        return 0
    problems: list[str] = []
    passed: dict[str, list] = {}
    for key, path, kind, stamp in track(todo, f"checking {ds.name} files", len(todo)):
        try:
            pixels = check_decodable(path, kind)
            if kind == "mask":
                mask_to_label_map(pixels, ds.classes, path)
        except MSBError as e:
            problems.append(str(e))
            continue
        passed[key] = stamp
    if use_record and passed:
        merged = {**_load_record(record_path), **passed}  # re-read: another process may have added files
        with write_guard(record_path, "verified-files record"):
            atomic_write_text(record_path, json.dumps({"version": VERIFY_VERSION, "files": merged}))
    if problems:
        raise MSBError(f"{len(problems)} bad file(s) in dataset '{ds.name}' ({ds.root}), checked at native "
                       f"resolution before use: {_problem_list(problems)}")
    return len(todo)
