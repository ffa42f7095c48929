"""The basic ``msb reaggregate`` (3 rules x 4 metrics per group) on Arrow columns, without pandas.

:func:`fast_reaggregate` reads only the columns the checks and the scores need (string columns as Arrow
dictionaries, so a key column is already integer codes), runs the checks of
:func:`msb.analysis.counts_io.read_counts_with_report` on the columns (SHA-256 against ``digests.json``, schema
columns and dtypes, no missing values, schema version, negative / inconsistent counts,
``tp + fp + fn + tn = height * width``, ``threshold_on`` values, finite thresholds, duplicate keys via one
``int64`` combined key, mixed thresholds in a group) and computes the scores of
:func:`msb.analysis.aggregate.reaggregate` with ``np.bincount`` over (group, class) codes.

It only ever *detects* a problem: whenever something is unusual (any failed check, a duplicate key to resolve,
a column of another Arrow type that pandas would still accept, files of differing layouts) it returns ``None``
and the caller runs the pandas path, which raises the usual one-line error or resolves the duplicates. So
every result it returns is the one the pandas path would return (tests compare both on the same files), and
every error message is the pandas path's. Measured: docs/performance.md.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from msb.analysis.aggregate_core import ALL_RULES, IMAGE_COLUMNS, SCORE_COLUMNS
from msb.analysis.count_scores import ALL_METRICS, ratio_or_nan, score_from_counts
from msb.analysis.counts_files import OPTIONAL_COLUMNS, find_counts_files
from msb.evaluation.counts import (COUNT_COLUMNS, COUNTS_COLUMNS, COUNTS_SCHEMA_VERSION, KEY_COLUMNS,
                                   PROTOCOL_DEFAULTS, THRESHOLD_ON_VALUES)
from msb.utils.atomic import atomic_path
from msb.utils.evaluation_folder import check_counts_digest, unverified_note

__all__ = ["FastScores", "fast_reaggregate"]

_ARROW_KIND = {"int64": (pa.int64(),), "float64": (pa.float64(),)}
_STRINGS = (pa.string(), pa.large_string())
_DICT = pa.dictionary(pa.int32(), pa.large_string())
#: Rows per checked batch (every column of a batch: ~5 MiB at 26 columns).
_BATCH_ROWS = 131_072
#: Columns the scores read (besides the group columns); the others are only checked.
_SCORED = frozenset((*KEY_COLUMNS, *IMAGE_COLUMNS, "class_id", "threshold", "threshold_on", "tp", "fp", "fn"))


@dataclass
class FastScores:
    """The long score table of :func:`msb.analysis.aggregate.reaggregate`, as plain columns.

    Attributes:
        columns: ``{name: list}`` in output order: the group columns, then :data:`SCORE_COLUMNS`.
        kinds: ``{group column: "string" | "int64" | "float64"}``.
        notes: the read notes (unverified folders), as :class:`~msb.analysis.counts_io.CountsReadReport`.
        n_rows: count rows read.
    """

    columns: dict[str, list]
    kinds: dict[str, str]
    notes: tuple[str, ...] = field(default=())
    n_rows: int = 0

    def to_frame(self):
        """The same table as a pandas DataFrame, dtypes as :func:`~msb.analysis.aggregate.score_table`."""
        import pandas as pd

        out = pd.DataFrame(self.columns)
        for c, kind in self.kinds.items():
            out[c] = out[c].astype("str" if kind == "string" else kind)
        return out

    def wide_csv(self) -> str:
        """:func:`msb.analysis.aggregate.scores_wide` of the table as CSV text (what ``--format csv`` prints)."""
        groups = list(self.kinds)
        cols = self.columns
        metrics = list(dict.fromkeys(cols["metric"]))
        rules = list(dict.fromkeys(cols["aggregation"]))
        rows: dict[tuple, dict] = {}
        for i in range(len(cols["value"])):
            key = tuple(cols[c][i] for c in groups)
            row = rows.setdefault(key, {"n_images": cols["n_images"][i], "n_classes": cols["n_classes"][i]})
            row[(cols["metric"][i], cols["aggregation"][i])] = cols["value"][i]
        header = [*groups, "n_images", "n_classes", *(f"{m}_{r}" for m in metrics for r in rules)]
        body = [[*key, r["n_images"], r["n_classes"], *(r.get((m, a), float("nan")) for m in metrics for a in rules)]
                for key, r in rows.items()]
        return _csv_text(header, body)

    def write(self, out_dir: str | os.PathLike) -> list[Path]:
        """``scores.csv`` and ``scores.parquet`` in ``out_dir``, as :func:`~msb.analysis.aggregate.write_scores`
        (temporary files renamed only when both are written; the same CSV text; Parquet with the same column
        types, without the pandas metadata block)."""
        out_dir = Path(out_dir)
        csv_path, parquet_path = out_dir / "scores.csv", out_dir / "scores.parquet"
        names = list(self.columns)
        body = list(zip(*self.columns.values()))
        kinds = {**self.kinds, "aggregation": "string", "metric": "string", "value": "float64", "n_images": "int64",
                 "n_classes": "int64", "n_units": "int64", "n_excluded": "int64"}
        table = pa.Table.from_arrays([_arrow(v, kinds[c]) for c, v in self.columns.items()], names=names)
        with atomic_path(csv_path) as tmp_csv, atomic_path(parquet_path) as tmp_parquet:
            Path(tmp_csv).write_text(_csv_text(names, body), encoding="utf-8")
            pq.write_table(table, tmp_parquet)
        return [csv_path, parquet_path]


def _cell(v: Any) -> Any:
    if isinstance(v, float):
        return "" if v != v else repr(v)  # as pandas' to_csv: NaN empty, floats in shortest round-trip form
    return v


def _csv_text(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows([_cell(v) for v in r] for r in rows)
    return buf.getvalue()


class _Unusual(Exception):
    """Something the pandas path must handle (its error message or its duplicate resolution)."""


def _needed(group_by: Sequence[str]) -> list[str]:
    return [c for c in COUNTS_COLUMNS if c not in OPTIONAL_COLUMNS or c in group_by]


def _read_file(path: Path, cols: list[str], group_by: Sequence[str] = ()) -> tuple[pa.Table, bool]:
    """One file's needed columns, checked; ``(table of the columns the scores use, verified)``.

    The columns only the checks need (``tn``, ``intersection``, ..., ``height``, ``width``, the digests and
    names) are read and checked ``_BATCH_ROWS`` rows at a time and dropped: the memory they take is one
    batch's, reused (at 1M rows the whole-file read was ~200 MB of fresh pages, most of the command's time on
    this machine; docs/performance.md).
    """
    try:
        data = path.read_bytes()
    except OSError:
        raise _Unusual from None
    verified = check_counts_digest(path, data)  # raises the pandas path's MSBError itself
    try:
        # ParquetFile, not pq.read_table: the latter imports pyarrow.dataset, which imports pandas (~0.5 s)
        schema = pq.ParquetFile(pa.BufferReader(data)).schema_arrow  # the stored types (footer only)
        # every schema column the file has: the optional ones are not scored but checked (types, no missing
        # values) as the pandas path reads and checks them
        present = [c for c in COUNTS_COLUMNS if c in schema.names and (c in cols or c in OPTIONAL_COLUMNS)]
        if any(c not in schema.names for c in cols if c not in PROTOCOL_DEFAULTS):  # v1 files lack only those
            raise _Unusual
        for c in present:  # exactly the Arrow types the evaluator writes; others (pandas may accept) go there
            kind = COUNTS_COLUMNS[c]
            if schema.field(c).type not in (_STRINGS if kind == "string" else _ARROW_KIND[kind]):
                raise _Unusual
        reader = pq.ParquetFile(pa.BufferReader(data), read_dictionary=[
            c for c in present if COUNTS_COLUMNS[c] == "string"])
        keep = [c for c in cols if c not in PROTOCOL_DEFAULTS and (c in _SCORED or c in group_by)]
        table = reader.read(columns=keep)  # the columns the scores use: whole, one chunk each
        rest = [c for c in present if c not in keep and not (c in OPTIONAL_COLUMNS and _no_nulls_stated(reader, c))]
        checked = rest + [c for c in (*COUNT_COLUMNS, "height", "width", "schema_version") if c in keep]
        for batch in reader.iter_batches(batch_size=_BATCH_ROWS, columns=checked):
            part = pa.Table.from_batches([batch])  # the columns only the checks use: a batch at a time
            if any(part.column(c).null_count for c in rest):
                raise _Unusual
            _check_rows(part)
    except _Unusual:
        raise
    except Exception:
        raise _Unusual from None
    if any(table.column(c).null_count for c in keep):
        raise _Unusual
    _check_thresholds(table)
    columns = []
    for c in table.column_names:  # one string type for every file (the evaluator writes string, pandas large)
        col = table.column(c)
        if pa.types.is_dictionary(col.type) and (col.type.value_type != pa.large_string()
                                                 or col.type.index_type != pa.int32()):
            col = pa.chunked_array([pa.DictionaryArray.from_arrays(  # cast the dictionary, not every row
                ch.indices if ch.indices.type == pa.int32() else ch.indices.cast(pa.int32()),
                _large_strings(ch.dictionary), safe=False) for ch in col.chunks], _DICT)  # indices as read
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


def _large_strings(arr: pa.Array) -> pa.Array:
    """A ``string`` array as ``large_string``, built from its buffers (64-bit offsets, the same bytes). The
    first ``cast`` of a process initialises Arrow's compute kernels (~35 ms), more than the rest of the
    conversion of a 25,000-entry dictionary."""
    if arr.type == pa.large_string():
        return arr
    if arr.type != pa.string() or arr.null_count:
        return arr.cast(pa.large_string())
    off = np.frombuffer(arr.buffers()[1], dtype=np.int32, count=len(arr) + 1, offset=arr.offset * 4).astype(np.int64)
    return pa.Array.from_buffers(pa.large_string(), len(arr), [None, pa.py_buffer(off), arr.buffers()[2]])


def _flat(arr: pa.Array) -> np.ndarray:
    """A fixed-width Arrow array without nulls as a NumPy view of its buffer (``Array.to_numpy`` and
    ``pa.array`` import pandas, ~0.5 s, which this module exists to avoid)."""
    dtype = np.dtype(arr.type.to_pandas_dtype()) if not pa.types.is_dictionary(arr.type) else None
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _np(table: pa.Table, c: str) -> np.ndarray:
    """Column ``c`` (int64 or float64, no nulls) as one NumPy array."""
    chunks = table.column(c).chunks
    if not chunks:
        return np.empty(0, dtype=np.dtype(table.schema.field(c).type.to_pandas_dtype()))
    return _flat(chunks[0]) if len(chunks) == 1 else np.concatenate([_flat(a) for a in chunks])


def _arrow(values: list, kind: str) -> pa.Array:
    """An Arrow array (large_string, int64 or float64) from Python values, built from its buffers."""
    if kind == "string":
        enc = [str(v).encode("utf-8") for v in values]
        off = np.zeros(len(enc) + 1, dtype=np.int64)
        off[1:] = np.cumsum([len(e) for e in enc])
        return pa.Array.from_buffers(pa.large_string(), len(enc), [None, pa.py_buffer(off), pa.py_buffer(b"".join(enc))])
    v = np.ascontiguousarray(np.asarray(values, dtype=kind))
    return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), len(v), [None, pa.py_buffer(v)])


def _check_rows(table: pa.Table) -> None:
    """The count conditions of :func:`msb.evaluation.counts.row_problems` and the schema-version check."""
    n = {c: _np(table, c) for c in COUNT_COLUMNS}
    h, w = _np(table, "height"), _np(table, "width")
    tp, fp, fn = n["tp"], n["fp"], n["fn"]
    if table.num_rows and (min(int(a.min()) for a in n.values()) < 0 or min(int(h.min()), int(w.min())) <= 0
                           or int(_np(table, "schema_version").max()) > COUNTS_SCHEMA_VERSION):
        raise _Unusual
    if ((n["intersection"] != tp).any() or (n["reference"] != tp + fn).any() or (n["predicted"] != tp + fp).any()
            or (n["union"] != tp + fp + fn).any() or (tp + fp + fn + n["tn"] != h * w).any()):
        raise _Unusual


def _check_thresholds(table: pa.Table) -> None:
    """The threshold conditions of :func:`msb.evaluation.counts.row_problems`: finite thresholds, known
    ``threshold_on`` values."""
    if not np.isfinite(_np(table, "threshold")).all():
        raise _Unusual
    for on in table.column("threshold_on").chunks:
        values = on.dictionary.to_pylist()
        used = np.bincount(_flat(on.indices), minlength=len(values)) > 0
        if any(v not in THRESHOLD_ON_VALUES for v, u in zip(values, used) if u):
            raise _Unusual


def _codes(table: pa.Table, c: str) -> tuple[np.ndarray, list]:
    """``(codes, values)``: ``values[codes[i]]`` is row ``i``'s value; values unique (not sorted; some may be
    unused by any row)."""
    col = table.column(c)
    if pa.types.is_dictionary(col.type):
        arr = col.unify_dictionaries().combine_chunks() if col.num_chunks > 1 else col.combine_chunks()
        values = arr.dictionary.to_pylist()
        codes = _flat(arr.indices)
        if len(set(values)) != len(values):  # a dictionary with repeats: code by value
            uniq, inv = np.unique(np.asarray(values, dtype=object), return_inverse=True)
            return inv[codes], list(uniq)
        return codes, values
    v = _np(table, c)
    if len(v) and v[0] == v[-1] and (v == v[0]).all():  # a constant column (fold, threshold, ...)
        return np.zeros(len(v), dtype=np.int8), [v[0].item()]
    if v.dtype.kind == "i" and len(v):
        lo, hi = int(v.min()), int(v.max())
        if hi - lo < 4 * len(v) + 1024:  # a small range: the value itself is the code (absent values unused)
            return (v if lo == 0 else v - lo), list(range(lo, hi + 1))
    uniq, inv = np.unique(v, return_inverse=True)
    return inv.astype(np.int64), uniq.tolist()


def _combine(parts: list[tuple[np.ndarray, int]], n: int) -> tuple[np.ndarray, int]:
    """One int64 code per row, equal iff every part's code is; ``(codes, upper bound of the codes)``. Built in
    place in one array (each fresh 8 MB array at 1M rows costs page faults, docs/performance.md)."""
    combined, card = None, 1
    for codes, k in parts:
        if k <= 1:
            continue
        if combined is None:
            combined, card = codes.astype(np.int64), k
            continue
        if card * k >= 2**62:
            uniq, inv = np.unique(combined, return_inverse=True)
            combined, card = inv.astype(np.int64), len(uniq)
        np.multiply(combined, k, out=combined)
        np.add(combined, codes, out=combined)
        card *= k
    return (np.zeros(n, dtype=np.int64) if combined is None else combined), card


def _row_scores(tp: np.ndarray, fp: np.ndarray, fn: np.ndarray):
    """Yield ``(metric, scores, undefined rows)`` for :data:`ALL_METRICS`: the per-row scores of
    :func:`~msb.analysis.count_scores.score_from_counts` (the same float64 operations in the same order), 0
    where undefined, and the ``(k,)`` indices of the undefined rows (denominator 0). The three buffers are
    reused from metric to metric: each yielded array is only valid until the next one."""
    t = tp.astype(np.float64)
    num, den, out = np.empty_like(t), np.empty_like(t), np.empty_like(t)
    for m in ALL_METRICS:
        if m == "dice":
            np.multiply(t, 2.0, out=num)
            np.add(num, fp, out=den)
            np.add(den, fn, out=den)
            top = num
        elif m == "iou":
            np.add(t, fp, out=den)
            np.add(den, fn, out=den)
            top = t
        elif m == "precision":
            np.add(t, fp, out=den)
            top = t
        else:
            np.add(t, fn, out=den)
            top = t
        bad = np.flatnonzero(den == 0)  # undefined rows are few: count them, not the defined ones
        den[bad] = 1.0
        np.divide(top, den, out=out)
        out[bad] = 0.0
        yield m, out, bad


def _dense(codes: np.ndarray, card: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dense codes 0..G-1 in the order of the codes' values, one row index of each)``."""
    if card <= 8 * len(codes) + 1024:
        present = np.bincount(codes, minlength=card) > 0
        remap = np.cumsum(present) - 1
        rep = np.zeros(card, dtype=np.int64)
        rep[codes] = np.arange(len(codes))  # any row of a group: its rows share the group key
        return remap[codes], rep[present]
    _, first, inv = np.unique(codes, return_index=True, return_inverse=True)
    return inv, first


