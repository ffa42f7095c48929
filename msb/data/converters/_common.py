"""Building blocks shared by the dataset-specific converters (PraNet, CVC-ClinicDB, ISIC-2018, BUSI, BKAI-IGH).

A converter lists its samples as :class:`Sample` records (source image, one or more source mask files, the
destination of the image copy, split/group/source values, extra index columns), then calls
:func:`write_samples` inside :func:`msb.data.converters.staged_output`. ``write_samples`` byte-copies every
image unchanged, turns the mask file(s) into one integer mask with a *mask function* and writes it as PNG
``masks/<sample_id>.png``.

Mask functions return a :class:`MaskResult`; ``n_changed`` is the number of pixels whose *label* differs from
the literal reading of the source (e.g. JPEG noise resolved by a threshold, or lesion pixels added by a second
mask file). Each converter states its exact definition in its docstring.

Every user error raises :class:`msb.errors.MSBError` naming the file and what to do.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import cv2
import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from msb.data.converters.folder import IMAGE_EXTENSIONS, _read_source_mask
from msb.data.converters.groups import group_keys, read_groups_csv
from msb.data.converters.provenance import record_mask
from msb.data.schema import INDEX_COLUMNS, image_size
from msb.errors import MSBError
from msb.utils.atomic import atomic_path, atomic_write_bytes

_MAX_LISTED = 10


def listed(items: Sequence[object]) -> str:
    """Comma-joined first 10 items plus ``... and N more``."""
    names = [str(p) for p in items]
    s = ", ".join(names[:_MAX_LISTED])
    return s + (f" ... and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else "")


def natural_key(text: str) -> tuple:
    """Sort key that orders embedded integers numerically (``'2' < '10'``, ``'benign (9)' < 'benign (10)'``)."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t.lower()) for t in re.split(r"(\d+)", text) if t != "")


def check_limit(limit: object) -> None:
    """Raise :class:`MSBError` unless ``limit`` is ``None`` or a positive ``int``."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise MSBError(f"limit must be a positive integer or None, got {limit!r}.")


def check_threshold(threshold: object) -> None:
    """Raise :class:`MSBError` unless ``threshold`` is a number in ``[0, 254]`` (8-bit masks)."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 255:
        raise MSBError(f"threshold must be a number in [0, 254] for 8-bit masks, got {threshold!r}.")


def find_child(folder: Path, names: Iterable[str]) -> Path | None:
    """The sub-folder of ``folder`` whose name equals one of ``names`` (case-insensitive, spaces/``_``/``-``
    ignored), or ``None``. ``names`` are tried in order."""
    if not folder.is_dir():
        return None

    def norm(s: str) -> str:
        return re.sub(r"[\s_\-]", "", s.lower())

    children = {norm(p.name): p for p in sorted(folder.iterdir()) if p.is_dir()}
    for n in names:
        if norm(n) in children:
            return children[norm(n)]
    return None


def descend_same_name(folder: Path) -> Path:
    """``folder/<folder.name>`` when that nested folder exists (Kaggle zips: ``train/train/``), else ``folder``."""
    inner = folder / folder.name
    return inner if inner.is_dir() else folder


def list_images(folder: Path) -> list[Path]:
    """Image files (extensions :data:`msb.data.converters.folder.IMAGE_EXTENSIONS`) directly in ``folder``,
    natural-sorted by name; hidden files skipped."""
    return sorted((p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                   and p.suffix.lower() in IMAGE_EXTENSIONS), key=lambda p: natural_key(p.name))


@dataclass(frozen=True)
class Sample:
    """One sample to write.

    Attributes:
        sample_id: unique id (no ``/``); also the mask file name ``masks/<sample_id>.png``.
        image: source image file (byte-copied unchanged).
        masks: source mask file(s); the mask function merges them.
        image_rel: destination of the image copy, relative to the prepared dataset (POSIX).
        split: ``train``/``val``/``test`` or ``''``.
        group: ``group`` column value (patient/video/near-duplicate set) or ``''``.
        source: ``source`` column value.
        extra: extra index columns as ``(column, value)`` pairs (same columns for every sample of a dataset).
    """

    sample_id: str
    image: Path
    masks: tuple[Path, ...]
    image_rel: str
    split: str = ""
    group: str = ""
    source: str = ""
    extra: tuple[tuple[str, str], ...] = ()


