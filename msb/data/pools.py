"""Training pools of a pool-contrast study: which training rows one run trains on (``data.pool``).

:func:`build_pool` derives the rows of a :class:`~msb.config.pools_schema.PoolConfig` from the run's training
split (the ``train`` rows of ``split.csv``; val/test are never touched) and the dataset index; kinds and their
rules are in :mod:`msb.config.pools_schema`. Every random draw uses ``numpy.random.default_rng(pool.seed)`` on
the sorted candidate ids, so a pool depends on its definition, the split and the index only (not on the run's
``random_seed``): the paired seeds of a study train on the same rows.

:func:`ensure_pool` writes the result as ``pool.csv`` (``sample_id,source,stratum``, sorted by ``sample_id``)
into the run folder on first use and reads it back on resume; its SHA-256 goes into ``manifest.json``.

Strata (``count_match``): ``presence`` = the foreground class ids present in the native-resolution reference
mask (``1;2``, ``none`` when empty), ``empty`` = ``empty``/``non-empty`` mask, ``source`` = the ``source``
column; a stratum label joins the chosen keys with ``|`` (e.g. ``presence=1|source=kvasir``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from msb.config.pools_schema import PoolConfig
from msb.data.neighbours import read_pairs, training_neighbours
from msb.data.schema import PreparedDataset, mask_to_onehot, read_mask
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text
from msb.utils.csvio import read_user_csv

__all__ = ["POOL_FILE", "POOL_COLUMNS", "build_pool", "mask_presence", "strata_labels", "ensure_pool",
           "read_pool_file", "pool_file_text", "check_pool"]

POOL_FILE = "pool.csv"
POOL_COLUMNS = ("sample_id", "source", "stratum")


def mask_presence(ds: PreparedDataset, sample_ids: Sequence[str]) -> dict[str, str]:
    """``sample_id`` -> foreground class ids present in its native-resolution mask (``"1;2"``; ``"none"``).

    Raises:
        MSBError: a mask value not covered by ``classes.csv`` (:func:`msb.data.schema.mask_to_onehot`).
    """
    fg = [c.class_id for c in ds.foreground_classes]
    out = {}
    for sid in sample_ids:
        p = ds.mask_path(sid)
        onehot = mask_to_onehot(read_mask(p), ds.classes, p)  # (C, H, W) bool over the foreground classes
        present = [str(fg[k]) for k in range(onehot.shape[0]) if onehot[k].any()]
        out[str(sid)] = ";".join(present) if present else "none"
    return out


def strata_labels(ids: Sequence[str], keys: Sequence[str], source: dict[str, str],
                  presence: Callable[[], dict[str, str]]) -> dict[str, str]:
    """Stratum label per id for the stratum ``keys`` (``presence``/``empty``/``source``, module docstring);
    ``presence`` is called (once) only when a key needs the masks."""
    pres = presence() if any(k in ("presence", "empty") for k in keys) else {}
    out = {}
    for sid in ids:
        parts = []
        for k in keys:
            if k == "presence":
                parts.append(f"presence={pres[sid]}")
            elif k == "empty":
                parts.append(f"empty={'empty' if pres[sid] == 'none' else 'non-empty'}")
            else:
                parts.append(f"source={source[sid]}")
        out[sid] = "|".join(parts)
    return out


def _flagged(flag_file: str) -> set[str]:
    from msb.analysis.stats.populations import parse_population  # reads audit tables; no training code

    return set(parse_population(f"flag:{flag_file}").values)


def _draw(rng: np.random.Generator, candidates: Sequence[str], k: int) -> list[str]:
    cand = sorted(candidates)
    idx = rng.choice(len(cand), size=k, replace=False)
    return sorted(cand[i] for i in idx)


def build_pool(pool: PoolConfig, train_ids: Sequence[str], source: dict[str, str], group: dict[str, str],
               presence: Callable[[], dict[str, str]], where: str = "data.pool") -> list[str]:
    """The sorted sample ids of ``pool`` (a subset of ``train_ids``).

    Args:
        pool: the pool definition (``match`` nested).
        train_ids: the run's training-split ids.
        source, group: ``sample_id`` -> ``source`` / ``group`` column of ``index.csv``.
        presence: returns ``sample_id`` -> present foreground class ids (:func:`mask_presence`), called only
            for ``count_match`` with ``presence``/``empty`` strata.
        where: named in errors (the run's config file).

    Raises:
        MSBError: an empty pool; ``remove`` sources/groups that occur in no training row; a match pool larger
            than the candidates; a stratum with fewer candidates than ``match`` has; ``swap`` without enough
            ``to_source`` rows outside ``match``; ``remove_neighbours`` without any exposed evaluation frame
            (or an unreadable pairs file); ``remove_distant`` whose ``match`` is not ``remove_neighbours`` or
            without enough distant rows in a stratum (each names the pool and the numbers).
    """
    train = sorted(str(i) for i in train_ids)
    rng = np.random.default_rng(pool.seed)
    name = f"{where}: pool {pool.name!r} ({pool.kind})"
    if pool.kind == "full":
        out = train
    elif pool.kind == "remove":
        known_src = {source[i] for i in train}
        known_grp = {group[i] for i in train}
        bad = [s for s in pool.sources if s not in known_src] + [g for g in pool.groups if g not in known_grp]
        if bad:
            raise MSBError(f"{name}: {bad} occur in no training row; sources: {sorted(known_src)}")
        drop = _flagged(pool.flag_file) if pool.flag_file else set()
        out = [i for i in train if source[i] not in pool.sources and group[i] not in pool.groups and i not in drop]
    elif pool.kind == "remove_neighbours":
        neighbours = training_neighbours(read_pairs(pool.pairs_file), train)
        if not neighbours:
            raise MSBError(f"{name}: no evaluation frame has a close training match in {pool.pairs_file} under "
                           f"this split; there are no neighbours to remove")
        drop = set().union(*neighbours.values())
        out = [i for i in train if i not in drop]
    elif pool.kind == "remove_distant":
        out = _remove_distant(pool, train, source, group, presence, where, rng, name)
    else:
        assert pool.match is not None or pool.kind == "swap"
        base = build_pool(pool.match, train, source, group, presence, where) if pool.match else train
        if pool.kind == "random_match":
            if len(base) > len(train):
                raise MSBError(f"{name}: match pool has {len(base)} rows, the training split only {len(train)}")
            out = _draw(rng, train, len(base))
        elif pool.kind == "count_match":
            labels = strata_labels(train, pool.strata, source, presence)
            want = pd.Series([labels[i] for i in base]).value_counts().sort_index()
            out = []
            for stratum, k in want.items():
                cand = [i for i in train if labels[i] == stratum]
                if len(cand) < k:
                    raise MSBError(f"{name}: stratum {stratum!r} has {len(cand)} training rows, the match pool "
                                   f"{k}; choose coarser strata")
                out += _draw(rng, cand, int(k))
            out = sorted(out)
        else:  # swap
            gone = [i for i in base if source[i] == pool.from_source]
            if not gone:
                raise MSBError(f"{name}: the base pool holds no row of source {pool.from_source!r}")
            held = set(base)
            cand = [i for i in train if source[i] == pool.to_source and i not in held]
            if len(cand) < len(gone):
                raise MSBError(f"{name}: {len(gone)} rows of {pool.from_source!r} to replace but only {len(cand)} "
                               f"training rows of {pool.to_source!r} outside the base pool; give a smaller "
                               f"'match' pool (e.g. a random_match) as the base")
            out = sorted([i for i in base if source[i] != pool.from_source] + _draw(rng, cand, len(gone)))
    if not out:
        raise MSBError(f"{name} is empty; it removes every training row")
    return out


def _remove_distant(pool: PoolConfig, train: list[str], source: dict[str, str], group: dict[str, str],
                    presence: Callable[[], dict[str, str]], where: str, rng: np.random.Generator, name: str
                    ) -> list[str]:
    """``remove_distant``: drop as many distant training rows as the ``remove_neighbours`` pool ``match`` drops,
    stratum by stratum (``pool.strata``; one stratum without), drawn with ``rng`` from the sorted candidates."""
    if pool.match is None or pool.match.kind != "remove_neighbours":
        raise MSBError(f"{name}: 'match' must be a remove_neighbours pool (the local removal it controls for)")
    kept = set(build_pool(pool.match, train, source, group, presence, where))
    removed = [i for i in train if i not in kept]
    distant = [i for i in train if i in kept]  # in no pair with an evaluation frame
    labels = strata_labels(train, pool.strata, source, presence) if pool.strata else {i: "all" for i in train}
    want = pd.Series([labels[i] for i in removed]).value_counts().sort_index()
    drop: list[str] = []
    for stratum, k in want.items():
        cand = [i for i in distant if labels[i] == stratum]
        if len(cand) < k:
            raise MSBError(f"{name}: stratum {stratum!r} has {len(cand)} distant training rows, the local removal "
                           f"drops {k}; choose coarser strata (or none)")
        drop += _draw(rng, cand, int(k))
    gone = set(drop)
    return [i for i in train if i not in gone]


def pool_file_text(ids: Sequence[str], source: dict[str, str], stratum: dict[str, str]) -> str:
    """CSV text of ``pool.csv`` (header ``sample_id,source,stratum``, rows sorted by ``sample_id``)."""
    df = pd.DataFrame({"sample_id": sorted(ids)})
    df["source"] = [source[i] for i in df["sample_id"]]
    df["stratum"] = [stratum[i] for i in df["sample_id"]]
    return df.to_csv(index=False, lineterminator="\n")


def read_pool_file(path: str | os.PathLike, train_ids: Sequence[str]) -> list[str]:
    """The sample ids of a ``pool.csv``.

    Raises:
        MSBError: wrong header, or an id that is not in the training split (the file belongs to another split;
            delete the run folder).
    """
    path = Path(path)
    df = read_user_csv(path, "pool file")
    if list(df.columns) != list(POOL_COLUMNS):
        raise MSBError(f"{path}: header must be {','.join(POOL_COLUMNS)}, got {','.join(df.columns)}")
    known = set(map(str, train_ids))
    bad = [i for i in df["sample_id"].astype(str) if i not in known]
    if bad:
        raise MSBError(f"{path}: {len(bad)} id(s) (first {bad[0]!r}) are not in the run's training split; the file "
                       f"belongs to another split: delete the run folder and rerun")
    return sorted(df["sample_id"].astype(str))


def _inputs(ds: PreparedDataset, train_ids: Sequence[str]
            ) -> tuple[dict[str, str], dict[str, str], Callable[[], dict[str, str]]]:
    """``source`` and ``group`` maps of the index (an empty group = the sample alone) and a presence function
    that reads the training masks once, on first call."""
    idx = ds.index
    source = dict(zip(idx["sample_id"].astype(str), idx["source"].astype(str)))
    group = {sid: (g or f"__{sid}") for sid, g in zip(idx["sample_id"].astype(str), idx["group"].astype(str))}
    cache: dict[str, dict[str, str]] = {}

    def presence() -> dict[str, str]:
        if "p" not in cache:
            cache["p"] = mask_presence(ds, sorted(map(str, train_ids)))
        return cache["p"]

    return source, group, presence


def ensure_pool(pool: PoolConfig, ds: PreparedDataset, run_dir: Path, train_ids: Sequence[str]) -> list[str]:
    """The run's training ids under ``pool``: read from ``run_dir/pool.csv`` when present (resume), else built
    (:func:`build_pool`) and written atomically. ``stratum`` column: the ``count_match`` strata of the pool, else
    ``source=<source>``.

    Raises:
        MSBError: see :func:`build_pool` and :func:`read_pool_file`.
    """
    path = Path(run_dir) / POOL_FILE
    if path.is_file():
        return read_pool_file(path, train_ids)
    source, group, presence = _inputs(ds, train_ids)
    ids = build_pool(pool, train_ids, source, group, presence, str(Path(run_dir) / "config.yaml"))
    stratum = strata_labels(ids, pool.strata or ["source"], source, presence)
    atomic_write_text(path, pool_file_text(ids, source, stratum))
    return ids


def check_pool(pool: PoolConfig, ds: PreparedDataset, train_ids: Sequence[str], where: str) -> int:
    """Build ``pool`` without writing anything (a study checks every pool before the first run trains).

    Returns:
        The pool's number of rows.

    Raises:
        MSBError: see :func:`build_pool` (naming ``where``).
    """
    source, group, presence = _inputs(ds, train_ids)
    return len(build_pool(pool, train_ids, source, group, presence, where))
