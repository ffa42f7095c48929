"""Phase 2 of a study, group-aware K-fold cross-validation of the selected configuration.

``_study/<unit>/folds.csv`` is drawn once per fold key (:func:`ensure_folds`: one ``_study/folds/<key>.csv`` shared
by the units that differ only in input size, architecture or seed; :mod:`msb.study.folds`; the run config's split
is kept in ``_study/<unit>/split.csv``). Fold ``j`` (0-based, as in ``folds.csv`` and the counts' ``fold`` column) is the
run folder ``<selected run id>-fold<j>``: the selected config, ``split.csv`` from the folds and ``fold.json``;
it is trained, evaluated on ``final.test_split`` and on every external set (:mod:`msb.study.evaluate`). Each fold
is an optuna work item of the study ``<study>/<unit>/cv/...``.

With ``cross_validation.inner_val`` each fold run selects its checkpoint on an inner split of its own training
rows (``inner_val`` in its ``split.csv``, drawn once into ``_study/<unit>/inner_val.csv``,
:func:`msb.study.folds.assign_inner_val`) instead of on the held-out fold: its config is the selected one with
``checkpoint.selection_split: inner_val`` (so its ``config.sha256`` differs from the selected run's; the folder
name ``<selected run id>-fold<j>`` does not).

Reads: the prepared dataset, ``folds.csv``. Writes: ``_study/folds/<key>.csv``, ``folds.csv``, ``split.csv``, the fold
run folders.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import TrialState

from msb.config.generate import GeneratedRun, config_hash, write_run_config
from msb.data.schema import PreparedDataset
from msb.data.splits import resolve_splits, split_file_text, write_split_file
from msb.engine.runner import train_run, write_manifest
from msb.errors import MSBError
from msb.study import coord
from msb.study.evaluate import evaluate_final, run_manifest_extra
from msb.study.folds import (INNER_SPLIT, assign_folds, assign_inner_val, empty_mask_strata, fold_split,
                             read_folds, read_inner_val, write_folds, write_inner_val)
from msb.study.manifest import read_json, write_json
from msb.study.search import Selected
from msb.study.units import StudyContext, StudyUnit, unit_lock, write_state
from msb.utils.device import select_device
from msb.utils.atomic import atomic_write_text
from msb.utils.hashing import sha256_file, sha256_json
from msb.utils.locks import file_lock
from msb.utils.progress import Logger

__all__ = ["folds_key", "ensure_folds", "ensure_inner_val", "fold_run", "cross_validate"]


def folds_key(u: StudyUnit, ds: PreparedDataset) -> str:
    """Name of the study-wide fold file shared by every unit that would draw the same folds:
    ``<dataset>-k<k>-seed<seed>-<group column|nogroup>-<8 hex>``, the hex being the SHA-256 of everything the
    draw depends on (prepared dataset folder, its ``data.split`` settings, ``k``, fold seed, group column,
    ``stratify``, ``include_test``). Input size, architecture, training seed and every other run-config key are
    not part of it, so units that differ only in them (the study axis ``data.input_size``) share one fold file."""
    cv = u.spec.cross_validation
    assert cv is not None
    s = u.cfg.data.split
    seed = cv.seed if cv.seed is not None else s.seed
    what = {"data_root": str(Path(ds.root).resolve()), "split": s.model_dump(mode="json"), "k": cv.k, "seed": seed,
            "group_column": cv.group_column, "stratify": cv.stratify, "include_test": cv.include_test}
    return f"{u.base.dataset}-k{cv.k}-seed{seed}-{cv.group_column or 'nogroup'}-{sha256_json(what)[:8]}"


def _draw_folds(u: StudyUnit, ds: PreparedDataset, folds_path: Path, split_path: Path, log: Logger) -> None:
    cv = u.spec.cross_validation
    assert cv is not None
    ids = [str(s) for s in ds.index["sample_id"]]
    s = u.cfg.data.split
    split = resolve_splits(ds.index, s.mode, s.val_fraction, s.test_fraction, s.seed, s.group_column,
                           ds.root / "index.csv")
    write_split_file(split_path, split)
    pool = ids if cv.include_test else [i for i in ids if split[i] != "test"]
    strata = None
    if cv.stratify == "empty_mask":
        strata = empty_mask_strata(ds, pool)
    elif cv.stratify:
        if cv.stratify not in ds.index.columns:
            raise MSBError(f"{u.study_file}: cross_validation.stratify {cv.stratify!r} is neither "
                           f"'empty_mask' nor a column of {ds.root / 'index.csv'} "
                           f"(columns: {', '.join(map(str, ds.index.columns))})")
        strata = ds.index.set_index(ds.index["sample_id"].astype(str))[cv.stratify]
    seed = cv.seed if cv.seed is not None else s.seed
    folds = assign_folds(ds.index, pool, cv.k, cv.group_column, strata, seed, where=str(u.study_file))
    write_folds(folds_path, folds)
    sizes = folds[folds["fold"] >= 0]["fold"].value_counts().sort_index()
    log(f"[{u.name}] {cv.k} folds drawn (seed {seed}): sizes {', '.join(str(int(n)) for n in sizes)}; "
        f"{int((folds['fold'] < 0).sum())} held-out test sample(s) -> {folds_path}")


def ensure_folds(u: StudyUnit, ds: PreparedDataset, log: Logger) -> tuple[pd.DataFrame, str]:
    """Draw the fold assignment once or read it; return it and the SHA-256 of the unit's ``folds.csv``.

    The draw is stored once per study and fold key (:func:`folds_key`) as ``_study/folds/<key>.csv`` (with
    ``<key>.split.csv``, the split the pool came from), under a study-wide lock; each unit's
    ``_study/<unit>/folds.csv`` and ``split.csv`` are byte copies of it. So the units of one dataset that differ
    only in input size (or architecture, or training seed) are trained and tested on the same folds, and their
    ``split_policy`` (``kfold(k=K,folds=<sha8>)``) is the same string. A unit file that already exists (a
    study started before the shared file existed) is kept as it is.

    Raises:
        MSBError: unknown ``cross_validation.stratify`` column, more folds than groups, ids not in the dataset,
            a damaged fold file.
    """
    cv = u.spec.cross_validation
    assert cv is not None
    path = u.state_dir / "folds.csv"
    ids = [str(s) for s in ds.index["sample_id"]]
    with unit_lock(u, "folds"):
        if not path.is_file():
            key = folds_key(u, ds)
            shared = u.root / "_study" / "folds" / f"{key}.csv"
            shared_split = shared.with_name(f"{key}.split.csv")
            with file_lock(u.root / "_study" / "locks" / f"folds-{key}.lock"):
                if not shared.is_file() or not shared_split.is_file():
                    _draw_folds(u, ds, shared, shared_split, log)
                else:
                    log(f"[{u.name}] folds shared with the other units of {u.base.dataset}: {shared}")
            read_folds(shared, known_ids=ids)  # a damaged shared file is named before it is copied
            atomic_write_text(u.state_dir / "split.csv", shared_split.read_text())
            atomic_write_text(path, shared.read_text())
        folds = read_folds(path, known_ids=ids)
    return folds, sha256_file(path)


def ensure_inner_val(u: StudyUnit, folds: pd.DataFrame) -> pd.DataFrame | None:
    """The inner selection split of every fold (``cross_validation.inner_val``), drawn once into
    ``_study/<unit>/inner_val.csv`` (under the unit's ``folds`` lock) and read back on resume; None without
    ``inner_val``.

    Args:
        u: the unit; folds: its folds table (:func:`ensure_folds`).

    Returns:
        DataFrame ``fold,sample_id`` or None.

    Raises:
        MSBError: a fold with fewer than two training groups; a damaged ``inner_val.csv``.
    """
    cv = u.spec.cross_validation
    if cv is None or cv.inner_val is None:
        return None
    path = u.state_dir / "inner_val.csv"
    with unit_lock(u, "folds"):
        if not path.is_file():
            seed = cv.seed if cv.seed is not None else u.cfg.data.split.seed
            write_inner_val(path, assign_inner_val(folds, cv.inner_val, seed,
                                                   where=f"{u.study_file} (cross_validation.inner_val)"))
        return read_inner_val(path, folds)


def fold_run(sel: Selected, j: int, inner_val: bool = False) -> GeneratedRun:
    """Run ``<selected run id>-fold<j>`` with the selected config.

    Args:
        sel: the search outcome; j: fold number.
        inner_val: the study has ``cross_validation.inner_val``: the config gets
            ``checkpoint.selection_split: inner_val`` (and its own config hash).
    """
    r = sel.final_run
    if not inner_val:
        return GeneratedRun(f"{r.run_id}-fold{j}", r.config, r.config_hash, r.dataset, r.architecture)
    cfg = r.config.model_copy(update={"checkpoint": r.config.checkpoint.model_copy(
        update={"selection_split": INNER_SPLIT})})
    return GeneratedRun(f"{r.run_id}-fold{j}", cfg, config_hash(cfg), r.dataset, r.architecture)


def _prepare_fold_dir(u: StudyUnit, run: GeneratedRun, run_dir: Path, folds: pd.DataFrame, j: int,
                      folds_sha: str, inner: pd.DataFrame | None = None) -> None:
    write_run_config(run, run_dir)
    split = fold_split(folds, j, inner)
    path = run_dir / "split.csv"
    if path.is_file():
        if path.read_text() != split_file_text(split):
            raise MSBError(f"{path}: differs from fold {j} of {u.state_dir / 'folds.csv'}; the folder belongs to "
                           f"another fold assignment; use another run_root or delete it")
    else:
        write_split_file(path, split)
    info = {"fold": j, "k": int(folds["fold"].max()) + 1, "folds_sha256": folds_sha, "study": u.spec.study,
            "unit": u.name}
    if read_json(run_dir / "fold.json") != info:
        write_json(run_dir / "fold.json", info)


def cross_validate(u: StudyUnit, sel: Selected, ds: PreparedDataset, ctx: StudyContext) -> tuple[Any, str]:
    """Train and evaluate every fold of unit ``u`` (or join other workers doing so); return the folds table
    and its SHA-256.

    Raises:
        MSBError: failed folds (after the retries), data errors.
    """
    cv = u.spec.cross_validation
    assert cv is not None
    folds, folds_sha = ensure_folds(u, ds, ctx.log)
    inner = ensure_inner_val(u, folds)
    device = str(select_device(u.cfg.train.device))
    metric = u.cfg.checkpoint.metric
    name = coord.phase_study_name(u.spec.study, u.name, "cv", u.spec_hash, u.instance)
    study = coord.get_or_create_study(ctx.storage, name, "minimize" if metric == "loss" else "maximize",
                                      [{"fold": j} for j in range(cv.k)])

    def work(trial: optuna.trial.Trial) -> None:
        j = int(trial.user_attrs["fold"])
        run = fold_run(sel, j, inner is not None)
        run_dir = u.root / run.run_id
        trial.set_user_attr("run_id", run.run_id)
        ctx.log(f"[{u.name}] fold {j + 1}/{cv.k} (trial {trial.number}) -> {run.run_id}")
        with unit_lock(u, run.run_id):
            _prepare_fold_dir(u, run, run_dir, folds, j, folds_sha, inner)
            res = train_run(run, run_dir, ds, ctx.track, ctx.log)
            evaluate_final(u, run_dir, ds, ctx)
            write_manifest(run_dir, run, device, run_manifest_extra(u, j, folds_sha))
        if math.isfinite(res.best_value):
            study.tell(trial, float(res.best_value))
        else:
            trial.set_user_attr("note", f"no finite validation {metric}")
            study.tell(trial, state=TrialState.PRUNED)

    coord.work_loop(study, ctx.storage, cv.k, f"[{u.name}] cv", work,
                    claim_lock=u.state_dir / "locks" / "claim-cv.lock", exclusive=ctx.exclusive,
                    heartbeat_interval=ctx.heartbeat_interval, poll_s=ctx.poll_s,
                    on_status=lambda st: write_state(u, cv=st.as_dict()), log=ctx.log)
    return folds, folds_sha
