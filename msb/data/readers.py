"""Image and mask readers of prepared datasets, and the raw-mask -> class mapping.

Geometry convention: images and masks are read *without* applying EXIF orientation (OpenCV is told to
ignore it, PIL never applies it), so the stored pixel grid is the one that is validated and used. Raw mask
values are mapped to classes by ``classes.csv`` (:mod:`msb.data.classes`). Part of the prepared-dataset
schema (:mod:`msb.data.schema`, which re-exports these names). Every user error raises
:class:`msb.errors.MSBError` naming the file and what to do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import cv2
import numpy as np
from PIL import Image, UnidentifiedImageError

from msb.data.classes import _MAX_LISTED, ClassSpec
from msb.errors import MSBError

__all__ = ["image_size", "mask_to_label_map", "mask_to_onehot", "read_image", "read_mask"]


def read_image(path: str | Path) -> np.ndarray:
    """Read an image as RGB.

    Args:
        path: image file (any format OpenCV decodes: PNG, JPEG, BMP, TIFF, ...).

    Returns:
        ``(H, W, 3)`` ``uint8`` RGB array. Grey images are repeated to 3 channels; an alpha channel is dropped;
        16-bit images are reduced to 8 bit by OpenCV (value / 256). EXIF orientation is ignored.

    Raises:
        MSBError: the file is missing or cannot be decoded.
    """
    path = Path(path)
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as e:
        raise MSBError(f"{path}: cannot read image file ({e}). Check that the file exists.") from e
    img = cv2.imdecode(data, cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION) if data.size else None
    if img is None:
        raise MSBError(f"{path}: cannot decode image (empty or corrupt file, or unsupported format). "
                       f"Replace the file or re-run `msb data prepare`.")
    return np.ascontiguousarray(img[:, :, ::-1])


def read_mask(path: str | Path) -> np.ndarray:
    """Read a mask's raw integer values.

    Decoding rules (PIL, no value remapping):

    * greyscale (``L``, ``I;16``, ``I``) -> the stored values;
    * palette (``P``) -> the palette *indices* (the usual label-mask convention);
    * 1-bit (``1``) -> ``0``/``1``;
    * ``RGB`` / ``RGBA`` / ``LA``: the colour channels must be equal at every pixel (a grey mask saved as colour)
      and are collapsed to one; an alpha channel must be fully opaque (255) and is dropped. Colour-coded masks
      (different channels) are *not* supported: convert them to one integer value per class first.

    Args:
        path: mask file (PNG recommended; JPEG masks are lossy and need binarising by a converter).

    Returns:
        ``(H, W)`` integer array: ``uint8`` for 8-bit / 1-bit / palette masks, ``uint16`` or ``int32`` for 16/32-bit.

    Raises:
        MSBError: missing/corrupt file, colour mask with unequal channels, translucent alpha, unsupported mode.
    """
    path = Path(path)
    try:
        with Image.open(path) as im:
            mode = im.mode
            arr = np.asarray(im)
    except FileNotFoundError as e:
        raise MSBError(f"{path}: mask file not found. Fix mask_path in index.csv or re-run `msb data prepare`.") from e
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise MSBError(f"{path}: cannot decode mask ({e}). Replace the file or re-run `msb data prepare`.") from e
    if mode == "1":
        return arr.astype(np.uint8)
    if mode in ("L", "P", "I;16", "I;16B", "I;16L", "I", "I;16N"):
        if arr.ndim != 2:  # pragma: no cover - defensive
            raise MSBError(f"{path}: unexpected mask shape {arr.shape} for mode {mode}.")
        return np.ascontiguousarray(arr)
    if mode in ("RGB", "RGBA", "LA"):
        colour = arr[..., :-1] if mode in ("RGBA", "LA") else arr
        if mode in ("RGBA", "LA"):
            alpha = arr[..., -1]
            if not np.all(alpha == 255):
                raise MSBError(f"{path}: mask has a translucent alpha channel (mode {mode}); masks must store class "
                               f"values in the grey/colour channels. Save it as a greyscale PNG.")
        if colour.shape[-1] == 1:
            return np.ascontiguousarray(colour[..., 0])
        c0 = colour[..., 0]
        if not all(np.array_equal(colour[..., k], c0) for k in range(1, colour.shape[-1])):
            n = int(np.count_nonzero(np.any(colour != c0[..., None], axis=-1)))
            raise MSBError(f"{path}: colour mask with different R/G/B values at {n} pixel(s); colour-coded masks are "
                           f"not supported. Convert it to one integer value per class (greyscale or palette PNG).")
        return np.ascontiguousarray(c0)
    raise MSBError(f"{path}: unsupported mask image mode {mode!r}. Save masks as 8/16-bit greyscale or palette PNG.")


def image_size(path: str | Path) -> tuple[int, int]:
    """Return ``(height, width)`` in pixels from the file header only (PIL, no pixel decode).

    Raises:
        MSBError: the file is missing or not a recognised image.
    """
    path = Path(path)
    try:
        with Image.open(path) as im:
            w, h = im.size
    except FileNotFoundError as e:
        raise MSBError(f"{path}: file not found.") from e
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise MSBError(f"{path}: not a readable image ({e}).") from e
    return int(h), int(w)


def _class_lut(classes: Sequence[ClassSpec], max_value: int) -> np.ndarray:
    """Lookup table raw value -> class_id (``-1`` = uncovered), length ``max_value + 1``, ``int16``."""
    lut = np.full(max_value + 1, -1, dtype=np.int16)
    for c in classes:
        for v in c.source_values:
            if v <= max_value:
                lut[int(v)] = c.class_id
    return lut


def mask_to_label_map(raw: np.ndarray, classes: Sequence[ClassSpec], mask_file: str | Path = "<mask>") -> np.ndarray:
    """Map raw mask values to class ids.

    Args:
        raw: ``(H, W)`` integer raw mask (from :func:`read_mask`).
        classes: the dataset classes.
        mask_file: file name used in the error message.

    Returns:
        ``(H, W)`` ``int64`` label map with values in ``0..K-1`` (0 = background).

    Raises:
        MSBError: ``raw`` is not 2-D integer, or some value is not in any class's ``source_values`` (the message
            names ``mask_file`` and lists the uncovered values with their pixel counts).
    """
    raw = np.asarray(raw)
    if raw.ndim != 2 or not (np.issubdtype(raw.dtype, np.integer) or raw.dtype == bool):
        raise MSBError(f"{mask_file}: mask must be a 2-D integer array, got shape {raw.shape} dtype {raw.dtype}.")
    if raw.dtype == bool:
        raw = raw.astype(np.uint8)
    if raw.size == 0:
        return np.zeros(raw.shape, dtype=np.int64)
    lo, hi = int(raw.min()), int(raw.max())
    if lo < 0 or hi > 65535:
        bad = np.unique(raw[(raw < 0) | (raw > 65535)])[:_MAX_LISTED]
        raise MSBError(f"{mask_file}: mask values {bad.tolist()} are outside [0, 65535] and not covered by "
                       f"classes.csv. Fix the mask.")
    lut = _class_lut(classes, hi)
    labels = lut[raw]
    uncovered = labels < 0
    if uncovered.any():
        vals, counts = np.unique(raw[uncovered], return_counts=True)
        listed = ", ".join(f"{int(v)} ({int(n)} px)" for v, n in list(zip(vals, counts))[:20])
        more = f" and {len(vals) - 20} more values" if len(vals) > 20 else ""
        raise MSBError(f"{mask_file}: mask values not covered by classes.csv: {listed}{more}. Add them to a class's "
                       f"source_values in classes.csv, or fix the mask (e.g. binarise a lossy JPEG mask).")
    return labels.astype(np.int64)


def mask_to_onehot(raw: np.ndarray, classes: Sequence[ClassSpec], mask_file: str | Path = "<mask>") -> np.ndarray:
    """Convert a raw mask to one boolean channel per foreground class.

    Args:
        raw: ``(H, W)`` integer raw mask (from :func:`read_mask`).
        classes: the dataset classes (class 0 = background is not output).
        mask_file: file name used in the error message.

    Returns:
        ``(C_fg, H, W)`` ``bool`` array; channel ``k`` is the foreground class with the ``k``-th smallest
        ``class_id`` (i.e. ``class_id = k + 1``).

    Raises:
        MSBError: as :func:`mask_to_label_map` (uncovered values, naming ``mask_file``).
    """
    labels = mask_to_label_map(raw, classes, mask_file)
    fg_ids = np.array(sorted(c.class_id for c in classes if c.class_id != 0), dtype=np.int64)
    return labels[None, :, :] == fg_ids[:, None, None]
