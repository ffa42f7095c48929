"""Cross-boundary census: for each relation, how many groups, rows and row pairs cross a boundary.

A *relation* partitions the rows into clusters (labels, one per row): e.g. "identical bytes" (same SHA-256),
"identical pHash", "near-duplicate" (connected components of candidate pairs), "shared group" (same non-empty
``group`` value), "same file name". A *boundary* gives each row a side: its split (``train``/``val``/``test``)
or, with ``--against``, its dataset. Rows with an empty side (no split assigned) are *unassigned*: they are
counted in cluster sizes but can neither cross nor be crossed.

Quantities (one row of the census table each; ``count`` of ``unit`` out of ``denominator`` of
``denominator_unit``):

======================================= ============= ==========================================================
quantity                                unit          denominator
======================================= ============= ==========================================================
``groups_with_2plus_rows``              groups        all groups of the relation (singletons included)
``crossing_groups``                     groups        groups with >= 2 rows
``crossing_groups`` (scope ``a|b``)     groups        groups with >= 2 rows; groups holding rows of both a and b
``rows_in_groups_with_2plus_rows``      rows          all rows
``crossing_rows``                       rows          rows with a side; a crossing row has a related row on
                                                      another side
``crossing_rows`` (scope ``s``)         rows          rows on side s
``crossing_pairs``                      row pairs     row pairs inside one group, both with a side (transitive:
                                                      near-duplicate groups are single-linkage clusters)
``crossing_rows_missed_by_filename``    rows          crossing rows; *missed* = no row on another side has the
                                                      same file name (lower-case stem of ``image_path``)
======================================= ============= ==========================================================
"""

from __future__ import annotations

from itertools import combinations
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

SPLIT_ORDER = ("train", "val", "test")
CENSUS_COLUMNS = ("relation", "quantity", "scope", "count", "unit", "denominator", "denominator_unit", "share")


def side_order(values: Sequence[str]) -> list[str]:
    """Non-empty side values: ``train``, ``val``, ``test`` first (if present), then the rest sorted."""
    present = {str(v) for v in values if str(v) != ""}
    return [s for s in SPLIT_ORDER if s in present] + sorted(present - set(SPLIT_ORDER))


def _pairs(n: np.ndarray) -> np.ndarray:
    n = np.asarray(n, dtype=np.int64)
    return n * (n - 1) // 2


def filename_flags(side: np.ndarray, stems: np.ndarray) -> np.ndarray:
    """Rows a filename-only check flags: some row on *another* non-empty side has the same stem.

    Args:
        side: ``(N,)`` str, ``''`` = unassigned.
        stems: ``(N,)`` str, the compared file names.

    Returns:
        ``(N,)`` bool.
    """
    df = pd.DataFrame({"side": side, "stem": stems})
    assigned = df[df["side"] != ""]
    n_sides = assigned.groupby("stem")["side"].nunique()
    multi = df["stem"].map(n_sides).fillna(0).to_numpy() >= 2
    return multi & (df["side"].to_numpy() != "")


