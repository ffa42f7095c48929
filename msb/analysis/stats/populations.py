"""Evaluation populations: restrict any aggregation to a named subset of images, predictions held fixed.

A population selects count rows by

* ``source``: the ``source`` column (origin of the image), e.g. ``source:cvc,kvasir``;
* ``ids``: a list of sample ids, from a text file (one id per line, ``#`` comments) or a CSV/Parquet file
  with a ``sample_id`` (or ``image_id``) column, e.g. ``ids:lists/hard_cases.txt``;
* ``flag``: an audit table (CSV or Parquet) with ``sample_id`` (or ``image_id``), optionally ``dataset``, and a
  boolean flag column; the rows whose flag is true are selected, e.g.
  ``flag:runs/audit/near_duplicates.csv:near_duplicate_in_train``. Without ``:COLUMN`` the column
  ``near_duplicate_in_train`` is used if present, else the single column that is not an id/dataset column.
  Flag values: ``true/false``, ``1/0``, ``yes/no`` (any case) or a boolean/integer 0/1 column.

A spec may be named: ``dups=flag:audit.csv`` (default name: the spec itself). :func:`compare_populations`
scores the subset, its complement and the full population with the same rules on the same stored predictions
("change the evaluation population, hold predictions fixed").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from msb.analysis.counts.aggregate import ALL_METRICS, DEFAULT_GROUP
from msb.analysis.counts.rules import BASE_RULES, aggregate_rules
from msb.errors import MSBError

__all__ = ["DEFAULT_FLAG_COLUMN", "Population", "parse_population", "compare_populations"]

#: Flag column looked for when a ``flag:`` spec names none (the near-duplicate audit's column).
DEFAULT_FLAG_COLUMN = "near_duplicate_in_train"
_ID_COLUMNS = ("sample_id", "image_id")
_TRUE = {"true", "1", "yes", "y", "t"}
_FALSE = {"false", "0", "no", "n", "f"}


@dataclass(frozen=True)
class Population:
    """A named subset of images.

    Attributes:
        name: display name.
        kind: ``"source"``, ``"ids"`` or ``"flag"``.
        values: selected sources (``source``) or sample ids (``ids``, ``flag``).
        datasets: for ``flag``/``ids`` files with a ``dataset`` column, the (dataset, id) pairs selected;
            empty when ids apply to every dataset.
        origin: where the population came from (the spec, or the file).
    """

    name: str
    kind: str
    values: frozenset[str]
    origin: str
    dataset_pairs: frozenset[tuple[str, str]] = frozenset()

    def mask(self, df: pd.DataFrame) -> np.ndarray:
        """Boolean ``(len(df),)`` mask of the count rows in the population."""
        if self.kind == "source":
            return df["source"].astype(str).isin(self.values).to_numpy()
        if self.dataset_pairs:
            pairs = pd.MultiIndex.from_arrays([df["dataset"].astype(str), df["image_id"].astype(str)])
            return pairs.isin(list(self.dataset_pairs))
        return df["image_id"].astype(str).isin(self.values).to_numpy()


def _read_table(path: Path, what: str) -> pd.DataFrame:
    if not path.is_file():
        raise MSBError(f"{path}: {what} file not found")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as e:  # pandas/pyarrow raise several types
        raise MSBError(f"{path}: cannot read {what} file as {'Parquet' if path.suffix == '.parquet' else 'CSV'} "
                       f"({type(e).__name__}: {e})") from None


def _id_column(df: pd.DataFrame, path: Path) -> str:
    for c in _ID_COLUMNS:
        if c in df.columns:
            return c
    raise MSBError(f"{path}: no 'sample_id' (or 'image_id') column; columns: {list(df.columns)}")


def _ids_population(name: str, path: Path, spec: str) -> Population:
    if path.suffix.lower() in (".csv", ".parquet", ".pq"):
        df = _read_table(path, "id list")
        col = _id_column(df, path)
        ids = [str(v).strip() for v in df[col]]
        pairs = (frozenset(zip(df["dataset"].astype(str), ids)) if "dataset" in df.columns else frozenset())
    else:
        if not path.is_file():
            raise MSBError(f"{path}: id list file not found")
        lines = path.read_text(encoding="utf-8").splitlines()
        ids = [ln.split("#", 1)[0].strip() for ln in lines]
        ids = [i for i in ids if i]
        pairs = frozenset()
    ids = [i for i in ids if i]
    if not ids:
        raise MSBError(f"{path}: the id list is empty; put one sample id per line")
    return Population(name, "ids", frozenset(ids), spec, pairs)


def _flag_value(v, path: Path, col: str, line: int):
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)) and v in (0, 1):
        return bool(v)
    if isinstance(v, (float, np.floating)) and v in (0.0, 1.0):
        return bool(v)
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise MSBError(f"{path}: column {col!r} row {line} has value {v!r}; flags must be true/false, 1/0 or yes/no")


def _flag_population(name: str, path: Path, column: str | None, spec: str) -> Population:
    df = _read_table(path, "audit flag")
    idc = _id_column(df, path)
    if column is None:
        if DEFAULT_FLAG_COLUMN in df.columns:
            column = DEFAULT_FLAG_COLUMN
        else:
            others = [c for c in df.columns if c not in (*_ID_COLUMNS, "dataset")]
            if len(others) != 1:
                raise MSBError(f"{path}: name the flag column (flag:{path}:COLUMN); candidates: {others}")
            column = others[0]
    if column not in df.columns:
        raise MSBError(f"{path}: no flag column {column!r}; columns: {list(df.columns)}")
    line0 = 2 if path.suffix.lower() not in (".parquet", ".pq") else 0  # CSV line of the first data row
    flags = np.array([_flag_value(v, path, column, i + line0) for i, v in enumerate(df[column])], dtype=bool)
    ids = df[idc].astype(str).str.strip().to_numpy()
    sel = ids[flags]
    pairs = (frozenset(zip(df["dataset"].astype(str).to_numpy()[flags], sel)) if "dataset" in df.columns
             else frozenset())
    return Population(name, "flag", frozenset(sel), f"{spec} (column {column!r})", pairs)


def parse_population(spec: str) -> Population:
    """Parse a population spec (module docstring): ``[NAME=]source:A,B``, ``[NAME=]ids:FILE``,
    ``[NAME=]flag:FILE[:COLUMN]``.

    Raises:
        MSBError: unknown kind, empty value, missing or unreadable file, missing id/flag column, a flag value
            that is not boolean (file, column and row named), an empty id list.
    """
    text = spec.strip()
    name = None
    head = text.split(":", 1)[0]
    if "=" in head:
        name, text = text.split("=", 1)
        name = name.strip()
    kind, sep, rest = text.partition(":")
    kind = kind.strip()
    if not sep or not rest.strip():
        raise MSBError(f"population {spec!r}: expected source:A,B | ids:FILE | flag:FILE[:COLUMN]")
    name = name or text
    if kind == "source":
        values = frozenset(v.strip() for v in rest.split(",") if v.strip())
        if not values:
            raise MSBError(f"population {spec!r}: no source given")
        return Population(name, "source", values, spec)
    if kind == "ids":
        return _ids_population(name, Path(rest.strip()), spec)
    if kind == "flag":
        path_text, column = rest.strip(), None
        p = Path(path_text)
        if not p.is_file() and ":" in path_text:
            path_text, column = path_text.rsplit(":", 1)
            p = Path(path_text)
        return _flag_population(name, p, column, spec)
    raise MSBError(f"population {spec!r}: unknown kind {kind!r}; use source:, ids: or flag:")


def compare_populations(df: pd.DataFrame, populations: Sequence[Population],
                        group_by: Sequence[str] = DEFAULT_GROUP, rules: Sequence[str] = BASE_RULES,
                        metrics: Sequence[str] = ALL_METRICS) -> pd.DataFrame:
    """Score each population, its complement and all rows under the same rules (predictions fixed).

    Args:
        df: counts rows.
        populations: from :func:`parse_population`.
        group_by, rules, metrics: as :func:`msb.analysis.counts.rules.aggregate_rules`.

    Returns:
        Tidy table: group columns, ``population, aggregation, metric, value_all, value_subset,
        value_complement, delta`` (= subset − all), ``n_images_all, n_images_subset, n_images_complement``.
        A group where the subset (or complement) is empty has NaN there and 0 images.

    Raises:
        MSBError: a population matching no count row at all (its origin and a few ids are named).
    """
    group_by = list(group_by)
    keys = [*group_by, "aggregation", "metric"]
    full = aggregate_rules(df, group_by, rules, metrics)
    out = []
    for pop in populations:
        m = pop.mask(df)
        if not m.any():
            shown = sorted(pop.values)[:5]
            raise MSBError(f"population {pop.name!r} ({pop.origin}) matches no count row: none of its "
                           f"{len(pop.values)} {'sources' if pop.kind == 'source' else 'ids'} (first {shown}) "
                           f"occur in the counts' {'source' if pop.kind == 'source' else 'image_id'} column")
        parts = {}
        for part, mask in (("subset", m), ("complement", ~m)):
            if mask.any():
                t = aggregate_rules(df.loc[mask], group_by, rules, metrics)
                parts[part] = t[[*keys, "value", "n_images"]].rename(
                    columns={"value": f"value_{part}", "n_images": f"n_images_{part}"})
        t = full[[*keys, "value", "n_images"]].rename(columns={"value": "value_all", "n_images": "n_images_all"})
        for part in ("subset", "complement"):
            if part in parts:
                t = t.merge(parts[part], on=keys, how="left")
            else:
                t[f"value_{part}"] = np.nan
                t[f"n_images_{part}"] = 0
            t[f"n_images_{part}"] = t[f"n_images_{part}"].fillna(0).astype(np.int64)
        t.insert(len(group_by), "population", pop.name)
        t["delta"] = t["value_subset"] - t["value_all"]
        out.append(t)
    cols = [*group_by, "population", "aggregation", "metric", "value_all", "value_subset", "value_complement",
            "delta", "n_images_all", "n_images_subset", "n_images_complement"]
    return pd.concat(out, ignore_index=True)[cols] if out else pd.DataFrame(columns=cols)
