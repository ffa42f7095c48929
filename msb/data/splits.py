"""Train/val/test splits: fixed (from ``index.csv``) or seeded random (optionally group-aware), and split files.

Random split algorithm (mode ``"random"``)
------------------------------------------
1. Units: with ``group_column`` given, all samples sharing a non-empty group value form one unit; a sample with
   an empty group value is a unit of its own. Without ``group_column`` every sample is a unit.
2. Units are sorted by key (so the result does not depend on row order) and shuffled with
   ``numpy.random.default_rng(seed).permutation``.
3. Cumulative sample counts along the shuffled units are cut twice: the test cut is the number of leading units
   whose cumulative count is closest to ``round(n * test_fraction)`` (at least one unit), the val cut is the next
   run of units whose count is closest to ``round(n * val_fraction)`` (at least one unit, leaving at least one
   unit for train). Ties go to the smaller cut. Without groups this gives exactly the rounded counts.

So every group lies entirely in one split, and the sample fractions are as close to the requested ones as whole
groups allow. Each of train/val/test must end up non-empty, else :class:`MSBError` says which fraction to
change.

Split files are CSV ``sample_id,split`` (``\\n`` line ends, in the order given), written atomically; their
SHA-256 is recorded with the run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from pathlib import Path
from typing import Iterable, Literal

import numpy as np
import pandas as pd

from msb.errors import MSBError
from msb.utils.atomic import atomic_write_bytes
from msb.utils.csvio import read_user_csv

SPLITS: tuple[str, ...] = ("train", "val", "test")
#: Values a split file may hold: :data:`SPLITS` plus ``inner_val``, the inner checkpoint-selection split of a
#: cross-validation fold run (``cross_validation.inner_val``, :mod:`msb.study.folds`).
SPLIT_FILE_VALUES: tuple[str, ...] = SPLITS + ("inner_val",)
_MAX_LISTED = 10


def _listed(items: list[str]) -> str:
    s = ", ".join(items[:_MAX_LISTED])
    return s + (f" ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def _check_non_empty(splits: pd.Series, hint: str) -> None:
    counts = splits.value_counts()
    empty = [s for s in SPLITS if int(counts.get(s, 0)) == 0]
    if empty:
        raise MSBError(f"split(s) {empty} would be empty ({', '.join(f'{s}={int(counts.get(s, 0))}' for s in SPLITS)}"
                       f"); every run needs non-empty train, val and test sets. {hint}")


def _closest_cut(cum: np.ndarray, start: int, target: float, lo: int, hi: int) -> int:
    """Index ``k`` in ``[lo, hi]`` minimising ``|cum[k] - cum[start] - target|`` (ties -> smaller ``k``)."""
    ks = np.arange(lo, hi + 1)
    err = np.abs(cum[ks] - cum[start] - target)
    return int(ks[int(np.argmin(err))])


def resolve_splits(index: pd.DataFrame, mode: Literal["fixed", "random"] = "random", val_fraction: float = 0.2,
                   test_fraction: float = 0.2, seed: int = 0, group_column: str | None = None,
                   index_file: str | os.PathLike | None = None) -> pd.Series:
    """Decide the split of every sample.

    Args:
        index: prepared-dataset index (needs ``sample_id``; ``split`` for ``fixed``; ``group_column`` if given).
            Row ``i`` (0-based) is reported as CSV line ``i + 2`` of ``index_file``.
        mode: ``"fixed"`` uses the ``split`` column as is; ``"random"`` draws a seeded split (module docstring).
        val_fraction: fraction of samples for validation, in (0, 1) (``random`` only).
        test_fraction: fraction of samples for testing, in (0, 1); ``val_fraction + test_fraction < 1``.
        seed: random seed (``random`` only).
        group_column: column whose values keep samples together (e.g. ``"group"``); ``None`` = no grouping.
            Empty cells are groups of one sample.
        index_file: file name for error messages (default ``index.csv``).

    Returns:
        ``pd.Series`` of ``str`` (``train``/``val``/``test``), indexed by ``sample_id`` in index row order, named
        ``split``.

    Raises:
        MSBError: unknown mode, missing columns, bad fractions, ``fixed`` rows with an empty or invalid split
            (naming their lines and sample ids), a split that ends up empty (saying which fraction to change),
            too few samples/groups.
    """
    where = str(index_file) if index_file is not None else "index.csv"
    if "sample_id" not in index.columns:
        raise MSBError(f"{where}: no sample_id column.")
    sids = index["sample_id"].astype(str).to_numpy()
    if len(sids) == 0:
        raise MSBError(f"{where}: no samples to split.")
    if pd.Series(sids).duplicated().any():
        raise MSBError(f"{where}: duplicate sample_id values; run `msb data validate` first.")
    if mode == "fixed":
        if "split" not in index.columns:
            raise MSBError(f"{where}: split mode 'fixed' needs a split column; use mode 'random' instead.")
        vals = index["split"].fillna("").astype(str).str.strip().to_numpy()
        bad = [f"line {i + 2} (sample_id {sids[i]!r}: {vals[i]!r})" for i in range(len(vals)) if vals[i] not in SPLITS]
        if bad:
            raise MSBError(f"{where}: split mode 'fixed' but {len(bad)} row(s) have an empty or invalid split: "
                           f"{_listed(bad)}. Fill the split column with train/val/test, or use split mode 'random'.")
        out = pd.Series(vals, index=pd.Index(sids, name="sample_id"), name="split", dtype=object)
        _check_non_empty(out, f"Assign some rows of {where} to the missing split(s), or use split mode 'random'.")
        return out
    if mode != "random":
        raise MSBError(f"unknown split mode {mode!r}; use 'fixed' or 'random'.")

    for nm, f in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if not isinstance(f, (int, float)) or isinstance(f, bool) or not 0.0 < float(f) < 1.0:
            raise MSBError(f"{nm} must be a number in (0, 1), got {f!r}.")
    if val_fraction + test_fraction >= 1.0:
        raise MSBError(f"val_fraction + test_fraction = {val_fraction + test_fraction:g} leaves no training data; "
                       f"make their sum < 1.")
    n = len(sids)
    if group_column:
        if group_column not in index.columns:
            raise MSBError(f"{where}: group column {group_column!r} not found; columns are {list(index.columns)}.")
        g = index[group_column].fillna("").astype(str).str.strip().to_numpy()
        keys = np.where(g != "", np.char.add("g:", g.astype(str)), np.char.add("s:", sids.astype(str)))
    else:
        keys = np.char.add("s:", sids.astype(str))
    unit_keys, unit_of = np.unique(keys, return_inverse=True)  # sorted keys -> order independent
    n_units = len(unit_keys)
    what = "groups" if group_column else "samples"
    if n_units < 3:
        raise MSBError(f"only {n_units} {what} to split; train, val and test each need at least one. "
                       f"Add data" + (" or split without group_column." if group_column else "."))
    order = np.random.default_rng(seed).permutation(n_units)
    sizes = np.bincount(unit_of, minlength=n_units)[order]
    cum = np.concatenate([[0], np.cumsum(sizes)]).astype(np.float64)
    k_test = _closest_cut(cum, 0, round(n * test_fraction), 1, n_units - 2)
    k_val = _closest_cut(cum, k_test, round(n * val_fraction), k_test + 1, n_units - 1)
    split_of_unit = np.empty(n_units, dtype=object)
    split_of_unit[order[:k_test]] = "test"
    split_of_unit[order[k_test:k_val]] = "val"
    split_of_unit[order[k_val:]] = "train"
    out = pd.Series(split_of_unit[unit_of], index=pd.Index(sids, name="sample_id"), name="split", dtype=object)
    _check_non_empty(out, "Change val_fraction/test_fraction or add data.")  # defensive: cuts keep >= 1 unit each
    return out


def split_file_text(splits: pd.Series) -> str:
    """CSV text ``sample_id,split`` for ``splits`` (``\\n`` line ends, in the series' order)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["sample_id", "split"])
    for sid, s in zip(splits.index, splits.to_numpy()):
        w.writerow([str(sid), str(s)])
    return buf.getvalue()


def write_split_file(path: str | os.PathLike, splits: pd.Series) -> str:
    """Write ``splits`` (index ``sample_id`` -> ``train``/``val``/``test``, or ``inner_val`` in a
    cross-validation fold run) as CSV atomically.

    Args:
        path: destination, e.g. ``runs/<study>/<run_id>/split.csv``.
        splits: as returned by :func:`resolve_splits`.

    Returns:
        Hex SHA-256 of the written bytes (equal to ``msb.utils.hashing.sha256_file(path)``).

    Raises:
        MSBError: a value not in train/val/test/inner_val, or a duplicate sample id (nothing is written).
    """
    vals = [str(v) for v in splits.to_numpy()]
    bad = [f"{sid!r}: {v!r}" for sid, v in zip(splits.index, vals) if v not in SPLIT_FILE_VALUES]
    if bad:
        raise MSBError(f"cannot write split file {path}: invalid split value(s) {_listed(bad)}; use "
                       f"train/val/test (or inner_val).")
    if pd.Index(splits.index).duplicated().any():
        raise MSBError(f"cannot write split file {path}: duplicate sample_id(s) in the split.")
    data = split_file_text(splits).encode("utf-8")
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def read_split_file(path: str | os.PathLike, known_ids: Iterable[str] | None = None) -> pd.Series:
    """Read a split file written by :func:`write_split_file`.

    Args:
        path: the CSV file (``sample_id,split``).
        known_ids: if given, every ``sample_id`` in the file must be one of these (e.g. the dataset's ids).

    Returns:
        ``pd.Series`` of ``str`` indexed by ``sample_id`` (file order), named ``split``.

    Raises:
        MSBError: missing file, wrong header, invalid split value, duplicate or unknown sample id (naming the
            1-based line).
    """
    path = Path(path)
    df = read_user_csv(path, "split file")
    if list(df.columns) != ["sample_id", "split"]:
        raise MSBError(f"split file {path}: header must be 'sample_id,split', got {','.join(df.columns)!r}.")
    problems = []
    for i, (sid, s) in enumerate(zip(df["sample_id"], df["split"])):
        if s not in SPLIT_FILE_VALUES:
            problems.append(f"line {i + 2} (sample_id {sid!r}): split {s!r} is not train/val/test/inner_val")
    dup = df["sample_id"].duplicated(keep="first")
    for i in np.flatnonzero(dup.to_numpy()):
        problems.append(f"line {i + 2}: duplicate sample_id {df['sample_id'].iat[i]!r}")
    if known_ids is not None:
        known = set(map(str, known_ids))
        for i, sid in enumerate(df["sample_id"]):
            if sid not in known:
                problems.append(f"line {i + 2}: sample_id {sid!r} is not in the dataset")
    if problems:
        raise MSBError(f"split file {path}: {_listed(problems)}. Fix the file or let the run regenerate it.")
    return pd.Series(df["split"].to_numpy(), index=pd.Index(df["sample_id"].to_numpy(), name="sample_id"),
                     name="split", dtype=object)
