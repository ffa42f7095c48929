"""Labelled fractions: which training images keep their masks (semi-supervised protocols).

Semi-supervised papers train on 10 % or 30 % of the training images with masks and the rest as images only,
and rarely publish which images were labelled. Here the labelled subset is a declared, recorded split policy
of the training split (``data.labelled_fraction`` or ``data.labelled_ids``), drawn once per seed and written to
``labelled.csv`` in the run folder (its SHA-256 goes to ``manifest.json`` as ``labelled_sha256``).

Draw algorithm (:func:`draw_labelled`)
--------------------------------------
1. Units: as in :mod:`msb.data.splits`, all training samples sharing a non-empty group value form one unit
   (all frames of a video, near-duplicates); a sample with an empty group value is a unit of its own. Units
   are never split, so all members of a group are on the same side.
2. Strata: a unit is ``non_empty`` when any member's mask has foreground, else ``empty``. Each stratum is
   drawn separately, so the labelled subset keeps the share of empty-mask images of the training split (as
   far as whole units allow).
3. Within a stratum (``empty`` first, then ``non_empty``) the units are sorted by key (row order does not
   matter) and shuffled with ``numpy.random.default_rng(seed)`` (one generator, used for both strata in that
   order); the leading units whose cumulative sample count is closest to ``round(fraction * n_stratum)`` are
   labelled (ties -> fewer). A stratum may contribute 0 units when its target rounds to 0; at least one sample
   must be labelled overall.

The seed is ``data.labelled_seed``, by default the run's ``random_seed``, so each seed of a study draws its own
subset and the same seed always draws the same one.

File ``labelled.csv``: ``sample_id,labelled`` with ``1``/``0``, one row per training sample (sorted by
``sample_id``), ``\\n`` line ends, written atomically. The same file format is accepted as
``data.labelled_ids`` (rows with ``labelled`` = 1), as is a CSV with a single ``sample_id`` column.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from msb.config.schema import RunConfig
from msb.data.cache import CachedArrays
from msb.data.schema import PreparedDataset
from msb.data.splits import _closest_cut, _listed
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_bytes
from msb.utils.csvio import read_user_csv

__all__ = ["LABELLED_FILE", "STRATA", "draw_labelled", "ensure_labelled", "explicit_labelled", "labelled_file_text",
           "labelled_train_ids",
           "read_labelled_file", "read_labelled_ids", "write_labelled_file"]

LABELLED_FILE = "labelled.csv"
STRATA: tuple[str, ...] = ("empty", "non_empty")


def _unit_keys(ids: np.ndarray, groups: Sequence[str] | None) -> np.ndarray:
    if groups is None:
        return np.char.add("s:", ids.astype(str))
    g = np.asarray([("" if v is None else str(v)).strip() for v in groups], dtype=object).astype(str)
    return np.where(g != "", np.char.add("g:", g), np.char.add("s:", ids.astype(str)))


def _check_inputs(train_ids: Sequence[str], groups: Sequence[str] | None, n_other: int, what: str) -> np.ndarray:
    ids = np.asarray([str(s) for s in train_ids], dtype=object).astype(str)
    if len(ids) == 0:
        raise MSBError("labelled subset: the training split is empty; nothing to label")
    if pd.Series(ids).duplicated().any():
        raise MSBError("labelled subset: duplicate sample ids in the training split")
    if groups is not None and len(groups) != len(ids):
        raise ValueError(f"groups has {len(groups)} entries for {len(ids)} training ids")
    if n_other != len(ids):
        raise ValueError(f"{what} has {n_other} entries for {len(ids)} training ids")
    return ids


def draw_labelled(train_ids: Sequence[str], non_empty: Sequence[bool], fraction: float, seed: int,
                  groups: Sequence[str] | None = None) -> pd.Series:
    """Draw the labelled subset of the training split (module docstring: group-aware, stratified).

    Args:
        train_ids: the training split's sample ids (any order; unique).
        non_empty: per id, whether its mask has any foreground pixel (at the training resolution).
        fraction: share of training samples to label, in (0, 1].
        seed: the draw's seed (``numpy.random.default_rng``).
        groups: per id, its group value (``""`` = no group); ``None`` = every sample is its own unit.

    Returns:
        ``pd.Series`` of bool (``True`` = labelled) indexed by ``sample_id`` (sorted), named ``labelled``.

    Raises:
        MSBError: empty training split, duplicate ids, a fraction outside (0, 1], or a draw with no labelled
            sample (the message says to raise the fraction).
        ValueError: ``non_empty`` / ``groups`` of the wrong length.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0.0 < float(fraction) <= 1.0:
        raise MSBError(f"data.labelled_fraction must be a number in (0, 1], got {fraction!r}")
    ids = _check_inputs(train_ids, groups, len(non_empty), "non_empty")
    keys = _unit_keys(ids, groups)
    unit_keys, unit_of = np.unique(keys, return_inverse=True)
    sizes = np.bincount(unit_of, minlength=len(unit_keys))
    unit_non_empty = np.zeros(len(unit_keys), dtype=bool)
    np.logical_or.at(unit_non_empty, unit_of, np.asarray(non_empty, dtype=bool))
    rng = np.random.default_rng(seed)
    labelled_unit = np.zeros(len(unit_keys), dtype=bool)
    for stratum_non_empty in (False, True):  # STRATA order: empty, non_empty
        members = np.flatnonzero(unit_non_empty == stratum_non_empty)  # sorted by unit key
        if members.size == 0:
            continue
        order = members[rng.permutation(members.size)]
        cum = np.concatenate([[0], np.cumsum(sizes[order])]).astype(np.float64)
        k = _closest_cut(cum, 0, round(float(fraction) * cum[-1]), 0, members.size)
        labelled_unit[order[:k]] = True
    labelled = labelled_unit[unit_of]
    if not labelled.any():
        raise MSBError(f"data.labelled_fraction {fraction:g} labels no image of the {len(ids)} training images "
                       f"({len(unit_keys)} groups); raise the fraction")
    out = pd.Series(labelled, index=pd.Index(ids, name="sample_id"), name="labelled", dtype=bool)
    return out.sort_index()