def _has_repeats(codes: np.ndarray, card: int) -> bool:
    if card <= 8 * len(codes) + 1024:
        return bool((np.bincount(codes, minlength=card) > 1).any())
    s = np.sort(codes)
    return bool((s[1:] == s[:-1]).any())


def _distinct_per_group(g: np.ndarray, n_groups: int, codes: np.ndarray, card: int) -> np.ndarray:
    """``(n_groups,)`` number of distinct ``codes`` among the rows of each group."""
    card = max(card, 1)
    if n_groups * card >= 2**62:
        raise _Unusual
    key = g * card + codes
    if n_groups * card <= 8 * len(g) + 1024:
        seen = np.zeros(n_groups * card, dtype=bool)
        seen[key] = True
        return seen.reshape(n_groups, card).sum(axis=1)
    return np.bincount(np.unique(key) // card, minlength=n_groups)


def fast_reaggregate(paths: list[str | os.PathLike] | str | os.PathLike, group_by: Sequence[str]) -> FastScores | None:
    """Scores of every group of the count files, as ``msb reaggregate FILES`` without extra options.

    Args:
        paths: files and/or folders (:func:`~msb.analysis.counts_files.find_counts_files`).
        group_by: group columns, columns of :data:`~msb.evaluation.counts.COUNTS_COLUMNS` (e.g.
            :data:`~msb.analysis.aggregate_core.DEFAULT_GROUP`, plus ``threshold``/``threshold_on``).

    Returns:
        The table of :func:`msb.analysis.aggregate.reaggregate` on
        :func:`msb.analysis.counts_io.read_counts` of ``paths`` (all rules and metrics; groups sorted by key),
        or ``None`` when the pandas path must run instead (any failed check, duplicate keys, unusual column
        types or layouts: see the module docstring).

    Raises:
        MSBError: as :func:`~msb.analysis.counts_files.find_counts_files`; a SHA-256 that differs from the
            folder's ``digests.json`` (the same message as the pandas path).
    """
    group_by = list(group_by)
    if any(c not in COUNTS_COLUMNS for c in group_by):
        return None
    files = find_counts_files(paths)
    cols = _needed(group_by)
    tables, unverified = [], []
    try:
        for f in files:
            t, verified = _read_file(f, cols, group_by)
            if not verified and f.parent not in unverified:
                unverified.append(f.parent)
            tables.append(t)
        if len({t.schema for t in tables}) > 1:
            raise _Unusual
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if table.num_rows == 0:
            raise _Unusual
        return _scores(table, group_by, (unverified_note(unverified),) if unverified else ())
    except _Unusual:
        return None


def _scores(table: pa.Table, group_by: list[str], notes: tuple[str, ...]) -> FastScores:
    n = table.num_rows
    coded = {c: _codes(table, c) for c in dict.fromkeys([*KEY_COLUMNS, *group_by, "threshold", "threshold_on"])}
    key, card = _combine([(coded[c][0], len(coded[c][1])) for c in KEY_COLUMNS], n)
    if _has_repeats(key, card):  # duplicates to resolve or to refuse: the pandas path
        raise _Unusual
    g, first = _dense(*_combine([(coded[c][0], len(coded[c][1])) for c in group_by], n))
    n_groups = len(first)
    gkeys = [tuple(coded[c][1][coded[c][0][i]] for c in group_by) for i in first]
    pool, n_pool = _combine([(coded[c][0], len(coded[c][1])) for c in ("threshold", "threshold_on")], n)
    if (_distinct_per_group(g, n_groups, pool, n_pool) > 1).any():  # mixed thresholds: the pandas path refuses
        raise _Unusual
    img, n_img = _combine([(coded[c][0], len(coded[c][1])) for c in IMAGE_COLUMNS if c not in group_by], n)
    n_images = _distinct_per_group(g, n_groups, img, n_img)
    cls_codes, cls_values = coded["class_id"]
    order = np.argsort(np.asarray(cls_values))  # classes in sorted order, as pd.factorize(sort=True)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    c = rank[cls_codes]
    n_c = len(order)
    gc = g * n_c + c
    counts = {k: _np(table, k) for k in ("tp", "fp", "fn")}
    sums = {k: np.bincount(gc, weights=v, minlength=n_groups * n_c).reshape(n_groups, n_c)
            for k, v in counts.items()}
    rows_gc = np.bincount(gc, minlength=n_groups * n_c).reshape(n_groups, n_c)
    tot = {k: np.bincount(g, weights=v, minlength=n_groups) for k, v in counts.items()}
    if max(int(v.sum()) for v in counts.values()) >= 2**53:  # float64 sums below are exact up to 2**53
        raise _Unusual
    n_rows_g = np.bincount(g, minlength=n_groups)
    per_metric = {}
    for m, s, bad in _row_scores(counts["tp"], counts["fp"], counts["fn"]):
        ssum = np.bincount(gc, weights=s, minlength=n_groups * n_c).reshape(n_groups, n_c)
        undef_gc = np.bincount(gc[bad], minlength=n_groups * n_c).reshape(n_groups, n_c)
        per_metric[m] = (ssum, rows_gc - undef_gc, undef_gc.sum(axis=1))
    records = []
    sort_idx = sorted(range(n_groups), key=lambda k: gkeys[k])  # groups in key order, as groupby(sort=True)
    for k in sort_idx:
        present = rows_gc[k] > 0
        ncls = int(present.sum())
        for rule in ALL_RULES:
            for m in ALL_METRICS:
                if rule == "global-micro":
                    v = float(score_from_counts(m, *(np.int64(tot[x][k]) for x in ("tp", "fp", "fn"))))
                    units, excl = 1, int(np.isnan(v))
                elif rule == "class-macro":
                    sc = score_from_counts(m, *(sums[x][k][present] for x in ("tp", "fp", "fn")))
                    dd = ~np.isnan(sc)
                    v = float(sc[dd].mean()) if dd.any() else float("nan")
                    units, excl = ncls, int((~dd).sum())
                else:
                    ssum, scnt, undefined = per_metric[m]
                    means = ratio_or_nan(ssum[k][present], scnt[k][present])
                    ok = ~np.isnan(means)
                    v = float(means[ok].mean()) if ok.any() else float("nan")
                    units, excl = int(n_rows_g[k]), int(undefined[k])
                records.append((*gkeys[k], rule, m, v, int(n_images[k]), ncls, units, excl))
    names = [*group_by, *SCORE_COLUMNS]
    columns = {c: [r[i] for r in records] for i, c in enumerate(names)}
    kinds = {c: COUNTS_COLUMNS[c] for c in group_by}
    return FastScores(columns=columns, kinds=kinds, notes=notes, n_rows=n)

