"""Group-aware K-fold assignment, persisted once per study as ``folds.csv``.

Algorithm (:func:`assign_folds`)
--------------------------------
1. The *pool* is the samples that are cross-validated: the non-test samples of the run config's split
   (``cross_validation.include_test: false``) or every sample (``true``). Other samples get fold ``-1``.
2. Groups: with ``group_column`` set, samples sharing a non-empty value form one group; an empty cell (or no
   ``group_column``) makes a sample its own group (the same rule as :mod:`msb.data.splits`).
3. Pool rows are sorted by ``sample_id`` (the result does not depend on ``index.csv`` row order).
4. Without ``stratify``: the groups are relabelled by ``numpy.random.default_rng(seed).permutation`` of
   their sorted keys, then scikit-learn ``GroupKFold(n_splits=k)`` (no shuffle) assigns them: largest group
   first to the fold with the fewest samples, so fold sizes are as equal as whole groups allow; the seeded
   labels break ties between equally sized groups.
   With ``stratify``: scikit-learn ``StratifiedGroupKFold(n_splits=k, shuffle=True, random_state=seed)``
   on the stratum labels (``empty_mask``: ``empty``/``non-empty`` reference mask; else an ``index.csv``
   column).
5. Fold ``j`` is the ``j``-th test fold yielded by the splitter.

So no group ever spans two folds, and the same inputs and seed give the same folds (with the same
scikit-learn version; the file is written once and reused on resume, so a later version never changes a
running study).

``folds.csv``: ``sample_id,group,stratum,fold`` in ``index.csv`` row order, ``\\n`` line ends; ``group`` is
the raw group value (empty when none), ``stratum`` the stratum label (empty without stratification), ``fold``
an integer in ``0..k-1`` or ``-1`` (held-out test / not cross-validated). Its SHA-256 is stored in the study
manifest. The split of fold ``j`` (:func:`fold_split`): ``val`` = fold ``j`` (checkpoint selection on the
held-out fold), ``train`` = the other folds, ``test`` = fold ``-1``.

Inner selection split (``cross_validation.inner_val: f``, :func:`assign_inner_val`): for each fold ``j`` the
groups of its training rows (folds ``!= j``, ``>= 0``; the group rule above, read from ``folds.csv``) are
sorted, permuted by ``numpy.random.default_rng([seed, j])`` and cut where the cumulative sample count is
closest to ``round(f * n_train)`` (at least one group on each side). Those rows are ``inner_val`` in fold
``j``'s split (checkpoint selection there), the rest ``train``; fold ``j`` stays ``val`` (the scored
out-of-fold split), fold ``-1`` ``test``. Persisted as ``inner_val.csv`` (``fold,sample_id``, by fold, then
``folds.csv`` row order).
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text

__all__ = ["FOLDS_COLUMNS", "INNER_COLUMNS", "INNER_SPLIT", "assign_folds", "write_folds", "read_folds",
           "fold_split", "empty_mask_strata", "assign_inner_val", "write_inner_val", "read_inner_val"]

FOLDS_COLUMNS: tuple[str, ...] = ("sample_id", "group", "stratum", "fold")
INNER_COLUMNS: tuple[str, ...] = ("fold", "sample_id")
#: Name of the inner checkpoint-selection split in a fold run's ``split.csv`` (``cross_validation.inner_val``).
INNER_SPLIT = "inner_val"


def _group_keys(pool: pd.DataFrame, group_column: str | None, where: str) -> tuple[np.ndarray, np.ndarray]:
    sids = pool["sample_id"].astype(str).to_numpy()
    if not group_column:
        return np.char.add("s:", sids.astype(str)), np.full(len(sids), "", dtype=object)
    if group_column not in pool.columns:
        raise MSBError(f"{where}: cross_validation.group_column {group_column!r} is not a column of index.csv "
                       f"(columns: {', '.join(map(str, pool.columns))}); set it to an existing column or null")
    raw = pool[group_column].fillna("").astype(str).str.strip().to_numpy()
    keys = np.where(raw != "", np.char.add("g:", raw.astype(str)), np.char.add("s:", sids.astype(str)))
    return keys, raw.astype(object)


def assign_folds(index: pd.DataFrame, pool_ids: Sequence[str], k: int, group_column: str | None = "group",
                 strata: pd.Series | None = None, seed: int = 0, where: str = "index.csv") -> pd.DataFrame:
    """Assign every pool sample to one of ``k`` folds, keeping groups together (module docstring).

    Args:
        index: prepared-dataset index (``sample_id`` and ``group_column``), any row order.
        pool_ids: sample ids to cross-validate (the rest get fold ``-1``).
        k: number of folds, >= 2.
        group_column: grouping column or ``None``.
        strata: optional stratum label per ``sample_id`` (index: sample ids) for ``StratifiedGroupKFold``.
        seed: fold seed.
        where: file/key named in error messages.

    Returns:
        DataFrame with :data:`FOLDS_COLUMNS` in ``index`` row order; ``fold`` is int64.

    Raises:
        MSBError: ``k < 2``, fewer groups than ``k`` in the pool, a missing group column, pool ids not in the
            index, strata missing for some pool sample.
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
        raise MSBError(f"{where}: cross_validation.k must be an integer >= 2, got {k!r}")
    all_ids = index["sample_id"].astype(str)
    pool_set = set(map(str, pool_ids))
    unknown = sorted(pool_set - set(all_ids))
    if unknown:
        raise MSBError(f"{where}: {len(unknown)} pool sample(s) are not in index.csv, e.g. {unknown[:3]}")
    pool = index[all_ids.isin(pool_set).to_numpy()].copy()
    pool["sample_id"] = pool["sample_id"].astype(str)
    pool = pool.sort_values("sample_id", kind="stable").reset_index(drop=True)
    keys, raw_groups = _group_keys(pool, group_column, where)
    uniq = np.unique(keys)
    what = f"groups (column {group_column!r})" if group_column else "samples"
    if len(uniq) < k:
        raise MSBError(f"{where}: {k}-fold cross-validation needs at least {k} {what} in the pool, found "
                       f"{len(uniq)}; lower cross_validation.k or add data")
    strat = np.full(len(pool), "", dtype=object)
    if strata is not None:
        s = strata.copy()
        s.index = s.index.astype(str)
        missing = [x for x in pool["sample_id"] if x not in s.index]
        if missing:
            raise MSBError(f"{where}: no stratum for {len(missing)} sample(s), e.g. {missing[:3]}")
        strat = s.loc[pool["sample_id"]].fillna("").astype(str).to_numpy().astype(object)
    X = np.zeros((len(pool), 1))
    fold_of = np.full(len(pool), -1, dtype=np.int64)
    if strata is not None:
        splitter = StratifiedGroupKFold(n_splits=int(k), shuffle=True, random_state=int(seed))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "least populated class has only n members"
            parts = list(splitter.split(X, strat.astype(str), keys))
    else:
        perm = np.random.default_rng(int(seed)).permutation(len(uniq))
        label = dict(zip(uniq, perm))
        parts = list(GroupKFold(n_splits=int(k)).split(X, groups=np.array([label[x] for x in keys])))
    for j, (_, test_idx) in enumerate(parts):
        fold_of[test_idx] = j
    if (fold_of < 0).any():  # pragma: no cover - sklearn assigns every sample
        raise RuntimeError("fold assignment left samples without a fold")
    by_id = pd.DataFrame({"sample_id": pool["sample_id"], "group": raw_groups, "stratum": strat, "fold": fold_of})
    by_id = by_id.set_index("sample_id")
    out = pd.DataFrame({"sample_id": all_ids.to_numpy()})
    if group_column and group_column in index.columns:
        out["group"] = index[group_column].fillna("").astype(str).str.strip().to_numpy()
    else:
        out["group"] = ""
    out["stratum"] = ""
    out["fold"] = -1
    in_pool = out["sample_id"].isin(by_id.index).to_numpy()
    out.loc[in_pool, "stratum"] = by_id.loc[out.loc[in_pool, "sample_id"], "stratum"].to_numpy()
    out.loc[in_pool, "fold"] = by_id.loc[out.loc[in_pool, "sample_id"], "fold"].to_numpy()
    out["fold"] = out["fold"].astype(np.int64)
    return out[list(FOLDS_COLUMNS)]