def explicit_labelled(train_ids: Sequence[str], labelled_ids: Sequence[str], groups: Sequence[str] | None = None,
                      where: str = "data.labelled_ids") -> pd.Series:
    """The labelled subset given as a list of ids (the way papers should publish it).

    Args:
        train_ids: the training split's sample ids.
        labelled_ids: ids to label; each must be a training id.
        groups: per training id, its group value; a group with labelled and unlabelled members is refused.
        where: the config key or file named in errors.

    Returns:
        As :func:`draw_labelled`.

    Raises:
        MSBError: an id not in the training split, a duplicate id, an empty list, or a split group (naming
            the ids or groups and what to do).
    """
    ids = _check_inputs(train_ids, groups, len(train_ids), "train_ids")
    wanted = [str(s) for s in labelled_ids]
    if not wanted:
        raise MSBError(f"{where}: no labelled ids given; list at least one training sample id")
    dup = sorted({s for s in wanted if wanted.count(s) > 1})
    if dup:
        raise MSBError(f"{where}: duplicate labelled id(s) {_listed(dup)}; list each id once")
    known = set(ids.tolist())
    unknown = [s for s in wanted if s not in known]
    if unknown:
        raise MSBError(f"{where}: {len(unknown)} labelled id(s) are not in this run's training split: "
                       f"{_listed(unknown)}; list only training ids (see the run's split.csv)")
    labelled = np.isin(ids, np.asarray(wanted, dtype=object).astype(str))
    if groups is not None:
        g = np.asarray([str(v).strip() for v in groups])
        split_groups = sorted({gv for gv in g[g != ""] if len(set(labelled[g == gv])) > 1})
        if split_groups:
            raise MSBError(f"{where}: group(s) {_listed(split_groups)} have labelled and unlabelled members; label "
                           "all frames of a group or none (or set data.split.group_column: null)")
    return pd.Series(labelled, index=pd.Index(ids, name="sample_id"), name="labelled", dtype=bool).sort_index()


def read_labelled_ids(path: str | os.PathLike) -> list[str]:
    """Labelled ids from a file: ``labelled.csv`` of another run (rows with ``labelled`` = 1) or a CSV with one
    ``sample_id`` column (every row labelled).

    Raises:
        MSBError: missing/unparsable file, another header, or a ``labelled`` value other than 0/1 (naming
            the 1-based line).
    """
    df = read_user_csv(path, "labelled-ids file", "give a CSV with a sample_id column (or a run's labelled.csv)")
    cols = list(df.columns)
    if cols == ["sample_id"]:
        return df["sample_id"].tolist()
    if cols != ["sample_id", "labelled"]:
        raise MSBError(f"labelled-ids file {path}: header must be 'sample_id' or 'sample_id,labelled', "
                       f"got {','.join(cols)!r}")
    bad = [f"line {i + 2}: {v!r}" for i, v in enumerate(df["labelled"]) if v not in ("0", "1")]
    if bad:
        raise MSBError(f"labelled-ids file {path}: labelled must be 0 or 1 ({_listed(bad)})")
    return df.loc[df["labelled"] == "1", "sample_id"].tolist()


