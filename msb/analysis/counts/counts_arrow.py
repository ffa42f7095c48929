"""Count files as Arrow columns, checked as :func:`msb.analysis.counts.counts_io.read_counts_with_report` checks them.

:func:`read_checked` reads the columns :mod:`msb.analysis.counts.reaggregate_fast` scores (string columns as Arrow
dictionaries, so a key column is already integer codes) and checks the file on its columns: SHA-256 against
``digests.json``, schema columns and dtypes, no missing values, schema version, negative / inconsistent counts,
``tp + fp + fn + tn = height * width``, ``threshold_on`` values, finite thresholds. The columns only the checks
need are read and checked ``BATCH_ROWS`` rows at a time and dropped. It only ever *detects*: anything unusual
raises :class:`Unusual`, and the caller runs the pandas path, which raises the usual one-line error.
It imports no pandas (``Array.to_numpy``, ``pa.array`` and ``pq.read_table`` would, ~0.5 s).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from msb.analysis.counts.aggregate_core import IMAGE_COLUMNS
from msb.analysis.counts.counts_files import OPTIONAL_COLUMNS
from msb.evaluation.counts import (COUNT_COLUMNS, COUNTS_COLUMNS, COUNTS_SCHEMA_VERSION, KEY_COLUMNS,
                                   PROTOCOL_DEFAULTS, THRESHOLD_ON_VALUES)
from msb.utils.evaluation_folder import check_counts_digest

__all__ = ["BATCH_ROWS", "Unusual", "needed_columns", "read_checked", "column_numpy", "flat_numpy", "large_strings"]

_ARROW_KIND = {"int64": (pa.int64(),), "float64": (pa.float64(),)}
_STRINGS = (pa.string(), pa.large_string())
_DICT = pa.dictionary(pa.int32(), pa.large_string())
#: Rows per checked batch (every column of a batch: ~5 MiB at 26 columns).
BATCH_ROWS = 131_072
#: Columns the scores read (besides the group columns); the others are only checked.
_SCORED = frozenset((*KEY_COLUMNS, *IMAGE_COLUMNS, "class_id", "threshold", "threshold_on", "tp", "fp", "fn"))


class Unusual(Exception):
    """Something the pandas path must handle (its error message or its duplicate resolution)."""


def needed_columns(group_by: Sequence[str]) -> list[str]:
    """The schema columns the scores and checks read: all but the optional ones not grouped by."""
    return [c for c in COUNTS_COLUMNS if c not in OPTIONAL_COLUMNS or c in group_by]


def read_checked(path: Path, cols: list[str], group_by: Sequence[str] = ()) -> tuple[pa.Table, bool]:
    """One file's needed columns, checked; ``(table of the columns the scores use, verified)``.

    The columns only the checks need (``tn``, ``intersection``, ..., ``height``, ``width``, the digests and
    names) are read and checked ``BATCH_ROWS`` rows at a time and dropped: the memory they take is one
    batch's, reused (at 1M rows the whole-file read was ~200 MB of fresh pages, most of the command's time on
    this machine; docs/performance.md).

    Args:
        path: a ``counts.parquet`` (schema: :data:`msb.evaluation.counts.COUNTS_COLUMNS`).
        cols: the columns to read and check (:func:`needed_columns`); optional columns present in the file are
            checked too (types, no missing values), as the pandas path reads them.
        group_by: group columns (kept in the returned table besides the scored ones).

    Returns:
        ``(table, verified)``: one chunk per column, string columns as ``dictionary<int32, large_string>``
        (counts in pixels, int64); ``verified`` = the SHA-256 matched the folder's ``digests.json``.

    Raises:
        Unusual: any failed check or unusual layout (the caller then runs the pandas path, which raises its
            one-line error naming the file, column and row).
        MSBError: a SHA-256 that differs from ``digests.json`` (the pandas path's message).
    """
    try:
        data = path.read_bytes()
    except OSError:
        raise Unusual from None
    verified = check_counts_digest(path, data)  # raises the pandas path's MSBError itself
    try:
        # ParquetFile, not pq.read_table: the latter imports pyarrow.dataset, which imports pandas (~0.5 s)
        schema = pq.ParquetFile(pa.BufferReader(data)).schema_arrow  # the stored types (footer only)
        # every schema column the file has: the optional ones are not scored but checked (types, no missing
        # values) as the pandas path reads and checks them
        present = [c for c in COUNTS_COLUMNS if c in schema.names and (c in cols or c in OPTIONAL_COLUMNS)]
        if any(c not in schema.names for c in cols if c not in PROTOCOL_DEFAULTS):  # v1 files lack only those
            raise Unusual
        for c in present:  # exactly the Arrow types the evaluator writes; others (pandas may accept) go there
            kind = COUNTS_COLUMNS[c]
            if schema.field(c).type not in (_STRINGS if kind == "string" else _ARROW_KIND[kind]):
                raise Unusual
        reader = pq.ParquetFile(pa.BufferReader(data), read_dictionary=[
            c for c in present if COUNTS_COLUMNS[c] == "string"])
        keep = [c for c in cols if c not in PROTOCOL_DEFAULTS and (c in _SCORED or c in group_by)]
        table = reader.read(columns=keep)  # the columns the scores use: whole, one chunk each
        rest = [c for c in present if c not in keep and not (c in OPTIONAL_COLUMNS and _no_nulls_stated(reader, c))]
        checked = rest + [c for c in (*COUNT_COLUMNS, "height", "width", "schema_version") if c in keep]
        for batch in reader.iter_batches(batch_size=BATCH_ROWS, columns=checked):
            part = pa.Table.from_batches([batch])  # the columns only the checks use: a batch at a time
            if any(part.column(c).null_count for c in rest):
                raise Unusual
            _check_rows(part)
    except Unusual:
        raise
    except Exception:
        raise Unusual from None
    if any(table.column(c).null_count for c in keep):
        raise Unusual
    _check_thresholds(table)
    columns = []
    for c in table.column_names:  # one string type for every file (the evaluator writes string, pandas large)
        col = table.column(c)
        if pa.types.is_dictionary(col.type) and (col.type.value_type != pa.large_string()
                                                 or col.type.index_type != pa.int32()):
            col = pa.chunked_array([pa.DictionaryArray.from_arrays(  # cast the dictionary, not every row
                ch.indices if ch.indices.type == pa.int32() else ch.indices.cast(pa.int32()),
                large_strings(ch.dictionary), safe=False) for ch in col.chunks], _DICT)  # indices as read
        columns.append(col)
    return pa.Table.from_arrays(columns, names=table.column_names), verified  # nullable fields, no metadata


def _no_nulls_stated(reader: pq.ParquetFile, column: str) -> bool:
    """Whether the file's footer states a null count of 0 for ``column`` in every row group (the Parquet column
    chunk statistics; pyarrow writes them by default), so that the column need not be decoded to check it."""
    meta = reader.metadata
    j = reader.schema_arrow.get_field_index(column)
    for i in range(meta.num_row_groups):
        st = meta.row_group(i).column(j).statistics
        if st is None or not st.has_null_count or st.null_count != 0:
            return False
    return True


def large_strings(arr: pa.Array) -> pa.Array:
    """A ``string`` array as ``large_string``, built from its buffers (64-bit offsets, the same bytes). The
    first ``cast`` of a process initialises Arrow's compute kernels (~35 ms), more than the rest of the
    conversion of a 25,000-entry dictionary."""
    if arr.type == pa.large_string():
        return arr
    if arr.type != pa.string() or arr.null_count:
        return arr.cast(pa.large_string())
    off = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4).astype(np.int64)
    return pa.Array.from_buffers(pa.large_string(), len(arr), [None, pa.py_buffer(off), arr.buffers()[2]])


def flat_numpy(arr: pa.Array) -> np.ndarray:
    """A fixed-width Arrow array without nulls as a NumPy view of its buffer (``Array.to_numpy`` and
    ``pa.array`` import pandas, ~0.5 s, which this module exists to avoid)."""
    dtype = np.dtype(arr.type.to_pandas_dtype()) if not pa.types.is_dictionary(arr.type) else None
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def column_numpy(table: pa.Table, c: str) -> np.ndarray:
    """Column ``c`` (int64 or float64, no nulls) as one NumPy array."""
    chunks = table.column(c).chunks
    if not chunks:
        return np.empty(0, dtype=np.dtype(table.schema.field(c).type.to_pandas_dtype()))
    return flat_numpy(chunks[0]) if len(chunks) == 1 else np.concatenate([flat_numpy(a) for a in chunks])


def _check_rows(table: pa.Table) -> None:
    """The count conditions of :func:`msb.evaluation.counts.row_problems` and the schema-version check."""
    n = {c: column_numpy(table, c) for c in COUNT_COLUMNS}
    h, w = column_numpy(table, "height"), column_numpy(table, "width")
    tp, fp, fn = n["tp"], n["fp"], n["fn"]
    if table.num_rows and (min(int(a.min()) for a in n.values()) < 0 or min(int(h.min()), int(w.min())) <= 0
                           or int(column_numpy(table, "schema_version").max()) > COUNTS_SCHEMA_VERSION):
        raise Unusual
    if ((n["intersection"] != tp).any() or (n["reference"] != tp + fn).any() or (n["predicted"] != tp + fp).any()
            or (n["union"] != tp + fp + fn).any() or (tp + fp + fn + n["tn"] != h * w).any()):
        raise Unusual


def _check_thresholds(table: pa.Table) -> None:
    """The threshold conditions of :func:`msb.evaluation.counts.row_problems`: finite thresholds, known
    ``threshold_on`` values."""
    if not np.isfinite(column_numpy(table, "threshold")).all():
        raise Unusual
    for on in table.column("threshold_on").chunks:
        values = on.dictionary.to_pylist()
        used = np.bincount(flat_numpy(on.indices), minlength=len(values)) > 0
        if any(v not in THRESHOLD_ON_VALUES for v, u in zip(values, used) if u):
            raise Unusual
