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
* ``thumb``: the grey image resized to ``thumb_size x thumb_size`` px by area mean (OpenCV ``INTER_AREA``'s
  cells, the mean computed exactly and rounded half to even: :func:`msb.audit.area.area_thumbnail`; aspect ratio not
  kept), ``uint8``, used by the pixel screens (:mod:`msb.audit.screens`).

How it is fast and still bit-identical to imagehash (``scripts/bench_audit.py`` checks both):

* the two LANCZOS resizes are Pillow's own fixed-point arithmetic written as exact float64 matrix products
  (:mod:`msb.audit.lanczos`); if the installed Pillow ever differs, PIL's own resize is used;
* the DCT of all 32x32 thumbnails is one batched ``scipy.fftpack.dct`` call (the transform imagehash calls,
  applied per 1-D line, so stacking does not change a coefficient), the medians one ``np.median`` call;
* the thumbnail is banded float64 products of integers too (:mod:`msb.audit.area`), reading the same float64
  copy of the grey image as the LANCZOS products while it is still in cache; from 1 Mpx the three horizontal
  passes run together over strips of 128 rows (:mod:`msb.audit.resize`);
* decoding, the resizes and the thumbnail run in ``workers`` threads for small sets (PIL, BLAS and OpenCV
  release the GIL; no process start-up, nothing to pickle) and in ``workers`` processes from
  :data:`PROCESS_FROM` images (forked; 2,000 where they must be spawned), where the Python part of each
  image (Pillow's header parsing, NumPy call overheads) would keep threads waiting on one GIL; BLAS and OpenCV run one thread each beside them.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import cv2
import imagehash
import numpy as np
import scipy.fftpack
from PIL import Image, UnidentifiedImageError
from threadpoolctl import threadpool_limits

from msb.audit.lanczos import fast_resize_matches_pillow, lanczos_hash_inputs, lanczos_matrix, pillow_lanczos
from msb.audit.resize import fingerprint_resizes
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


def _pack_rows(bits: np.ndarray) -> np.ndarray:
    """``(N, 64)`` bool -> ``(N,)`` uint64, first bit most significant."""
    return np.packbits(bits, axis=1).view(">u8").ravel().astype(np.uint64)


def batch_hashes(p32: np.ndarray, d98: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pHash and dHash of N images from their LANCZOS inputs, packed like :func:`pack_hash`.

    Args:
        p32: ``(N, 32, 32)`` grey values (any real dtype) resized to 32x32.
        d98: ``(N, 8, 9)`` grey values resized to 9 wide x 8 high.

    Returns:
        ``(phash, dhash)``, each ``(N,)`` ``uint64``. pHash: ``scipy.fftpack.dct`` along rows then columns
        (imagehash's call, one batched call here), top-left 8x8 ``> median``; dHash: ``pixel > left
        neighbour``.
    """
    n = len(p32)
    if n == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    dct = scipy.fftpack.dct(scipy.fftpack.dct(np.asarray(p32, np.float64), axis=1), axis=2)
    low = dct[:, :HASH_SIZE, :HASH_SIZE].reshape(n, HASH_SIZE * HASH_SIZE)
    med = np.median(low, axis=1)
    d = np.asarray(d98)
    return _pack_rows(low > med[:, None]), _pack_rows((d[:, :, 1:] > d[:, :, :-1]).reshape(n, -1))


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


@dataclass
class _Decoded:
    """One image decoded, before its hashes are computed in a batch."""

    sha256: str
    height: int
    width: int
    n_bytes: int
    thumb: np.ndarray
    p32: np.ndarray | None
    d98: np.ndarray | None
    hashes: tuple[int, int] | None = None  # (phash, dhash) once computed in a worker process


def _decode(path: str | os.PathLike, thumb_size: int) -> _Decoded:
    """Read, hash the bytes, decode to grey, resize (LANCZOS inputs + thumbnail). Raises MSBError."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise MSBError(f"{path}: cannot read image file ({e}).") from e
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            w, h = im.size
            grey = np.asarray(im.convert("L"))
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise MSBError(f"{path}: cannot decode image ({e}). Replace the file or remove its row.") from e
    p32, d98, thumb = fingerprint_resizes(grey, thumb_size)
    return _Decoded(hashlib.sha256(data).hexdigest(), int(h), int(w), len(data), thumb, p32, d98)


def fingerprint(path: str | os.PathLike, thumb_size: int = DEFAULT_THUMB) -> ImageFingerprint:
    """Compute :class:`ImageFingerprint` of one image file.

    Args:
        path: image file (any format PIL decodes).
        thumb_size: side of the grey thumbnail in pixels.

    Raises:
        MSBError: the file is missing or cannot be decoded (naming it).
    """
    r = _decode(path, thumb_size)
    ph, dh = batch_hashes(r.p32[None], r.d98[None])
    return ImageFingerprint(r.sha256, int(ph[0]), int(dh[0]), r.height, r.width, r.n_bytes, r.thumb)


def _safe_decode(path: str, thumb_size: int) -> _Decoded | str:
    try:
        return _decode(path, thumb_size)
    except MSBError as e:
        return str(e)


#: Worker processes instead of threads (2 workers or more) from this many images when they can be forked (a
#: few ms each), and from :data:`PROCESS_FROM_SPAWN` when they must be spawned (each imports NumPy, OpenCV and
#: Pillow anew, ~0.5 s). Threads share one GIL, and each image keeps a thread in Python for a part of its time
#: (Pillow's header parsing, NumPy call overheads); processes don't wait on each other. Below, threads (no
#: start-up, nothing to pickle). Measured in scripts/bench_audit.py.
PROCESS_FROM = 500
PROCESS_FROM_SPAWN = 2000
_CHUNK = 64  # images per task of a worker process, at most (at least 8 tasks per worker: balanced ends)


def _init_process() -> None:
    """Worker process set-up: one OpenCV and one BLAS thread each (the processes are the parallelism)."""
    cv2.setNumThreads(1)
    threadpool_limits(limits=1, user_api="blas")
    fast_resize_matches_pillow()


def _hash_chunk(paths: list[str], thumb_size: int) -> list[_Decoded | str]:
    """Decode and hash ``paths`` in a worker process; the LANCZOS inputs are replaced by the hashes (less to
    send back). Unreadable files come back as their error line."""
    out = [_safe_decode(p, thumb_size) for p in paths]
    ok = [r for r in out if not isinstance(r, str)]
    if ok:
        ph, dh = batch_hashes(np.stack([r.p32 for r in ok]), np.stack([r.d98 for r in ok]))
        for r, a, b in zip(ok, ph.tolist(), dh.tolist()):
            r.p32 = r.d98 = None
            r.hashes = (a, b)
    return out


def _start_method() -> str:
    """``fork`` where the platform has it and this process runs no other Python thread (no lock can be copied
    while held), else ``spawn``."""
    return "fork" if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1 else "spawn"


def _in_processes(names: list[str], thumb_size: int, workers: int, method: str) -> Iterator[_Decoded | str]:
    """Per-image results of :func:`_hash_chunk` over ``workers`` processes started by ``method``, in input
    order."""
    size = max(1, min(_CHUNK, -(-len(names) // (8 * workers))))
    chunks = [names[i:i + size] for i in range(0, len(names), size)]
    with ProcessPoolExecutor(max_workers=min(workers, len(chunks)), initializer=_init_process,
                             mp_context=multiprocessing.get_context(method)) as ex:
        for part in ex.map(_hash_chunk, chunks, [thumb_size] * len(chunks)):
            yield from part


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
    """Fingerprint many images (optionally in ``workers`` threads).

    Args:
        paths: image files.
        thumb_size: grey thumbnail side in pixels.
        workers: threads or processes decoding and resizing (1 = this thread only). Below
            :data:`PROCESS_FROM` images (:data:`PROCESS_FROM_SPAWN` where processes can't be forked), threads
            (decoding and BLAS release the GIL; no start-up); from it, worker processes in chunks of 64 images,
            each with one OpenCV and one BLAS thread. The values are the same either way.
        progress: optional wrapper around the per-image result iterator (e.g. a progress bar).

    Returns:
        :class:`HashTable` in the order of ``paths``; hashes bit-identical to ``imagehash.phash`` /
        ``imagehash.dhash`` on the same files.

    Raises:
        MSBError: ``workers < 1``; listing every unreadable file (up to 10 named, plus the count).
    """
    if not isinstance(workers, int) or workers < 1:
        raise MSBError(f"workers must be an integer >= 1, got {workers!r}.")
    fast_resize_matches_pillow()  # probe once here, before any worker thread hashes
    fn = partial(_safe_decode, thumb_size=thumb_size)
    names = [str(p) for p in paths]
    cv_threads = cv2.getNumThreads()
    cv2.setNumThreads(1)  # the thumbnails are tiny: OpenCV's own thread pool costs more than it gives
    blas = threadpool_limits(limits=1, user_api="blas")  # likewise BLAS's, beside our own worker threads
    try:
        method = _start_method()
        if workers >= 2 and len(names) >= (PROCESS_FROM if method == "fork" else PROCESS_FROM_SPAWN):
            it: Iterable = _in_processes(names, thumb_size, workers, method)
            results = list(progress(it) if progress else it)
        elif workers == 1 or len(names) < 2:
            it = map(fn, names)
            results = list(progress(it) if progress else it)
        else:
            with ThreadPoolExecutor(max_workers=workers) as ex:
                it = ex.map(fn, names)
                results = list(progress(it) if progress else it)
    finally:
        cv2.setNumThreads(cv_threads)
        blas.restore_original_limits()
    problems = [r for r in results if isinstance(r, str)]
    if problems:
        shown = "; ".join(problems[:_MAX_LISTED])
        more = f"; ... and {len(problems) - _MAX_LISTED} more" if len(problems) > _MAX_LISTED else ""
        raise MSBError(f"{len(problems)} image(s) could not be fingerprinted: {shown}{more}")
    n = len(results)
    phash, dhash = np.zeros(n, np.uint64), np.zeros(n, np.uint64)
    todo = [i for i, r in enumerate(results) if r.hashes is None]
    if todo:
        phash[todo], dhash[todo] = batch_hashes(np.stack([results[i].p32 for i in todo]),
                                                np.stack([results[i].d98 for i in todo]))
    done = [i for i, r in enumerate(results) if r.hashes is not None]
    if done:
        phash[done] = np.array([results[i].hashes[0] for i in done], dtype=np.uint64)
        dhash[done] = np.array([results[i].hashes[1] for i in done], dtype=np.uint64)
    thumbs = (np.stack([r.thumb for r in results]) if n else np.zeros((0, thumb_size, thumb_size), np.uint8))
    return HashTable(sha256=np.array([r.sha256 for r in results], dtype=object), phash=phash, dhash=dhash,
                     height=np.array([r.height for r in results], dtype=np.int64),
                     width=np.array([r.width for r in results], dtype=np.int64),
                     n_bytes=np.array([r.n_bytes for r in results], dtype=np.int64), thumbs=thumbs)


def hex64(values: np.ndarray) -> list[str]:
    """``uint64`` hashes as 16-digit lower-case hex strings (imagehash's ``str`` format)."""
    return [f"{int(v):016x}" for v in np.asarray(values, dtype=np.uint64)]


__all__ = ["pack_hash", "fingerprint", "hash_images", "HashTable", "ImageFingerprint", "hex64", "HASH_SIZE",
           "DEFAULT_THUMB", "batch_hashes", "lanczos_hash_inputs", "lanczos_matrix", "pillow_lanczos",
           "fast_resize_matches_pillow"]
