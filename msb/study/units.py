"""Planning a study: its units (one per dataset x architecture), their folders, settings check and locks.

A *unit* is one dataset x architecture of a study file, named ``<dataset>-<arch>``. Its study-level state lives
in ``<run_root>/<study>/_study/<unit>/`` (``spec.json``, ``state.json``, ``selected.json``, ``folds.csv``,
``split.csv``, ``manifest.json``, ``locks/``); its run folders sit beside ``_study`` as usual.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import filelock

from msb.config.generate import GeneratedRun, StudySpec, axes_slug, config_hash, generate_runs, load_study
from msb.config.schema import RunConfig
from msb.config.study_spec import apply_params, grid_points, param_distributions
from msb.engine.runner import checkpoint_roles
from msb.errors import MSBError
from msb.study.coord import owner_id
from msb.study.external import ExternalSet
from msb.study.manifest import read_json, write_json
from msb.utils.hashing import sha256_json
from msb.utils.locks import file_lock
from msb.utils.progress import Logger, Tracker, no_log, no_track

__all__ = ["StudyUnit", "StudyContext", "study_units", "check_spec", "check_selection_split", "unit_lock",
           "prepare_lock", "write_state", "study_lock"]


@dataclass
class StudyUnit:
    """One dataset x architecture of a study file, with its folders.

    Attributes:
        spec: the study file's spec; study_file: its path; configs_root: its configs root.
        base: the generated run (run config of this dataset x architecture, ``run_root`` applied).
        root: ``<run_root>/<study>``; name: ``<dataset>-<arch>``; state_dir: ``root/_study/<name>``.
        spec_hash: SHA-256 of the unit's search/cross-validation settings and base config hash.
        instance: random id of this study folder (``spec.json``), part of the optuna study names.
        externals: the resolved external test sets (``final.external``).
    """

    spec: StudySpec
    study_file: Path
    configs_root: Path
    base: GeneratedRun
    root: Path
    name: str
    state_dir: Path
    spec_hash: str = ""
    instance: str = ""
    externals: list[ExternalSet] = field(default_factory=list)

    @property
    def cfg(self) -> RunConfig:
        """The unit's run config (study overrides and ``run_root`` applied)."""
        return self.base.config

    @property
    def searched(self) -> bool:
        """Whether the unit has a search phase (``search.method`` other than ``none``)."""
        return self.spec.search is not None and self.spec.search.method != "none"

    @property
    def has_work_items(self) -> bool:
        """Whether any phase runs optuna work items (search or cross-validation); a plain study has none."""
        return self.searched or self.spec.cross_validation is not None

    def make_run(self, cfg: RunConfig, suffix: str = "") -> GeneratedRun:
        """A run of this unit with config ``cfg``: id ``<dataset>-<arch>-<hash8><suffix>``."""
        h = config_hash(cfg)
        return GeneratedRun(f"{self.base.dataset}-{self.base.architecture}-{h[:8]}{suffix}", cfg, h,
                            self.base.dataset, self.base.architecture)

    def roles(self) -> list[str]:
        """Checkpoint roles to evaluate (``evaluation.checkpoint``; ``both`` = best and latest)."""
        return checkpoint_roles(self.cfg)


@dataclass
class StudyContext:
    """What every phase of one ``msb run`` shares.

    Attributes:
        url: optuna storage URL (``None`` until a phase needs one); storage: the open ``RDBStorage`` or None.
        exclusive: plain ``msb run`` (True) or ``--worker`` (False).
        heartbeat_interval, grace_period: seconds; poll_s: seconds between looks while waiting for others.
        track, log: progress wrapper and line logger.
    """

    url: str | None
    exclusive: bool
    heartbeat_interval: int = 30
    grace_period: int = 120
    poll_s: float = 2.0
    track: Tracker = no_track
    log: Logger = no_log
    storage: Any = None


