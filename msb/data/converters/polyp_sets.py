"""Converters of the polyp test sets CVC-ColonDB, ETIS-LaribPolypDB and CVC-300 (EndoScene), each from its
original release layout, the common ``images/ + masks/`` layout, or its PraNet ``TestDataset/<name>/`` copy
(:mod:`msb.data.converters.layouts`). Binary masks: **value > 127 -> 255** (``threshold``), PNG ``{0, 255}``;
images byte-copied; ``source`` = the dataset name; ``split`` empty (``test`` for a PraNet copy).

``cvc-colondb``: Bernal J., Sanchez J., Vilarino F. "Towards automatic polyp detection with a polyp appearance
model." Pattern Recognition 45(9) (2012) 3166-3182. https://doi.org/10.1016/j.patcog.2012.03.002. Research use
with citation (the release README gives no licence; check with CVC before redistribution). Official layout: one
folder of frames ``<n>.tiff`` (some ``.tif``) with masks ``p<n>.tiff`` (contours ``cp<n>.tiff`` ignored), 380
frames from 15 sequences. ``group`` = ``seq<k>`` from the README's frame-to-sequence table
(:data:`COLONDB_SEQUENCES`) when the frames carry their release numbers (official and images-masks layouts;
``sequence_groups``); sequences 11 and 15 show the same polyp (35 near-identical pairs, shared
``PROVENANCE.md``), so they share ``seq11+15``. PraNet's renumbered copy gets no groups (pass ``groups_csv``).

``etis-larib``: Silva J., Histace A., Romain O., Dray X., Granado B. "Toward embedded detection of polyps in WCE
images for early diagnosis of colorectal cancer." IJCARS 9(2) (2014) 283-293.
https://doi.org/10.1007/s11548-013-0926-3. Official URL https://polyp.grand-challenge.org/EtisLarib/; research
use with citation. Official layout: ``ETIS-LaribPolypDB/<n>.tif`` + ``Ground Truth/p<n>.tif`` (196 frames, 34
sequences; no sequence ids shipped, ``group`` empty unless ``groups_csv``).

``cvc-300``: Vazquez D. et al. "A benchmark for endoluminal scene segmentation of colonoscopy images." Journal
of Healthcare Engineering 2017, 4037190. https://doi.org/10.1155/2017/4037190. Research use with citation.
Official (EndoScene ``CVC-300``) layout: ``bbdd/<n>.bmp`` + ``gtpolyp/<n>.bmp`` (300 frames; PraNet's
``TestDataset/CVC-300`` holds its 60 test frames). EndoScene built CVC-300 from CVC-ColonDB frames: never use
the two as independent test sets without a hash check (``msb audit --against``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from msb.data.converters.staging import ConversionReport
from msb.data.converters._common import apply_groups, check_limit, check_threshold
from msb.data.converters.binary import layout_samples, with_groups, write_binary
from msb.data.converters.layouts import Layout, Part, detect_layout, find_dir
from msb.data.converters.folder import IMAGE_EXTENSIONS
from msb.errors import MSBError

__all__ = ["convert_cvc_colondb", "convert_etis_larib", "convert_cvc_300", "COLONDB_SEQUENCES",
           "colondb_group"]

DEFAULT_THRESHOLD = 127
#: CVC-ColonDB sequence -> (first frame, last frame), from the release README (shared PROVENANCE.md table)
COLONDB_SEQUENCES: dict[int, tuple[int, int]] = {
    1: (1, 38), 2: (39, 60), 3: (61, 76), 4: (301, 320), 5: (77, 97), 6: (98, 148), 7: (149, 155),
    8: (321, 340), 9: (156, 203), 10: (204, 208), 11: (209, 263), 12: (341, 360), 13: (361, 380),
    14: (264, 273), 15: (274, 300)}
_MERGED = {11: "seq11+15", 15: "seq11+15"}


def colondb_group(frame: int) -> str:
    """``seq<k>`` of a CVC-ColonDB frame number (``seq11+15`` for sequences 11 and 15), ``''`` if out of range."""
    for seq, (lo, hi) in COLONDB_SEQUENCES.items():
        if lo <= frame <= hi:
            return _MERGED.get(seq, f"seq{seq}")
    return ""


def _numbered_folder(folder: Path | None) -> bool:
    if folder is None or not folder.is_dir():
        return False
    stems = {p.stem.lower() for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS}
    return any(s.isdigit() and f"p{s}" in stems for s in stems)


def _colondb_official(source: Path) -> Layout | None:
    for d in (source, find_dir(source, ("CVC-ColonDB",))):
        if _numbered_folder(d):
            assert d is not None
            return Layout("official", (Part(d, d, pairing="numbered", label=f"{d.name}/ (<n> + p<n>)"),))
    return None


def _etis_official(source: Path) -> Layout | None:
    for base in (source, find_dir(source, ("ETIS-LaribPolypDB",))):
        if base is None:
            continue
        img, gt = find_dir(base, ("ETIS-LaribPolypDB", "Original", "images")), find_dir(base, ("Ground Truth", "GT"))
        if img is not None and gt is not None and img != base:
            return Layout("official", (Part(img, gt, pairing="numbered", label=f"{img.name}/ + {gt.name}/"),))
    return None


def _cvc300_official(source: Path) -> Layout | None:
    for base in (source, find_dir(source, ("CVC-300",))):
        if base is None:
            continue
        img, gt = find_dir(base, ("bbdd",)), find_dir(base, ("gtpolyp",))
        if img is not None and gt is not None:
            return Layout("official", (Part(img, gt, label="bbdd/ + gtpolyp/"),))
    return None


def _convert(source: str | os.PathLike, out: str | os.PathLike, *, name: str, label: str,
             official: Callable[[Path], Layout | None], expected: str, official_count: int, limit: int | None,
             threshold: float, groups_csv: str | None, group_id_column: str | None, group_column: str,
             overwrite: bool, notes: list[str], groups_of: Callable[[Layout, list], list] | None = None
             ) -> ConversionReport:
    src = Path(source).expanduser()
    if not src.is_dir():
        raise MSBError(f"source folder {src} not found; pass the {label} folder ({expected}, or images/ + masks/).")
    check_limit(limit)
    check_threshold(threshold)
    layout = detect_layout(src, official, wrappers=(label,), pranet_test=label, expected=expected)
    samples = layout_samples(layout, label, limit, notes)
    if groups_of is not None:
        samples = groups_of(layout, samples)
    samples = apply_groups(samples, groups_csv, group_id_column, group_column, notes,
                           limited=limit is not None)
    count = official_count if layout.name != "pranet" else None
    return write_binary(samples, src, out, name=name, threshold=threshold, foreground="polyp", overwrite=overwrite,
                        notes=notes, official_count=count if limit is None else None)


def convert_cvc_colondb(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                        threshold: float = DEFAULT_THRESHOLD, sequence_groups: bool = True,
                        groups_csv: str | None = None, group_id_column: str | None = None,
                        group_column: str = "group", overwrite: bool = False) -> ConversionReport:
    """Convert a CVC-ColonDB copy (module docstring) into a prepared dataset at ``out``.

    Args:
        source: the CVC-ColonDB folder (official, images-masks or PraNet layout).
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        limit: keep the first ``limit`` frames in numeric order.
        threshold: ``value > threshold`` -> 255 (default 127).
        sequence_groups: ``group`` from :data:`COLONDB_SEQUENCES` for numbered frames (not for PraNet copies).
        groups_csv: optional groups CSV (its rows override the sequence groups), e.g. the shared copy's
            ``index.csv`` with ``group_id_column="frame", group_column="sequence"``.
        group_id_column: key column of ``groups_csv`` (default ``sample_id``, else ``image``).
        group_column: group column of ``groups_csv`` (default ``group``).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport`.

    Raises:
        MSBError: no layout found, unpaired files, unreadable files, size mismatch, bad options; nothing is left
            at ``out`` after an error.
    """
    notes: list[str] = []

    def groups_of(layout: Layout, samples: list) -> list:
        if not sequence_groups or layout.name == "pranet":
            notes.append("group empty: " + ("sequence_groups=False" if not sequence_groups else
                                            "PraNet's copy is renumbered, sequences unknown (pass --groups)"))
            return samples
        group_of = {s.image.stem: colondb_group(int(s.image.stem)) for s in samples if s.image.stem.isdigit()}
        notes.append(f"group = video sequence from the release README's frame table for {len(group_of)} numbered "
                     f"frame(s) (sequences 11 and 15 show one polyp: merged into seq11+15)")
        return with_groups(samples, group_of)

    return _convert(source, out, name="cvc-colondb", label="CVC-ColonDB", official=_colondb_official,
                    expected="<n>.tiff + p<n>.tiff frames", official_count=380, limit=limit, threshold=threshold,
                    groups_csv=groups_csv, group_id_column=group_id_column, group_column=group_column,
                    overwrite=overwrite, notes=notes, groups_of=groups_of)


def convert_etis_larib(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                       threshold: float = DEFAULT_THRESHOLD, groups_csv: str | None = None,
                       group_id_column: str | None = None, group_column: str = "group",
                       overwrite: bool = False) -> ConversionReport:
    """Convert an ETIS-LaribPolypDB copy (module docstring) into a prepared dataset at ``out``.

    Args, returns and errors as :func:`convert_cvc_colondb` (no ``sequence_groups``: no sequence ids exist).
    """
    notes = [] if groups_csv else ["ETIS-Larib ships no sequence ids (196 frames of 34 sequences): group is empty; "
                                   "run `msb audit` before splitting"]
    return _convert(source, out, name="etis-larib", label="ETIS-LaribPolypDB", official=_etis_official,
                    expected="ETIS-LaribPolypDB/<n>.tif + 'Ground Truth'/p<n>.tif", official_count=196, limit=limit,
                    threshold=threshold, groups_csv=groups_csv, group_id_column=group_id_column,
                    group_column=group_column, overwrite=overwrite, notes=notes)


def convert_cvc_300(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                    threshold: float = DEFAULT_THRESHOLD, groups_csv: str | None = None,
                    group_id_column: str | None = None, group_column: str = "group",
                    overwrite: bool = False) -> ConversionReport:
    """Convert a CVC-300 (EndoScene) copy (module docstring) into a prepared dataset at ``out``.

    Args, returns and errors as :func:`convert_etis_larib`.
    """
    notes = ["CVC-300 (EndoScene) frames come from CVC-ColonDB: hash-check before using both as test sets "
             "(msb audit DATASET --against OTHER)"]
    return _convert(source, out, name="cvc-300", label="CVC-300", official=_cvc300_official,
                    expected="bbdd/ + gtpolyp/", official_count=300, limit=limit, threshold=threshold,
                    groups_csv=groups_csv, group_id_column=group_id_column, group_column=group_column,
                    overwrite=overwrite, notes=notes)
