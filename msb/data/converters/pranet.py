"""PraNet polyp layout converter (``TrainDataset`` + ``TestDataset``: Kvasir-SEG, CVC-ClinicDB, CVC-ColonDB,
ETIS-LaribPolypDB, CVC-300), the de-facto polyp benchmark of Fan et al. (MICCAI 2020).

Citation: Fan D.-P., Ji G.-P., Zhou T., Chen G., Fu H., Shen J., Shao L. "PraNet: Parallel Reverse Attention
Network for Polyp Segmentation." MICCAI 2020, LNCS 12266, pp. 263-273. https://doi.org/10.1007/978-3-030-59725-2_26
(arXiv:2006.11392)
Official URL: https://github.com/DengPingFan/PraNet (README links TrainDataset.zip / TestDataset.zip).
Licence: the layout re-distributes five datasets, each under its own terms (Kvasir-SEG: research and education;
CVC-ClinicDB / CVC-ColonDB / CVC-300 (EndoScene) / ETIS-Larib: research use with citation). Cite the original
datasets as well; see ``docs/datasets.md``.

Source layout (``--source`` may be the folder holding ``TrainDataset/`` and/or ``TestDataset/``, or either of
those folders itself, e.g. after ``--source TestDataset.zip``):

* ``TrainDataset/image/*.png`` + ``TrainDataset/mask/*.png`` (``images``/``masks`` accepted too): 1450 pairs,
  900 Kvasir-SEG + 550 CVC-ClinicDB. The sub-dataset is told by the file name: numeric names (``1.png``) are
  CVC-ClinicDB frames, all others (``cju...``) Kvasir-SEG. ``split = train``.
* ``TestDataset/<name>/images/*.png`` + ``TestDataset/<name>/masks/*.png`` for ``<name>`` in CVC-300 (60),
  CVC-ClinicDB (62), CVC-ColonDB (380), ETIS-LaribPolypDB (196), Kvasir (100). ``split = test``.

What the converter writes:

* ``source`` = ``Kvasir`` / ``CVC-ClinicDB`` / ``CVC-ColonDB`` / ``ETIS-LaribPolypDB`` / ``CVC-300`` (the
  test-folder names; Kvasir-SEG training frames are ``Kvasir`` too);
* ``sample_id`` = ``<split>-<source>-<stem>`` (test sets reuse names like ``1.png``);
* images byte-copied to ``images/<split>/<source>/<file>``; masks binarised with **value > 128 -> 255**
  (``threshold``; ``gt > 128`` is the PraNet evaluation toolbox's rule) and written as PNG ``{0, 255}``;
  ``n_changed_mask_pixels`` counts pixels whose value was changed (anti-aliased or JPEG-noise values).
  Colour masks are reduced to their rounded channel mean first (counted in the notes);
* ``test_sets`` keeps only the named ``TestDataset`` sub-folders (e.g. ``[Kvasir, CVC-ClinicDB]``: the PraNet
  "seen" pool, whose unseen sets CVC-ColonDB / ETIS / CVC-300 then come in as external sets); ``train: false``
  drops ``TrainDataset`` (a test-only prepared dataset, e.g. one unseen set as an external set);
* ``val_fraction`` (default 0.1) moves a seeded, group-aware share of ``TrainDataset`` to ``val`` so that
  ``split.mode: fixed`` works without selecting on a test set; ``val_fraction=0`` keeps the official two-way
  split;
* ``group``: ``kvasir-neardup_<k>`` for the six known Kvasir-SEG near-duplicate pairs
  (:data:`msb.data.converters.kvasir_seg.NEAR_DUPLICATE_PAIRS`); CVC-ClinicDB frames come from colonoscopy
  videos but the release carries no sequence ids, so supply them with ``groups_csv`` (columns
  ``sample_id`` or ``image``, and ``group``) or derive groups with ``msb audit --apply-clusters``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from msb.data.converters.staging import ConversionReport, staged_output
from msb.data.converters._common import (Sample, carve_validation, check_limit, check_threshold, find_child,
                                         natural_key, apply_groups, threshold_mask_fn, write_samples)
from msb.data.converters.folder import find_pairs
from msb.data.converters.kvasir_seg import NEAR_DUPLICATE_PAIRS
from msb.data.schema import ClassSpec, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError

#: test sub-datasets of the PraNet release and their official sizes
TEST_SETS: dict[str, int] = {"CVC-300": 60, "CVC-ClinicDB": 62, "CVC-ColonDB": 380, "ETIS-LaribPolypDB": 196,
                             "Kvasir": 100}
DEFAULT_THRESHOLD = 128
_IMG = ("image", "images")
_MSK = ("mask", "masks")


def _pair_dirs(folder: Path) -> tuple[Path, Path] | None:
    img, msk = find_child(folder, _IMG), find_child(folder, _MSK)
    return (img, msk) if img is not None and msk is not None else None


def _layout(source: Path) -> tuple[Path | None, Path | None]:
    """``(train folder, test folder)``, either may be None; ``source`` may be one of them itself."""
    train, test = find_child(source, ("TrainDataset",)), find_child(source, ("TestDataset",))
    if train is None and test is None:
        if _pair_dirs(source) is not None:
            return source, None
        if any(_pair_dirs(p) is not None for p in source.iterdir() if p.is_dir()):
            return None, source
    return train, test


def _check_test_sets(test_sets, test_dir: Path | None, source: Path) -> set[str] | None:
    """The ``test_sets`` option as a set (None = all), checked against :data:`TEST_SETS` and the source."""
    if test_sets is None:
        return None
    names = [test_sets] if isinstance(test_sets, str) else list(test_sets)
    bad = [n for n in names if n not in TEST_SETS]
    if bad:
        raise MSBError(f"test_sets: unknown PraNet test set(s) {bad}; choose from {list(TEST_SETS)}.")
    found = {p.name for p in test_dir.iterdir() if p.is_dir()} if test_dir is not None else set()
    missing = [n for n in names if n not in found]
    if missing:
        raise MSBError(f"{source}: test_sets {missing} not found under TestDataset/ (found {sorted(found)}).")
    return set(names)


def train_source_of(stem: str) -> str:
    """Sub-dataset of a ``TrainDataset`` file: numeric stems are CVC-ClinicDB frames, others Kvasir-SEG."""
    return "CVC-ClinicDB" if re.fullmatch(r"\d+", stem) else "Kvasir"


def convert_pranet(source: str | os.PathLike, out: str | os.PathLike, *, limit: int | None = None,
                   threshold: float = DEFAULT_THRESHOLD, val_fraction: float = 0.1, seed: int = 0,
                   groups_csv: str | None = None, group_id_column: str | None = None, group_column: str = "group",
                   test_sets: list[str] | tuple[str, ...] | None = None, train: bool = True,
                   overwrite: bool = False) -> ConversionReport:
    """Convert a PraNet-layout polyp collection into one prepared dataset at ``out``.

    Args:
        source: folder with ``TrainDataset/`` and/or ``TestDataset/`` (or one of them), see module docstring.
        out: destination folder (built in a hidden temporary sibling, renamed at the end).
        limit: keep the first ``limit`` pairs of each sub-folder (train, each test set) by natural name order.
        threshold: mask binarisation, ``value > threshold`` -> 255 (default 128, PraNet toolbox's ``gt > 128``).
        val_fraction: share of ``TrainDataset`` moved to ``val`` (seeded, group-aware); 0 keeps train/test only.
        seed: seed of the validation draw.
        groups_csv: optional CSV with video/patient ids (keys: ``sample_id``, or a file name/stem that only one
            sample has).
        group_id_column: its key column (default ``sample_id``, else ``image``).
        group_column: its group column (default ``group``).
        test_sets: ``TestDataset`` sub-folders to keep (names of :data:`TEST_SETS`); None = every one found.
        train: convert ``TrainDataset`` (False: a test-only dataset).
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`msb.data.converters.ConversionReport` (changed pixels = values altered by the threshold).

    Raises:
        MSBError: no ``TrainDataset``/``TestDataset`` found, unknown test folder, a ``test_sets`` name that is not
            a PraNet test set or not in the source, nothing left to convert, unpaired files, unreadable files, size
            mismatch, bad options. Nothing is left at ``out`` after an error.
    """
    source = Path(source).expanduser()
    if not source.is_dir():
        raise MSBError(f"source folder {source} not found; pass the folder holding TrainDataset/ and/or TestDataset/.")
    check_limit(limit)
    check_threshold(threshold)
    train_dir, test_dir = _layout(source)
    if train_dir is None and test_dir is None:
        raise MSBError(f"{source}: no TrainDataset/ (image/, mask/) or TestDataset/<name>/ (images/, masks/) found; "
                       f"--source must be the PraNet data folder.")
    keep = _check_test_sets(test_sets, test_dir, source)
    if not train:
        train_dir = None
    if train_dir is None and (test_dir is None or keep == set()):
        raise MSBError(f"{source}: nothing to convert (train={train}, test_sets={test_sets}); keep TrainDataset or "
                       f"name at least one test set of {list(TEST_SETS)}.")
    notes: list[str] = []
    samples: list[Sample] = []
    neardup = {sid: f"kvasir-neardup_{k + 1}" for k, pair in enumerate(NEAR_DUPLICATE_PAIRS) for sid in pair}

    def add(folder: Path, split: str, fixed_source: str | None) -> int:
        dirs = _pair_dirs(folder)
        if dirs is None:
            raise MSBError(f"{folder}: expected sub-folders image(s)/ and mask(s)/; found "
                           f"{sorted(p.name for p in folder.iterdir() if p.is_dir())}.")
        pairs, more = find_pairs(dirs[0], dirs[1])
        notes.extend(f"{folder.name}: {m}" for m in more)
        pairs = sorted(pairs, key=lambda p: natural_key(p.sample_id))
        if limit is not None and limit < len(pairs):
            notes.append(f"limit={limit}: kept the first {limit} of {len(pairs)} pairs of {folder.name}")
            pairs = pairs[:limit]
        for p in pairs:
            src = fixed_source or train_source_of(p.sample_id)
            sid = f"{split}-{src}-{p.sample_id}"
            group = neardup.get(p.sample_id, "") if src == "Kvasir" else ""
            samples.append(Sample(sid, p.image, (p.mask,), f"images/{split}/{src}/{p.image.name}", split, group, src))
        return len(pairs)

    if train_dir is not None:
        add(train_dir, "train", None)
    if test_dir is not None:
        subs = sorted(p for p in test_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
        unknown = [p.name for p in subs if p.name not in TEST_SETS]
        if unknown:
            raise MSBError(f"{test_dir}: unknown test set folder(s) {unknown}; expected some of "
                           f"{', '.join(TEST_SETS)}. Rename or remove them.")
        for sub in subs:
            if keep is not None and sub.name not in keep:
                notes.append(f"test_sets: {sub.name} left out")
                continue
            n = add(sub, "test", sub.name)
            if limit is None and n != TEST_SETS[sub.name]:
                notes.append(f"{sub.name}: {n} pairs (the PraNet release has {TEST_SETS[sub.name]})")
    samples = apply_groups(samples, groups_csv, group_id_column, group_column, notes,
                           limited=limit is not None)
    with staged_output(out, overwrite=overwrite, source=source) as tmp:
        index, n_changed, n_pixels, counters = write_samples(samples, tmp, threshold_mask_fn(threshold))
        index, n_val = carve_validation(index, val_fraction, seed)
        classes = [ClassSpec(0, "background", (0,)), ClassSpec(1, "polyp", (255,))]
        write_prepared_dataset(tmp, index, classes)
        load_prepared_dataset(tmp, check_files=True)
    by_source = index.groupby(["split", "source"]).size()
    notes.insert(0, "samples per split/source: " + ", ".join(f"{s}/{src}={n}" for (s, src), n in by_source.items()))
    notes.append(f"masks binarised: value > {threshold:g} -> 255, else 0")
    if counters.get("colour_masks"):
        notes.append(f"{counters['colour_masks']} colour mask(s) with unequal R/G/B channels: their rounded channel "
                     f"mean was thresholded")
    if n_val:
        notes.append(f"val_fraction={val_fraction}: {n_val} TrainDataset row(s) moved to val (seed {seed}, whole "
                     f"groups); the official protocol has no validation set")
    n_nd = int((index["group"].str.startswith("kvasir-neardup_")).sum())
    notes.append(f"{n_nd} Kvasir-SEG row(s) in known near-duplicate pairs share a group; CVC-ClinicDB frames have no "
                 f"video ids in this release (train and test frames of one video may be near-duplicates: run "
                 f"`msb audit`)")
    return ConversionReport(n_samples=len(index), n_changed_mask_pixels=n_changed, notes=notes,
                            out=Path(out).expanduser().absolute(), name="pranet", n_mask_pixels=n_pixels)


__all__ = ["convert_pranet", "TEST_SETS", "train_source_of"]