def folds_text(folds: pd.DataFrame) -> str:
    """CSV text of a folds table (``\\n`` line ends)."""
    buf = io.StringIO()
    folds[list(FOLDS_COLUMNS)].to_csv(buf, index=False, lineterminator="\n")
    return buf.getvalue()


def write_folds(path: str | Path, folds: pd.DataFrame) -> Path:
    """Write ``folds.csv`` atomically. Returns the path."""
    atomic_write_text(path, folds_text(folds))
    return Path(path)


def read_folds(path: str | Path, known_ids: Sequence[str] | None = None) -> pd.DataFrame:
    """Read ``folds.csv``.

    Raises:
        MSBError: unreadable file, wrong header, a fold that is not an integer >= -1, duplicate sample ids,
            or (with ``known_ids``) a sample set that differs from the dataset's.
    """
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype={"sample_id": str, "group": str, "stratum": str}, keep_default_na=False)
    except Exception as exc:  # noqa: BLE001 - any parse error is a user-facing problem with this file
        raise MSBError(f"{path}: cannot read the fold file ({exc}); delete it to recompute the folds") from None
    if list(df.columns) != list(FOLDS_COLUMNS):
        raise MSBError(f"{path}: header must be {','.join(FOLDS_COLUMNS)}, got {','.join(map(str, df.columns))}")
    folds = pd.to_numeric(df["fold"], errors="coerce")
    bad = np.flatnonzero(folds.isna().to_numpy() | (folds < -1).to_numpy() | (folds != folds.round()).to_numpy())
    if len(bad):
        i = int(bad[0])
        raise MSBError(f"{path}: line {i + 2}: fold {df['fold'].iat[i]!r} is not an integer >= -1")
    df["fold"] = folds.astype(np.int64)
    if df["sample_id"].duplicated().any():
        raise MSBError(f"{path}: duplicate sample_id values; delete the file to recompute the folds")
    if known_ids is not None and set(df["sample_id"]) != set(map(str, known_ids)):
        raise MSBError(f"{path}: its samples differ from the dataset's index.csv (the dataset changed after the "
                       f"folds were drawn); use a new run_root or delete the study folder")
    return df


