"""On-disk preprocessing cache: decode and resize every image and mask once per preprocessing setting.

The cache key is the SHA-256 of: the cache format version, ``index.csv`` and ``classes.csv`` bytes, the input
size, the interpolation rules, and (size, mtime) of every image and mask file. A changed file or setting gives
a new key, so a stale cache is never read. Layout of ``<cache_dir>/<key>/``:

- ``images.npy``: uint8 (N, H, W, 3) RGB, resized with ``cv2.INTER_AREA`` when shrinking, ``INTER_LINEAR``
  when enlarging;
- ``masks.npy``: uint8 (N, C, H, W) in {0, 1}, C = foreground classes; the raw mask is resized with nearest
  neighbour, then mapped through ``classes.csv``;
- ``sample_ids.json``: the row order.

The folder is written under a temporary name and renamed when complete (no partial cache).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from msb.data.schema import PreparedDataset, mask_to_label_map, mask_to_onehot, read_image, read_mask
from msb.utils.atomic import current_umask
from msb.utils.hashing import sha256_file, sha256_json
from msb.utils.io_errors import write_guard
from msb.utils.progress import Tracker, no_track

__all__ = ["CachedArrays", "cache_key", "build_cache", "resize_image", "resize_mask"]

CACHE_VERSION = 1


@dataclass
class CachedArrays:
    """Memory-mapped cache arrays; ``row_of[sample_id]`` gives the row in ``images``/``masks``."""

    images: np.ndarray
    masks: np.ndarray
    sample_ids: list[str]
    path: Path

    @property
    def row_of(self) -> dict[str, int]:
        """``sample_id`` -> row index in :attr:`images` and :attr:`masks`."""
        return {s: i for i, s in enumerate(self.sample_ids)}


def resize_image(img: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize (H, W, 3) uint8 to ``size`` = (height, width): INTER_AREA when shrinking, else INTER_LINEAR."""
    h, w = size
    if img.shape[:2] == (h, w):
        return img
    interp = cv2.INTER_AREA if (h < img.shape[0] and w < img.shape[1]) else cv2.INTER_LINEAR
    return cv2.resize(img, (w, h), interpolation=interp)


def resize_mask(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Nearest-neighbour resize of a raw (H, W) integer mask to ``size`` = (height, width)."""
    h, w = size
    if mask.shape[:2] == (h, w):
        return mask
    return cv2.resize(mask, (w, h), interpolation=cv2.INTER_NEAREST)


def cache_key(ds: PreparedDataset, size: tuple[int, int]) -> str:
    """SHA-256 key of a dataset + preprocessing setting (see module docstring)."""
    stats = []
    for sid in ds.index["sample_id"]:
        for p in (ds.image_path(sid), ds.mask_path(sid)):
            st = os.stat(p)
            stats.append((str(sid), p.name, st.st_size, st.st_mtime_ns))
    return sha256_json({
        "version": CACHE_VERSION,
        "index": sha256_file(ds.root / "index.csv"),
        "classes": sha256_file(ds.root / "classes.csv"),
        "size": list(size),
        "image_interp": "area-down/linear-up",
        "mask_interp": "nearest",
        "files": stats,
    })


def build_cache(ds: PreparedDataset, size: tuple[int, int], cache_dir: str | Path | None = None,
                track: Tracker = no_track) -> CachedArrays:
    """Return the cache for ``ds`` at ``size`` (height, width), building it if absent.

    Args:
        ds: a validated prepared dataset.
        size: (height, width) in pixels.
        cache_dir: folder holding cache entries; default ``<dataset root>/.msb_cache``.
        track: progress wrapper ``track(iterable, description, total)`` (the CLI passes a rich progress bar).

    Raises:
        MSBError: from :func:`mask_to_label_map` when a mask holds a value not in ``classes.csv`` (names the
            file and the value's pixel count at native resolution); a disk-full or I/O error while writing
            the cache (one line naming the cache folder and the free space).
    """
    cache_dir = Path(cache_dir) if cache_dir is not None else ds.root / ".msb_cache"
    key = cache_key(ds, size)
    final = cache_dir / key[:16]
    if not (final / "sample_ids.json").is_file():
        with write_guard(final, "preprocessing cache"):
            _build(ds, size, cache_dir, key, final, track)
    ids = json.loads((final / "sample_ids.json").read_text())
    return CachedArrays(np.load(final / "images.npy", mmap_mode="r"), np.load(final / "masks.npy", mmap_mode="r"),
                        ids, final)


def _build(ds: PreparedDataset, size: tuple[int, int], cache_dir: Path, key: str, final: Path,
           track: Tracker) -> None:
    """Write the cache entry ``final`` under a temporary name, then rename it (see :func:`build_cache`)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=cache_dir))
    try:
        ids = [str(s) for s in ds.index["sample_id"]]
        n, c = len(ids), len(ds.foreground_classes)
        images = np.lib.format.open_memmap(tmp / "images.npy", mode="w+", dtype=np.uint8,
                                           shape=(n, size[0], size[1], 3))
        masks = np.lib.format.open_memmap(tmp / "masks.npy", mode="w+", dtype=np.uint8,
                                          shape=(n, c, size[0], size[1]))
        for i, sid in enumerate(track(ids, f"caching {ds.name} at {size[0]}x{size[1]}", n)):
            images[i] = resize_image(read_image(ds.image_path(sid)), size)
            mpath = ds.mask_path(sid)
            raw = read_mask(mpath)
            mask_to_label_map(raw, ds.classes, mpath)  # values checked at native size: true pixel counts
            masks[i] = mask_to_onehot(resize_mask(raw, size), ds.classes, mpath)
        images.flush()
        masks.flush()
        del images, masks
        (tmp / "sample_ids.json").write_text(json.dumps(ids))
        os.chmod(tmp, 0o777 & ~current_umask())
        if final.exists():  # a concurrent builder finished first
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
