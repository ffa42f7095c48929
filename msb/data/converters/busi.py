"""BUSI (Breast Ultrasound Images) converter: one lesion mask file per lesion, merged into one binary mask.

Citation: Al-Dhabyani W., Gomaa M., Khaled H., Fahmy A. "Dataset of breast ultrasound images." Data in Brief 28
(2020) 104863. https://doi.org/10.1016/j.dib.2019.104863
Official URL: https://scholar.cu.edu.eg/?q=afahmy/pages/dataset (mirrored on Kaggle as "Breast Ultrasound Images
Dataset").
Licence: public dataset, open-access article; cite it and check the terms of the distribution you use before any
commercial use or redistribution.

Source layouts (found by walking ``--source`` recursively, so all of these work): the official
``Dataset_BUSI_with_GT/<class>/<class> (<k>).png`` with masks ``<class> (<k>)_mask.png`` (and
``_mask_1.png``, ``_mask_2.png``, one per extra lesion) in the same folder; per-class ``images/`` + ``mask/``
sub-folders; or a flat ``images/`` + ``masks/`` folder (the shared subset). A file whose stem ends in
``_mask`` or ``_mask_<j>`` is a mask of the image with the stem before it; every other PNG is an image.

What the converter writes:

* ``sample_id`` = the image stem (``benign (3)``; names keep their spaces and parentheses); rows in natural
  order; images byte-copied to ``images/<name>``; ``source`` = ``busi``; ``split`` empty;
* extra column ``diagnosis`` = ``benign``/``malignant``/``normal`` (the file-name prefix; empty if none);
* mask = **union** over the image's mask files of ``value > 0`` (1-bit ``{0,1}``, grey/RGB/RGBA ``{0,255}``
  encodings all occur), written as PNG ``{0, 255}``; normal images get an all-zero mask (empty reference);
* ``n_changed_mask_pixels`` = lesion pixels of the union that are *not* lesion in the primary ``_mask.png``
  (pixels contributed by the extra lesion files); the value re-encoding ``1 -> 255`` is not counted;
* ``group``: from ``<source>/index.csv`` when it has ``image`` and ``near_dup_group`` columns (the shared
  subset), else from ``groups_csv`` (``sample_id`` or ``image``, ``group``), else empty (BUSI has no patient
  ids; run ``msb audit`` and use ``--apply-clusters``);
* ``exclude_label_conflicts`` (default True) drops the 19 images that are near-identical across diagnosis
  classes (:data:`LABEL_CONFLICTS`, listed in the shared PROVENANCE.md), when present.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.converters._common import (MaskResult, Sample, apply_groups, check_limit, listed, natural_key,
                                         read_grey_mask, write_samples)
from msb.data.schema import ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError

SOURCE_LABEL = "busi"
DIAGNOSES = ("benign", "malignant", "normal")
_MASK_RE = re.compile(r"^(?P<stem>.+?)_mask(?:_(?P<j>\d+))?$")
#: images near-identical across diagnosis classes (NCC >= 0.94), excluded by default
LABEL_CONFLICTS: frozenset[str] = frozenset(
    [f"benign ({k})" for k in (42, 131, 85, 164, 269, 333, 399, 406, 433, 435, 437)]
    + [f"malignant ({k})" for k in (51, 52, 77, 93, 94, 145)] + [f"normal ({k})" for k in (1, 34)])


def diagnosis_of(stem: str) -> str:
    """``benign``/``malignant``/``normal`` from a BUSI file stem (``'benign (3)'``), or ``''``."""
    m = re.match(r"^(benign|malignant|normal)\b", stem.strip().lower())
    return m.group(1) if m else ""


def find_busi_files(source: Path) -> tuple[dict[str, Path], dict[str, list[Path]]]:
    """Walk ``source`` for PNG images and masks.

    Returns:
        ``(image stem -> image file, image stem -> mask files sorted primary first then by index)``.

    Raises:
        MSBError: two images with the same stem, or no images at all.
    """
    images: dict[str, Path] = {}
    masks: dict[str, list[tuple[int, Path]]] = {}
    dups = []
    for p in sorted(source.rglob("*"), key=lambda p: str(p)):
        if not p.is_file() or p.suffix.lower() != ".png" or any(part.startswith(".") for part in
                                                                 p.relative_to(source).parts):
            continue
        m = _MASK_RE.match(p.stem)
        if m:
            masks.setdefault(m.group("stem"), []).append((int(m.group("j")) if m.group("j") else -1, p))
        elif p.stem in images:
            dups.append(f"{images[p.stem]} / {p}")
        else:
            images[p.stem] = p
    if dups:
        raise MSBError(f"{source}: several images share a stem (the sample_id): {listed(dups)}. Keep one copy.")
    if not images:
        raise MSBError(f"{source}: no BUSI PNG images found (expected e.g. 'benign (1).png' with "
                       f"'benign (1)_mask.png'); --source must be the Dataset_BUSI_with_GT folder.")
    return images, {k: [p for _, p in sorted(v, key=lambda t: t[0])] for k, v in masks.items()}


def _union_mask(sample: Sample) -> MaskResult:
    """Union of ``value > 0`` over the mask files; ``n_changed`` = union pixels absent from the primary mask."""
    union = None
    primary = None
    reduced = 0
    for k, path in enumerate(sample.masks):
        raw, red = read_grey_mask(path)
        reduced += int(red)
        fg = raw > 0
        if union is None:
            union, primary = fg.copy(), fg
        elif fg.shape != union.shape:
            raise MSBError(f"{path} is {fg.shape[0]}x{fg.shape[1]} (HxW) but {sample.masks[0]} is "
                           f"{union.shape[0]}x{union.shape[1]}; all mask files of sample_id {sample.sample_id!r} "
                           f"must have the image's size.")
        else:
            union |= fg
    assert union is not None and primary is not None
    return MaskResult(np.where(union, np.uint8(255), np.uint8(0)), int(np.count_nonzero(union & ~primary)),
                      {"multi_mask_images": int(len(sample.masks) > 1), "colour_masks": reduced})


def _shared_groups(source: Path, images: dict[str, Path]) -> dict[str, str] | None:
    f = source / "index.csv"
    if not f.is_file():
        return None
    try:
        df = pd.read_csv(f, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError):
        return None
    if not {"image", "near_dup_group"} <= set(df.columns):
        return None
    by_name = {p.name: stem for stem, p in images.items()}
    return {by_name[n]: g.strip() for n, g in zip(df["image"], df["near_dup_group"]) if n in by_name}


def convert_busi(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                 exclude_label_conflicts: bool = True, groups_csv: str | None = None,
                 group_id_column: str | None = None, group_column: str = "group",
                 overwrite: bool = False) -> ConversionReport:
    """Convert a BUSI download (any of the layouts in the module docstring) into a prepared dataset at ``out``.

    Args:
        source: the BUSI folder (e.g. ``Dataset_BUSI_with_GT``).
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        limit: keep the first ``limit`` images in natural name order (after exclusions).
        exclude_label_conflicts: drop :data:`LABEL_CONFLICTS` images when present.
        groups_csv: optional groups CSV; replaces ``<source>/index.csv``'s groups.
        group_id_column: its key column (default ``sample_id``, else ``image``).
        group_column: its group column (default ``group``).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport` (changed pixels = lesion pixels added by extra mask files).

    Raises:
        MSBError: no images, duplicate stems, images without a mask file, masks without an image, unreadable
            files, size mismatch between an image and any of its masks. Nothing is left at ``out`` after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the BUSI folder (Dataset_BUSI_with_GT).")
    check_limit(limit)
    images, masks = find_busi_files(source)
    no_mask = sorted((images[s].name for s in images if s not in masks), key=natural_key)
    no_image = sorted((p.name for s, ps in masks.items() if s not in images for p in ps), key=natural_key)
    if no_mask or no_image:
        parts = []
        if no_mask:
            parts.append(f"{len(no_mask)} image(s) without a '<stem>_mask.png': {listed(no_mask)}")
        if no_image:
            parts.append(f"{len(no_image)} mask(s) without an image: {listed(no_image)}")
        raise MSBError(f"{source}: unpaired files: " + "; ".join(parts) + ". Restore the missing files or remove "
                       "the orphans.")
    notes: list[str] = []
    stems = sorted(images, key=natural_key)
    if exclude_label_conflicts:
        dropped = [s for s in stems if s in LABEL_CONFLICTS]
        stems = [s for s in stems if s not in LABEL_CONFLICTS]
        notes.append(f"exclude_label_conflicts: dropped {len(dropped)} of the {len(LABEL_CONFLICTS)} images that are "
                     f"near-identical across diagnosis classes" + (f" ({listed(dropped)})" if dropped else ""))
    if limit is not None and limit < len(stems):
        notes.append(f"limit={limit}: kept the first {limit} of {len(stems)} images")
        stems = stems[:limit]
    groups: dict[str, str] = {}
    if not groups_csv:
        shared = _shared_groups(source, images)
        if shared is not None:
            groups = shared
            notes.append(f"groups from {source / 'index.csv'} (near_dup_group)")
        else:
            notes.append("no patient ids in BUSI: group is empty; near-duplicates are common (run `msb audit`, then "
                         "`--apply-clusters`)")
    samples = [Sample(s, images[s], tuple(masks[s]), f"images/{images[s].name}", "", groups.get(s, ""),
                      SOURCE_LABEL, (("diagnosis", diagnosis_of(s)),)) for s in stems]
    samples = apply_groups(samples, groups_csv, group_id_column, group_column, notes,
                           limited=limit is not None or exclude_label_conflicts)
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, n_changed, n_pixels, counters = write_samples(samples, tmp, _union_mask)
        write_prepared_dataset(tmp, index, [ClassSpec(0, "background", (0,)), ClassSpec(1, "lesion", (255,))])
        load_prepared_dataset(tmp, check_files=True)
    counts = index["diagnosis"].value_counts()
    notes.insert(0, "diagnosis: " + ", ".join(f"{d}={int(counts.get(d, 0))}" for d in DIAGNOSES))
    notes.append(f"{counters.get('multi_mask_images', 0)} image(s) have several mask files (one per lesion): "
                 f"merged by union; {n_changed:,} lesion pixel(s) come from the extra files")
    n_empty = int((index["diagnosis"] == "normal").sum())
    notes.append(f"{n_empty} normal image(s) have an empty reference mask (Dice/IoU undefined when the prediction "
                 f"is empty too)")
    if counters.get("colour_masks"):
        notes.append(f"{counters['colour_masks']} colour mask(s) with unequal channels: channel mean > 0 used")
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes,
                            out=Path(out).expanduser().absolute(), name="busi", n_mask_pixels=n_pixels,
                            headline="Merging the extra lesion mask files (<stem>_mask_<j>.png, by union) added {n:,} "
                                     "lesion pixels to the primary masks ({pct:.3f} % of {total:,} mask pixels).")


__all__ = ["convert_busi", "LABEL_CONFLICTS", "diagnosis_of", "find_busi_files"]
