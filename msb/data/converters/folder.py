"""Generic converter: an images folder + a masks folder -> prepared dataset.

Pairing rule
------------
* Files considered: names not starting with ``.`` whose extension (case-insensitive) is one of
  :data:`IMAGE_EXTENSIONS`; other files are ignored (counted in the notes).
* An image ``<stem>.<ext>`` pairs with the mask ``<stem><mask_suffix>.<any ext>`` in ``masks_dir``
  (stems compared exactly, case-sensitive). Example with ``mask_suffix="_mask"``: ``a.png`` <-> ``a_mask.png``
  (or ``a_mask.tif``). With ``mask_suffix=""`` the mask has the image's stem.
* ``sample_id`` = image stem. Two images with the same stem (``a.png``, ``a.jpg``) or two masks for one stem
  are an error. If ``images_dir`` and ``masks_dir`` are the same folder, files whose stem ends with
  ``mask_suffix`` are masks and the rest are images (``mask_suffix`` must then be non-empty).
* Unpaired images or masks are an error listing them, unless ``allow_unpaired=True`` (then skipped, noted).

Mask values
-----------
* ``threshold=None``: raw values are kept (masks re-encoded losslessly as PNG, 8 or 16 bit); ``classes.csv``
  gets class 0 = background (value 0) and one class per other observed value in ascending order, named
  ``class_<value>`` unless ``class_names`` maps the value to a name. JPEG masks are refused in this mode
  (lossy noise would become classes): pass a threshold. **Without ``class_names``, masks holding more than two
  distinct values in all are refused** (faint noise in greyscale masks would silently become classes): the
  error names the values seen and suggests ``--threshold 127``; declare multi-class masks with
  ``class_names={value: name}``, and then every observed non-zero value must be declared.
* ``threshold=t``: binarised, ``value > t`` -> 255, else 0; classes background (0) / ``foreground_name``
  (255). ``n_changed_mask_pixels`` counts pixels whose written value differs from the source value. Colour
  masks with unequal channels are reduced to the rounded channel mean in this mode (noted).

Images are byte-copied unchanged to ``images/<original name>``; masks are written to
``masks/<sample_id>.png``. ``split`` is empty (the run decides splits); ``group`` is empty unless a groups CSV
is given (``groups_csv``, ``group_id_column``, ``group_column``: :func:`msb.data.converters._common.read_groups_csv`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import cv2
import numpy as np
import pandas as pd
from PIL import Image, UnidentifiedImageError

from msb.data.schema import (INDEX_COLUMNS, ClassSpec, image_size, load_prepared_dataset, read_mask,
                             write_prepared_dataset)
from msb.data.converters.groups import group_keys, read_groups_csv
from msb.data.converters.provenance import record_mask
from msb.data.converters.staging import ConversionReport, staged_output
from msb.errors import MSBError
from msb.utils.atomic import atomic_path, atomic_write_bytes

#: extensions (lower case) of files treated as images/masks
IMAGE_EXTENSIONS: tuple[str, ...] = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")
_LOSSY = (".jpg", ".jpeg")
_MAX_LISTED = 10


@dataclass(frozen=True)
class Pair:
    """One image/mask pair found in the source.

    Attributes:
        sample_id: the image stem.
        image: source image file.
        mask: source mask file.
        group: value for the ``group`` column ('' = none).
    """

    sample_id: str
    image: Path
    mask: Path
    group: str = ""


def _listed(paths: Sequence[Any]) -> str:
    names = [str(p) for p in paths]
    s = ", ".join(names[:_MAX_LISTED])
    return s + (f" ... and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else "")


def _list_images(folder: Path) -> tuple[list[Path], int]:
    """Image-like files in ``folder`` sorted by name, and the count of ignored other files."""
    files, ignored = [], 0
    for p in sorted(folder.iterdir(), key=lambda p: p.name):
        if not p.is_file() or p.name.startswith("."):
            continue
        if p.suffix.lower() in IMAGE_EXTENSIONS:
            files.append(p)
        else:
            ignored += 1
    return files, ignored


def find_pairs(images_dir: str | os.PathLike, masks_dir: str | os.PathLike, mask_suffix: str = "",
               allow_unpaired: bool = False) -> tuple[list[Pair], list[str]]:
    """Pair image and mask files by the rule in the module docstring.

    Args:
        images_dir: folder of images.
        masks_dir: folder of masks (may equal ``images_dir`` when ``mask_suffix`` is non-empty).
        mask_suffix: text between the image stem and the mask extension (e.g. ``"_mask"``).
        allow_unpaired: skip unpaired files instead of raising.

    Returns:
        ``(pairs sorted by sample_id, notes)``.

    Raises:
        MSBError: missing folders, duplicate stems, ambiguous masks, unpaired files (unless allowed), no pairs.
    """
    images_dir, masks_dir = Path(images_dir), Path(masks_dir)
    for kind, d in (("images", images_dir), ("masks", masks_dir)):
        if not d.is_dir():
            raise MSBError(f"{kind} folder {d} not found; check --source and the {kind}_dir option.")
    same = images_dir.resolve() == masks_dir.resolve()
    if same and not mask_suffix:
        raise MSBError(f"images and masks are in the same folder {images_dir} but mask_suffix is empty; set "
                       f"mask_suffix (e.g. '_mask') so masks can be told apart from images.")
    notes: list[str] = []
    img_files, ign_i = _list_images(images_dir)
    msk_files, ign_m = (img_files, 0) if same else _list_images(masks_dir)
    if same:
        msk_files = [p for p in img_files if p.stem.endswith(mask_suffix)]
        img_files = [p for p in img_files if not p.stem.endswith(mask_suffix)]
    if ign_i or ign_m:
        notes.append(f"ignored {ign_i + ign_m} non-image file(s) (extensions other than {', '.join(IMAGE_EXTENSIONS)})")

    images: dict[str, Path] = {}
    dups = []
    for p in img_files:
        if p.stem in images:
            dups.append(f"{images[p.stem].name} / {p.name}")
        images[p.stem] = p
    if dups:
        raise MSBError(f"{images_dir}: several images share a stem (the sample_id): {_listed(dups)}. Rename or remove "
                       f"the duplicates.")
    masks: dict[str, Path] = {}
    bad_masks, amb = [], []
    for p in msk_files:
        if mask_suffix and not p.stem.endswith(mask_suffix):
            bad_masks.append(p)
            continue
        key = p.stem[: len(p.stem) - len(mask_suffix)] if mask_suffix else p.stem
        if key in masks:
            amb.append(f"{masks[key].name} / {p.name}")
        masks[key] = p
    if amb:
        raise MSBError(f"{masks_dir}: several mask files match one image stem: {_listed(amb)}. Keep one mask per "
                       f"image (merge multi-lesion masks first).")
    no_mask = [images[s] for s in sorted(images) if s not in masks]
    no_image = sorted([masks[k] for k in masks if k not in images] + bad_masks, key=lambda p: p.name)
    if (no_mask or no_image) and not allow_unpaired:
        parts = []
        if no_mask:
            parts.append(f"{len(no_mask)} image(s) without a mask '<stem>{mask_suffix}.<ext>' in {masks_dir}: "
                         f"{_listed([p.name for p in no_mask])}")
        if no_image:
            parts.append(f"{len(no_image)} mask(s) without an image in {images_dir}: "
                         f"{_listed([p.name for p in no_image])}")
        raise MSBError("unpaired files: " + "; ".join(parts) + ". Fix the file names or mask_suffix, or pass "
                       "allow_unpaired=True to skip them.")
    if no_mask:
        notes.append(f"skipped {len(no_mask)} image(s) without a mask: {_listed([p.name for p in no_mask])}")
    if no_image:
        notes.append(f"skipped {len(no_image)} mask(s) without an image: {_listed([p.name for p in no_image])}")
    pairs = [Pair(s, images[s], masks[s]) for s in sorted(images) if s in masks]
    if not pairs:
        raise MSBError(f"no image/mask pairs found in {images_dir} and {masks_dir} (mask_suffix={mask_suffix!r}). "
                       f"Check the folders and the pairing rule.")
    return pairs, notes


def _read_source_mask(path: Path, binarise: bool) -> tuple[np.ndarray, bool]:
    """Raw mask values ``(H, W)``; in binarise mode colour masks with unequal channels give the rounded mean.

    Returns ``(raw, reduced)`` where ``reduced`` says the channel mean was used.
    """
    try:
        return read_mask(path), False
    except MSBError as err:
        if not binarise:
            raise
        try:
            with Image.open(path) as im:
                if im.mode not in ("RGB", "RGBA"):
                    raise err
                arr = np.asarray(im)
        except (UnidentifiedImageError, OSError, ValueError):
            raise err from None
        if arr.shape[-1] == 4 and not np.all(arr[..., 3] == 255):
            raise err
        return np.rint(arr[..., :3].astype(np.float32).mean(axis=-1)).astype(np.uint8), True


def _encode_png(mask: np.ndarray, path: Path) -> bytes:
    ok, buf = cv2.imencode(".png", mask, [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:  # pragma: no cover
        raise MSBError(f"{path}: could not encode mask as PNG.")
    return buf.tobytes()


def _check_values(values: set[int], class_names: Mapping[int, str] | None, pairs: Sequence[Pair]) -> None:
    """Refuse noisy or undeclared mask values (``threshold=None``; module docstring)."""
    seen = sorted(values)
    shown = ", ".join(map(str, seen[:12])) + (f", ... ({len(seen)} values)" if len(seen) > 12 else "")
    folder = pairs[0].mask.parent if pairs else "the masks folder"
    if class_names is None and len(seen) > 2:
        raise MSBError(f"masks in {folder} hold {len(seen)} distinct values ({shown}); a binary mask has two. Pass "
                       f"--threshold 127 (value > 127 -> foreground) to binarise them, or declare the classes with "
                       f"--option class_names='{{1: name1, 2: name2}}'.")
    if class_names is not None:
        extra = sorted(values - {0} - {int(k) for k in class_names})
        if extra:
            raise MSBError(f"masks in {folder} hold value(s) {', '.join(map(str, extra[:12]))} not in class_names "
                           f"{dict(class_names)} (values seen: {shown}); add them to class_names, or pass "
                           f"--threshold 127 to binarise.")


def convert_pairs(pairs: Sequence[Pair], dest: Path, *, threshold: float | None, source_label: str,
                  foreground_name: str = "foreground", class_names: Mapping[int, str] | None = None
                  ) -> tuple[pd.DataFrame, list[ClassSpec], int, int, list[str]]:
    """Copy images and write masks of ``pairs`` into ``dest`` (a staging folder) and build the index/classes.

    Args:
        pairs: the pairs (``sample_id`` must be unique).
        dest: folder to write ``images/`` and ``masks/`` into.
        threshold: ``None`` keeps raw values; a number binarises (``value > threshold`` -> 255).
        source_label: value of the ``source`` column.
        foreground_name: class name of value 255 in binarise mode.
        class_names: raw value -> class name, for ``threshold=None``.

    Returns:
        ``(index DataFrame, classes, n_changed_mask_pixels, n_mask_pixels, notes)``.

    Raises:
        MSBError: unreadable image/mask, image/mask size mismatch (naming both files), JPEG masks without a
            threshold, mask values outside 16 bit, no foreground value in any mask (``threshold=None``).
    """
    (dest / "images").mkdir(parents=True, exist_ok=True)
    (dest / "masks").mkdir(parents=True, exist_ok=True)
    binarise = threshold is not None
    if not binarise:
        lossy = [p.mask.name for p in pairs if p.mask.suffix.lower() in _LOSSY]
        if lossy:
            raise MSBError(f"{len(lossy)} mask(s) are JPEG (lossy): {_listed(lossy)}; their compression noise would "
                           f"become classes. Pass a threshold (e.g. threshold=127) to binarise them.")
    rows, values = [], set()
    n_changed = n_pixels = n_reduced = 0
    for pair in pairs:
        h, w = image_size(pair.image)
        raw, reduced = _read_source_mask(pair.mask, binarise)
        n_reduced += int(reduced)
        if raw.shape != (h, w):
            raise MSBError(f"image {pair.image} is {h}x{w} (HxW) but its mask {pair.mask} is "
                           f"{raw.shape[0]}x{raw.shape[1]}; image and mask must have the same size. Fix or remove "
                           f"this pair (sample_id {pair.sample_id!r}).")
        changed = 0
        if binarise:
            out = np.where(raw > threshold, np.uint8(255), np.uint8(0))
            changed = int(np.count_nonzero(out != raw))
            n_changed += changed
        else:
            if raw.size and (int(raw.min()) < 0 or int(raw.max()) > 65535):
                raise MSBError(f"{pair.mask}: mask values outside [0, 65535]; use 8/16-bit masks.")
            out = raw.astype(np.uint8) if (raw.size == 0 or int(raw.max()) <= 255) else raw.astype(np.uint16)
            values.update(int(v) for v in np.unique(out))
        n_pixels += int(raw.size)
        img_rel = f"images/{pair.image.name}"
        msk_rel = f"masks/{pair.sample_id}.png"
        with atomic_path(dest / img_rel) as tmp:
            shutil.copyfile(pair.image, tmp)
        atomic_write_bytes(dest / msk_rel, _encode_png(out, dest / msk_rel))
        record_mask(msk_rel, changed, int(raw.size))
        rows.append({"sample_id": pair.sample_id, "image_path": img_rel, "mask_path": msk_rel, "split": "",
                     "group": pair.group, "height": h, "width": w, "source": source_label})
    notes: list[str] = []
    if binarise:
        classes = [ClassSpec(0, "background", (0,)), ClassSpec(1, foreground_name, (255,))]
        notes.append(f"masks binarised: value > {threshold} -> 255, else 0; {n_changed} of {n_pixels} mask pixels "
                     f"changed value")
        if n_reduced:
            notes.append(f"{n_reduced} colour mask(s) had unequal R/G/B channels; their rounded channel mean was "
                         f"thresholded")
    else:
        names = dict(class_names or {})
        _check_values(values, class_names, pairs)
        fg = sorted((values | set(int(k) for k in names)) - {0})
        if not fg:
            raise MSBError("every mask contains only the value 0 (no foreground); nothing to segment. Check the "
                           "masks, or pass class_names={value: name} to declare the foreground classes.")
        classes = [ClassSpec(0, names.get(0, "background"), (0,))]
        classes += [ClassSpec(i + 1, names.get(v, f"class_{v}"), (v,)) for i, v in enumerate(fg)]
        notes.append(f"mask values kept unchanged; classes from observed values: "
                     f"{', '.join(f'{c.source_values[0]}->{c.name}' for c in classes)}")
    index = pd.DataFrame(rows, columns=list(INDEX_COLUMNS))
    return index, classes, n_changed, n_pixels, notes


def convert_folder(source: str | os.PathLike, out: str | os.PathLike, *, images_dir: str = "images",
                   masks_dir: str = "masks", mask_suffix: str = "", threshold: float | None = None,
                   allow_unpaired: bool = False, class_names: Mapping[int, str] | None = None,
                   foreground_name: str = "foreground", source_label: str | None = None,
                   limit: int | None = None, groups_csv: str | None = None, group_id_column: str | None = None,
                   group_column: str = "group", overwrite: bool = False) -> ConversionReport:
    """Convert an images folder + masks folder into a prepared dataset at ``out``.

    Args:
        source: base folder; ``images_dir``/``masks_dir`` are relative to it (or absolute).
        out: destination folder (built in a temporary sibling and renamed at the end).
        images_dir: image folder.
        masks_dir: mask folder (may be the same as ``images_dir`` with a non-empty ``mask_suffix``).
        mask_suffix: image ``a.png`` pairs with mask ``a<mask_suffix>.<any ext>``.
        threshold: ``None`` keeps mask values (classes from observed values); a number binarises
            (``value > threshold`` -> 255).
        allow_unpaired: skip unpaired files (listed in the notes) instead of raising.
        class_names: raw value -> class name (``threshold=None`` only).
        foreground_name: name of the foreground class in binarise mode.
        source_label: ``source`` column value (default: the source folder's name).
        limit: keep only the first ``limit`` pairs by sorted ``sample_id`` (quick tests).
        groups_csv: optional groups CSV (:func:`msb.data.converters._common.read_groups_csv`).
        group_id_column: its key column (default ``sample_id``, else ``image``).
        group_column: its group column (default ``group``).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport`.

    Raises:
        MSBError: see :func:`find_pairs` and :func:`convert_pairs` (noisy masks without a threshold or class
            list); bad ``limit`` or groups CSV; existing output. On error no
            output folder or temporary folder is left.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the folder that holds {images_dir}/ and {masks_dir}/.")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise MSBError(f"limit must be a positive integer or None, got {limit!r}.")
    pairs, notes = find_pairs(source / images_dir, source / masks_dir, mask_suffix, allow_unpaired)
    if limit is not None and limit < len(pairs):
        notes.append(f"limit={limit}: kept the first {limit} of {len(pairs)} pairs by sample_id")
        pairs = pairs[:limit]
    if groups_csv:
        groups = read_groups_csv(groups_csv, group_keys(pairs), group_id_column, group_column,  # type: ignore[arg-type]
                                 skip_unknown=limit is not None)
        pairs = [Pair(p.sample_id, p.image, p.mask, groups.get(p.sample_id, p.group)) for p in pairs]
        notes.append(f"groups from {groups_csv} (column {group_column!r}): {sum(1 for v in groups.values() if v)} "
                     f"sample(s) given a group")
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, classes, n_changed, n_pixels, more = convert_pairs(
            pairs, tmp, threshold=threshold, source_label=source_label or source.resolve().name,
            foreground_name=foreground_name, class_names=class_names)
        write_prepared_dataset(tmp, index, classes)
        load_prepared_dataset(tmp, check_files=True)
    out_path = Path(out).expanduser().absolute()
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes + more, out=out_path,
                            name="folder", n_mask_pixels=n_pixels)
