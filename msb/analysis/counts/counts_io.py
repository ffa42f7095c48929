"""Reading and checking ``counts.parquet`` files (schema: ``docs/counts_schema.md``).

:func:`read_counts` accepts any mix of files and folders, checks every file against the counts schema
(:mod:`msb.evaluation.counts`), concatenates the rows and resolves duplicate rows:

* exact duplicates (same values in every column, e.g. the same file passed twice, or a folder and a
  file inside it) are dropped, keeping the first, and counted in the report;
* conflicting duplicates (same key :data:`~msb.evaluation.counts.KEY_COLUMNS`, some other value
  different) are refused with an :class:`~msb.errors.MSBError` listing the first keys and files.

Before a file is parsed its SHA-256 is checked against the ``digests.json`` of its folder (written by the
evaluator, :mod:`msb.utils.evaluation_folder`); a mismatch (a flipped byte, a truncated file, a hand edit) is
refused with one line naming the file and the command that regenerates it. Files in folders without
``digests.json`` (written before digests existed) are read unverified, with one note in the report.
Files inside hidden folders (staging folders of interrupted evaluations, ``.msb_cache``) are not results
and are skipped when a folder is searched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from msb.analysis.counts.counts_files import COUNTS_FILENAME, OPTIONAL_COLUMNS, find_counts_files
from msb.errors import MSBError
# the counts schema and its pure row checks (no inference code)
from msb.evaluation.counts import (
    COUNTS_COLUMNS,
    COUNTS_SCHEMA_VERSION,
    PROTOCOL_DEFAULTS,
    KEY_COLUMNS,
    row_problems,
)
from msb.utils.evaluation_folder import check_counts_digest, regenerate_command, unverified_note

__all__ = ["COUNTS_FILENAME", "OPTIONAL_COLUMNS", "CountsReadReport", "find_counts_files", "read_counts",
           "read_counts_with_report"]

#: How many conflicting keys an error message lists.
_MAX_LISTED = 5


@dataclass(frozen=True)
class CountsReadReport:
    """What :func:`read_counts_with_report` read.

    Attributes:
        files: the count files read, in order (a file passed twice appears twice).
        n_rows_read: rows read over all files, before dropping duplicates.
        n_duplicates_dropped: exact duplicate rows dropped.
        n_rows: rows returned.
        notes: human-readable remarks for the CLI (how many duplicates were dropped; one line naming the
            folders read without ``digests.json``, i.e. unverified).
    """

    files: tuple[Path, ...]
    n_rows_read: int
    n_duplicates_dropped: int
    n_rows: int
    notes: tuple[str, ...] = field(default=())


def _read_one(path: Path, skip: frozenset[str] = frozenset()) -> tuple[pd.DataFrame, bool]:
    """Read and validate one count file; return its schema columns in schema order (less ``skip``, a subset
    of :data:`OPTIONAL_COLUMNS`) and whether its digest was verified (False: no ``digests.json``)."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise MSBError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    verified = check_counts_digest(path, data)
    fix = regenerate_command(path.parent)
    try:
        table = pq.read_table(pa.BufferReader(data), columns=None if not skip else
                              [c for c in pq.read_schema(pa.BufferReader(data)).names if c not in skip])
    except Exception as e:  # pyarrow raises several types (ArrowInvalid, OSError, ...)
        raise MSBError(f"{path}: cannot read as Parquet ({type(e).__name__}: {e}); the file is damaged or "
                       f"not a {COUNTS_FILENAME} written by the msb evaluator; regenerate it with: {fix}") from None
    # a version-1 file has no protocol columns: they read as PROTOCOL_DEFAULTS ("unspecified" protocol)
    legacy = [c for c in PROTOCOL_DEFAULTS if c not in table.column_names]
    for c in legacy:
        kind = COUNTS_COLUMNS[c]
        table = table.append_column(c, pa.array([PROTOCOL_DEFAULTS[c]] * table.num_rows,
                                                type=pa.string() if kind == "string" else pa.int64()))
    missing = [c for c in COUNTS_COLUMNS if c not in table.column_names and c not in skip]
    if missing and {"aggregation", "metric", "value"} <= set(table.column_names):
        raise MSBError(f"{path}: this is a scores table (written by msb run / msb reaggregate), not a counts "
                       f"file; give the {COUNTS_FILENAME} files or the run/study folders that hold them, e.g. "
                       f"msb reaggregate {path.parent}")
    if missing:
        raise MSBError(f"{path}: not a counts file, missing columns {missing}; rewrite it with the "
                       f"current schema: {fix}")
    df = table.select([c for c in COUNTS_COLUMNS if c not in skip]).to_pandas()
    for col, kind in COUNTS_COLUMNS.items():
        if col in skip:
            continue
        s = df[col]
        if s.isna().any():
            i = int(np.flatnonzero(s.isna().to_numpy())[0])
            raise MSBError(f"{path}: column {col!r} has missing values (first at row {i}); "
                           f"regenerate it with: {fix}")
        ok = (pd.api.types.is_string_dtype(s) if kind == "string"
              else pd.api.types.is_integer_dtype(s) if kind == "int64"
              else pd.api.types.is_float_dtype(s) or pd.api.types.is_integer_dtype(s))
        if not ok:
            raise MSBError(f"{path}: column {col!r} has dtype {s.dtype}, expected {kind}; "
                           f"regenerate it with: {fix}")
    versions = set(int(v) for v in df["schema_version"].unique())
    newer = sorted(v for v in versions if v > COUNTS_SCHEMA_VERSION)
    if newer:
        raise MSBError(f"{path}: written with counts schema version {newer[0]}, this msb reads up "
                       f"to version {COUNTS_SCHEMA_VERSION}; upgrade msb")
    problems = row_problems(df)
    if problems:
        raise MSBError(f"{path}: " + "; ".join(problems) + "; the file is corrupt or was edited, "
                       f"regenerate it with: {fix}")
    if df["threshold"].dtype != np.float64:
        df["threshold"] = df["threshold"].astype(np.float64)
    return df, verified


