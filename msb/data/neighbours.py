"""Close training matches of evaluation frames, read from an audit pairs table (ReuScope step four).

The table is ``msb audit``'s ``pairs.csv`` (or any CSV/Parquet with the same columns): one row per image pair,
columns ``sample_id_a``, ``sample_id_b`` and, optionally, ``confirmed`` (only rows with a true value count; the
audit's candidate pairs that its screens did not confirm are left out). For a training split (a set of training
sample ids), an **evaluation frame** is any id that is not a training id; its **training neighbours** are the
training ids it shares a counted pair with. An evaluation frame with at least one neighbour is **exposed**.

Used by the ``remove_neighbours`` / ``remove_distant`` pools (:mod:`msb.data.pools`) and by the local-versus-
distant difference-in-differences (:mod:`msb.analysis.stats.did`), so both read the pairs the same way.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from msb.errors import MSBError

__all__ = ["PAIR_COLUMNS", "read_pairs", "training_neighbours"]

PAIR_COLUMNS = ("sample_id_a", "sample_id_b")
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f", ""}


def read_pairs(path: str | os.PathLike) -> list[tuple[str, str]]:
    """The counted pairs ``(sample_id_a, sample_id_b)`` of a pairs table (module docstring), in file order.

    Raises:
        MSBError: missing or unreadable file, missing id column, a ``confirmed`` value that is not boolean
            (file, column and row named).
    """
    path = Path(path)
    if not path.is_file():
        raise MSBError(f"{path}: pairs file not found; give the pairs.csv of an msb audit of this dataset")
    try:
        df = (pd.read_parquet(path) if path.suffix.lower() in (".parquet", ".pq")
              else pd.read_csv(path, dtype=str, keep_default_na=False))
    except Exception as e:  # pandas/pyarrow raise several types
        raise MSBError(f"{path}: cannot read the pairs file ({type(e).__name__}: {e})") from None
    missing = [c for c in PAIR_COLUMNS if c not in df.columns]
    if missing:
        raise MSBError(f"{path}: pairs file lacks column(s) {missing}; columns: {list(df.columns)}")
    keep = [True] * len(df)
    if "confirmed" in df.columns:
        keep = []
        for i, v in enumerate(df["confirmed"]):
            s = str(v).strip().lower()
            if s not in _TRUE and s not in _FALSE:
                raise MSBError(f"{path}: column 'confirmed' row {i + 2} has value {v!r}; use true/false or 1/0")
            keep.append(s in _TRUE)
    a = df["sample_id_a"].astype(str).str.strip().to_numpy()
    b = df["sample_id_b"].astype(str).str.strip().to_numpy()
    return [(x, y) for x, y, k in zip(a, b, keep) if k and x != y]


def training_neighbours(pairs: Iterable[tuple[str, str]], train_ids: Iterable[str]) -> dict[str, set[str]]:
    """Evaluation id -> its training neighbours (only exposed frames are keys; pairs inside one side ignored)."""
    train = set(map(str, train_ids))
    out: dict[str, set[str]] = {}
    for a, b in pairs:
        if (a in train) == (b in train):
            continue
        e, t = (b, a) if a in train else (a, b)
        out.setdefault(e, set()).add(t)
    return out