def fold_split(folds: pd.DataFrame, j: int, inner: pd.DataFrame | None = None) -> pd.Series:
    """Split of fold ``j``: ``val`` for fold ``j``, ``train`` for the other folds, ``test`` for fold -1; with
    ``inner`` (the table of :func:`assign_inner_val`), fold ``j``'s inner rows are :data:`INNER_SPLIT` instead
    of ``train``.

    Args:
        folds: the folds table (:data:`FOLDS_COLUMNS`).
        j: fold number, ``0..k-1``.
        inner: ``fold,sample_id`` rows of the inner selection splits, or None (no inner split).

    Returns:
        ``pd.Series`` (index ``sample_id``, name ``split``) in the table's row order.
    """
    f = folds["fold"].to_numpy()
    split = np.where(f == j, "val", np.where(f >= 0, "train", "test")).astype(object)
    if inner is not None:
        ids = set(inner.loc[inner["fold"] == j, "sample_id"].astype(str))
        split[folds["sample_id"].astype(str).isin(ids).to_numpy() & (split == "train")] = INNER_SPLIT
    return pd.Series(split, index=pd.Index(folds["sample_id"].astype(str).to_numpy(), name="sample_id"),
                     name="split", dtype=object)


def _fold_keys(folds: pd.DataFrame) -> np.ndarray:
    """Group key per row of a folds table: ``g:<group>`` when the group cell is set, else ``s:<sample_id>``."""
    sids = folds["sample_id"].astype(str).to_numpy()
    raw = folds["group"].fillna("").astype(str).str.strip().to_numpy()
    return np.array([f"g:{g}" if g else f"s:{sid}" for g, sid in zip(raw, sids)], dtype=object)


