"""Kvasir-SEG converter (1000 colonoscopy frames with polyp masks).

Source layouts (detected in this order, :mod:`msb.data.converters.layouts`):

* official = images-masks: ``<source>/images/<id>.jpg`` and ``<source>/masks/<id>.jpg`` with the same file names
  (``.jpeg`` and ``.png`` are accepted too; any other file, e.g. ``kavsir_bboxes.json``, is ignored; an unzipped
  ``Kvasir-SEG/`` wrapper is entered);
* PraNet: ``TrainDataset/{image,mask}/`` (its non-numeric names = the 900 Kvasir-SEG training frames) and
  ``TestDataset/Kvasir/{images,masks}/`` (100); ``split`` = train / test as shipped.

What the converter does:

* images are byte-copied unchanged (the JPEG is kept) to ``images/<id>.jpg``;
* masks are JPEG, so they carry compression noise (observed values 0-9 and 246-255, none in 20-235): they are
  binarised with **value > 127 -> 255, else 0** (``threshold`` option) and written as PNG ``{0, 255}`` to
  ``masks/<id>.png``. ``n_changed_mask_pixels`` counts pixels whose value was neither 0 nor 255 (for the
  official release about 0.73 % of mask pixels). Masks are stored as 3-channel JPEGs with identical channels;
  should the channels differ, the rounded channel mean is thresholded (noted in the report);
* ``classes.csv``: 0 background (value 0), 1 polyp (value 255); ``split`` empty; ``source`` = ``kvasir-seg``;
* ``group``: Kvasir-SEG has no patient or video ids, so ``group`` is empty except for the six known
  near-duplicate pairs (same frame under two ids, see ``datasets/kvasir_seg.yaml``), which get a shared group
  ``neardup_<k>`` so that a group-aware split keeps each pair on one side (``near_duplicate_groups`` option).
  In a group-aware split an empty group means "a group of its own".
"""

from __future__ import annotations

import os
from pathlib import Path

from msb.data.converters.staging import ConversionReport
from msb.data.converters._common import apply_groups, check_limit, check_threshold
from msb.data.converters.binary import layout_samples, with_groups, write_binary
from msb.data.converters.layouts import detect_layout
from msb.errors import MSBError

SOURCE_LABEL = "kvasir-seg"
DEFAULT_THRESHOLD = 127

#: near-identical frames stored under different ids (NCC >= 0.95 on 64x64 thumbnails; shared PROVENANCE.md)
NEAR_DUPLICATE_PAIRS: tuple[tuple[str, str], ...] = (
    ("cju30bmab08bi0835mvlr6e0r", "cju77k828z46w0871r0avuoo9"),
    ("cju76lsehyia10987u54vn8rb", "cju772304yw5t0818vbw8kkjf"),
    ("cju886ryxnsl50801r93jai7q", "cju8amfdtqi4x09871tygrgqe"),
    ("cju5fydrud94708507vo6oy21", "cju7avvi51iox0817ym55y6tt"),
    ("cju1hhj6mxfp90835n3wofrap", "cju3x9lttikfb0818a0g104zn"),
    ("cju1gi7jlwyld0835cdf6g6qz", "cju5uget8krjy0818kvywd0zu"),
)


def _not_numeric(stem: str) -> bool:
    return not stem.isdigit()


def convert_kvasir_seg(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                       threshold: int = DEFAULT_THRESHOLD, near_duplicate_groups: bool = True,
                       groups_csv: str | None = None, group_id_column: str | None = None,
                       group_column: str = "group", overwrite: bool = False) -> ConversionReport:
    """Convert a Kvasir-SEG download (official images-masks or PraNet layout) into a prepared dataset at ``out``.

    Args:
        source: folder holding ``images/`` and ``masks/`` (or a PraNet ``TrainDataset/``/``TestDataset/`` folder).
        out: destination folder; built in a hidden temporary sibling and renamed at the end.
        limit: keep only the first ``limit`` pairs in natural name order (per part of the layout; quick tests / CI).
        threshold: binarisation threshold on the 8-bit mask value (``value > threshold`` -> 255). 127 is safe for
            the official release (no value lies in 20-235).
        near_duplicate_groups: put the six known near-duplicate pairs into shared ``group`` values.
        groups_csv: optional CSV of groups (applied after the near-duplicate groups; its rows win).
        group_id_column: its key column (default ``sample_id``, else ``image``).
        group_column: its group column (default ``group``).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport` with the changed-pixel count.

    Raises:
        MSBError: no layout found, unpaired files, unreadable files, image/mask size mismatch, bad ``limit``,
            existing non-empty ``out`` without ``overwrite``. Nothing is left at ``out`` (nor any temporary
            folder) after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; --source must be the Kvasir-SEG folder that holds images/ "
                       f"and masks/ (e.g. the unzipped 'Kvasir-SEG' folder).")
    check_limit(limit)
    check_threshold(threshold)
    layout = detect_layout(source, None, wrappers=("Kvasir-SEG",), pranet_test="Kvasir", pranet_train=_not_numeric)
    notes: list[str] = []
    samples = layout_samples(layout, SOURCE_LABEL, limit, notes)
    if near_duplicate_groups:
        group_of = {sid: f"neardup_{k + 1}" for k, pair in enumerate(NEAR_DUPLICATE_PAIRS) for sid in pair}
        samples = with_groups(samples, group_of)
        n_grouped = sum(1 for s in samples if s.group)
        notes.append(f"{n_grouped} sample(s) in known near-duplicate pairs got a shared group (neardup_1..6); "
                     f"Kvasir-SEG has no patient/video ids, all other groups are empty")
    samples = apply_groups(samples, groups_csv, group_id_column, group_column, notes,
                           limited=limit is not None)
    notes.append("images overlap HyperKvasir's segmented-images: do not use them for cross-dataset evaluation "
                 "against each other")
    return write_binary(samples, source, out, name="kvasir-seg", threshold=threshold, foreground="polyp",
                        overwrite=overwrite, notes=notes)
