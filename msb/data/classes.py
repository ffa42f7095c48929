"""Dataset classes: ``classes.csv`` (class ids, names, raw mask values), its validation, reading and writing.

``<root>/classes.csv`` holds ``class_id, name, source_values``: one row per class, ``class_id`` contiguous
from 0, class 0 is the background; ``source_values`` is a ``;``-separated list of the raw integer mask values
mapped to that class (e.g. ``0`` for background, ``255`` for the lesion). Each raw value belongs to at most
one class. Part of the prepared-dataset schema (:mod:`msb.data.schema`, which re-exports these names).

Every user error raises :class:`msb.errors.MSBError` naming the file, the 1-based CSV line (:func:`csv_line`)
and what to do.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from msb.errors import MSBError
from msb.utils.csvio import read_user_csv

__all__ = ["CLASSES_FILE", "CLASSES_COLUMNS", "ClassSpec", "classes_to_csv", "csv_line", "read_classes",
           "validate_classes"]

CLASSES_FILE = "classes.csv"
CLASSES_COLUMNS: tuple[str, ...] = ("class_id", "name", "source_values")


#: at most this many problems are listed in one error message (the total count is always given)
_MAX_LISTED = 10


def _problem_list(problems: Sequence[str]) -> str:
    """Join problems into one message fragment: the first ``_MAX_LISTED`` and a count of the rest."""
    shown = "; ".join(problems[:_MAX_LISTED])
    if len(problems) > _MAX_LISTED:
        shown += f"; ... and {len(problems) - _MAX_LISTED} more"
    return shown


def csv_line(position: int) -> int:
    """1-based CSV line of the data row at 0-based ``position`` (line 1 is the header)."""
    return int(position) + 2


@dataclass(frozen=True)
class ClassSpec:
    """One segmentation class.

    Attributes:
        class_id: integer id; 0 is the background, foreground classes are 1..K-1 (contiguous).
        name: human-readable name (unique within a dataset, e.g. ``"polyp"``).
        source_values: raw integer mask values (as stored in the mask files) that map to this class.
    """

    class_id: int
    name: str
    source_values: tuple[int, ...]


def validate_classes(classes: Sequence[ClassSpec], where: str = CLASSES_FILE) -> list[ClassSpec]:
    """Check a class list and return it sorted by ``class_id``.

    Rules: ids contiguous ``0..K-1`` with ``K >= 2``, class 0 present (background), names unique and
    non-empty, each class has at least one source value, source values are integers in ``[0, 65535]`` and
    no value is listed under two classes.

    Args:
        classes: the classes, any order.
        where: file name used in error messages.

    Returns:
        The classes sorted by ``class_id``.

    Raises:
        MSBError: naming ``where`` and the offending class.
    """
    classes = sorted(classes, key=lambda c: c.class_id)
    ids = [c.class_id for c in classes]
    if len(classes) < 2:
        raise MSBError(f"{where}: needs a background class (class_id 0) and at least one foreground class; "
                       f"found {len(classes)} class(es). Add the missing rows.")
    if ids != list(range(len(classes))):
        raise MSBError(f"{where}: class_id values must be contiguous 0..{len(classes) - 1} with 0 = background; "
                       f"found {ids}. Renumber the classes.")
    names = [c.name for c in classes]
    for c in classes:
        if not str(c.name).strip():
            raise MSBError(f"{where}: class_id {c.class_id} has an empty name. Give every class a name.")
        if names.count(c.name) > 1:
            raise MSBError(f"{where}: class name {c.name!r} is used by more than one class. Make names unique.")
        if len(c.source_values) == 0:
            raise MSBError(f"{where}: class_id {c.class_id} ({c.name!r}) has no source_values. List the raw mask "
                           f"values that belong to it, separated by ';'.")
    owner: dict[int, ClassSpec] = {}
    for c in classes:
        for v in c.source_values:
            if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or not 0 <= int(v) <= 65535:
                raise MSBError(f"{where}: class_id {c.class_id} ({c.name!r}) has source value {v!r}; values must be "
                               f"integers in [0, 65535].")
            if int(v) in owner:
                raise MSBError(f"{where}: raw mask value {int(v)} is listed under class_id {owner[int(v)].class_id} "
                               f"({owner[int(v)].name!r}) and class_id {c.class_id} ({c.name!r}). Each value may "
                               f"belong to one class only.")
            owner[int(v)] = c
    return classes


def read_classes(path: str | Path) -> list[ClassSpec]:
    """Read and validate ``classes.csv``.

    Args:
        path: path of ``classes.csv``.

    Returns:
        Classes sorted by ``class_id`` (class 0 = background).

    Raises:
        MSBError: missing file, missing columns, non-integer ids or values (naming the CSV line), or any rule
            of :func:`validate_classes`.
    """
    path = Path(path)
    df = read_user_csv(path, "classes file", f"a prepared dataset needs classes.csv (columns "
                                             f"{', '.join(CLASSES_COLUMNS)}); run `msb data prepare` or write it")
    missing = [c for c in CLASSES_COLUMNS if c not in df.columns]
    if missing:
        raise MSBError(f"{path}: missing column(s) {missing}; expected {list(CLASSES_COLUMNS)}.")
    classes = []
    for pos, row in enumerate(df.itertuples(index=False)):
        line = csv_line(pos)
        try:
            cid = int(str(row.class_id).strip())
        except ValueError:
            raise MSBError(f"{path} line {line}: class_id {row.class_id!r} is not an integer.") from None
        raw = str(row.source_values).strip()
        try:
            values = tuple(int(v.strip()) for v in raw.split(";") if v.strip() != "")
        except ValueError:
            raise MSBError(f"{path} line {line}: source_values {raw!r} must be ';'-separated integers "
                           f"(e.g. '0' or '1;2').") from None
        classes.append(ClassSpec(class_id=cid, name=str(row.name).strip(), source_values=values))
    return validate_classes(classes, where=str(path))


def classes_to_csv(classes: Sequence[ClassSpec]) -> str:
    """Render classes as the text of ``classes.csv`` (``\\n`` line ends, sorted by ``class_id``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CLASSES_COLUMNS)
    for c in sorted(classes, key=lambda c: c.class_id):
        w.writerow([c.class_id, c.name, ";".join(str(int(v)) for v in c.source_values)])
    return buf.getvalue()