def relation_census(relation: str, labels: np.ndarray, side: np.ndarray, stems: np.ndarray,
                    sides: Sequence[str] | None = None) -> list[dict]:
    """Census rows of one relation (quantities in the module docstring).

    Args:
        relation: relation name (first column of the output rows).
        labels: ``(N,)`` cluster label per row.
        side: ``(N,)`` str boundary side per row (``''`` = unassigned).
        stems: ``(N,)`` str file names for the filename-only check.
        sides: side values to report per side (default :func:`side_order` of ``side``).

    Returns:
        List of dicts with keys :data:`CENSUS_COLUMNS`.
    """
    labels = np.asarray(labels)
    side = np.asarray(side, dtype=object).astype(str)
    sides = list(sides) if sides is not None else side_order(side)
    n = len(labels)
    df = pd.DataFrame({"label": labels, "side": side})
    size = df.groupby("label").size()
    n_groups = int(len(size))
    multi_labels = size.index[size.to_numpy() >= 2]
    n_multi = int(len(multi_labels))
    rows_in_multi = int(size[size >= 2].sum())
    assigned = df[df["side"] != ""]
    sides_per_label = assigned.groupby("label")["side"].agg(lambda s: frozenset(s))
    crossing_labels = {lab for lab, ss in sides_per_label.items() if len(ss) >= 2}
    n_cross_groups = len(crossing_labels)
    # crossing rows: assigned rows whose group has another side
    row_sides = df["label"].map(sides_per_label)
    is_cross = np.array([bool(s != "" and isinstance(ss, frozenset) and len(ss - {s}) > 0)
                         for s, ss in zip(df["side"], row_sides)], dtype=bool)
    n_assigned = int((side != "").sum())
    # pairs
    per_label_side = assigned.groupby(["label", "side"]).size()
    n_assigned_per_label = assigned.groupby("label").size()
    total_pairs = int(_pairs(n_assigned_per_label.to_numpy()).sum())
    same_side_pairs = int(_pairs(per_label_side.to_numpy()).sum())
    # filename check
    flags = filename_flags(side, np.asarray(stems, dtype=object).astype(str))
    missed = int((is_cross & ~flags).sum())
    n_cross_rows = int(is_cross.sum())

    def row(quantity: str, scope: str, count: int, unit: str, den: int, den_unit: str) -> dict:
        return {"relation": relation, "quantity": quantity, "scope": scope, "count": int(count), "unit": unit,
                "denominator": int(den), "denominator_unit": den_unit,
                "share": (count / den) if den else float("nan")}

    out = [row("groups_with_2plus_rows", "all", n_multi, "groups", n_groups, "groups (singletons included)"),
           row("crossing_groups", "all", n_cross_groups, "groups", n_multi, "groups with >= 2 rows")]
    for a, b in combinations(sides, 2):
        cnt = sum(1 for ss in sides_per_label if a in ss and b in ss)
        out.append(row("crossing_groups", f"{a}|{b}", cnt, "groups", n_multi, "groups with >= 2 rows"))
    out.append(row("rows_in_groups_with_2plus_rows", "all", rows_in_multi, "rows", n, "rows"))
    out.append(row("crossing_rows", "all", n_cross_rows, "rows", n_assigned, "rows with a side"))
    for s in sides:
        on_s = side == s
        out.append(row("crossing_rows", s, int((is_cross & on_s).sum()), "rows", int(on_s.sum()), f"rows on {s}"))
    out.append(row("crossing_pairs", "all", total_pairs - same_side_pairs, "row pairs", total_pairs,
                   "row pairs within groups (both rows with a side)"))
    out.append(row("crossing_rows_missed_by_filename", "all", missed, "rows", n_cross_rows, "crossing rows"))
    return out


def census_table(relations: Mapping[str, np.ndarray], side: np.ndarray, stems: np.ndarray) -> pd.DataFrame:
    """Census of several relations over one boundary.

    Args:
        relations: relation name -> ``(N,)`` labels.
        side: ``(N,)`` boundary side per row (``''`` = unassigned).
        stems: ``(N,)`` file names for the filename-only check.

    Returns:
        DataFrame with columns :data:`CENSUS_COLUMNS`, relations in the given order.
    """
    sides = side_order(side)
    rows: list[dict] = []
    for name, labels in relations.items():
        rows += relation_census(name, labels, side, stems, sides)
    return pd.DataFrame(rows, columns=list(CENSUS_COLUMNS))


def summary_table(census: pd.DataFrame) -> pd.DataFrame:
    """Compact view: one row per relation, ``"count / denominator"`` strings for the ``scope == 'all'`` quantities.

    Columns: ``relation``, ``groups >=2 rows``, ``crossing groups``, ``rows in groups``, ``crossing rows``,
    ``missed by filename`` (denominators as in the module docstring).
    """
    cols = {"groups_with_2plus_rows": "groups >=2 rows", "crossing_groups": "crossing groups",
            "rows_in_groups_with_2plus_rows": "rows in groups", "crossing_rows": "crossing rows",
            "crossing_rows_missed_by_filename": "missed by filename"}
    out = []
    for rel, g in census[census["scope"] == "all"].groupby("relation", sort=False):
        row = {"relation": rel}
        for q, name in cols.items():
            r = g[g["quantity"] == q]
            row[name] = f"{int(r['count'].iat[0])} / {int(r['denominator'].iat[0])}" if len(r) else ""
        out.append(row)
    return pd.DataFrame(out, columns=["relation", *cols.values()])


__all__ = ["census_table", "relation_census", "filename_flags", "side_order", "summary_table", "CENSUS_COLUMNS"]
