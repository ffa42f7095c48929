"""ISIC 2018 Task 1 (lesion boundary segmentation) converter: dermoscopic JPEGs with binary lesion masks.

Citations: Codella N., Rotemberg V., Tschandl P., Celebi M.E., Dusza S., Gutman D., Helba B., Kalloo A.,
Liopyris K., Marchetti M., Kittler H., Halpern A. "Skin Lesion Analysis Toward Melanoma Detection 2018: A
Challenge Hosted by the International Skin Imaging Collaboration (ISIC)." arXiv:1902.03368 (2019); and
Tschandl P., Rosendahl C., Kittler H. "The HAM10000 dataset, a large collection of multi-source dermatoscopic
images of common pigmented skin lesions." Scientific Data 5, 180161 (2018). https://doi.org/10.1038/sdata.2018.161
Official URL: https://challenge.isic-archive.com/data/#2018
Licence: CC BY-NC 4.0 as stated in the ``LICENSE.txt`` shipped in each input zip (the converter copies the
shipped ``LICENSE.txt``/``ATTRIBUTION.txt`` files to ``<out>/licences/``; those files are authoritative).

Source layouts: the official one (any subset of the three phases; a phase is converted when both its folders
are present), or, when no phase folder exists, the common ``images/ + masks/`` layout (masks
``ISIC_<id>_segmentation.png`` or ``ISIC_<id>.png``; ``split`` empty), e.g. the shared ISIC 2017 subset:

====== =================================== ====================================== ======
split  images (``ISIC_<7 digits>.jpg``)    masks (``ISIC_<id>_segmentation.png``) count
====== =================================== ====================================== ======
train  ``ISIC2018_Task1-2_Training_Input`` ``ISIC2018_Task1_Training_GroundTruth`` 2594
val    ``ISIC2018_Task1-2_Validation_Input`` ``ISIC2018_Task1_Validation_GroundTruth`` 100
test   ``ISIC2018_Task1-2_Test_Input``     ``ISIC2018_Task1_Test_GroundTruth``    1000
====== =================================== ====================================== ======

What the converter writes: ``sample_id`` = ``ISIC_<id>``, ``split`` from the phase, ``source`` =
``isic2018-task1``; images byte-copied (JPEG kept) to ``images/<split>/``; masks (PNG ``{0, 255}`` in the
release) binarised with **value > 127 -> 255** (``threshold``; ``n_changed_mask_pixels`` is 0 for a pristine
release) and written as PNG. ``group`` is empty: the challenge zips carry no lesion or patient ids; several
images can show one lesion (HAM10000 ``lesion_id``), so pass them with ``groups_csv`` (``sample_id`` or
``image``, ``group``) when available, and audit with ``msb audit``.
"""

from __future__ import annotations

import os
from pathlib import Path

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.converters._common import (Sample, apply_groups, check_limit, check_threshold, copy_text_files,
                                         find_child, natural_key, threshold_mask_fn, write_samples)
from msb.data.converters.binary import layout_samples
from msb.data.converters.layouts import images_masks_layout
from msb.data.converters.folder import find_pairs
from msb.data.schema import ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError

SOURCE_LABEL = "isic2018-task1"
DEFAULT_THRESHOLD = 127
MASK_SUFFIX = "_segmentation"
#: split -> (input folder, ground-truth folder, official count)
PHASES: dict[str, tuple[str, str, int]] = {
    "train": ("ISIC2018_Task1-2_Training_Input", "ISIC2018_Task1_Training_GroundTruth", 2594),
    "val": ("ISIC2018_Task1-2_Validation_Input", "ISIC2018_Task1_Validation_GroundTruth", 100),
    "test": ("ISIC2018_Task1-2_Test_Input", "ISIC2018_Task1_Test_GroundTruth", 1000),
}


