"""Screens on the content, not the frame: what is constant across a dataset is left out (``msb audit --fov``).

Endoscopy and ultrasound frames share a fixed frame: the black border outside the field of view (FOV), a
burned-in overlay box or text. On grey thumbnails these pixels dominate the Pearson correlation and the
low-frequency hashes, so frames of different recordings look like near-duplicates. This module finds that frame
and computes the fingerprints of the screens on the rest.

Masks (``True`` = content; ``S x S`` in the normalised coordinates of the ``S x S`` thumbnails of
:mod:`msb.audit.hashing`, aspect ratio not kept):

* **dataset mask** (``--fov auto``, :func:`estimate_fov`): a pixel is left out when its grey value barely varies
  over the images (at least ``dev_share`` = 2/3 of the thumbnails within ``dev_max`` grey levels of the
  pixel's median, so a border or overlay shared by two thirds of the images counts even when the others differ;
  connected regions of fewer than ``min_region`` such pixels are ignored as chance; at most ``max_sample``
  images, drawn with seed 0) or when it is dark (``<= dark_max``) in at least ``dark_share`` of the images (the region
  outside the FOV); the left-out region is grown by one pixel (the thumbnails blend border and content at its
  edge). Fewer than ``min_images`` images, or more than ``max_left_out`` of the pixels left out: nothing is left
  out (recorded as a note). ``--fov MASK.png``: a user mask (non-zero = content), resized with nearest
  neighbour; ``--fov none``: nothing left out, the audit of earlier versions.
* **content crop**: the bounding box of the dataset mask, scaled to each image's size;
* **image mask** (``auto`` only): the dataset mask minus the image's own dark border, i.e. the pixels of its
  ``S x S`` thumbnail that are ``<= dark_max`` and connected (8-neighbourhood) to the thumbnail's edge or to the
  left-out region, grown by one pixel. Frames of one dataset recorded with different scopes thus each lose their
  own border.

Fingerprints on the content (:func:`content_fingerprints`; one more decode per image): the screen thumbnail is
the whole grey image (PIL ``convert("L")``) resized to ``S x S`` by area mean
(:func:`msb.audit.area.area_thumbnail`), as in :mod:`msb.audit.hashing`, with its left-out pixels set to the
mean of its content pixels; pHash and dHash are
imagehash's (bit for bit: the batched path of :mod:`msb.audit.hashing`) of the grey image cropped to the content crop, the dataset mask's
left-out pixels there (nearest-neighbour upsampled) set to the mean grey of its content pixels (the image mask
is not used for the hashes: two copies of one frame with slightly different JPEG noise could lose different
border pixels and so differ in a few hash bits). The screens
(:mod:`msb.audit.screens`) then compare two images over the pixels that are content in *both* image masks.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError
from scipy import ndimage
from threadpoolctl import threadpool_limits

from msb.audit.area import area_thumbnail
from msb.audit.hashing import batch_hashes, lanczos_hash_inputs
from msb.errors import MSBError

#: defaults of :func:`estimate_fov` (grey levels of 8-bit images, shares of images / pixels)
FOV_DEFAULTS = {"dev_max": 6.0, "dev_share": 2 / 3, "min_region": 8, "dark_max": 24, "dark_share": 0.9,
                "min_images": 4, "max_left_out": 0.9,
                "max_sample": 2000}


@dataclass
class FovMask:
    """The dataset mask and what it leaves out.

    Attributes:
        mode: ``auto``, ``none`` or ``file``.
        mask: ``(S, S)`` bool, ``True`` = content (all ``True`` when nothing is left out).
        per_image: whether each image also loses its own dark border (``auto``).
        left_out_fraction: share of the ``S x S`` pixels left out by the dataset mask.
        parts: ``{"constant": share, "dark": share}`` of the pixels each criterion leaves out (before growing).
        source: the mask file (``file`` mode), else ``None``.
        notes: why nothing was left out, when so.
    """

    mode: str
    mask: np.ndarray
    per_image: bool = False
    left_out_fraction: float = 0.0
    parts: dict[str, float] = field(default_factory=dict)
    source: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def active(self) -> bool:
        """True when the content screens differ from the whole-frame screens."""
        return self.mode != "none" and (self.left_out_fraction > 0 or self.per_image)

    def describe(self) -> dict[str, Any]:
        """JSON-able record (``audit.json`` ``fov``)."""
        rule = {"none": "nothing left out (whole frame)",
                "file": f"user mask {self.source} (non-zero = content), nearest-neighbour resize",
                "auto": (f"left out: >= 2/3 of the images within {FOV_DEFAULTS['dev_max']} grey levels of the median "
                         f"or dark "
                         f"(<= {FOV_DEFAULTS['dark_max']}) in >= {FOV_DEFAULTS['dark_share']:.0%} of the images, "
                         f"grown by 1 px; per image also its dark border connected to the image's edge")}[self.mode]
        return {"mode": self.mode, "rule": rule, "left_out_fraction": round(float(self.left_out_fraction), 4),
                "parts": {k: round(float(v), 4) for k, v in self.parts.items()}, "per_image": self.per_image,
                "active": self.active, "notes": list(self.notes), "mask_size": list(self.mask.shape)}


def _grow(excluded: np.ndarray) -> np.ndarray:
    return ndimage.binary_dilation(excluded, structure=np.ones((3, 3), bool)) if excluded.any() else excluded


def estimate_fov(thumbs: np.ndarray, dev_max: float = FOV_DEFAULTS["dev_max"],
                 dev_share: float = FOV_DEFAULTS["dev_share"], min_region: int = FOV_DEFAULTS["min_region"],
                 dark_max: int = FOV_DEFAULTS["dark_max"], dark_share: float = FOV_DEFAULTS["dark_share"],
                 min_images: int = FOV_DEFAULTS["min_images"],
                 max_left_out: float = FOV_DEFAULTS["max_left_out"],
                 max_sample: int = FOV_DEFAULTS["max_sample"]) -> FovMask:
    """The dataset mask of ``--fov auto`` (module docstring).

    Args:
        thumbs: ``(N, S, S)`` ``uint8`` grey thumbnails of the whole frames.
        dev_max, dev_share: a pixel with at least ``dev_share`` of the images within ``dev_max`` grey levels of
            its median (over the images) is constant.
        min_region: constant regions (8-connected) with fewer pixels are ignored.
        dark_max, dark_share: a pixel ``<= dark_max`` in at least ``dark_share`` of the images is outside the FOV.
        min_images: below this many images nothing is estimated.
        max_left_out: more than this share left out: nothing is left out (a dataset of near-identical images).
        max_sample: at most this many thumbnails are used (``numpy.random.default_rng(0)`` draw).

    Returns:
        :class:`FovMask` with ``mode="auto"`` and ``per_image=True``.
    """
    n = len(thumbs)
    size = thumbs.shape[1:] if thumbs.ndim == 3 else (1, 1)
    full = np.ones(size, bool)
    if n < min_images:
        return FovMask("auto", full, True, notes=[f"{n} image(s) < {min_images}: no dataset mask estimated"])
    if n > max_sample:
        thumbs = thumbs[np.sort(np.random.default_rng(0).choice(n, size=max_sample, replace=False))]
    t = thumbs.astype(np.float32)
    med = np.median(t, axis=0)
    constant = (np.abs(t - med) <= dev_max).mean(axis=0) >= dev_share
    lab, k = ndimage.label(constant, structure=np.ones((3, 3), bool))
    if k:
        sizes = np.bincount(lab.ravel())
        constant &= sizes[lab] >= min_region
    dark = (thumbs <= dark_max).mean(axis=0) >= dark_share
    excluded = _grow(constant | dark)
    share = float(excluded.mean())
    parts = {"constant": float(constant.mean()), "dark": float(dark.mean())}
    if share > max_left_out:
        return FovMask("auto", full, True, parts=parts,
                       notes=[f"{share:.0%} of the pixels would be left out (> {max_left_out:.0%}): dataset mask "
                              f"not used"])
    return FovMask("auto", ~excluded, True, share, parts)


def load_fov_mask(path: str | os.PathLike, size: int) -> FovMask:
    """A user mask (``--fov MASK.png``): any image PIL reads, non-zero = content, resized to ``size x size``
    (nearest neighbour).

    Raises:
        MSBError: the file is missing or unreadable, or holds no content pixel.
    """
    p = Path(path)
    try:
        with Image.open(p) as im:
            arr = np.asarray(im.convert("L"))
    except (OSError, UnidentifiedImageError, ValueError) as e:
        raise MSBError(f"--fov {p}: cannot read the mask image ({e}); give a PNG whose non-zero pixels are the "
                       f"content, or --fov auto|none.") from e
    m = cv2.resize((arr > 0).astype(np.uint8), (size, size), interpolation=cv2.INTER_NEAREST).astype(bool)
    if not m.any():
        raise MSBError(f"--fov {p}: the mask has no non-zero (content) pixel at {size}x{size}; draw the content "
                       f"white on black.")
    return FovMask("file", m, False, float(1 - m.mean()), source=str(p))


def crop_box(mask: np.ndarray) -> tuple[int, int, int, int]:
    """``(r0, r1, c0, c1)``: half-open bounding box of the ``True`` pixels of ``mask`` (whole mask if none)."""
    rows, cols = np.flatnonzero(mask.any(axis=1)), np.flatnonzero(mask.any(axis=0))
    if not len(rows):
        return 0, mask.shape[0], 0, mask.shape[1]
    return int(rows[0]), int(rows[-1]) + 1, int(cols[0]), int(cols[-1]) + 1


@dataclass
class ContentTable:
    """Fingerprints of the content of N images (module docstring), aligned with the input order.

    Attributes:
        phash, dhash: ``(N,)`` ``uint64`` hashes of the content crop.
        thumbs: ``(N, S, S)`` ``uint8`` whole-image thumbnails (left-out pixels set to the image's content mean).
        masks: ``(N, S, S)`` bool image masks (``True`` = content).
        box: the content crop in thumbnail pixels ``(r0, r1, c0, c1)``.
    """

    phash: np.ndarray
    dhash: np.ndarray
    thumbs: np.ndarray
    masks: np.ndarray
    box: tuple[int, int, int, int]


def _image_mask(thumb: np.ndarray, base: np.ndarray, dark_max: int) -> np.ndarray:
    """``base`` minus the dark region of ``thumb`` connected to the edge or to ``~base``, grown by 1 px."""
    dark = thumb <= dark_max
    if not dark.any():
        return base.copy()
    lab, _ = ndimage.label(dark, structure=np.ones((3, 3), bool))
    seeds = np.zeros_like(dark)
    seeds[0, :] = seeds[-1, :] = seeds[:, 0] = seeds[:, -1] = True
    seeds |= ~base
    touching = np.unique(lab[seeds & dark])
    border = np.isin(lab, touching[touching > 0])
    return base & ~_grow(border)


def _content_one(path: str, fov: FovMask, size: int, box: tuple[int, int, int, int]
                 ) -> tuple[int, int, np.ndarray, np.ndarray] | str:
    try:
        with Image.open(path) as im:
            grey = np.asarray(im.convert("L"))
    except (OSError, UnidentifiedImageError, ValueError) as e:
        return f"{path}: cannot decode image ({e})"
    h, w = grey.shape
    thumb = area_thumbnail(grey, size)
    m = _image_mask(thumb, fov.mask, FOV_DEFAULTS["dark_max"]) if fov.per_image else fov.mask.copy()
    if not m.any():
        m = fov.mask.copy()
    if not m.all():
        thumb = thumb.copy()
        thumb[~m] = int(round(float(thumb[m].mean())))
    r0, c0 = int(np.floor(box[0] * h / size)), int(np.floor(box[2] * w / size))
    r1, c1 = max(int(np.ceil(box[1] * h / size)), r0 + 1), max(int(np.ceil(box[3] * w / size)), c0 + 1)
    crop = grey[r0:r1, c0:c1]
    full_m = (cv2.resize(fov.mask.astype(np.uint8), (w, h), interpolation=cv2.INTER_NEAREST) > 0)[r0:r1, c0:c1]
    if full_m.any() and not full_m.all():
        crop = crop.copy()
        crop[~full_m] = int(round(float(crop[full_m].mean())))
    p32, d98 = lanczos_hash_inputs(np.ascontiguousarray(crop))  # = imagehash's resizes of the crop, bit for bit
    ph, dh = batch_hashes(p32[None], d98[None])
    return int(ph[0]), int(dh[0]), np.ascontiguousarray(thumb, np.uint8), m


def content_fingerprints(paths: Sequence[str | os.PathLike], fov: FovMask, size: int, workers: int = 1
                         ) -> ContentTable:
    """Fingerprints of the content of each image (module docstring).

    Args:
        paths: image files (already fingerprinted once, :func:`msb.audit.hashing.hash_images`).
        fov: the dataset mask (``S x S``; its crop is scaled to each image's size in pixels).
        size: screen thumbnail side in pixels.
        workers: threads (PIL and OpenCV release the GIL while decoding and resizing).

    Returns:
        :class:`ContentTable`.

    Raises:
        MSBError: an image cannot be decoded (naming up to 10).
    """
    if fov.mask.shape != (size, size):
        fov = FovMask(fov.mode, cv2.resize(fov.mask.astype(np.uint8), (size, size),
                                           interpolation=cv2.INTER_NEAREST).astype(bool), fov.per_image)
    box = crop_box(fov.mask)
    names = [str(p) for p in paths]

    def one(p: str):
        return _content_one(p, fov, size, box)

    with threadpool_limits(limits=1, user_api="blas"):  # small products: BLAS threads would only contend
        if workers > 1 and len(names) > 1:
            with ThreadPoolExecutor(max_workers=workers) as ex:
                results = list(ex.map(one, names))
        else:
            results = [one(p) for p in names]
    problems = [r for r in results if isinstance(r, str)]
    if problems:
        raise MSBError(f"{len(problems)} image(s) could not be read for the content screens: "
                       + "; ".join(problems[:10]) + (f"; ... and {len(problems) - 10} more" if len(problems) > 10
                                                     else ""))
    n = len(results)
    return ContentTable(phash=np.array([r[0] for r in results], dtype=np.uint64),
                        dhash=np.array([r[1] for r in results], dtype=np.uint64),
                        thumbs=np.stack([r[2] for r in results]) if n else np.zeros((0, size, size), np.uint8),
                        masks=np.stack([r[3] for r in results]) if n else np.zeros((0, size, size), bool), box=box)


def resolve_fov(spec: str, thumbs: np.ndarray, size: int) -> FovMask:
    """``--fov`` value -> :class:`FovMask`: ``auto`` (:func:`estimate_fov`), ``none`` or a mask file path."""
    if spec == "none":
        return FovMask("none", np.ones((size, size), bool))
    if spec == "auto":
        return estimate_fov(thumbs)
    return load_fov_mask(spec, size)


def write_fov_mask(fov: FovMask, path: str | os.PathLike) -> Path:
    """Write the dataset mask as an 8-bit PNG (255 = content, 0 = left out); returns the path."""
    from msb.utils.atomic import atomic_path

    p = Path(path)
    with atomic_path(p) as tmp:
        ok = cv2.imwrite(str(tmp), fov.mask.astype(np.uint8) * 255)
    if not ok:
        raise MSBError(f"{p}: cannot write the FOV mask image.")
    return p


__all__ = ["FovMask", "ContentTable", "estimate_fov", "load_fov_mask", "resolve_fov", "content_fingerprints",
           "crop_box", "write_fov_mask", "FOV_DEFAULTS"]
