"""BKAI-IGH NeoPolyp(-Small) converter: colonoscopy frames with colour-coded masks -> three classes.

Citation: Lan P.N., An N.S., Hang D.V., Long D.V., Trung T.Q., Thuy N.T., Sang D.V. "NeoUNet: Towards Accurate
Colon Polyp Segmentation and Neoplasm Detection." Advances in Visual Computing (ISVC 2021), LNCS 13018.
arXiv:2107.05023.
Official URL: https://www.kaggle.com/competitions/bkai-igh-neopolyp/data (BKAI-IGH NeoPolyp-Small: 1000 training
frames with masks, 200 test frames without).
Licence: released for the BKAI-IGH NeoPolyp Kaggle competition; the competition's rules/data page states the
terms (accept them on Kaggle; research use, cite the article). Not verified here: check before redistribution.

Source layouts: the Kaggle zip, ``train/train/<id>.jpeg`` images and ``train_gt/train_gt/<id>.jpeg`` colour
masks with the same names (the doubled folder level is optional; ``test/test/``, without masks, is skipped and
counted in the notes); or the common ``images/ + masks/`` layout (e.g. the shared 120-pair subset).

Colour code (official): **red = neoplastic polyp, green = non-neoplastic polyp**, black = background. The masks
are lossy JPEGs, so each pixel is classified from its red (R) and green (G) channel with ``threshold`` t
(default 127; the blue channel is ignored):

======================== ===============================================
rule                     prepared mask value / class
======================== ===============================================
R > t and G <= t         1 ``neoplastic``
G > t and R <= t         2 ``non_neoplastic``
R > t and G > t          1 if R >= G else 2 (counted as *ambiguous*)
otherwise                0 ``background``
======================== ===============================================

Written as PNG with values ``{0, 1, 2}`` (``classes.csv``: 0 background [0], 1 neoplastic [1],
2 non_neoplastic [2]). ``n_changed_mask_pixels`` = pixels whose source colour is not exactly one of
``(0,0,0)``, ``(255,0,0)``, ``(0,255,0)`` (their class came from the threshold rule). ``sample_id`` = image
stem, ``source`` = ``bkai-igh-neopolyp``, ``split`` empty (the 200 official test frames have no public masks),
``group`` empty (no patient/video ids; ``groups_csv`` accepted). ``merge_polyp_classes=True`` writes one
``polyp`` class (255) instead (0 background, 255 where class 1 or 2).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.converters._common import (MaskResult, Sample, apply_groups, check_limit, check_threshold,
                                         descend_same_name, find_child, list_images, natural_key, open_rgb,
                                         write_samples)
from msb.data.converters.layouts import images_masks_layout
from msb.data.converters.folder import find_pairs
from msb.data.schema import ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError

SOURCE_LABEL = "bkai-igh-neopolyp"
DEFAULT_THRESHOLD = 127
CLASSES = [ClassSpec(0, "background", (0,)), ClassSpec(1, "neoplastic", (1,)), ClassSpec(2, "non_neoplastic", (2,))]
#: classes with ``merge_polyp_classes=True``
MERGED_CLASSES = [ClassSpec(0, "background", (0,)), ClassSpec(1, "polyp", (255,))]
_PURE = np.array([[0, 0, 0], [255, 0, 0], [0, 255, 0]], dtype=np.uint8)


def classify_colour_mask(rgb: np.ndarray, threshold: float = DEFAULT_THRESHOLD) -> tuple[np.ndarray, int, int]:
    """Turn a red/green colour mask into class values by the rule in the module docstring.

    Args:
        rgb: ``(H, W, 3)`` ``uint8`` RGB mask.
        threshold: channel threshold t (``> t`` is "on").

    Returns:
        ``(labels (H, W) uint8 in {0, 1, 2}, n_not_pure, n_ambiguous)`` where ``n_not_pure`` counts pixels not
        exactly black/red/green and ``n_ambiguous`` pixels with both R and G above t.
    """
    r = rgb[..., 0].astype(np.int16)
    g = rgb[..., 1].astype(np.int16)
    r_on, g_on = r > threshold, g > threshold
    both = r_on & g_on
    red = (r_on & ~g_on) | (both & (r >= g))
    green = (g_on & ~r_on) | (both & (g > r))
    labels = np.zeros(rgb.shape[:2], np.uint8)
    labels[red] = 1
    labels[green] = 2
    pure = np.zeros(rgb.shape[:2], bool)
    for colour in _PURE:
        pure |= np.all(rgb == colour, axis=-1)
    return labels, int(np.count_nonzero(~pure)), int(np.count_nonzero(both))


def convert_bkai_neopolyp(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                          threshold: float = DEFAULT_THRESHOLD, groups_csv: str | None = None,
                          group_id_column: str | None = None, group_column: str = "group",
                          merge_polyp_classes: bool = False, overwrite: bool = False) -> ConversionReport:
    """Convert the BKAI-IGH NeoPolyp Kaggle release into a three-class prepared dataset at ``out``.

    Args:
        source: folder holding ``train/`` and ``train_gt/`` (``test/`` is ignored).
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        limit: keep the first ``limit`` pairs in natural name order.
        threshold: colour channel threshold t (default 127).
        groups_csv: optional groups CSV (e.g. the shared subset's ``index.csv`` with ``group_id_column="image"``,
            ``group_column="near_dup_group"``).
        group_id_column: its key column (default ``sample_id``, else ``image``).
        group_column: its group column (default ``group``).
        merge_polyp_classes: write one ``polyp`` class (value 255) = neoplastic or non-neoplastic, i.e.
            ``R > t or G > t`` (the shared PROVENANCE.md's ``max(R, G) > 127``), instead of the two classes.
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport` (changed pixels = pixels not exactly black/red/green).

    Raises:
        MSBError: neither ``train/`` + ``train_gt/`` nor ``images/`` + ``masks/`` found, unpaired files,
            unreadable files, size mismatch, bad options. Nothing is left at ``out`` after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the BKAI-IGH NeoPolyp folder holding train/ and "
                       f"train_gt/.")
    check_limit(limit)
    check_threshold(threshold)
    img_dir, gt_dir = find_child(source, ("train",)), find_child(source, ("train_gt",))
    if img_dir is not None and gt_dir is not None:
        pairs, notes = find_pairs(descend_same_name(img_dir), descend_same_name(gt_dir))
        notes.insert(0, "layout: official (train/ + train_gt/)")
    elif (layout := images_masks_layout(source, ("bkai-igh-neopolyp",))) is not None:
        part = layout.parts[0]
        pairs, notes = find_pairs(part.images, part.masks)
        notes.insert(0, f"layout: images-masks ({part.label})")
    else:
        raise MSBError(f"{source}: needs train/ (images) and train_gt/ (colour masks), or images/ + masks/; found "
                       f"{sorted(p.name for p in source.iterdir() if p.is_dir())}. --source must be the unzipped "
                       f"bkai-igh-neopolyp folder.")
    pairs = sorted(pairs, key=lambda p: natural_key(p.sample_id))
    if limit is not None and limit < len(pairs):
        notes.append(f"limit={limit}: kept the first {limit} of {len(pairs)} pairs")
        pairs = pairs[:limit]
    test_dir = find_child(source, ("test",))
    if test_dir is not None:
        notes.append(f"skipped {len(list_images(descend_same_name(test_dir)))} test image(s) in {test_dir.name}/: "
                     f"their masks are not public")
    samples = [Sample(p.sample_id, p.image, (p.mask,), f"images/{p.image.name}", "", "", SOURCE_LABEL) for p in pairs]
    samples = apply_groups(samples, groups_csv, group_id_column, group_column, notes,
                           limited=limit is not None)

    def mask_fn(sample: Sample) -> MaskResult:
        labels, not_pure, ambiguous = classify_colour_mask(open_rgb(sample.masks[0]), threshold)
        written = np.where(labels > 0, np.uint8(255), np.uint8(0)) if merge_polyp_classes else labels
        return MaskResult(written, not_pure, {"ambiguous": ambiguous, "neoplastic": int((labels == 1).sum()),
                                             "non_neoplastic": int((labels == 2).sum())})

    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, n_changed, n_pixels, counters = write_samples(samples, tmp, mask_fn)
        write_prepared_dataset(tmp, index, MERGED_CLASSES if merge_polyp_classes else CLASSES)
        load_prepared_dataset(tmp, check_files=True)
    notes.append(f"colour masks classified with threshold {threshold:g} on R and G (red -> 1 neoplastic, green -> 2 "
                 f"non_neoplastic): {counters.get('neoplastic', 0):,} neoplastic and "
                 f"{counters.get('non_neoplastic', 0):,} non-neoplastic pixels; {counters.get('ambiguous', 0):,} "
                 f"pixel(s) had both R and G above the threshold (assigned to the larger channel)")
    if merge_polyp_classes:
        notes.append("merge_polyp_classes: both classes written as one polyp class (value 255)")
    if not groups_csv:
        notes.append("no patient/video ids: group is empty; run `msb audit` before splitting")
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes,
                            out=Path(out).expanduser().absolute(), name="bkai-igh-neopolyp", n_mask_pixels=n_pixels,
                            headline="The colour rule classified {n:,} of {total:,} mask pixels that are not exactly "
                                     "black, red or green ({pct:.3f} %).")


__all__ = ["convert_bkai_neopolyp", "classify_colour_mask", "CLASSES"]
