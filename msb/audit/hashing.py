"""Per-image fingerprints: SHA-256 of the bytes, pHash and dHash (64 bit, packed ``uint64``), grey thumbnails.

Definitions (each image is decoded once with PIL, EXIF orientation *not* applied, converted to 8-bit grey with
PIL's ``convert("L")``, i.e. ITU-R 601-2 luma ``L = R*299/1000 + G*587/1000 + B*114/1000``):

* ``sha256``: hex SHA-256 of the file's bytes (byte-identical files share it);
* ``phash``: ``imagehash.phash(img, hash_size=8, highfreq_factor=4)``: grey image resized to 32x32 px (PIL
  LANCZOS), 2-D DCT-II, the top-left 8x8 coefficients compared with their median (Zauner 2010, "Implementation
  and benchmarking of perceptual image hash functions"; imagehash implementation);
* ``dhash``: ``imagehash.dhash(img, hash_size=8)``: grey image resized to 9x8 px (LANCZOS), bit = pixel greater
  than its left neighbour (N. Krawetz, "Kind of like that", hackerfactor.com, 2013);
* both hashes are packed row-major, first bit most significant, into one ``uint64``; ``f"{h:016x}"`` equals
  ``str(imagehash_object)``, so values can be checked against imagehash directly;
* ``thumb``: the grey image resized to ``thumb_size x thumb_size`` px with OpenCV ``INTER_AREA`` (aspect
  ratio not kept), ``uint8``, used by the pixel screens (:mod:`msb.audit.screens`).
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import cv2
import imagehash
import numpy as np
from PIL import Image, UnidentifiedImageError

from msb.errors import MSBError

HASH_SIZE = 8
HIGHFREQ_FACTOR = 4
DEFAULT_THUMB = 64
_MAX_LISTED = 10


def pack_hash(h: imagehash.ImageHash) -> int:
    """Pack an imagehash ``ImageHash`` (``hash_size**2 == 64`` bits) into a Python int (row-major, MSB first).

    Raises:
        ValueError: the hash does not have 64 bits.
    """
    bits = np.asarray(h.hash, dtype=bool).ravel()
    if bits.size != 64:
        raise ValueError(f"expected a 64-bit hash, got {bits.size} bits")
    return int.from_bytes(np.packbits(bits).tobytes(), "big")


@dataclass
class ImageFingerprint:
    """Fingerprints of one image file (see module docstring)."""

    sha256: str
    phash: int
    dhash: int
    height: int
    width: int
    n_bytes: int
    thumb: np.ndarray


def fingerprint(path: str | os.PathLike, thumb_size: int = DEFAULT_THUMB) -> ImageFingerprint:
    """Compute :class:`ImageFingerprint` of one image file.

    Args:
        path: image file (any format PIL decodes).
        thumb_size: side of the grey thumbnail in pixels.

    Raises:
        MSBError: the file is missing or cannot be decoded (naming it).
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise MSBError(f"{path}: cannot read image file ({e}).") from e
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            w, h = im.size
            grey = im.convert("L")
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise MSBError(f"{path}: cannot decode image ({e}). Replace the file or remove its row.") from e
    ph = pack_hash(imagehash.phash(grey, hash_size=HASH_SIZE, highfreq_factor=HIGHFREQ_FACTOR))
    dh = pack_hash(imagehash.dhash(grey, hash_size=HASH_SIZE))
    thumb = cv2.resize(np.asarray(grey), (thumb_size, thumb_size), interpolation=cv2.INTER_AREA)
    return ImageFingerprint(hashlib.sha256(data).hexdigest(), ph, dh, int(h), int(w), len(data),
                            np.ascontiguousarray(thumb, dtype=np.uint8))


def _init_worker() -> None:
    """Worker set-up: one OpenCV thread per process (the processes are the parallelism)."""
    cv2.setNumThreads(1)


def _safe_fingerprint(path: str, thumb_size: int) -> ImageFingerprint | str:
    try:
        return fingerprint(path, thumb_size)
    except MSBError as e:
        return str(e)


@dataclass
class HashTable:
    """Fingerprints of N images, aligned with the input order.

    Attributes:
        sha256: ``(N,)`` ``object`` array of hex digests.
        phash: ``(N,)`` ``uint64``.
        dhash: ``(N,)`` ``uint64``.
        height: ``(N,)`` ``int64`` pixels.
        width: ``(N,)`` ``int64`` pixels.
        n_bytes: ``(N,)`` ``int64`` file sizes.
        thumbs: ``(N, S, S)`` ``uint8`` grey thumbnails.
    """

    sha256: np.ndarray
    phash: np.ndarray
    dhash: np.ndarray
    height: np.ndarray
    width: np.ndarray
    n_bytes: np.ndarray
    thumbs: np.ndarray

    def __len__(self) -> int:
        return len(self.phash)


def hash_images(paths: Sequence[str | os.PathLike], thumb_size: int = DEFAULT_THUMB, workers: int = 1,
                progress: Callable[[Iterable], Iterator] | None = None) -> HashTable:
    """Fingerprint many images (optionally in ``workers`` processes).

    Args:
        paths: image files.
        thumb_size: grey thumbnail side in pixels.
        workers: processes (1 = in this process; more start ``spawn`` workers, about a second each).
        progress: optional wrapper around the result iterator (e.g. a progress bar).

    Returns:
        :class:`HashTable` in the order of ``paths``.

    Raises:
        MSBError: listing every unreadable file (up to 10 named, plus the count).
    """
    if workers < 1:
        raise MSBError(f"workers must be >= 1, got {workers}.")
    fn = partial(_safe_fingerprint, thumb_size=thumb_size)
    names = [str(p) for p in paths]
    if workers == 1 or len(names) < 2 * workers:
        it: Iterable = map(fn, names)
        results = list(progress(it) if progress else it)
    else:
        # spawn (not fork): the parent may hold OpenCV/OpenMP thread pools that are not fork-safe
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_init_worker) as ex:
            it = ex.map(fn, names, chunksize=max(1, min(64, len(names) // (8 * workers))))
            results = list(progress(it) if progress else it)
    problems = [r for r in results if isinstance(r, str)]
    if problems:
        shown = "; ".join(problems[:_MAX_LISTED])
        more = f"; ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise MSBError(f"{len(problems)} image(s) could not be fingerprinted: {shown}{more}")
    n = len(results)
    thumbs = np.stack([r.thumb for r in results]) if n else np.zeros((0, thumb_size, thumb_size), np.uint8)
    return HashTable(sha256=np.array([r.sha256 for r in results], dtype=object),
                     phash=np.array([r.phash for r in results], dtype=np.uint64),
                     dhash=np.array([r.dhash for r in results], dtype=np.uint64),
                     height=np.array([r.height for r in results], dtype=np.int64),
                     width=np.array([r.width for r in results], dtype=np.int64),
                     n_bytes=np.array([r.n_bytes for r in results], dtype=np.int64), thumbs=thumbs)


def hex64(values: np.ndarray) -> list[str]:
    """``uint64`` hashes as 16-digit lower-case hex strings (imagehash's ``str`` format)."""
    return [f"{int(v):016x}" for v in np.asarray(values, dtype=np.uint64)]


__all__ = ["pack_hash", "fingerprint", "hash_images", "HashTable", "ImageFingerprint", "hex64", "HASH_SIZE",
           "DEFAULT_THUMB"]
