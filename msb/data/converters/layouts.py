"""Source layouts shared by the converters: the common ``images/ + masks/`` layout, the PraNet
``TrainDataset/ + TestDataset/<set>/`` layout and the numbered ``<n>.tif`` + ``p<n>.tif`` layout of the CVC
releases, so that a converter accepts the copies people actually have, not only the official zip.

A converter asks :func:`detect_layout` with its own official-layout finder first; the first layout that matches
wins, in the order *official*, *images-masks*, *pranet*. Each layout is a tuple of :class:`Part` (an image
folder, a mask folder, how to pair them, and the split the copy ships). :func:`pair_part` turns a part into
:class:`msb.data.converters.folder.Pair` records.

Pairing rules:

* ``pairing="stem"``: mask ``<stem><mask_suffix>.<ext>`` (:func:`msb.data.converters.folder.find_pairs`); in
  the images-masks layout the suffix is guessed with :func:`guess_mask_suffix` among ``""``, ``"_mask"``,
  ``"_segmentation"`` (the one that pairs the most masks; ``""`` wins ties);
* ``pairing="numbered"``: image ``<n>.<ext>`` (``n`` an integer) with mask ``p<n>.<ext>`` (CVC-ColonDB and
  ETIS-LaribPolypDB originals); other files (e.g. the ``cp<n>`` contours) are ignored and counted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from msb.data.converters.folder import IMAGE_EXTENSIONS, Pair, find_pairs
from msb.errors import MSBError

__all__ = ["Part", "Layout", "detect_layout", "images_masks_layout", "pranet_layout", "pair_part",
           "guess_mask_suffix", "find_dir", "IMAGE_DIRS", "MASK_DIRS"]

#: accepted names of the image / mask folder of the images-masks layout (case, spaces, ``_``/``-`` ignored)
IMAGE_DIRS: tuple[str, ...] = ("images", "image", "imgs", "img")
MASK_DIRS: tuple[str, ...] = ("masks", "mask", "gt", "labels", "annotations")
_SUFFIXES: tuple[str, ...] = ("", "_mask", "_segmentation")


@dataclass(frozen=True)
class Part:
    """One image folder + mask folder of a source.

    Attributes:
        images: image folder.
        masks: mask folder (may equal ``images`` with ``pairing="numbered"``).
        split: the split this copy ships (``train``/``test`` for PraNet folders) or ``''``.
        pairing: ``"stem"`` or ``"numbered"`` (module docstring).
        mask_suffix: for ``"stem"``; ``None`` = guess it.
        keep: optional filter on the sample id (PraNet ``TrainDataset`` mixes Kvasir-SEG and CVC-ClinicDB).
        label: for messages and notes (e.g. ``TestDataset/CVC-300``).
    """

    images: Path
    masks: Path
    split: str = ""
    pairing: str = "stem"
    mask_suffix: str | None = ""
    keep: Callable[[str], bool] | None = None
    label: str = ""


@dataclass(frozen=True)
class Layout:
    """A detected layout: ``name`` is ``official``, ``images-masks`` or ``pranet``; ``parts`` its folders."""

    name: str
    parts: tuple[Part, ...]


def _norm(s: str) -> str:
    return re.sub(r"[\s_\-]", "", s.lower())


def find_dir(folder: Path, names: Sequence[str]) -> Path | None:
    """The sub-folder of ``folder`` named like one of ``names`` (case, spaces, ``_``, ``-`` ignored), in the
    order of ``names``; ``None`` when there is none or ``folder`` is not a folder."""
    if not folder.is_dir():
        return None
    children = {_norm(p.name): p for p in sorted(folder.iterdir()) if p.is_dir() and not p.name.startswith(".")}
    for n in names:
        if _norm(n) in children:
            return children[_norm(n)]
    return None


def images_masks_layout(source: Path, wrappers: Sequence[str] = ()) -> Layout | None:
    """``source/images/ + source/masks/`` (folder names :data:`IMAGE_DIRS`, :data:`MASK_DIRS`), also one level
    down in a wrapper folder named like one of ``wrappers`` (e.g. the unzipped ``Kvasir-SEG/``)."""
    for base in (source, *(d for d in (find_dir(source, wrappers),) if d is not None)):
        img, msk = find_dir(base, IMAGE_DIRS), find_dir(base, MASK_DIRS)
        if img is not None and msk is not None:
            return Layout("images-masks", (Part(img, msk, mask_suffix=None, label=f"{img.name}/ + {msk.name}/"),))
    return None


def pranet_layout(source: Path, test_set: str | None, train_keep: Callable[[str], bool] | None) -> Layout | None:
    """The PraNet copy of one dataset: ``TrainDataset/{image,mask}/`` rows that pass ``train_keep`` (split
    ``train``; skipped when ``train_keep`` is None) and ``TestDataset/<test_set>/{images,masks}/`` (split
    ``test``). ``source`` may hold ``TrainDataset/``/``TestDataset/`` or be ``TestDataset/`` itself."""
    train, test = find_dir(source, ("TrainDataset",)), find_dir(source, ("TestDataset",))
    if train is None and test is None and test_set and find_dir(source, (test_set,)) is not None:
        test = source
    parts = []
    if train is not None and train_keep is not None:
        img, msk = find_dir(train, ("image", "images")), find_dir(train, ("mask", "masks"))
        if img is not None and msk is not None:
            parts.append(Part(img, msk, "train", keep=train_keep, label="TrainDataset"))
    sub = find_dir(test, (test_set,)) if test is not None and test_set else None
    if sub is not None:
        img, msk = find_dir(sub, ("images", "image")), find_dir(sub, ("masks", "mask"))
        if img is not None and msk is not None:
            parts.append(Part(img, msk, "test", label=f"TestDataset/{sub.name}"))
    return Layout("pranet", tuple(parts)) if parts else None


def detect_layout(source: Path, official: Callable[[Path], Layout | None] | None, *,
                  wrappers: Sequence[str] = (), pranet_test: str | None = None,
                  pranet_train: Callable[[str], bool] | None = None, expected: str = "") -> Layout:
    """The first layout of ``source`` that matches: ``official(source)``, then images-masks, then PraNet.

    Args:
        source: the source folder.
        official: the converter's official-layout finder (``None``: the official layout *is* images-masks).
        wrappers: wrapper folder names for the images-masks layout.
        pranet_test: the dataset's ``TestDataset/<name>`` folder (``None``: not in the PraNet release).
        pranet_train: filter of the dataset's rows in ``TrainDataset`` (``None``: not part of it).
        expected: the official layout in words, for the error message.

    Raises:
        MSBError: no layout matches; the message lists what each layout needs and the folders found.
    """
    for finder in (official, lambda s: images_masks_layout(s, wrappers),
                   lambda s: pranet_layout(s, pranet_test, pranet_train) if (pranet_test or pranet_train) else None):
        layout = finder(source) if finder is not None else None
        if layout is not None:
            return layout
    found = sorted(p.name for p in source.iterdir() if p.is_dir()) if source.is_dir() else []
    accepted = ([expected] if expected else []) + ["images/ + masks/"]
    if pranet_test or pranet_train:
        accepted.append("PraNet TrainDataset/ + TestDataset/" + (pranet_test or "<set>") + "/")
    img, msk = find_dir(source, IMAGE_DIRS), find_dir(source, MASK_DIRS)
    if (img is None) != (msk is None):
        have, miss = (img, MASK_DIRS) if img is not None else (msk, IMAGE_DIRS)
        assert have is not None
        raise MSBError(f"{source}: {have.name}/ found but no {'mask' if img is not None else 'image'} folder beside "
                       f"it ({'/, '.join(miss)}/); --source must be the folder holding both (accepted layouts: "
                       f"{'; '.join(accepted)}).")
    raise MSBError(f"{source}: no known layout found (accepted: {'; '.join(accepted)}); sub-folders found: "
                   f"{found}. Point --source at the dataset folder.")


def guess_mask_suffix(images: Path, masks: Path, candidates: Sequence[str] = _SUFFIXES) -> str:
    """The candidate suffix that pairs the most mask files with image stems (ties: the earlier candidate)."""
    def stems(d: Path) -> set[str]:
        return {p.stem for p in d.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS}

    img, msk = stems(images), stems(masks)
    if images.resolve() == masks.resolve():
        candidates = [c for c in candidates if c]
    best, best_n = candidates[0], -1
    for c in candidates:
        n = sum(1 for s in msk if (s.endswith(c) if c else True) and s[: len(s) - len(c)] in img)
        if n > best_n:
            best, best_n = c, n
    return best


def _pair_numbered(part: Part, mask_prefix: str = "p") -> tuple[list[Pair], list[str]]:
    num = re.compile(r"^(\d+)$")
    pat = re.compile(rf"^{re.escape(mask_prefix)}(\d+)$")

    def scan(folder: Path) -> list[Path]:
        return sorted((p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")
                       and p.suffix.lower() in IMAGE_EXTENSIONS), key=lambda p: p.name)

    img_files = scan(part.images)
    msk_files = img_files if part.masks.resolve() == part.images.resolve() else scan(part.masks)
    images = {str(int(m.group(1))): p for p in img_files if (m := num.match(p.stem))}
    masks = {str(int(m.group(1))): p for p in msk_files if (m := pat.match(p.stem))}
    used = set(images.values()) | set(masks.values())
    ignored = len(set(img_files) | set(msk_files)) - len(used)
    no_mask = sorted(set(images) - set(masks), key=int)
    no_image = sorted(set(masks) - set(images), key=int)
    if no_mask or no_image:
        parts = []
        if no_mask:
            parts.append(f"{len(no_mask)} frame(s) without a mask '{mask_prefix}<n>' in {part.masks}: "
                         f"{', '.join(images[k].name for k in no_mask[:10])}")
        if no_image:
            parts.append(f"{len(no_image)} mask(s) without a frame in {part.images}: "
                         f"{', '.join(masks[k].name for k in no_image[:10])}")
        raise MSBError("unpaired files: " + "; ".join(parts) + ". Restore or remove them.")
    if not images:
        raise MSBError(f"{part.images}: no numbered frames '<n>.<ext>' with masks '{mask_prefix}<n>.<ext>' found.")
    label = part.label or part.images.name
    notes = [f"{label}: ignored {ignored} other image file(s) (e.g. contours)"] if ignored else []
    return [Pair(k, images[k], masks[k]) for k in sorted(images, key=int)], notes


def pair_part(part: Part) -> tuple[list[Pair], list[str]]:
    """Pairs of ``part`` (module docstring), filtered by ``part.keep``.

    Returns:
        ``(pairs, notes)``.

    Raises:
        MSBError: as :func:`msb.data.converters.folder.find_pairs`; unpaired numbered frames; nothing left after
            ``keep``.
    """
    if part.pairing == "numbered":
        pairs, notes = _pair_numbered(part)
    else:
        suffix = guess_mask_suffix(part.images, part.masks) if part.mask_suffix is None else part.mask_suffix
        pairs, notes = find_pairs(part.images, part.masks, mask_suffix=suffix)
        if suffix:
            notes.append(f"{part.label or part.images.name}: masks paired as '<stem>{suffix}.<ext>'")
    if part.keep is not None:
        pairs = [p for p in pairs if part.keep(p.sample_id)]
        if not pairs:
            raise MSBError(f"{part.images}: no file of this dataset found in {part.label or part.images}.")
    return pairs, notes
