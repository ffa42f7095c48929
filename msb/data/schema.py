"""Prepared-dataset schema: ``index.csv`` + ``classes.csv``, validation on load, image and mask readers.

A *prepared dataset* is a folder ``<root>`` holding:

``<root>/index.csv``
    One row per sample. Required columns (any order; extra columns are kept):

    ========== ==============================================================================
    column     meaning
    ========== ==============================================================================
    sample_id  unique, non-empty; used as a file name later (no ``/``, ``\\``, ``.``/``..``)
    image_path image file, relative to ``<root>`` (POSIX ``/`` separators)
    mask_path  mask file, relative to ``<root>``; raw integer values, see ``classes.csv``
    split      ``train`` / ``val`` / ``test`` or empty (the run then decides the split)
    group      optional grouping key (patient / video / centre / near-duplicate set), may be empty
    height     image height in pixels (int > 0)
    width      image width in pixels (int > 0)
    source     free text naming where the sample came from (e.g. ``kvasir-seg``)
    ========== ==============================================================================

    Optional columns ``spacing_row``, ``spacing_col``: pixel spacing in mm per pixel (float > 0,
    empty = 1.0).

``<root>/classes.csv``
    ``class_id, name, source_values``: one row per class, ``class_id`` contiguous from 0, class 0 is the
    background; ``source_values`` is a ``;``-separated list of the raw integer mask values mapped to that
    class (e.g. ``0`` for background, ``255`` for the lesion). Each raw value belongs to at most one class.

Geometry convention: images and masks are read *without* applying EXIF orientation (OpenCV is told to
ignore it, PIL never applies it), so the stored pixel grid is the one that is validated and used.

Every user error raises :class:`msb.errors.MSBError` with a message naming the file, the 1-based CSV line
(line 1 is the header, so data row ``i`` (0-based) is line ``i + 2``), the ``sample_id`` and what to do.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Sequence

import numpy as np
import pandas as pd

from msb.data.classes import (CLASSES_COLUMNS, CLASSES_FILE, ClassSpec, _problem_list, classes_to_csv, csv_line,
                              read_classes, validate_classes)
from msb.data.readers import image_size, mask_to_label_map, mask_to_onehot, read_image, read_mask
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_bytes

# the class and reader names are re-exported: callers import them from msb.data.schema
__all__ = ["INDEX_FILE", "CLASSES_FILE", "INDEX_COLUMNS", "OPTIONAL_INDEX_COLUMNS", "CLASSES_COLUMNS",
           "VALID_SPLITS", "ClassSpec", "PreparedDataset", "classes_to_csv", "csv_line", "image_size",
           "index_to_csv", "load_prepared_dataset", "mask_to_label_map", "mask_to_onehot", "read_classes",
           "read_image", "read_mask", "validate_classes", "write_prepared_dataset"]

INDEX_FILE = "index.csv"
INDEX_COLUMNS: tuple[str, ...] = ("sample_id", "image_path", "mask_path", "split", "group", "height", "width",
                                  "source")
OPTIONAL_INDEX_COLUMNS: tuple[str, ...] = ("spacing_row", "spacing_col")
VALID_SPLITS: tuple[str, ...] = ("train", "val", "test")



# --------------------------------------------------------------------------------------------------------
# prepared dataset
# --------------------------------------------------------------------------------------------------------
@dataclass
class PreparedDataset:
    """A loaded (and validated) prepared dataset.

    Attributes:
        root: dataset folder (absolute).
        name: dataset name (the folder name unless given).
        index: the rows of ``index.csv`` in file order, ``RangeIndex``. Dtypes: ``sample_id``, ``image_path``,
            ``mask_path``, ``split``, ``group``, ``source`` are ``str`` (empty string = empty cell); ``height``,
            ``width`` are ``int64``; ``spacing_row``/``spacing_col`` (if present) ``float64`` mm/px (empty = 1.0).
        classes: classes sorted by ``class_id`` (class 0 = background).
    """

    root: Path
    name: str
    index: pd.DataFrame
    classes: list[ClassSpec]
    _position: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.classes = sorted(self.classes, key=lambda c: c.class_id)
        self._position = {str(s): i for i, s in enumerate(self.index["sample_id"])}

    @property
    def foreground_classes(self) -> list[ClassSpec]:
        """Foreground classes (``class_id >= 1``) in ``class_id`` order: the channel order of masks/predictions."""
        return [c for c in self.classes if c.class_id != 0]

    @property
    def sample_ids(self) -> list[str]:
        """All sample ids in ``index.csv`` order."""
        return [str(s) for s in self.index["sample_id"]]

    def __len__(self) -> int:
        return len(self.index)

    def row(self, sample_id: str) -> pd.Series:
        """The index row of ``sample_id``.

        Raises:
            MSBError: unknown sample id.
        """
        try:
            pos = self._position[str(sample_id)]
        except KeyError:
            raise MSBError(f"{self.root / INDEX_FILE}: no sample with sample_id {sample_id!r}.") from None
        return self.index.iloc[pos]

    def image_path(self, sample_id: str) -> Path:
        """Absolute path of the image of ``sample_id`` (raises MSBError for an unknown id)."""
        return self.root / str(self.row(sample_id)["image_path"])

    def mask_path(self, sample_id: str) -> Path:
        """Absolute path of the mask of ``sample_id`` (raises MSBError for an unknown id)."""
        return self.root / str(self.row(sample_id)["mask_path"])

    def spacing(self, sample_id: str) -> tuple[float, float]:
        """Pixel spacing ``(row, col)`` in mm per pixel; 1.0 where the column is absent or the cell empty."""
        r = self.row(sample_id)
        out = []
        for col in OPTIONAL_INDEX_COLUMNS:
            v = r[col] if col in r.index else np.nan
            out.append(1.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v))
        return out[0], out[1]

    def load_image(self, sample_id: str) -> np.ndarray:
        """``(H, W, 3)`` ``uint8`` RGB image of ``sample_id`` (see :func:`read_image`)."""
        return read_image(self.image_path(sample_id))

    def load_onehot(self, sample_id: str) -> np.ndarray:
        """``(C_fg, H, W)`` ``bool`` reference mask of ``sample_id`` (see :func:`mask_to_onehot`)."""
        p = self.mask_path(sample_id)
        return mask_to_onehot(read_mask(p), self.classes, p)


def _is_bad_relpath(p: str) -> str | None:
    """Return why ``p`` is not an acceptable relative path, or None when fine."""
    if p.strip() == "":
        return "is empty"
    if p.startswith(("/", "\\")) or (len(p) > 1 and p[1] == ":"):
        return "is absolute (paths must be relative to the dataset folder)"
    return None


def _bad_sample_id(s: str) -> str | None:
    if s.strip() == "":
        return "sample_id is empty"
    if s != s.strip():
        return f"sample_id {s!r} has leading/trailing spaces"
    if "/" in s or "\\" in s or s in (".", "..") or "\x00" in s:
        return f"sample_id {s!r} cannot be used as a file name (contains '/', '\\\\' or is '.'/'..')"
    return None


def load_prepared_dataset(root: str | Path, check_files: bool = True, check_mask_values: bool = False,
                          name: str | None = None) -> PreparedDataset:
    """Load and validate a prepared dataset folder.

    Checks (each problem is reported with the ``index.csv`` path, CSV line, ``sample_id`` and file):

    * ``index.csv`` / ``classes.csv`` exist and parse; required columns present; ``classes.csv`` rules
      (:func:`validate_classes`);
    * ``sample_id`` non-empty, unique, usable as a file name; ``split`` in {train, val, test, empty};
      ``height``/``width`` positive integers; ``spacing_*`` positive floats or empty; paths relative;
    * ``check_files``: image and mask files exist, are readable images (header only, via PIL) and have the
      same size as each other and as the index ``height``/``width``;
    * ``check_mask_values`` (slow: decodes every mask): masks decode (:func:`read_mask`) and every value is
      covered by ``classes.csv``.

    Args:
        root: dataset folder.
        check_files: check the files on disk (fast, headers only).
        check_mask_values: additionally decode every mask and check its values.
        name: dataset name; defaults to the folder name.

    Returns:
        The :class:`PreparedDataset`.

    Raises:
        MSBError: listing up to 10 problems (and the total count) of the first failing check.
    """
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise MSBError(f"{root}: prepared dataset folder not found. Run `msb data prepare NAME --source DIR` "
                       f"or `msb data synth` first.")
    index_file = root / INDEX_FILE
    if not index_file.is_file():
        raise MSBError(f"{index_file}: not found; {root} is not a prepared dataset. Run `msb data prepare` "
                       f"or `msb data synth`.")
    classes = read_classes(root / CLASSES_FILE)
    try:
        df = pd.read_csv(index_file, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise MSBError(f"{index_file}: cannot be parsed as CSV ({e}). Fix or regenerate the file.") from e
    missing = [c for c in INDEX_COLUMNS if c not in df.columns]
    if missing:
        raise MSBError(f"{index_file}: missing column(s) {missing}. Required columns: {list(INDEX_COLUMNS)} "
                       f"(optional: {list(OPTIONAL_INDEX_COLUMNS)}).")
    if len(df) == 0:
        raise MSBError(f"{index_file}: has no rows. Add samples or re-run `msb data prepare`.")

    def where(pos: int) -> str:
        return f"{index_file} line {csv_line(pos)} (sample_id {df['sample_id'].iat[pos]!r})"

    problems: list[str] = []
    # sample ids
    for pos, s in enumerate(df["sample_id"]):
        why = _bad_sample_id(s)
        if why:
            problems.append(f"{where(pos)}: {why}")
    dup = df["sample_id"].duplicated(keep=False) & (df["sample_id"].str.strip() != "")
    if dup.any():
        for sid, grp in df[dup].groupby("sample_id", sort=True):
            lines = ", ".join(str(csv_line(p)) for p in grp.index)
            problems.append(f"{index_file}: duplicate sample_id {sid!r} on lines {lines}")
    _raise(problems, "make every sample_id unique, non-empty and free of path separators")

    # split values
    for pos, s in enumerate(df["split"]):
        if s not in VALID_SPLITS and s != "":
            problems.append(f"{where(pos)}: split {s!r} is not one of train/val/test/empty")
    _raise(problems, "use train, val, test or leave the split cell empty")

    # sizes
    sizes = {}
    for col in ("height", "width"):
        vals = []
        for pos, v in enumerate(df[col]):
            try:
                iv = int(v.strip())
                if iv <= 0 or str(iv) != v.strip():
                    raise ValueError
            except ValueError:
                problems.append(f"{where(pos)}: {col} {v!r} is not a positive integer")
                iv = 0
            vals.append(iv)
        sizes[col] = np.asarray(vals, dtype=np.int64)
    # spacing
    spacing = {}
    for col in OPTIONAL_INDEX_COLUMNS:
        if col not in df.columns:
            continue
        vals = []
        for pos, v in enumerate(df[col]):
            if v.strip() == "":
                vals.append(1.0)
                continue
            try:
                fv = float(v)
                if not (math.isfinite(fv) and fv > 0):
                    raise ValueError
            except ValueError:
                problems.append(f"{where(pos)}: {col} {v!r} is not a positive number (mm per pixel) or empty")
                fv = 1.0
            vals.append(fv)
        spacing[col] = np.asarray(vals, dtype=np.float64)
    # paths
    for col in ("image_path", "mask_path"):
        for pos, v in enumerate(df[col]):
            why = _is_bad_relpath(v)
            if why:
                problems.append(f"{where(pos)}: {col} {v!r} {why}")
    _raise(problems, "fix these cells")

    df = df.copy()
    df["height"] = sizes["height"]
    df["width"] = sizes["width"]
    for col, vals in spacing.items():
        df[col] = vals

    if check_files:
        for pos in range(len(df)):
            img_file = root / PurePosixPath(df["image_path"].iat[pos])
            msk_file = root / PurePosixPath(df["mask_path"].iat[pos])
            hw: dict[str, tuple[int, int]] = {}
            for kind, f in (("image", img_file), ("mask", msk_file)):
                if not f.is_file():
                    problems.append(f"{where(pos)}: {kind} file {f} is missing")
                    continue
                try:
                    hw[kind] = image_size(f)
                except MSBError:
                    problems.append(f"{where(pos)}: {kind} file {f} is not a readable image")
            if len(hw) < 2:
                continue
            exp = (int(df["height"].iat[pos]), int(df["width"].iat[pos]))
            if hw["image"] != hw["mask"]:
                problems.append(f"{where(pos)}: image {img_file} is {hw['image'][0]}x{hw['image'][1]} (HxW) but mask "
                                f"{msk_file} is {hw['mask'][0]}x{hw['mask'][1]}")
            elif hw["image"] != exp:
                problems.append(f"{where(pos)}: image {img_file} is {hw['image'][0]}x{hw['image'][1]} (HxW) but "
                                f"index.csv says height={exp[0]}, width={exp[1]}")
        _raise(problems, "restore or fix the files (image and mask must have the same size, matching "
                         "height/width), or re-run `msb data prepare`")

    if check_mask_values:
        for pos in range(len(df)):
            msk_file = root / PurePosixPath(df["mask_path"].iat[pos])
            try:
                mask_to_label_map(read_mask(msk_file), classes, msk_file)
            except MSBError as e:
                problems.append(f"{where(pos)}: {e}")
        _raise(problems, "fix the masks or extend source_values in classes.csv")

    return PreparedDataset(root=root, name=name or root.name, index=df.reset_index(drop=True), classes=classes)


def _raise(problems: list[str], what_to_do: str) -> None:
    """Raise one MSBError listing ``problems`` (if any) followed by ``what_to_do``."""
    if problems:
        n = len(problems)
        msg = f"{n} problem(s) in the prepared dataset: {_problem_list(problems)}. To fix: {what_to_do}."
        problems.clear()
        raise MSBError(msg)


def index_to_csv(index: pd.DataFrame) -> str:
    """Render an index DataFrame as the text of ``index.csv``.

    Column order: the required columns, then ``spacing_row``/``spacing_col`` if present, then any extra columns
    in their given order. Missing/NaN cells are written empty; ``\\n`` line ends; deterministic.

    Raises:
        MSBError: a required column is missing.
    """
    missing = [c for c in INDEX_COLUMNS if c not in index.columns]
    if missing:
        raise MSBError(f"index to write is missing column(s) {missing}; required: {list(INDEX_COLUMNS)}.")
    cols = list(INDEX_COLUMNS) + [c for c in OPTIONAL_INDEX_COLUMNS if c in index.columns]
    cols += [c for c in index.columns if c not in cols]
    buf = io.StringIO()
    index[cols].to_csv(buf, index=False, lineterminator="\n", na_rep="")
    return buf.getvalue()


def write_prepared_dataset(root: str | Path, index: pd.DataFrame, classes: Sequence[ClassSpec]) -> None:
    """Write ``index.csv`` and ``classes.csv`` into ``root`` (atomically, each file).

    The image/mask files themselves must already be in ``root`` (converters write them first). The classes are
    validated before anything is written, so a bad class list leaves no file behind.

    Args:
        root: dataset folder (created if needed).
        index: one row per sample with at least :data:`INDEX_COLUMNS`.
        classes: the classes (class 0 = background).

    Raises:
        MSBError: invalid classes or missing index columns (nothing is written).
    """
    classes = validate_classes(classes, where=f"classes for {Path(root) / CLASSES_FILE}")
    index_text = index_to_csv(index)
    classes_text = classes_to_csv(classes)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(root / CLASSES_FILE, classes_text.encode("utf-8"))
    atomic_write_bytes(root / INDEX_FILE, index_text.encode("utf-8"))
