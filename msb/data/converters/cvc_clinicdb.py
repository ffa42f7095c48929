"""CVC-ClinicDB converter, original release layout (612 colonoscopy frames, TIFF, 384x288).

Citation: Bernal J., Sanchez F.J., Fernandez-Esparrach G., Gil D., Rodriguez C., Vilarino F. "WM-DOVA maps for
accurate polyp highlighting in colonoscopy: Validation vs. saliency maps from physicians." Computerized Medical
Imaging and Graphics 43 (2015) 99-111. https://doi.org/10.1016/j.compmedimag.2015.02.007
Official URL: https://polyp.grand-challenge.org/CVCClinicDB/
Licence: free for research use; publications must cite the article above (terms on the official page; check
them before any commercial use or redistribution).

Source layout: ``<source>/Original/<n>.tif`` and ``<source>/Ground Truth/<n>.tif`` with the same names
(``GroundTruth``/``Ground_Truth`` and ``.tiff``/``.png``/``.bmp`` are accepted; the Kaggle copy's ``TIF/`` or
``PNG/`` wrapper folder is entered automatically, TIF preferred).

What the converter writes:

* ``sample_id`` = the frame number (``1`` .. ``612``), rows in numeric order; ``source`` = ``CVC-ClinicDB``;
  ``split`` empty (no official split);
* images byte-copied unchanged (TIFF kept) to ``images/<name>``; masks binarised with **value > 127 -> 255**
  (``threshold``) and written as PNG ``{0, 255}``; ``n_changed_mask_pixels`` counts pixels whose value changed;
* ``group``: the frames were extracted from colonoscopy video sequences, but the TIFF release carries no
  sequence id, so ``group`` is empty unless ``groups_csv`` (``sample_id`` or ``image``, ``group``) gives them.
  Consecutive frames of one sequence are near-duplicates: audit before splitting (``msb audit``) and use
  ``msb audit --apply-clusters`` to turn near-duplicate clusters into groups.
"""

from __future__ import annotations

import os
from pathlib import Path

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.converters._common import (Sample, check_limit, check_threshold, find_child, natural_key,
                                         read_groups_csv, threshold_mask_fn, write_samples)
from msb.data.converters.folder import find_pairs
from msb.data.schema import ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError

SOURCE_LABEL = "CVC-ClinicDB"
DEFAULT_THRESHOLD = 127
_ORIG = ("Original",)
_GT = ("Ground Truth", "GroundTruth", "Ground_Truth", "GT")


def _find_layout(source: Path) -> tuple[Path, Path] | None:
    for base in (source, find_child(source, ("TIF", "TIFF")), find_child(source, ("PNG",)),
                 find_child(source, ("CVC-ClinicDB", "CVC_ClinicDB"))):
        if base is None:
            continue
        img, gt = find_child(base, _ORIG), find_child(base, _GT)
        if img is not None and gt is not None:
            return img, gt
    return None


def convert_cvc_clinicdb(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                         threshold: float = DEFAULT_THRESHOLD, groups_csv: str | None = None,
                         overwrite: bool = False) -> ConversionReport:
    """Convert the CVC-ClinicDB release (``Original/`` + ``Ground Truth/``) into a prepared dataset at ``out``.

    Args:
        source: folder holding ``Original/`` and ``Ground Truth/`` (or a ``TIF/``/``PNG/`` wrapper of them).
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        limit: keep the first ``limit`` frames in numeric order.
        threshold: ``value > threshold`` -> 255 (default 127).
        groups_csv: optional CSV with video-sequence ids (``sample_id`` or ``image``, ``group``).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport`.

    Raises:
        MSBError: layout not found, unpaired files, unreadable files, size mismatch, bad options; nothing is left
            at ``out`` after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the CVC-ClinicDB folder holding Original/ and "
                       f"'Ground Truth/'.")
    check_limit(limit)
    check_threshold(threshold)
    layout = _find_layout(source)
    if layout is None:
        raise MSBError(f"{source}: no 'Original/' and 'Ground Truth/' sub-folders found; --source must be the "
                       f"CVC-ClinicDB folder (the official zip's CVC-ClinicDB/).")
    pairs, notes = find_pairs(*layout)
    pairs = sorted(pairs, key=lambda p: natural_key(p.sample_id))
    if limit is not None and limit < len(pairs):
        notes.append(f"limit={limit}: kept the first {limit} of {len(pairs)} frames")
        pairs = pairs[:limit]
    samples = [Sample(p.sample_id, p.image, (p.mask,), f"images/{p.image.name}", "", "", SOURCE_LABEL)
               for p in pairs]
    if groups_csv:
        known = {s.sample_id: s.sample_id for s in samples} | {s.image.name: s.sample_id for s in samples}
        groups = read_groups_csv(groups_csv, known)
        samples = [Sample(s.sample_id, s.image, s.masks, s.image_rel, "", groups.get(s.sample_id, ""), s.source)
                   for s in samples]
        notes.append(f"groups from {groups_csv}: {sum(1 for v in groups.values() if v)} frame(s) given a group")
    else:
        notes.append("no video-sequence ids in this release: group is empty; consecutive frames are "
                     "near-duplicates (run `msb audit`, then `--apply-clusters` for group-aware splits)")
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, n_changed, n_pixels, counters = write_samples(samples, tmp, threshold_mask_fn(threshold))
        write_prepared_dataset(tmp, index, [ClassSpec(0, "background", (0,)), ClassSpec(1, "polyp", (255,))])
        load_prepared_dataset(tmp, check_files=True)
    notes.append(f"masks binarised: value > {threshold:g} -> 255, else 0")
    if counters.get("colour_masks"):
        notes.append(f"{counters['colour_masks']} colour mask(s) with unequal R/G/B channels: their rounded channel "
                     f"mean was thresholded")
    if limit is None and len(index) != 612:
        notes.append(f"{len(index)} frames converted; the official release has 612")
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes,
                            out=Path(out).expanduser().absolute(), name="cvc-clinicdb", n_mask_pixels=n_pixels)


__all__ = ["convert_cvc_clinicdb"]