def study_units(study_path: str | Path, run_root: str | None = None,
                exclusions: list[dict[str, Any]] | None = None) -> list[StudyUnit]:
    """Units of a study file (see :class:`StudyUnit`); every search point is applied to the run config first,
    so that a bad key or value fails before anything is written or trained.

    ``exclusions``: when a list is given, units whose architecture cannot run an input size of the study axis
    (``size_divisor``) are left out and appended to it (:func:`msb.config.generate.generate_runs`).

    Raises:
        MSBError: config errors (file, key and what to do).
    """
    study_path = Path(study_path).resolve()
    spec, configs_root = load_study(study_path)
    units = []
    for run in generate_runs(study_path, exclusions):
        cfg = run.config if run_root is None else run.config.model_copy(update={"run_root": run_root})
        run = GeneratedRun(run.run_id, cfg, run.config_hash, run.dataset, run.architecture)
        root = Path(cfg.run_root) / cfg.study
        name = f"{run.dataset}-{run.architecture}" + (f"-{axes_slug(cfg.axes)}" if cfg.axes else "")
        u = StudyUnit(spec, study_path, configs_root, run, root, name, root / "_study" / name)  # type: ignore[arg-type]
        _validate_search(u)
        check_selection_split(u)
        u.spec_hash = sha256_json({
            "search": spec.search.model_dump(mode="json") if spec.search else None,
            "cross_validation": spec.cross_validation.model_dump(mode="json") if spec.cross_validation else None,
            "base_config_hash": run.config_hash})
        units.append(u)
    names = [u.name for u in units]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise MSBError(f"{study_path}: two study units share the name {dup[0]!r}; give each axis value once")
    return units


def _validate_search(u: StudyUnit) -> None:
    """Apply every grid point (or, for Hyperband, the bounds and every choice of each parameter) to the run
    config. Raises :class:`MSBError` on a bad key or value."""
    s = u.spec.search
    if s is None or s.method == "none":
        return
    extra = {"train": {"epochs": s.max_epochs}} if s.max_epochs else None
    if s.method == "grid":
        samples = grid_points(s.params)
    else:
        samples = []
        for name, d in param_distributions(s.params).items():
            values = d.choices if d.type == "categorical" else [d.low, d.high]
            for v in values or []:
                samples.append({name: int(v) if d.type == "int" else v})
    for p in samples:
        apply_params(u.cfg, p, str(u.study_file), extra)


def check_selection_split(u: StudyUnit) -> None:
    """Refuse a unit whose evaluated runs would select their ``best`` checkpoint on the split they are scored on
    (``evaluation.checkpoint`` ``best``/``both`` and ``evaluation.split`` equal to the selection split): e.g.
    ``final: {test_split: val, checkpoint: best}`` with cross-validation, where ``val`` is the held-out fold.
    Fold runs of a study with ``cross_validation.inner_val`` select on ``inner_val`` and pass.

    Search trials are not checked: they are never evaluated (no counts); their objective is the selection
    metric on the run config's ``val`` by design (hyperparameter selection). Without cross-validation the best
    trial's run is the final run and is checked here like any final run.

    Args:
        u: the unit (its run config carries ``final.*`` as ``evaluation.*``).

    Raises:
        MSBError: one line naming the study file, the scored-split key, ``checkpoint.selection_split`` and the
            fixes (``final.checkpoint: latest``; ``cross_validation.inner_val: FRACTION``).
    """
    cfg, final, cv = u.cfg, u.spec.final, u.spec.cross_validation
    if cfg.evaluation.checkpoint not in ("best", "both"):
        return
    if cv is not None and cv.inner_val is not None:
        return  # fold runs select on inner_val (msb.study.crossval.fold_run)
    if cv is not None and cv.include_test and cfg.evaluation.split == "test":
        return  # no internal evaluation (msb.study.evaluate.internal_eval_enabled)
    sel = cfg.checkpoint.selection_split
    if cfg.evaluation.split.strip().lower() != sel.strip().lower():
        return
    scored = "final.test_split" if final is not None and final.test_split is not None else "evaluation.split"
    which = "final.checkpoint" if final is not None and final.checkpoint is not None else "evaluation.checkpoint"
    fix = ("set cross_validation.inner_val: FRACTION (e.g. 0.2) to select on an inner split of each fold's "
           "training rows" if cv is not None else "score another split (final.test_split: test)")
    raise MSBError(f"{u.study_file}: {scored}: {cfg.evaluation.split} and checkpoint.selection_split: {sel} "
                   f"(unit {u.name}): with {which}: {cfg.evaluation.checkpoint} every run would be scored on the "
                   f"split its checkpoint was selected on (optimistic scores); set final.checkpoint: latest, or "
                   f"{fix}")