def labelled_file_text(labelled: pd.Series) -> str:
    """CSV text ``sample_id,labelled`` (1/0) in the series' order, ``\\n`` line ends."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["sample_id", "labelled"])
    for sid, v in zip(labelled.index, labelled.to_numpy()):
        w.writerow([str(sid), "1" if bool(v) else "0"])
    return buf.getvalue()


def write_labelled_file(path: str | os.PathLike, labelled: pd.Series) -> str:
    """Write ``labelled.csv`` atomically (temporary file, then rename); returns the SHA-256 of its bytes."""
    data = labelled_file_text(labelled).encode("utf-8")
    atomic_write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def read_labelled_file(path: str | os.PathLike, train_ids: Sequence[str]) -> pd.Series:
    """Read a run's ``labelled.csv`` back and check it covers exactly the training split.

    Raises:
        MSBError: bad header or value, or ids that differ from ``train_ids`` (the run's split changed:
            delete the run folder or restore its files).
    """
    df = read_user_csv(path, "labelled file")
    if list(df.columns) != ["sample_id", "labelled"]:
        raise MSBError(f"labelled file {path}: header must be 'sample_id,labelled', got {','.join(df.columns)!r}")
    bad = [f"line {i + 2}: {v!r}" for i, v in enumerate(df["labelled"]) if v not in ("0", "1")]
    if bad:
        raise MSBError(f"labelled file {path}: labelled must be 0 or 1 ({_listed(bad)})")
    if set(df["sample_id"]) != {str(s) for s in train_ids} or df["sample_id"].duplicated().any():
        raise MSBError(f"labelled file {path} does not list exactly this run's training ids; the run folder is "
                       "inconsistent: delete it (or restore split.csv and labelled.csv) and run again")
    return pd.Series(df["labelled"].to_numpy() == "1", index=pd.Index(df["sample_id"].to_numpy(), name="sample_id"),
                     name="labelled", dtype=bool)


def ensure_labelled(run_dir: str | os.PathLike, train_ids: Sequence[str], non_empty: Sequence[bool], seed: int,
                    fraction: float | None = None, labelled_ids: Sequence[str] | str | None = None,
                    groups: Sequence[str] | None = None) -> pd.Series:
    """The run's labelled subset: read ``run_dir/labelled.csv`` when present (resume), else draw or take it and
    write the file.

    Args:
        run_dir: the run folder.
        train_ids, non_empty, groups: as in :func:`draw_labelled`.
        seed: the draw's seed.
        fraction: ``data.labelled_fraction`` (exclusive with ``labelled_ids``).
        labelled_ids: ``data.labelled_ids``: a list of ids, or a path to a file (:func:`read_labelled_ids`).

    Returns:
        As :func:`draw_labelled`.

    Raises:
        MSBError: neither or both of ``fraction`` / ``labelled_ids``; see the functions above.
    """
    path = Path(run_dir) / LABELLED_FILE
    if path.is_file():
        return read_labelled_file(path, train_ids)
    if (fraction is None) == (labelled_ids is None):
        raise MSBError("give exactly one of data.labelled_fraction and data.labelled_ids")
    if fraction is not None:
        labelled = draw_labelled(train_ids, non_empty, fraction, seed, groups)
    elif isinstance(labelled_ids, str):
        labelled = explicit_labelled(train_ids, read_labelled_ids(labelled_ids), groups, where=labelled_ids)
    else:
        labelled = explicit_labelled(train_ids, list(labelled_ids or []), groups)
    write_labelled_file(path, labelled)
    return labelled


def labelled_train_ids(cfg: RunConfig, run_dir: str | os.PathLike, ds: PreparedDataset, cache: CachedArrays,
                       train_ids: Sequence[str]) -> list[str]:
    """The labelled training ids of a run with ``data.labelled_fraction`` / ``data.labelled_ids``.

    Strata come from the cached masks at the training resolution (``data.input_size``: what a loss would see),
    groups from ``data.split.group_column`` of ``index.csv``, the seed from ``data.labelled_seed`` or else
    ``random_seed``. ``labelled.csv`` is written on first use and reused on resume (:func:`ensure_labelled`).

    Args:
        cfg: the run config; run_dir: the run folder; ds: the prepared dataset; cache: its cache at
            ``data.input_size``; train_ids: the run's training ids.

    Returns:
        The labelled ids, in the order of ``train_ids``.

    Raises:
        MSBError: see :func:`ensure_labelled`.
    """
    row_of = cache.row_of
    non_empty = [bool(np.asarray(cache.masks[row_of[s]]).any()) for s in train_ids]
    gcol = cfg.data.split.group_column
    groups = ds.index.set_index("sample_id").loc[list(train_ids), gcol].tolist() \
        if gcol and gcol in ds.index.columns else None
    seed = cfg.data.labelled_seed if cfg.data.labelled_seed is not None else cfg.random_seed
    labelled = ensure_labelled(run_dir, train_ids, non_empty, seed, cfg.data.labelled_fraction,
                               cfg.data.labelled_ids, groups)
    return [s for s in train_ids if bool(labelled[s])]
