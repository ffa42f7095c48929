"""One binary-mask conversion for any detected layout (:mod:`msb.data.converters.layouts`): the common path
of the Kvasir-SEG, CVC-ClinicDB, CVC-ColonDB, ETIS-LaribPolypDB and CVC-300 converters.

:func:`layout_samples` lists the samples of a layout: ``sample_id`` = the image stem (the frame number for
numbered frames); when two parts share a stem (PraNet train/test copies), every id gets its split as a prefix
(``train-<stem>``, ``test-<stem>``). Images are byte-copied to ``images/<split>/<name>`` (``images/<name>``
without a split). :func:`write_binary` thresholds the masks (``value > t`` -> 255) and writes the dataset
through :func:`msb.data.converters.staged_output`.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from msb.data.converters._common import Sample, natural_key, threshold_mask_fn, write_samples
from msb.data.converters.layouts import Layout, pair_part
from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.schema import ClassSpec, load_prepared_dataset, write_prepared_dataset

__all__ = ["layout_samples", "write_binary"]


def layout_samples(layout: Layout, source_label: str, limit: int | None, notes: list[str]) -> list[Sample]:
    """Samples of every part of ``layout`` in natural name order, at most ``limit`` per part.

    Args:
        layout: a detected layout.
        source_label: the ``source`` column value.
        limit: per-part cap (``None`` = all).
        notes: receives the pairing notes, the layout name and the per-part counts.

    Returns:
        The samples (``split`` from the part: ``train``/``test`` for PraNet copies, else ``''``).

    Raises:
        MSBError: as :func:`msb.data.converters.layouts.pair_part`.
    """
    per_part = []
    for part in layout.parts:
        pairs, more = pair_part(part)
        notes.extend(more)
        pairs = sorted(pairs, key=lambda p: natural_key(p.sample_id))
        if limit is not None and limit < len(pairs):
            notes.append(f"limit={limit}: kept the first {limit} of {len(pairs)} pairs of {part.label or part.images}")
            pairs = pairs[:limit]
        per_part.append((part, pairs))
    stems = [p.sample_id for _, pairs in per_part for p in pairs]
    prefix = len(set(stems)) != len(stems)
    samples = []
    for part, pairs in per_part:
        for p in pairs:
            sid = f"{part.split}-{p.sample_id}" if prefix else p.sample_id
            rel = f"images/{part.split}/{p.image.name}" if part.split else f"images/{p.image.name}"
            samples.append(Sample(sid, p.image, (p.mask,), rel, part.split, p.group, source_label))
    notes.insert(0, f"layout: {layout.name} (" + ", ".join(f"{part.label or part.images.name}: {len(pairs)}"
                                                          for part, pairs in per_part) + ")")
    if layout.name == "pranet":
        notes.append("split column = the PraNet split as shipped (TrainDataset -> train, TestDataset -> test)")
    return samples


def write_binary(samples: Sequence[Sample], source: str | os.PathLike, out: str | os.PathLike, *, name: str,
                 threshold: float, foreground: str, overwrite: bool, notes: list[str],
                 official_count: int | None = None) -> ConversionReport:
    """Write ``samples`` as a binary prepared dataset (0 background, 255 ``foreground``) at ``out``.

    Masks: ``value > threshold`` -> 255, else 0, PNG; colour masks with unequal channels are reduced to their
    rounded channel mean first (:func:`msb.data.converters._common.threshold_mask_fn`). ``n_changed_mask_pixels``
    = pixels whose written value differs from the source value.

    Raises:
        MSBError: unreadable files, size mismatch, duplicate ids, existing ``out`` without ``overwrite``; nothing
            is left at ``out`` after an error.
    """
    samples = list(samples)
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, n_changed, n_pixels, counters = write_samples(samples, tmp, threshold_mask_fn(threshold))
        write_prepared_dataset(tmp, index, [ClassSpec(0, "background", (0,)), ClassSpec(1, foreground, (255,))])
        load_prepared_dataset(tmp, check_files=True)
    notes.append(f"masks binarised: value > {threshold:g} -> 255, else 0")
    if counters.get("colour_masks"):
        notes.append(f"{counters['colour_masks']} colour mask(s) with unequal R/G/B channels: their rounded channel "
                     f"mean was thresholded")
    if official_count is not None and len(index) != official_count:
        notes.append(f"{len(index)} samples converted; the official release has {official_count}")
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes,
                            out=Path(out).expanduser().absolute(), name=name, n_mask_pixels=n_pixels)


def with_groups(samples: Sequence[Sample], group_of: dict[str, str]) -> list[Sample]:
    """``samples`` with ``group`` from ``group_of`` (keyed by the image stem) where it has one."""
    return [replace(s, group=group_of.get(s.image.stem, s.group)) for s in samples]
