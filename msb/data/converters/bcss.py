"""BCSS (Breast Cancer Semantic Segmentation) converter: multi-class pathology masks -> a declared class map.

Citation: Amgad M., Elfandy H., Hussein H., et al. "Structured crowdsourcing enables convolutional segmentation
of histology images." Bioinformatics 35(18) (2019) 3461-3467. https://doi.org/10.1093/bioinformatics/btz083
Official URL: https://github.com/PathologyDataScience/BCSS (download scripts, ``meta/gtruth_codes.tsv``).
Licence: the data is distributed as CC0 1.0 according to the BCSS README and its mirrors; the repository's
LICENSE file (MIT) covers the download code. Check the current README before redistribution.

The release: 151 regions of interest (ROIs) from TCGA breast-cancer H&E whole-slide images, one PNG mask per
ROI whose pixel values are the ground-truth codes of :data:`GT_CODES` (``0`` = outside the ROI, "don't care";
``1`` = tumor, ``2`` = stroma, ...). File names start with the TCGA slide name (``TCGA-A1-A0SK-DX1_xmin..``),
whose first three fields are the patient. Semi-supervised papers tile the ROIs into patches (e.g. 224x224);
the converter accepts ROIs or patches alike.

Source layout: ``<source>/images/`` (also ``rgbs_colorNormalized/`` or ``rgbs/`` of the official download) and
``<source>/masks/``, an image and its mask sharing the file stem.

What the converter writes:

* ``sample_id`` = the stem; images byte-copied to ``images/<name>``; ``source`` = ``bcss``; ``split`` empty;
* the mask through the **declared class map** ``foreground`` (default ``{"tumour": [1]}``: the binary task
  tumour vs rest): class k (in the order given) gets the prepared value k, every other code is background
  (class 0, "rest"). For example ``{"tumour": [1, 19, 20], "stroma": [2]}`` gives a 3-class dataset with
  angioinvasion and DCIS counted as tumour. The map is written to ``classes.csv`` (names) and
  ``bcss_class_map.json`` (codes), so a run records which task it solved;
* code 0 (outside the ROI) is not a tissue class: it is written as background and counted as changed pixels
  (``n_changed_mask_pixels`` = outside-ROI pixels given the background label); ``max_outside_roi_fraction``
  drops images with a larger share of it (default 1.0: keep all);
* ``group`` = the TCGA patient (``TCGA-XX-YYYY``; empty when the name has no TCGA prefix), so patches of one
  patient never straddle a split; extra columns ``patient`` and ``outside_roi_fraction``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from msb.data.converters._common import (MaskResult, Sample, check_limit, find_child, list_images, listed,
                                         natural_key, read_grey_mask, write_samples)
from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.schema import ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text

__all__ = ["GT_CODES", "DEFAULT_FOREGROUND", "convert_bcss", "patient_of", "resolve_class_map"]

SOURCE_LABEL = "bcss"
#: BCSS ground-truth codes (``meta/gtruth_codes.tsv`` of PathologyDataScience/BCSS)
GT_CODES: dict[int, str] = {
    0: "outside_roi", 1: "tumor", 2: "stroma", 3: "lymphocytic_infiltrate", 4: "necrosis_or_debris",
    5: "glandular_secretions", 6: "blood", 7: "exclude", 8: "metaplasia_NOS", 9: "fat", 10: "plasma_cells",
    11: "other_immune_infiltrate", 12: "mucoid_material", 13: "normal_acinus_or_duct", 14: "lymphatics",
    15: "undetermined", 16: "nerve", 17: "skin_adnexa", 18: "blood_vessel", 19: "angioinvasion", 20: "dcis",
    21: "other"}
OUTSIDE_ROI = 0
#: the binary task of semi-supervised cards: tumour vs rest
DEFAULT_FOREGROUND: dict[str, list[int]] = {"tumour": [1]}
_PATIENT_RE = re.compile(r"^(TCGA-[A-Za-z0-9]{2}-[A-Za-z0-9]{4})", re.IGNORECASE)


def patient_of(stem: str) -> str:
    """The TCGA patient (``TCGA-XX-YYYY``) at the start of a BCSS file stem, upper-cased, or ``""``."""
    m = _PATIENT_RE.match(stem.strip())
    return m.group(1).upper() if m else ""


def resolve_class_map(foreground: Mapping[str, Sequence[int]] | None) -> list[tuple[str, tuple[int, ...]]]:
    """Validate the declared class map ``{class name: [BCSS codes]}`` (None = :data:`DEFAULT_FOREGROUND`).

    Returns:
        ``[(name, codes), ...]`` in the given order; class k (1-based) is the k-th entry.

    Raises:
        MSBError: not a mapping, an empty map or code list, a code not in :data:`GT_CODES`, code 0 (outside the
            ROI) used as a class, a code in two classes, a repeated or reserved name.
    """
    fg = DEFAULT_FOREGROUND if foreground is None else foreground
    if not isinstance(fg, Mapping) or not fg:
        raise MSBError(f"bcss option foreground must be a non-empty mapping {{class name: [codes]}}, e.g. "
                       f"{{tumour: [1]}}; got {foreground!r}")
    out: list[tuple[str, tuple[int, ...]]] = []
    seen: dict[int, str] = {}
    for name, codes in fg.items():
        name = str(name).strip()
        if not name or name.lower() == "background" or any(name == n for n, _ in out):
            raise MSBError(f"bcss option foreground: class name {name!r} is empty, repeated or reserved "
                           "('background' is the rest)")
        if isinstance(codes, (int, np.integer)) and not isinstance(codes, bool):
            codes = [codes]
        if not isinstance(codes, Sequence) or isinstance(codes, str) or not codes:
            raise MSBError(f"bcss option foreground: class {name!r} needs a non-empty list of BCSS codes")
        clean = []
        for c in codes:
            if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or int(c) not in GT_CODES:
                raise MSBError(f"bcss option foreground: class {name!r}: {c!r} is not a BCSS code (0-21, "
                               "meta/gtruth_codes.tsv)")
            if int(c) == OUTSIDE_ROI:
                raise MSBError(f"bcss option foreground: class {name!r}: code 0 is 'outside_roi' (don't care), "
                               "not tissue; it cannot be a class")
            if int(c) in seen:
                raise MSBError(f"bcss option foreground: code {int(c)} ({GT_CODES[int(c)]}) is in classes "
                               f"{seen[int(c)]!r} and {name!r}; give each code to one class")
            seen[int(c)] = name
            clean.append(int(c))
        out.append((name, tuple(clean)))
    return out


def _mask_fn(class_map: list[tuple[str, tuple[int, ...]]]):
    lut = np.zeros(256, np.uint8)
    for k, (_, codes) in enumerate(class_map, start=1):
        lut[list(codes)] = k

    def fn(sample: Sample) -> MaskResult:
        raw, reduced = read_grey_mask(sample.masks[0])
        if reduced:
            raise MSBError(f"{sample.masks[0]}: a colour mask; BCSS masks are single-channel code images "
                           "(meta/gtruth_codes.tsv). Use the masks/ folder of the official download.")
        raw = raw.astype(np.int64)
        unknown = [int(v) for v in np.unique(raw) if int(v) not in GT_CODES]
        if unknown:
            n = int(np.isin(raw, unknown).sum())
            raise MSBError(f"{sample.masks[0]}: value(s) {unknown[:10]} ({n} px) are not BCSS codes 0-21 "
                           "(meta/gtruth_codes.tsv); is this a BCSS mask?")
        return MaskResult(lut[raw], int(np.count_nonzero(raw == OUTSIDE_ROI)))

    return fn


def _outside_fraction(mask_path: Path) -> float:
    raw, _ = read_grey_mask(mask_path)
    return float(np.count_nonzero(raw == OUTSIDE_ROI)) / float(raw.size)


def convert_bcss(source: str | os.PathLike, out: str | os.PathLike, *,
                 foreground: Mapping[str, Sequence[int]] | None = None, max_outside_roi_fraction: float = 1.0,
                 limit: int | None = None, overwrite: bool = False) -> ConversionReport:
    """Convert BCSS ROIs or patches (``images/`` + ``masks/``) into a prepared dataset at ``out``.

    Args:
        source: folder holding ``images/`` (or ``rgbs_colorNormalized/``, ``rgbs/``) and ``masks/``.
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        foreground: the declared class map ``{class name: [BCSS codes]}``; default ``{"tumour": [1]}``
            (binary tumour vs rest). Codes not listed are background.
        max_outside_roi_fraction: drop images whose mask has a larger share of code 0 (outside the ROI), in
            [0, 1]; 1.0 keeps all.
        limit: keep the first ``limit`` images in natural name order (after the outside-ROI filter).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`ConversionReport`; ``n_changed_mask_pixels`` = outside-ROI pixels written as background.

    Raises:
        MSBError: missing folders, no images, unpaired files, a mask value that is not a BCSS code, a colour
            mask, an image/mask size mismatch, a bad class map, nothing left after the filter. Nothing is left
            at ``out`` after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the BCSS folder holding images/ and masks/.")
    check_limit(limit)
    f = max_outside_roi_fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 <= float(f) <= 1.0:
        raise MSBError(f"max_outside_roi_fraction must be a number in [0, 1], got {f!r}.")
    class_map = resolve_class_map(foreground)
    img_dir = find_child(source, ["images", "rgbs_colorNormalized", "rgbs"])
    msk_dir = find_child(source, ["masks"])
    if img_dir is None or msk_dir is None:
        raise MSBError(f"{source}: expected sub-folders images/ (or rgbs_colorNormalized/) and masks/; found "
                       f"{sorted(p.name for p in source.iterdir() if p.is_dir())}.")
    images = {p.stem: p for p in list_images(img_dir)}
    masks = {p.stem: p for p in list_images(msk_dir)}
    if not images:
        raise MSBError(f"{img_dir}: no images found.")
    no_mask = sorted((s for s in images if s not in masks), key=natural_key)
    no_image = sorted((s for s in masks if s not in images), key=natural_key)
    if no_mask or no_image:
        parts = ([f"{len(no_mask)} image(s) without a mask in {msk_dir.name}/: {listed(no_mask)}"] if no_mask else []) \
            + ([f"{len(no_image)} mask(s) without an image: {listed(no_image)}"] if no_image else [])
        raise MSBError(f"{source}: unpaired files: " + "; ".join(parts) + ". Restore or remove them.")
    stems = sorted(images, key=natural_key)
    fractions = {s: _outside_fraction(masks[s]) for s in stems}
    notes: list[str] = []
    kept = [s for s in stems if fractions[s] <= float(f)]
    if len(kept) < len(stems):
        notes.append(f"max_outside_roi_fraction={float(f):g}: dropped {len(stems) - len(kept)} image(s) with more "
                     "outside-ROI pixels")
    if not kept:
        raise MSBError(f"{source}: every image has more than {float(f):g} outside-ROI pixels; raise "
                       "max_outside_roi_fraction.")
    if limit is not None and limit < len(kept):
        notes.append(f"limit={limit}: kept the first {limit} of {len(kept)} images")
        kept = kept[:limit]
    samples = [Sample(s, images[s], (masks[s],), f"images/{images[s].name}", "", patient_of(s), SOURCE_LABEL,
                      (("patient", patient_of(s)), ("outside_roi_fraction", f"{fractions[s]:.6f}")))
               for s in kept]
    classes = [ClassSpec(0, "background", (0,))] + [ClassSpec(k, n, (k,)) for k, (n, _) in
                                                    enumerate(class_map, start=1)]
    mapping = {"foreground": {n: list(c) for n, c in class_map},
               "background": "every other BCSS code; code 0 (outside_roi, don't care) is written as background",
               "prepared_values": {n: k for k, (n, _) in enumerate(class_map, start=1)},
               "gt_codes": {str(k): v for k, v in GT_CODES.items()}}
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, n_changed, n_pixels, _ = write_samples(samples, tmp, _mask_fn(class_map))
        write_prepared_dataset(tmp, index, classes)
        atomic_write_text(tmp / "bcss_class_map.json", json.dumps(mapping, indent=2) + "\n")
        load_prepared_dataset(tmp, check_files=True)
    desc = "; ".join(f"{n} = codes {list(c)} ({', '.join(GT_CODES[x] for x in c)})" for n, c in class_map)
    notes.insert(0, f"class map: {desc}; every other code is background")
    n_pat = len({p for p in index["patient"] if p})
    notes.append(f"group = TCGA patient ({n_pat} patient(s); {int((index['patient'] == '').sum())} image(s) "
                 "without a TCGA prefix have no group)")
    notes.append(f"{n_changed:,} outside-ROI pixel(s) (code 0, don't care) written as background")
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes,
                            out=Path(out).expanduser().absolute(), name="bcss", n_mask_pixels=n_pixels)
