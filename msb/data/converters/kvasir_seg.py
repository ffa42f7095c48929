"""Kvasir-SEG converter (1000 colonoscopy frames with polyp masks).

Source layout (the official release): ``<source>/images/<id>.jpg`` and ``<source>/masks/<id>.jpg`` with the
same file names (``.jpeg`` and ``.png`` are accepted too; any other file, e.g. ``kavsir_bboxes.json``, is
ignored).

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

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.converters.folder import Pair, convert_pairs, find_pairs
from msb.data.schema import load_prepared_dataset, write_prepared_dataset
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


def convert_kvasir_seg(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                       threshold: int = DEFAULT_THRESHOLD, near_duplicate_groups: bool = True,
                       overwrite: bool = False) -> ConversionReport:
    """Convert a Kvasir-SEG download into a prepared dataset at ``out``.

    Args:
        source: folder holding ``images/`` and ``masks/``.
        out: destination folder; built in a hidden temporary sibling and renamed at the end.
        limit: keep only the first ``limit`` pairs by sorted name (quick tests / CI); ``None`` = all.
        threshold: binarisation threshold on the 8-bit mask value (``value > threshold`` -> 255). 127 is safe for
            the official release (no value lies in 20-235).
        near_duplicate_groups: put the six known near-duplicate pairs into shared ``group`` values.
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport` with the changed-pixel count.

    Raises:
        MSBError: missing ``images/``/``masks/``, unpaired files, unreadable files, image/mask size mismatch,
            bad ``limit``, existing non-empty ``out`` without ``overwrite``. Nothing is left at ``out`` (nor any
            temporary folder) after an error.
    """
    source = Path(source).expanduser()
    for sub in ("images", "masks"):
        if not (source / sub).is_dir():
            raise MSBError(f"{source / sub} not found; --source must be the Kvasir-SEG folder that holds images/ "
                           f"and masks/ (e.g. the unzipped 'Kvasir-SEG' folder).")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise MSBError(f"limit must be a positive integer or None, got {limit!r}.")
    if not 0 <= threshold < 255:
        raise MSBError(f"threshold must be in [0, 254] for 8-bit masks, got {threshold!r} (127 is safe).")
    pairs, notes = find_pairs(source / "images", source / "masks", mask_suffix="", allow_unpaired=False)
    n_all = len(pairs)
    if limit is not None and limit < n_all:
        pairs = pairs[:limit]
        notes.append(f"limit={limit}: kept the first {limit} of {n_all} pairs by name")
    if near_duplicate_groups:
        group_of = {sid: f"neardup_{k + 1}" for k, pair in enumerate(NEAR_DUPLICATE_PAIRS) for sid in pair}
        pairs = [Pair(p.sample_id, p.image, p.mask, group_of.get(p.sample_id, "")) for p in pairs]
        n_grouped = sum(1 for p in pairs if p.group)
        notes.append(f"{n_grouped} sample(s) in known near-duplicate pairs got a shared group (neardup_1..6); "
                     f"Kvasir-SEG has no patient/video ids, all other groups are empty")
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, classes, n_changed, n_pixels, more = convert_pairs(
            pairs, tmp, threshold=threshold, source_label=SOURCE_LABEL, foreground_name="polyp")
        write_prepared_dataset(tmp, index, classes)
        load_prepared_dataset(tmp, check_files=True)
    notes = more + notes + ["images overlap HyperKvasir's segmented-images: do not use them for cross-dataset "
                            "evaluation against each other"]
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes,
                            out=Path(out).expanduser().absolute(), name="kvasir-seg", n_mask_pixels=n_pixels)