@dataclass
class MaskResult:
    """Output of a mask function.

    Attributes:
        mask: ``(H, W)`` ``uint8`` mask holding the prepared raw values (listed in ``classes.csv``).
        n_changed: pixels whose label differs from the literal reading of the source (definition per converter).
        counters: named counts summed over the dataset for the report (e.g. ``{"colour_masks": 1}``).
    """

    mask: np.ndarray
    n_changed: int = 0
    counters: dict[str, int] = field(default_factory=dict)


MaskFn = Callable[[Sample], MaskResult]


def read_grey_mask(path: Path) -> tuple[np.ndarray, bool]:
    """Read a mask as one integer channel: :func:`msb.data.schema.read_mask`, or, for a colour mask with unequal
    R/G/B channels, their rounded mean (then ``reduced`` is True).

    Returns:
        ``(raw (H, W) integer array, reduced)``.

    Raises:
        MSBError: unreadable file, translucent alpha, unsupported mode.
    """
    return _read_source_mask(Path(path), True)


def threshold_mask_fn(threshold: float) -> MaskFn:
    """Mask function for one lossy/anti-aliased grey mask per sample: ``value > threshold`` -> 255, else 0.

    ``n_changed`` = pixels whose written value differs from the source value (i.e. neither 0 nor 255 before,
    or 0/255 flipped by the threshold), the same definition as the Kvasir-SEG converter.
    Counter ``colour_masks``: masks with unequal R/G/B channels (their rounded channel mean was thresholded).
    """
    def fn(sample: Sample) -> MaskResult:
        raw, reduced = read_grey_mask(sample.masks[0])
        out = np.where(raw > threshold, np.uint8(255), np.uint8(0))
        return MaskResult(out, int(np.count_nonzero(out != raw)), {"colour_masks": int(reduced)})

    return fn


def _encode_png(mask: np.ndarray, path: Path) -> bytes:
    ok, buf = cv2.imencode(".png", mask, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:  # pragma: no cover
        raise MSBError(f"{path}: could not encode mask as PNG.")
    return buf.tobytes()


def write_samples(samples: Sequence[Sample], dest: Path, mask_fn: MaskFn
                  ) -> tuple[pd.DataFrame, int, int, dict[str, int]]:
    """Copy the images and write the masks of ``samples`` into ``dest`` (a staging folder).

    Args:
        samples: the samples (unique ``sample_id`` and ``image_rel``).
        dest: folder to write into (``images/...`` as given by ``image_rel``, ``masks/<sample_id>.png``).
        mask_fn: builds the prepared mask of one sample.

    Returns:
        ``(index DataFrame with INDEX_COLUMNS + extra columns, n_changed, n_mask_pixels, summed counters)``.

    Raises:
        MSBError: duplicate ids/destinations, unreadable image or mask (naming the file), image/mask size
            mismatch (naming both files and the sample id).
    """
    ids = [s.sample_id for s in samples]
    dup = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) != len(ids) else []
    if dup:
        raise MSBError(f"several source files map to the same sample_id: {listed(dup)}; rename the files.")
    rels = [s.image_rel for s in samples]
    if len(set(rels)) != len(rels):
        raise MSBError("several images map to the same destination file; this is a converter bug.")
    rows, counters = [], {}
    n_changed = n_pixels = 0
    for s in samples:
        h, w = image_size(s.image)
        res = mask_fn(s)
        if res.mask.shape != (h, w):
            raise MSBError(f"image {s.image} is {h}x{w} (HxW) but its mask {listed([m for m in s.masks])} is "
                           f"{res.mask.shape[0]}x{res.mask.shape[1]}; image and mask must have the same size. "
                           f"Fix or remove this pair (sample_id {s.sample_id!r}).")
        n_changed += int(res.n_changed)
        n_pixels += int(res.mask.size)
        for k, v in res.counters.items():
            counters[k] = counters.get(k, 0) + int(v)
        with atomic_path(dest / s.image_rel) as tmp:
            shutil.copyfile(s.image, tmp)
        msk_rel = f"masks/{s.sample_id}.png"
        atomic_write_bytes(dest / msk_rel, _encode_png(np.ascontiguousarray(res.mask), dest / msk_rel))
        record_mask(msk_rel, int(res.n_changed), int(res.mask.size))
        row = {"sample_id": s.sample_id, "image_path": s.image_rel, "mask_path": msk_rel, "split": s.split,
               "group": s.group, "height": h, "width": w, "source": s.source}
        row.update(dict(s.extra))
        rows.append(row)
    extra_cols = [c for c, _ in samples[0].extra] if samples else []
    index = pd.DataFrame(rows, columns=list(INDEX_COLUMNS) + extra_cols)
    return index, n_changed, n_pixels, counters