def convert_isic2018_task1(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                           threshold: float = DEFAULT_THRESHOLD, groups_csv: str | None = None,
                           group_id_column: str | None = None, group_column: str = "group",
                           source_label: str = SOURCE_LABEL, overwrite: bool = False) -> ConversionReport:
    """Convert ISIC 2018 Task 1 folders into a prepared dataset at ``out``.

    Args:
        source: folder holding the unzipped phase folders (table in the module docstring).
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        limit: keep the first ``limit`` pairs of each phase by name.
        threshold: ``value > threshold`` -> 255 (default 127).
        groups_csv: optional CSV with lesion/patient ids (e.g. HAM10000's ``image_id,lesion_id``).
        group_id_column: its key column (default ``sample_id``, else ``image``).
        group_column: its group column (default ``group``).
        source_label: the ``source`` column value (e.g. ``isic2017-part1`` for an ISIC 2017 copy in this layout).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport`.

    Raises:
        MSBError: no complete phase and no images/ + masks/ found, a phase with only one of its two folders,
            unpaired files, unreadable files, size mismatch, bad options. Nothing is left at ``out`` after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the folder holding the unzipped ISIC2018_Task1 "
                       f"folders.")
    check_limit(limit)
    check_threshold(threshold)
    notes: list[str] = []
    samples: list[Sample] = []
    licences: list[tuple[Path, str]] = []
    found = []
    for split, (inp, gt, official) in PHASES.items():
        img_dir, gt_dir = find_child(source, (inp,)), find_child(source, (gt,))
        if img_dir is None and gt_dir is None:
            continue
        if img_dir is None or gt_dir is None:
            have, miss = (inp, gt) if img_dir is not None else (gt, inp)
            raise MSBError(f"{source}: found {have}/ but not {miss}/; unzip both (a phase needs images and ground "
                           f"truth), or remove {have}/.")
        found.append(split)
        pairs, more = find_pairs(img_dir, gt_dir, mask_suffix=MASK_SUFFIX)
        notes.extend(f"{split}: {m}" for m in more)
        pairs = sorted(pairs, key=lambda p: natural_key(p.sample_id))
        if limit is not None and limit < len(pairs):
            notes.append(f"limit={limit}: kept the first {limit} of {len(pairs)} {split} pairs")
            pairs = pairs[:limit]
        elif limit is None and len(pairs) != official:
            notes.append(f"{split}: {len(pairs)} pairs (the official release has {official})")
        samples += [Sample(p.sample_id, p.image, (p.mask,), f"images/{split}/{p.image.name}", split, "", source_label)
                    for p in pairs]
        for d in (img_dir, gt_dir):
            for name in ("LICENSE.txt", "ATTRIBUTION.txt"):
                if (d / name).is_file():
                    licences.append((d / name, f"licences/{d.name}_{name}"))
    if not found:
        layout = images_masks_layout(source, ("ISIC2018", "ISIC"))
        if layout is None:
            raise MSBError(f"{source}: none of the ISIC 2018 Task 1 folders found (e.g. {PHASES['train'][0]}/ with "
                           f"{PHASES['train'][1]}/) and no images/ + masks/; --source must be the folder holding "
                           f"the unzipped phases.")
        found.append("")
        samples = layout_samples(layout, source_label, limit, notes)
    if not groups_csv:
        notes.append("no lesion/patient ids in the challenge release: group is empty (several images may show one "
                     "lesion; pass --groups or run `msb audit`)")
    samples = apply_groups(samples, groups_csv, group_id_column, group_column, notes,
                           limited=limit is not None)
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, n_changed, n_pixels, _ = write_samples(samples, tmp, threshold_mask_fn(threshold))
        copied = copy_text_files(licences, tmp)
        write_prepared_dataset(tmp, index, [ClassSpec(0, "background", (0,)), ClassSpec(1, "lesion", (255,))])
        load_prepared_dataset(tmp, check_files=True)
    if found != [""]:
        notes.insert(0, "phases: " + ", ".join(f"{s}={int((index['split'] == s).sum())}" for s in found))
    notes.append(f"masks binarised: value > {threshold:g} -> 255, else 0")
    if copied:
        notes.append(f"licence files copied: {', '.join(copied)}")
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes,
                            out=Path(out).expanduser().absolute(), name="isic2018-task1", n_mask_pixels=n_pixels)


__all__ = ["convert_isic2018_task1", "PHASES"]
