"""``msb run``: the one study pipeline. plan -> search -> cross-validation -> final evaluation (external sets,
fold ensemble) -> manifests, for every dataset x architecture *unit* of a study file.

==============  =========================  =====================================================================
phase           module                     what it does
==============  =========================  =====================================================================
plan            :mod:`msb.study.units`      units, run configs, settings check (``spec.json``), locks
search          :mod:`msb.study.search`     grid / Hyperband trials -> ``selected.json`` (skipped: no search)
cross-val.      :mod:`msb.study.crossval`   ``folds.csv`` -> fold run folders, trained and evaluated (skipped: no
                                            ``cross_validation``)
final           :mod:`msb.study.final`      the final run (no folds) or fold re-evaluation + ensemble; manifests
==============  =========================  =====================================================================

A plain study (no ``search``, no ``cross_validation``) is the degenerate case: its final run is the run config's
own run, trained and evaluated, and no optuna storage is opened. Every step is resumable: work items are optuna
trials (:mod:`msb.study.coord`) in an RDB storage (SQLite ``runs/<study>/_study/optuna.db`` by default,
``--storage URL`` to share a study between ``msb run --worker`` processes), run folders resume from their last
finished epoch, evaluations and ensembles are skipped when their ``DONE`` marker matches, every file is written
atomically. Run folders are trained and evaluated by :mod:`msb.engine.runner`, which knows nothing of studies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from msb.config.generate import find_configs_root
from msb.data.prepare import ensure_dataset
from msb.data.schema import PreparedDataset
from msb.engine import distributed
from msb.engine.acceleration import OutOfDeviceMemory
from msb.engine.runner import RunOutcome
from msb.errors import MSBError
from msb.notify.study import notify_on_completion
from msb.study.crossval import cross_validate, ensure_folds
from msb.study.external import resolve_external
from msb.study.final import final_single, finalize_folds, write_study_manifest
from msb.study.manifest import read_json
from msb.study.search import run_search
from msb.study.storage import close_storage, default_storage_url, open_storage
from msb.study.units import (StudyContext, StudyUnit, check_spec, prepare_lock, study_lock, study_units,
                             write_state)
from msb.utils.atomic import atomic_write_text
from msb.utils.locks import file_lock
from msb.utils.progress import Logger, Tracker, no_log, no_track

__all__ = ["run_study", "write_exclusions", "EXCLUSION_COLUMNS"]


def _resolve_externals(u: StudyUnit, ds: PreparedDataset, log: Logger) -> None:
    u.externals = []
    for e in (u.spec.final.external if u.spec.final else []):
        unknown = sorted(set(e.for_datasets or ()) - set(u.spec.datasets))
        if unknown:
            raise MSBError(f"{u.study_file}: final.external {e.name or e.dataset!r}: for_datasets {unknown} are not "
                           f"datasets of the study ({', '.join(u.spec.datasets)})")
        if e.for_datasets is not None and u.base.dataset not in e.for_datasets:
            continue  # this external set belongs to other datasets' units
        with file_lock(u.root / "_study" / "locks" / "external.lock"):  # prepared on first use
            u.externals.append(resolve_external(e, ds.classes, u.configs_root, u.study_file.parent,
                                                str(u.study_file), log))


def _open_storage(ctx: StudyContext, units: list[StudyUnit]) -> None:
    if ctx.storage is None:
        ctx.url = ctx.url or default_storage_url(units[0].root)
        ctx.storage = open_storage(ctx.url, ctx.heartbeat_interval, ctx.grace_period)


@notify_on_completion  # finished/failed notification (msb/notify, docs/notifications.md); never fails the study
def run_study(study_path: str | Path, track: Tracker = no_track, log: Logger = no_log,
              run_root: str | None = None, worker: bool = False, storage: str | None = None,
              heartbeat_interval: int = 30, grace_period: int = 120, poll_s: float = 2.0,
              wait: bool = False) -> list[RunOutcome]:
    """Run (or resume, or join as a worker) every unit of a study file (module docstring).

    Args:
        study_path: the study YAML.
        track, log: progress wrapper and line logger (the CLI passes rich ones).
        run_root: overrides ``run_root`` of every run config.
        worker: cooperate with other processes on the same storage (``msb run --worker``): never re-attach a
            trial another process may own; wait for items others are running.
        storage: optuna RDB URL (default: SQLite ``<run_root>/<study>/_study/optuna.db``); giving one (or
            ``worker``) opens it even for a plain study.
        heartbeat_interval, grace_period: seconds between heartbeats / before a silent trial is stale.
        poll_s: seconds between checks while waiting for other processes.
        wait: a plain run queues behind another plain run of the same study instead of refusing
            (:func:`msb.study.units.study_lock`).

    Returns:
        One :class:`RunOutcome` per evaluated run (fold runs and the ensemble, or the single final run). A unit
        whose training runs out of GPU memory (:class:`~msb.engine.acceleration.OutOfDeviceMemory`) is excluded:
        its one-line reason goes to the log and to ``_study/<unit>/excluded.json``, the other units go on (under
        DDP the job stops instead: the other ranks died inside the failed step). An architecture whose size
        divisor does not divide an input size of the ``data.input_size`` axis gets no unit (known at
        generation). Both kinds are listed in ``_study/exclusions.csv`` (:func:`write_exclusions`), which the
        resolution analysis reads.

    Raises:
        MSBError: config errors, a changed study spec, failed work items, unreachable storage, data errors,
            another plain run of the study holding its lock (without ``wait``); every unit excluded.
    """
    excluded: list[dict[str, Any]] = []
    units = study_units(study_path, run_root, excluded)
    if not units and excluded:  # e.g. unavailable_architectures: exclude and none of them is installed
        raise MSBError(f"{study_path}: every unit is excluded, nothing to run ({len(excluded)} exclusions, e.g. "
                       f"{excluded[0]['unit']}: {excluded[0]['reason']}); `msb generate` lists them all")
    if not units:
        return []
    for e in excluded:
        log(f"[{e['unit']}] excluded: {e['reason']}")
    args = (track, log, worker, storage, heartbeat_interval, grace_period, poll_s, excluded)
    if worker:
        return _run_units(study_path, units, *args)
    with study_lock(units[0].root, wait, log):
        return _run_units(study_path, units, *args)


EXCLUSION_COLUMNS = ("unit", "dataset", "architecture", "input_size", "reason")


def write_exclusions(root: Path, units: list[StudyUnit], at_generation: list[dict[str, Any]]) -> Path:
    """Write ``<root>/_study/exclusions.csv`` (columns :data:`EXCLUSION_COLUMNS`; ``input_size`` in px, the
    height): the units left out at generation (input size not divisible) and those whose
    ``_study/<unit>/excluded.json`` says they ran out of device memory in training. Rewritten (atomically) at the
    end of every ``msb run``; header only when nothing is excluded. Returns the path."""
    import pandas as pd

    rows = [dict(e) for e in at_generation]
    for u in units:
        data = read_json(u.state_dir / "excluded.json")
        if data:
            rows.append({"unit": u.name, "dataset": u.base.dataset, "architecture": u.base.architecture,
                         "input_size": int(u.cfg.data.input_size[0]), "reason": str(data.get("reason", ""))})
    path = root / "_study" / "exclusions.csv"
    atomic_write_text(path, pd.DataFrame(rows, columns=list(EXCLUSION_COLUMNS)).to_csv(index=False,
                                                                                       lineterminator="\n"))
    return path


def _run_units(study_path: str | Path, units: list[StudyUnit], track: Tracker, log: Logger, worker: bool,
               storage: str | None, heartbeat_interval: int, grace_period: int, poll_s: float,
               excluded: list[dict[str, Any]]) -> list[RunOutcome]:
    root, rule = find_configs_root(study_path, units[0].spec.configs_root)
    log(f"configs root: {root} ({rule})")
    ctx = StudyContext(storage, not worker, heartbeat_interval, grace_period, poll_s, track, log)
    if worker or storage is not None:
        _open_storage(ctx, units)  # a bad URL fails before anything is written
    outcomes: list[RunOutcome] = []
    try:
        checked: dict[str, PreparedDataset] = {}
        for u in [u for u in units if u.cfg.data.pool is not None]:  # every pool is drawn before anything trains
            u.state_dir.mkdir(parents=True, exist_ok=True)
            if u.cfg.data.root not in checked:
                with prepare_lock(u):
                    checked[u.cfg.data.root] = ensure_dataset(u.cfg, log)
            _check_pool(u, checked[u.cfg.data.root])
        for u in units:
            u.state_dir.mkdir(parents=True, exist_ok=True)
            with prepare_lock(u):
                ds = ensure_dataset(u.cfg, log)
            # checks that need the data come before anything is recorded or trained: external sets and their
            # class maps, and whether the k folds can be drawn (k <= number of groups)
            _resolve_externals(u, ds, log)
            if u.spec.cross_validation is not None:
                ensure_folds(u, ds, log)
            if u.has_work_items:
                check_spec(u)
                _open_storage(ctx, units)
            try:
                outcomes += _train_unit(u, ds, ctx)
                (u.state_dir / "excluded.json").unlink(missing_ok=True)  # a rerun that fits is no longer excluded
            except OutOfDeviceMemory as exc:
                if distributed.current() is not None:
                    raise  # the other ranks stopped inside the failed step: the job ends (torchrun stops them)
                log(f"[{u.name}] excluded: {exc}")
                atomic_write_text(u.state_dir / "excluded.json", json.dumps(
                    {"reason": str(exc), "excluded": [{"architecture": u.base.architecture,
                                                       "input_size": int(u.cfg.data.input_size[0]),
                                                       "reason": str(exc)}]}, indent=2))
        write_exclusions(units[0].root, units, excluded)
        if not outcomes:
            raise MSBError(f"{units[0].root}: every run was excluded (see _study/<unit>/excluded.json); nothing to "
                           f"score; lower train.batch_size or data.input_size and rerun")
        write_study_manifest(units, ctx.url)
    finally:
        if ctx.storage is not None:
            try:
                close_storage(ctx.storage)
            except Exception as exc:  # noqa: BLE001 - never hide the study's own error behind a closing one
                log(f"closing the optuna storage failed ({type(exc).__name__}: {exc})")
    return outcomes


def _check_pool(u: StudyUnit, ds: PreparedDataset) -> None:
    """Draw the unit's training pool on the run config's split without writing anything (msb.data.pools)."""
    from msb.data.pools import check_pool
    from msb.data.splits import resolve_splits

    s = u.cfg.data.split
    splits = resolve_splits(ds.index, s.mode, s.val_fraction, s.test_fraction, s.seed, s.group_column)
    train = sorted(str(k) for k, v in splits.items() if v == "train")
    lim = u.cfg.data.max_samples_per_split
    check_pool(u.cfg.data.pool, ds, train[:lim] if lim else train, f"{u.study_file} (unit {u.name})")


def _train_unit(u: StudyUnit, ds: Any, ctx: StudyContext) -> list[RunOutcome]:
    """Search, cross-validate (if configured) and finalise one unit; its outcomes."""
    write_state(u, phase="search")
    sel = run_search(u, ds, ctx)
    if u.spec.cross_validation is None:
        write_state(u, phase="final")
        return [final_single(u, sel, ds, ctx)]
    write_state(u, phase="cv")
    _, folds_sha = cross_validate(u, sel, ds, ctx)
    write_state(u, phase="final")
    return finalize_folds(u, sel, ds, ctx, folds_sha)