def check_spec(u: StudyUnit) -> None:
    """Create ``spec.json`` once (atomically with ``os.link``, so concurrent workers agree on one ``instance``
    id) or check that it matches, and set ``u.instance``. The optuna study names carry the instance id: a study
    folder that is deleted and started again never picks up the trials of its predecessor from a persistent
    (PostgreSQL) storage.

    Raises:
        MSBError: the folder was started with other search / cross-validation settings or another run config.
    """
    path = u.state_dir / "spec.json"
    if not path.is_file():
        data = {"spec_hash": u.spec_hash, "instance": uuid.uuid4().hex, "study": u.spec.study, "unit": u.name,
                "study_file": str(u.study_file), "base_config_hash": u.base.config_hash,
                "search": u.spec.search.model_dump(mode="json") if u.spec.search else None,
                "cross_validation": u.spec.cross_validation.model_dump(mode="json")
                if u.spec.cross_validation else None}
        tmp = u.state_dir / f".spec.{uuid.uuid4().hex}.json"
        write_json(tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink(missing_ok=True)
    old = read_json(path) or {}
    if old.get("spec_hash") != u.spec_hash:
        raise MSBError(f"{path}: this study folder was started with other search/cross_validation settings or "
                       f"another run config (spec hash {str(old.get('spec_hash'))[:12]}... vs {u.spec_hash[:12]}...); "
                       f"use another run_root (--run-root) or delete {u.root} to start over")
    u.instance = str(old["instance"])


def unit_lock(u: StudyUnit, what: str) -> filelock.BaseFileLock:
    """Lock ``_study/<unit>/locks/<what>.lock`` (a run folder, a phase's claims, the final phase)."""
    return file_lock(u.state_dir / "locks" / f"{what}.lock")


def prepare_lock(u: StudyUnit) -> filelock.BaseFileLock:
    """Study-wide lock around dataset preparation, so that workers starting together prepare a dataset once."""
    key = sha256_json(str(Path(u.cfg.data.root).absolute()))[:12]
    return file_lock(u.root / "_study" / "locks" / f"prepare-{key}.lock")


def write_state(u: StudyUnit, **parts: Any) -> None:
    """Update ``_study/<unit>/state.json`` (the phase and each phase's item status; written atomically)."""
    path = u.state_dir / "state.json"
    state = read_json(path) or {}
    state.update(parts)
    write_json(path, state, stamp=True)


@contextlib.contextmanager
def study_lock(root: Path, wait: bool = False, log: Logger = no_log) -> Iterator[None]:
    """Hold ``<root>/_study/locks/study.lock`` for a plain ``msb run``, ``msb evaluate RUN`` or ``msb metrics RUN``
    (one such process per study folder at a time; ``--worker`` processes coordinate through the optuna storage
    instead). The holder is recorded in
    ``study.owner`` (``host:pid:start``, start time, command line) so a refused run can say who holds it; the
    lock itself is released by the operating system when the holder dies, so a stale owner file means nothing.

    Args:
        root: ``<run_root>/<study>``; wait: block until the lock is free (``--wait``) instead of refusing.

    Raises:
        MSBError: the lock is held by another process and ``wait`` is False (the message names the holder).
    """
    locks = root / "_study" / "locks"
    lock = file_lock(locks / "study.lock")
    owner_file = locks / "study.owner"
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        holder = read_json(owner_file) or {}
        who = (f"process {holder.get('owner', '?')} running '{holder.get('command', '?')}' since "
               f"{holder.get('started', '?')}")
        if not wait:
            raise MSBError(f"{root}: another msb process is working on this study: {who}; wait for it to end, "
                           f"rerun 'msb run' with --wait to queue behind it, or use --worker processes to share "
                           f"the work") from None
        log(f"waiting for the other msb process working on this study to end: {who}")
        lock.acquire()
    try:
        write_json(owner_file, {"owner": owner_id(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                "command": " ".join(sys.argv)})
        yield
    finally:
        lock.release()