def assign_inner_val(folds: pd.DataFrame, fraction: float, seed: int, where: str = "folds.csv") -> pd.DataFrame:
    """Draw the inner checkpoint-selection split of every fold from its training rows, by whole groups
    (module docstring).

    Args:
        folds: the folds table (:data:`FOLDS_COLUMNS`, any row order; groups as written by :func:`assign_folds`).
        fraction: target share of a fold's training rows, ``0 < fraction < 1``.
        seed: the fold seed (``cross_validation.seed`` or ``data.split.seed``).
        where: file/key named in error messages.

    Returns:
        DataFrame ``fold,sample_id`` (:data:`INNER_COLUMNS`): by fold, then ``folds`` row order.

    Raises:
        MSBError: ``fraction`` outside (0, 1), or a fold whose training rows hold fewer than two groups.
    """
    if not 0.0 < float(fraction) < 1.0:
        raise MSBError(f"{where}: cross_validation.inner_val must lie strictly between 0 and 1, got {fraction!r}")
    f = folds["fold"].to_numpy()
    keys = _fold_keys(folds)
    sids = folds["sample_id"].astype(str).to_numpy()
    rows: list[tuple[int, str]] = []
    for j in range(int(f.max()) + 1 if len(f) else 0):
        train = (f >= 0) & (f != j)
        uniq, sizes = np.unique(keys[train], return_counts=True)
        if len(uniq) < 2:
            raise MSBError(f"{where}: fold {j} has {len(uniq)} training group(s); cross_validation.inner_val needs "
                           f"at least 2 (one for selection, one for training); lower cross_validation.k or remove "
                           f"inner_val")
        perm = np.random.default_rng([int(seed) & 0xFFFFFFFF, j]).permutation(len(uniq))
        cum = np.cumsum(sizes[perm])
        target = round(float(fraction) * int(train.sum()))
        cut = int(np.argmin(np.abs(cum[:-1] - target))) + 1  # groups perm[:cut]; >= 1 left for training
        chosen = set(uniq[perm[:cut]])
        rows += [(j, s) for s, k, t in zip(sids, keys, train) if t and k in chosen]
    return pd.DataFrame(rows, columns=list(INNER_COLUMNS)).astype({"fold": np.int64, "sample_id": object})


def write_inner_val(path: str | Path, inner: pd.DataFrame) -> Path:
    """Write ``inner_val.csv`` (``fold,sample_id``, ``\n`` line ends) atomically. Returns the path."""
    buf = io.StringIO()
    inner[list(INNER_COLUMNS)].to_csv(buf, index=False, lineterminator="\n")
    atomic_write_text(path, buf.getvalue())
    return Path(path)


def read_inner_val(path: str | Path, folds: pd.DataFrame) -> pd.DataFrame:
    """Read ``inner_val.csv`` and check it against the folds table.

    Args:
        path: the file written by :func:`write_inner_val`.
        folds: the unit's folds table.

    Returns:
        DataFrame ``fold,sample_id``.

    Raises:
        MSBError: unreadable file, wrong header, or a row that is not a training row of its fold (in the
            held-out fold, the test split, or unknown); the message says to delete the file.
    """
    path = Path(path)
    try:
        df = pd.read_csv(path, dtype={"sample_id": str}, keep_default_na=False)
    except Exception as exc:  # noqa: BLE001 - any parse error is a user-facing problem with this file
        raise MSBError(f"{path}: cannot read the inner selection split ({exc}); delete it to redraw it") from None
    if list(df.columns) != list(INNER_COLUMNS):
        raise MSBError(f"{path}: header must be {','.join(INNER_COLUMNS)}, got {','.join(map(str, df.columns))}; "
                       f"delete it to redraw it")
    fold_of = dict(zip(folds["sample_id"].astype(str), folds["fold"].astype(int)))
    valid = {str(x) for x in range(int(folds["fold"].max()) + 1)}
    for i, (j, sid) in enumerate(zip(df["fold"], df["sample_id"])):
        fj = fold_of.get(str(sid))
        if str(j) not in valid or fj is None or fj < 0 or str(fj) == str(j):
            raise MSBError(f"{path}: line {i + 2}: sample {sid!r} is not a training row of fold {j} in the folds "
                           f"file; delete {path.name} to redraw the inner selection split")
    df["fold"] = df["fold"].astype(np.int64)
    df["sample_id"] = df["sample_id"].astype(str).astype(object)
    return df


def empty_mask_strata(ds, sample_ids: Sequence[str]) -> pd.Series:
    """``empty`` / ``non-empty`` per sample: whether the native-resolution reference mask has any foreground
    pixel (any foreground class). ``ds`` is a :class:`msb.data.schema.PreparedDataset`.

    Raises:
        MSBError: a mask value not covered by ``classes.csv`` (from :func:`msb.data.schema.mask_to_onehot`).
    """
    from msb.data.schema import mask_to_onehot, read_mask

    out = {}
    for sid in sample_ids:
        p = ds.mask_path(sid)
        out[str(sid)] = "non-empty" if mask_to_onehot(read_mask(p), ds.classes, p).any() else "empty"
    return pd.Series(out, name="stratum", dtype=object)