def _key_text(row: pd.Series) -> str:
    def plain(v):
        return v.item() if isinstance(v, np.generic) else v

    return "(" + ", ".join(f"{k}={plain(row[k])!r}" for k in KEY_COLUMNS) + ")"


def read_counts_with_report(
    paths: list[str | os.PathLike] | str | os.PathLike, columns: list[str] | None = None,
) -> tuple[pd.DataFrame, CountsReadReport]:
    """Like :func:`read_counts` but also return a :class:`CountsReadReport`.

    Args:
        paths: as :func:`read_counts`.
        columns: columns the caller needs; the :data:`OPTIONAL_COLUMNS` not listed are not read (columnar
            Parquet read), every other column is read and checked as always. ``None``: all columns. When
            some key repeats (duplicates to resolve), the files are read again in full so that exact and
            conflicting duplicates are told apart on every column.
    """
    skip = frozenset(c for c in OPTIONAL_COLUMNS if columns is not None and c not in columns)
    files = find_counts_files(paths)
    frames = []
    unverified: list[Path] = []
    for i, f in enumerate(files):
        df, verified = _read_one(f, skip)
        if not verified and f.parent not in unverified:
            unverified.append(f.parent)
        df["_file"] = i
        frames.append(df)
    df = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    n_read = len(df)

    cols = [c for c in COUNTS_COLUMNS if c not in skip]
    # an exact duplicate is also a key duplicate: compare all columns only among rows whose key repeats
    # (one 7-column pass instead of a 25-column one when nothing repeats, the usual case)
    key_dup = df.duplicated(subset=list(KEY_COLUMNS), keep=False).to_numpy()
    n_dup = 0
    if key_dup.any() and skip:
        return read_counts_with_report(paths)
    if key_dup.any():
        exact = np.zeros(len(df), dtype=bool)
        exact[key_dup] = df.loc[key_dup].duplicated(subset=cols, keep="first").to_numpy()
        n_dup = int(exact.sum())
        if n_dup:
            df = df.loc[~exact].reset_index(drop=True)

    conflict = (df.duplicated(subset=list(KEY_COLUMNS), keep=False).to_numpy() if key_dup.any()
                else np.zeros(len(df), dtype=bool))
    if conflict.any():
        bad = df.loc[conflict]
        n_keys = int(bad.drop_duplicates(subset=list(KEY_COLUMNS)).shape[0])
        lines = []
        for _, grp in list(bad.groupby(list(KEY_COLUMNS), sort=False))[:_MAX_LISTED]:
            first = grp.iloc[0]
            differing = [c for c in cols if grp[c].nunique(dropna=False) > 1]
            where = sorted({str(files[int(j)]) for j in grp["_file"]})
            lines.append(f"{_key_text(first)} differs in {differing} across {where}")
        raise MSBError(
            f"conflicting duplicate count rows: {n_keys} key(s) appear more than once with different "
            f"values (key = {list(KEY_COLUMNS)}); first: " + "; ".join(lines)
            + ". Pass each evaluation once, or remove the stale counts file")

    df = df.drop(columns="_file").reset_index(drop=True)
    notes: tuple[str, ...] = ()
    if n_dup:
        notes = (f"dropped {n_dup} exact duplicate row(s) (same values in every column)",)
    if unverified:
        notes = (*notes, unverified_note(unverified))
    report = CountsReadReport(files=tuple(files), n_rows_read=n_read, n_duplicates_dropped=n_dup,
                              n_rows=len(df), notes=notes)
    return df, report


def read_counts(paths: list[str | os.PathLike] | str | os.PathLike) -> pd.DataFrame:
    """Read one or many ``counts.parquet`` files into one validated DataFrame.

    Args:
        paths: files and/or folders (a folder contributes every ``counts.parquet`` below it,
            recursively); a single path is accepted too.

    Returns:
        DataFrame with exactly the columns of :data:`~msb.evaluation.counts.COUNTS_COLUMNS` in schema
        order (strings as pandas string dtype, ints ``int64``, ``threshold`` ``float64``), exact
        duplicate rows dropped. ``df.attrs["n_duplicates_dropped"]`` (int) and ``df.attrs["files"]``
        (list of str) report what was read; :func:`read_counts_with_report` returns the same as a
        :class:`CountsReadReport`.

    Raises:
        MSBError: naming the file (and for row problems the row position, ``image_id`` and
            ``class_id``) and, for a damaged file, the command that regenerates it: SHA-256 differs from
            the folder's ``digests.json``; path not found; folder without count files; file not readable as Parquet;
            missing columns (listed); missing values or wrong dtypes; negative counts; derived counts
            inconsistent; ``tp + fp + fn + tn != height * width``; unknown ``threshold_on``; newer
            schema version; conflicting duplicate keys (first keys and files listed).
    """
    df, report = read_counts_with_report(paths)
    df.attrs["n_duplicates_dropped"] = report.n_duplicates_dropped
    df.attrs["files"] = [str(f) for f in report.files]
    return df
