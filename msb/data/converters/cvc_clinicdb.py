"""CVC-ClinicDB converter, original release layout (612 colonoscopy frames, TIFF, 384x288).

Citation: Bernal J., Sanchez F.J., Fernandez-Esparrach G., Gil D., Rodriguez C., Vilarino F. "WM-DOVA maps for
accurate polyp highlighting in colonoscopy: Validation vs. saliency maps from physicians." Computerized Medical
Imaging and Graphics 43 (2015) 99-111. https://doi.org/10.1016/j.compmedimag.2015.02.007
Official URL: https://polyp.grand-challenge.org/CVCClinicDB/
Licence: free for research use; publications must cite the article above (terms on the official page; check
them before any commercial use or redistribution).

Source layouts (detected in this order, :mod:`msb.data.converters.layouts`):

* official: ``<source>/Original/<n>.tif`` and ``<source>/Ground Truth/<n>.tif`` with the same names
  (``GroundTruth``/``Ground_Truth``/``GT`` and ``.tiff``/``.png``/``.bmp`` are accepted; the Kaggle copy's
  ``TIF/`` or ``PNG/`` wrapper folder and a ``CVC-ClinicDB/`` wrapper are entered automatically, TIF preferred);
* images-masks: ``<source>/images/<n>.png`` + ``<source>/masks/<n>.png`` (common public copies);
* PraNet: ``TrainDataset/{image,mask}/<n>.png`` (the numeric names = the 550 CVC-ClinicDB training frames) and
  ``TestDataset/CVC-ClinicDB/{images,masks}/`` (62); ``split`` = train / test as shipped.

What the converter writes:

* ``sample_id`` = the frame number (``1`` .. ``612``; ``<split>-<n>`` if a PraNet copy repeats a number), rows
  in numeric order; ``source`` = ``CVC-ClinicDB``; ``split`` empty (no official split) except for PraNet copies;
* images byte-copied unchanged (TIFF kept) to ``images/<name>``; masks binarised with **value > 127 -> 255**
  (``threshold``) and written as PNG ``{0, 255}``; ``n_changed_mask_pixels`` counts pixels whose value changed;
* ``group``: the frames were extracted from colonoscopy video sequences, but the TIFF release carries no
  sequence id, so ``group`` is empty unless ``groups_csv`` gives them (e.g. a ``frame,sequence`` CSV with
  ``group_id_column="frame", group_column="sequence"``). Consecutive frames of one sequence are
  near-duplicates: audit before splitting (``msb audit``) and use ``msb audit --apply-clusters`` to turn
  near-duplicate clusters into groups.
"""

from __future__ import annotations

import os
from pathlib import Path

from msb.data.converters.staging import ConversionReport
from msb.data.converters._common import apply_groups, check_limit, check_threshold, find_child
from msb.data.converters.binary import layout_samples, write_binary
from msb.data.converters.layouts import Layout, Part, detect_layout
from msb.errors import MSBError

SOURCE_LABEL = "CVC-ClinicDB"
DEFAULT_THRESHOLD = 127
OFFICIAL_COUNT = 612
_ORIG = ("Original",)
_GT = ("Ground Truth", "GroundTruth", "Ground_Truth", "GT")


def official_layout(source: Path) -> Layout | None:
    """``Original/`` + ``Ground Truth/`` in ``source`` or in its ``TIF/``, ``PNG/`` or ``CVC-ClinicDB/`` wrapper."""
    for base in (source, find_child(source, ("TIF", "TIFF")), find_child(source, ("PNG",)),
                 find_child(source, ("CVC-ClinicDB", "CVC_ClinicDB"))):
        if base is None:
            continue
        img, gt = find_child(base, _ORIG), find_child(base, _GT)
        if img is not None and gt is not None:
            return Layout("official", (Part(img, gt, label=f"{img.name}/ + {gt.name}/"),))
    return None


def convert_cvc_clinicdb(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                         threshold: float = DEFAULT_THRESHOLD, groups_csv: str | None = None,
                         group_id_column: str | None = None, group_column: str = "group",
                         overwrite: bool = False) -> ConversionReport:
    """Convert a CVC-ClinicDB copy (official, images-masks or PraNet layout) into a prepared dataset at ``out``.

    Args:
        source: the CVC-ClinicDB folder (any layout of the module docstring).
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        limit: keep the first ``limit`` frames in numeric order (per part of the layout).
        threshold: ``value > threshold`` -> 255 (default 127).
        groups_csv: optional CSV with video-sequence ids.
        group_id_column: its key column (default ``sample_id``, else ``image``), e.g. ``frame``.
        group_column: its group column (default ``group``), e.g. ``sequence``.
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport`.

    Raises:
        MSBError: no layout found, unpaired files, unreadable files, size mismatch, bad options or groups CSV;
            nothing is left at ``out`` after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the CVC-ClinicDB folder (Original/ + 'Ground Truth/', "
                       f"or images/ + masks/).")
    check_limit(limit)
    check_threshold(threshold)
    layout = detect_layout(source, official_layout, wrappers=("CVC-ClinicDB",), pranet_test="CVC-ClinicDB",
                           pranet_train=str.isdigit, expected="Original/ + 'Ground Truth/'")
    notes: list[str] = []
    samples = layout_samples(layout, SOURCE_LABEL, limit, notes)
    samples = apply_groups(samples, groups_csv, group_id_column, group_column, notes,
                           limited=limit is not None)
    if not groups_csv:
        notes.append("no video-sequence ids in this release: group is empty; consecutive frames are "
                     "near-duplicates (pass --groups, or run `msb audit`, then `--apply-clusters`)")
    return write_binary(samples, source, out, name="cvc-clinicdb", threshold=threshold, foreground="polyp",
                        overwrite=overwrite, notes=notes,
                        official_count=OFFICIAL_COUNT if limit is None and layout.name != "pranet" else None)


__all__ = ["convert_cvc_clinicdb", "official_layout"]
