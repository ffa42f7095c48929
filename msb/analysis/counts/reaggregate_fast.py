"""The basic ``msb reaggregate`` (3 rules x 4 metrics per group) on Arrow columns, without pandas.

:func:`fast_reaggregate` reads (:func:`msb.analysis.counts.counts_arrow.read_checked`) only the columns the checks and the scores need (string columns as Arrow
dictionaries, so a key column is already integer codes), runs the checks of
:func:`msb.analysis.counts.counts_io.read_counts_with_report` on the columns (SHA-256 against ``digests.json``, schema
columns and dtypes, no missing values, schema version, negative / inconsistent counts,
``tp + fp + fn + tn = height * width``, ``threshold_on`` values, finite thresholds, duplicate keys via one
``int64`` combined key, mixed thresholds in a group) and computes the scores of
:func:`msb.analysis.counts.aggregate.reaggregate` with ``np.bincount`` over (group, class) codes.

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

from msb.analysis.counts.aggregate_core import ALL_RULES, IMAGE_COLUMNS, SCORE_COLUMNS
from msb.analysis.counts.count_scores import ALL_METRICS, ratio_or_nan, score_from_counts
from msb.analysis.counts.counts_arrow import Unusual as _Unusual, column_numpy as _np, flat_numpy as _flat
from msb.analysis.counts.counts_arrow import needed_columns as _needed
from msb.analysis.counts.counts_arrow import read_checked as _read_file
from msb.analysis.counts.counts_files import find_counts_files
from msb.evaluation.counts import COUNTS_COLUMNS, KEY_COLUMNS
from msb.utils.atomic import atomic_path
from msb.utils.evaluation_folder import unverified_note

__all__ = ["FastScores", "fast_reaggregate"]


@dataclass
class FastScores:
    """The long score table of :func:`msb.analysis.counts.aggregate.reaggregate`, as plain columns.

    Attributes:
        columns: ``{name: list}`` in output order: the group columns, then :data:`SCORE_COLUMNS`.
        kinds: ``{group column: "string" | "int64" | "float64"}``.
        notes: the read notes (unverified folders), as :class:`~msb.analysis.counts.counts_io.CountsReadReport`.
        n_rows: count rows read.
    """

    columns: dict[str, list]
    kinds: dict[str, str]
    notes: tuple[str, ...] = field(default=())
    n_rows: int = 0

    def to_frame(self):
        """The same table as a pandas DataFrame, dtypes as :func:`~msb.analysis.counts.aggregate.score_table`."""
        import pandas as pd

        out = pd.DataFrame(self.columns)
        for c, kind in self.kinds.items():
            out[c] = out[c].astype("str" if kind == "string" else kind)
        return out

    def wide_csv(self) -> str:
        """:func:`msb.analysis.counts.aggregate.scores_wide` of the table as CSV text (what ``--format csv`` prints)."""
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
        """``scores.csv`` and ``scores.parquet`` in ``out_dir``, as :func:`~msb.analysis.counts.aggregate.write_scores`
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


def _arrow(values: list, kind: str) -> pa.Array:
    """An Arrow array (large_string, int64 or float64) from Python values, built from its buffers."""
    if kind == "string":
        enc = [str(v).encode("utf-8") for v in values]
        off = np.zeros(len(enc) + 1, dtype=np.int64)
        off[1:] = np.cumsum([len(e) for e in enc])
        return pa.Array.from_buffers(pa.large_string(), len(enc), [None, pa.py_buffer(off), pa.py_buffer(b"".join(enc))])
    v = np.ascontiguousarray(np.asarray(values, dtype=kind))
    return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), len(v), [None, pa.py_buffer(v)])


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
    :func:`~msb.analysis.counts.count_scores.score_from_counts` (the same float64 operations in the same order), 0
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
        paths: files and/or folders (:func:`~msb.analysis.counts.counts_files.find_counts_files`).
        group_by: group columns, columns of :data:`~msb.evaluation.counts.COUNTS_COLUMNS` (e.g.
            :data:`~msb.analysis.counts.aggregate_core.DEFAULT_GROUP`, plus ``threshold``/``threshold_on``).

    Returns:
        The table of :func:`msb.analysis.counts.aggregate.reaggregate` on
        :func:`msb.analysis.counts.counts_io.read_counts` of ``paths`` (all rules and metrics; groups sorted by key),
        or ``None`` when the pandas path must run instead (any failed check, duplicate keys, unusual column
        types or layouts: see the module docstring).

    Raises:
        MSBError: as :func:`~msb.analysis.counts.counts_files.find_counts_files`; a SHA-256 that differs from the
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