def apply_groups(samples: Sequence[Sample], groups_csv: str | os.PathLike | None, id_column: str | None,
                 group_column: str, notes: list[str], limited: bool = False) -> list[Sample]:
    """``samples`` with ``group`` set from the groups CSV (rows it does not list keep their group); a note
    says how many samples got a group. No CSV: ``samples`` unchanged. ``limited`` (a ``limit`` kept part of
    the source): CSV rows naming samples that are not converted are skipped instead of refused."""
    if not groups_csv:
        return list(samples)
    groups = read_groups_csv(groups_csv, group_keys(samples), id_column, group_column, skip_unknown=limited)
    notes.append(f"groups from {groups_csv} (column {group_column!r}): {sum(1 for v in groups.values() if v)} "
                 f"sample(s) given a group, {len(set(v for v in groups.values() if v))} distinct group(s)")
    return [replace(s, group=groups.get(s.sample_id, s.group)) for s in samples]


def carve_validation(index: pd.DataFrame, fraction: float, seed: int) -> tuple[pd.DataFrame, int]:
    """Move a seeded, group-aware share of the ``train`` rows to ``val`` (for releases with train/test only).

    Units are the non-empty ``group`` values (a whole group moves) and ungrouped rows; units are sorted by key,
    permuted with ``numpy.random.default_rng(seed)`` and taken in that order until the number of moved rows is
    closest to ``round(n_train * fraction)`` (at least one unit, at least one unit left for training).

    Args:
        index: index with ``split`` and ``group`` columns (modified copy returned).
        fraction: share of the train rows, in ``[0, 1)``; 0 leaves the index unchanged.
        seed: random seed.

    Returns:
        ``(new index, number of rows moved to val)``.

    Raises:
        MSBError: ``fraction`` outside ``[0, 1)``, or fewer than 2 train units while ``fraction > 0``.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 <= float(fraction) < 1.0:
        raise MSBError(f"val_fraction must be a number in [0, 1), got {fraction!r}.")
    index = index.copy()
    if fraction == 0:
        return index, 0
    train = np.flatnonzero(index["split"].to_numpy() == "train")
    if len(train) == 0:
        return index, 0
    g = index["group"].to_numpy()[train].astype(str)
    sid = index["sample_id"].to_numpy()[train].astype(str)
    keys = np.where(g != "", np.char.add("g:", g), np.char.add("s:", sid))
    units, unit_of = np.unique(keys, return_inverse=True)
    if len(units) < 2:
        raise MSBError(f"val_fraction={fraction} needs at least 2 training groups/samples; found {len(units)}. "
                       f"Use val_fraction=0.")
    order = np.random.default_rng(seed).permutation(len(units))
    cum = np.cumsum(np.bincount(unit_of, minlength=len(units))[order])
    target = round(len(train) * float(fraction))
    ks = np.arange(1, len(units))  # number of units taken: 1 .. n_units - 1
    k = int(ks[int(np.argmin(np.abs(cum[ks - 1] - target)))])
    chosen = np.zeros(len(units), bool)
    chosen[order[:k]] = True
    moved = train[chosen[unit_of]]
    index.loc[moved, "split"] = "val"
    return index, int(len(moved))


def copy_text_files(files: Iterable[tuple[Path, str]], dest: Path) -> list[str]:
    """Copy licence/attribution text files shipped with a release into ``dest`` (``(source, relative dest)``).

    Returns:
        The relative destinations written.
    """
    written = []
    for src, rel in files:
        with atomic_path(dest / rel) as tmp:
            shutil.copyfile(src, tmp)
        written.append(rel)
    return written


def open_rgb(path: Path) -> np.ndarray:
    """``(H, W, 3)`` ``uint8`` RGB pixels of an image file via PIL (EXIF orientation not applied).

    Raises:
        MSBError: missing or undecodable file.
    """
    try:
        with Image.open(path) as im:
            return np.asarray(im.convert("RGB"))
    except FileNotFoundError as e:
        raise MSBError(f"{path}: file not found.") from e
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise MSBError(f"{path}: cannot decode image ({e}). Replace the file.") from e
