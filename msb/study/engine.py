"""Study orchestration: search -> K-fold cross-validation -> final evaluation (+ external sets, ensemble).

For every dataset x architecture of a study file (a *unit*, named ``<dataset>-<arch>``):

1. **Search** (``search.method`` grid / hyperband) on the run config's own train/val split: every trial is an
   ordinary run folder ``runs/<study>/<dataset>-<arch>-<hash8>/`` (hash of the trial's config), trained for
   the search budget; trials are not evaluated on the test split. The objective is the best per-epoch
   validation value of ``search.metric``; Hyperband reports it every epoch and stops pruned trials. The best
   COMPLETE trial (ties: lowest trial number) gives the selected parameters. ``method: none`` selects the
   run config as is.
2. **Cross-validation** (``cross_validation``): ``folds.csv`` is drawn once (:mod:`msb.study.folds`); fold
   ``j`` is the run folder ``<selected run id>-fold<j>`` (selected config, ``split.csv`` from the folds,
   ``fold.json``), trained, evaluated on ``final.test_split`` (counts rows ``fold = j``) and on every external
   set. Without cross-validation the final run is the best trial's run (or the run config's run).
3. **Final**: the strict-majority ensemble of the folds on every evaluation set they share
   (:mod:`msb.study.ensemble`, folder ``<selected run id>-ensemble``), then the manifests.

Every step is resumable: trials and folds are optuna work items (:mod:`msb.study.coord`) in an RDB storage
(SQLite file ``runs/<study>/_study/optuna.db`` by default, ``--storage URL`` to share one study between
``msb run --worker`` processes on several machines), run folders resume from their last finished epoch,
evaluations and ensembles are skipped when their ``DONE`` marker matches, and every file is written atomically.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import optuna
from optuna.trial import TrialState

from msb.config.generate import GeneratedRun, StudySpec, config_hash, generate_runs, load_study, write_run_config
from msb.config.schema import RunConfig
from msb.data.schema import PreparedDataset
from msb.data.splits import resolve_splits, split_file_text, write_split_file
from msb.engine.runner import RunOutcome, ensure_dataset, evaluate_run, train_run, write_manifest
from msb.errors import MSBError
from msb.models.checkpoint import load_state, read_records
from msb.study import coord
from msb.study.ensemble import ensemble_evaluation, ensemble_model_name, ensemble_run_id
from msb.study.external import (ExternalSet, evaluate_external, external_eval_dir, parse_class_map_option,
                                 resolve_external)
from msb.study.folds import assign_folds, empty_mask_strata, fold_split, read_folds, write_folds
from msb.study.manifest import package_versions, read_json, safe_url, write_json
from msb.config.study_spec import ExternalSpec, ParamDistribution, apply_params, grid_points, param_distributions
from msb.utils.device import select_device
from msb.utils.hashing import sha256_file, sha256_json
from msb.utils.progress import Logger, Tracker, no_log, no_track

__all__ = ["StudyUnit", "study_units", "run_study_spec", "evaluate_study_external", "evaluate_external_cli",
           "fold_run_dirs"]

METRIC_KEYS = {"dice": "val_dice", "iou": "val_iou", "loss": "val_loss"}


@dataclass
class StudyUnit:
    """One dataset x architecture of a study file, with its folders.

    Attributes:
        spec: the study file's spec; study_file: its path; configs_root: its configs root.
        base: the generated run (run config of this dataset x architecture, ``run_root`` applied).
        root: ``<run_root>/<study>``; name: ``<dataset>-<arch>``; state_dir: ``root/_study/<name>``.
        spec_hash: SHA-256 of the unit's search/cross-validation settings and base config hash.
        instance: random id of this study folder (``spec.json``), part of the optuna study names.
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

    def make_run(self, cfg: RunConfig, suffix: str = "") -> GeneratedRun:
        """A run of this unit with config ``cfg``: id ``<dataset>-<arch>-<hash8><suffix>``."""
        h = config_hash(cfg)
        return GeneratedRun(f"{self.base.dataset}-{self.base.architecture}-{h[:8]}{suffix}", cfg, h,
                            self.base.dataset, self.base.architecture)

    def roles(self) -> list[str]:
        """Checkpoint roles to evaluate (``evaluation.checkpoint``; ``both`` = best and latest)."""
        c = self.cfg.evaluation.checkpoint
        return ["best", "latest"] if c == "both" else [c]


def study_units(study_path: str | Path, run_root: str | None = None) -> list[StudyUnit]:
    """Units of a study file (see :class:`StudyUnit`). Raises :class:`MSBError` on config errors."""
    study_path = Path(study_path).resolve()
    spec, configs_root = load_study(study_path)
    units = []
    for run in generate_runs(study_path):
        cfg = run.config if run_root is None else run.config.model_copy(update={"run_root": run_root})
        run = GeneratedRun(run.run_id, cfg, run.config_hash, run.dataset, run.architecture)
        root = Path(cfg.run_root) / cfg.study
        name = f"{run.dataset}-{run.architecture}"
        u = StudyUnit(spec, study_path, configs_root, run, root, name, root / "_study" / name)  # type: ignore[arg-type]
        _validate_search(u)
        u.spec_hash = sha256_json({
            "search": spec.search.model_dump(mode="json") if spec.search else None,
            "cross_validation": spec.cross_validation.model_dump(mode="json") if spec.cross_validation else None,
            "base_config_hash": run.config_hash})
        units.append(u)
    return units


# ------------------------------------------------------------------------------------------------ helpers
def _validate_search(u: StudyUnit) -> None:
    """Apply every grid point (or, for Hyperband, the bounds and every choice of each parameter) to the run
    config, so that a bad key or value fails before anything is written or trained. Raises :class:`MSBError`."""
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


def _check_spec(u: StudyUnit) -> None:
    """Create ``spec.json`` once (atomically with ``os.link``, so concurrent workers agree on one ``instance``
    id) or check that it matches. The optuna study names carry the instance id: a study folder that is deleted
    and started again never picks up the trials of its predecessor from a persistent (PostgreSQL) storage."""
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


def _lock(u: StudyUnit, what: str) -> contextlib.AbstractContextManager:
    return coord.file_lock(u.state_dir / "locks" / f"{what}.lock")


def _prepare_lock(u: StudyUnit) -> contextlib.AbstractContextManager:
    """Study-wide lock around dataset preparation, so that workers starting together prepare a dataset once."""
    key = sha256_json(str(Path(u.cfg.data.root).absolute()))[:12]
    return coord.file_lock(u.root / "_study" / "locks" / f"prepare-{key}.lock")


def _best_value(history: list[dict[str, Any]], key: str, maximize: bool) -> float:
    vals = [float(h[key]) for h in history if h.get(key) is not None and math.isfinite(float(h[key]))]
    if not vals:
        return float("nan")
    return max(vals) if maximize else min(vals)


def _suggest(trial: optuna.trial.Trial, name: str, d: ParamDistribution) -> Any:
    if d.type == "float":
        return trial.suggest_float(name, float(d.low), float(d.high), log=d.log,  # type: ignore[arg-type]
                                   step=None if d.step is None else float(d.step))
    if d.type == "int":
        return trial.suggest_int(name, int(d.low), int(d.high), step=int(d.step or 1), log=d.log)  # type: ignore[arg-type]
    choices = list(d.choices or [])
    if all(c is None or isinstance(c, (bool, int, float, str)) for c in choices):
        return trial.suggest_categorical(name, choices)
    return json.loads(trial.suggest_categorical(name, [json.dumps(c) for c in choices]))


def _make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _write_state(u: StudyUnit, **parts: Any) -> None:
    path = u.state_dir / "state.json"
    state = read_json(path) or {}
    state.update(parts)
    write_json(path, state, stamp=True)


def _status_dict(st: coord.ItemsStatus) -> dict[str, Any]:
    return {"n_items": st.n_items, "done": sorted(st.done), "pending": sorted(st.pending), "failed": sorted(st.failed)}


# ------------------------------------------------------------------------------------------------ work loop
@dataclass
class _Ctx:
    storage: Any
    url: str
    exclusive: bool
    heartbeat_interval: float
    poll_s: float
    track: Tracker
    log: Logger


def _work_loop(u: StudyUnit, study: optuna.Study, n_items: int, phase: str, ctx: _Ctx,
               work: Callable[[optuna.trial.Trial], None], reseed: Callable[[int], None] | None = None
               ) -> coord.ItemsStatus:
    """Claim and run work items of ``study`` until every item is finished (module docstring of coord)."""
    if ctx.exclusive:
        st = coord.items_status(study, n_items)
        for item, t in st.failed.items():
            ctx.log(f"[{u.name}] {phase} item {item} (trial {t.number}) failed before; retrying it")
            coord.retry_trial(study, t)
    waited = False
    while True:
        st = coord.items_status(study, n_items)
        _write_state(u, **{phase: _status_dict(st)})
        if st.complete:
            return st
        if st.failed and not st.pending:
            raise MSBError(f"[{u.name}] {phase}: work item(s) {sorted(st.failed)} failed (trial(s) "
                           f"{[t.number for t in st.failed.values()]} of optuna study {study.study_name!r}); see the "
                           f"error above or the log of the worker that ran it, then rerun 'msb run' to retry")
        # claims are serialised per study folder: SQLite's compare-and-set alone lets two processes that
        # read the same WAITING trial at the same instant both switch it to RUNNING (PostgreSQL's row locks
        # do not need this, but the lock is cheap and workers share the run folder anyway)
        with _lock(u, f"claim-{phase}"):
            trial = coord.claim_next(study, ctx.exclusive, reseed, ctx.log)
        if trial is None:
            if not waited:
                ctx.log(f"[{u.name}] {phase}: waiting for {len(st.pending)} item(s) run by other processes")
                waited = True
            time.sleep(ctx.poll_s)
            continue
        waited = False
        with coord.Heartbeat(ctx.storage, trial._trial_id, ctx.heartbeat_interval):
            try:
                work(trial)
            except BaseException:
                with contextlib.suppress(Exception):
                    study.tell(trial, state=TrialState.FAIL)
                raise


# ------------------------------------------------------------------------------------------------ search
@dataclass
class _Selected:
    params: dict[str, Any]
    final_run: GeneratedRun            # base config + params (the fold runs' config)
    trial_run: GeneratedRun | None     # the best trial's own run (None without search)
    value: float = float("nan")
    trial_number: int | None = None


def _search(u: StudyUnit, ds: PreparedDataset, ctx: _Ctx) -> _Selected:
    s = u.spec.search
    where = str(u.study_file)
    if s is None or s.method == "none":
        run = u.make_run(u.cfg)
        return _Selected({}, run, None)
    metric = s.metric or u.cfg.checkpoint.metric
    maximize = metric != "loss"
    key = METRIC_KEYS[metric]
    max_epochs = s.max_epochs or u.cfg.train.epochs
    extra = {"train": {"epochs": s.max_epochs}} if s.max_epochs else None
    if s.method == "grid":
        points = grid_points(s.params)
        items = [{"params_json": json.dumps(p)} for p in points]
        sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=0)  # never asked: params fixed
        pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
        dists: dict[str, ParamDistribution] = {}
    else:
        dists = param_distributions(s.params)
        seed = s.sampler.seed if s.sampler.seed is not None else u.cfg.random_seed
        sampler = _make_sampler(s.sampler.name, seed)
        pruner = optuna.pruners.HyperbandPruner(min_resource=s.min_epochs, max_resource=max_epochs,
                                                reduction_factor=s.reduction_factor)
        items = [{} for _ in range(int(s.n_trials or 0))]
    device = str(select_device(u.cfg.train.device))
    name = coord.phase_study_name(u.spec.study, u.name, "search", u.spec_hash, u.instance)
    study = coord.get_or_create_study(ctx.storage, name, "maximize" if maximize else "minimize", items,
                                      sampler, pruner)

    def reseed(number: int) -> None:
        if s.method == "hyperband":
            seed = s.sampler.seed if s.sampler.seed is not None else u.cfg.random_seed
            study.sampler = _make_sampler(s.sampler.name, seed + number)

    def work(trial: optuna.trial.Trial) -> None:
        if s.method == "grid":
            params = json.loads(trial.user_attrs["params_json"])
        else:
            params = {n: _suggest(trial, n, d) for n, d in dists.items()}
        run = u.make_run(apply_params(u.cfg, params, where, extra))
        trial.set_user_attr("params_json", json.dumps(params))
        trial.set_user_attr("run_id", run.run_id)
        run_dir = u.root / run.run_id
        ctx.log(f"[{u.name}] search trial {trial.number} {json.dumps(params)} -> {run.run_id}")
        reported = set(study._storage.get_trial(trial._trial_id).intermediate_values)

        def report(row: dict[str, Any]) -> bool:
            step, v = int(row["epoch"]), float(row[key])
            if step not in reported and math.isfinite(v):
                trial.report(v, step)
                reported.add(step)
            return trial.should_prune()

        with _lock(u, run.run_id):
            pruned_at = None
            state = load_state(run_dir)
            history = list(state["history"]) if state else []
            for row in history:
                if report(row):
                    pruned_at = int(row["epoch"])
                    break
            if pruned_at is None and not (state and state.get("finished")):
                pruned: list[int] = []

                def on_epoch_end(row: dict[str, Any]) -> bool:
                    if report(row):
                        pruned.append(int(row["epoch"]))
                        return True
                    return False

                res = train_run(run, run_dir, ds, ctx.track, ctx.log, on_epoch_end=on_epoch_end)
                history = res.history
                if pruned and not res.finished:
                    pruned_at = pruned[-1]
            write_manifest(run_dir, run, device, {**_run_manifest_extra(u), "search_trial": trial.number,
                                                  "search_params": params})
        if pruned_at is not None:
            ctx.log(f"[{u.name}] trial {trial.number} pruned at epoch {pruned_at} (Hyperband)")
            study.tell(trial, state=TrialState.PRUNED)
            return
        value = _best_value(history, key, maximize)
        if not math.isfinite(value):
            ctx.log(f"[{u.name}] trial {trial.number}: no finite validation {metric}; not selectable")
            trial.set_user_attr("note", f"no finite validation {metric}")
            study.tell(trial, state=TrialState.PRUNED)
            return
        ctx.log(f"[{u.name}] trial {trial.number}: best validation {metric} {value:.6f}")
        study.tell(trial, value)

    st = _work_loop(u, study, len(items), "search", ctx, work, reseed)
    complete = [t for t in st.done.values() if t.state == TrialState.COMPLETE and t.value is not None]
    if not complete:
        raise MSBError(f"[{u.name}] search: no trial completed with a finite validation {metric} (all pruned or "
                       f"undefined); widen the search or raise search.max_epochs")
    best = sorted(complete, key=lambda t: ((-t.value if maximize else t.value), t.number))[0]
    params = json.loads(best.user_attrs["params_json"])
    final_run = u.make_run(apply_params(u.cfg, params, where))
    trial_run = u.make_run(apply_params(u.cfg, params, where, extra))
    trials = [{"number": t.number, "item": t.user_attrs.get("item"), "state": t.state.name, "value": t.value,
               "params": json.loads(t.user_attrs.get("params_json", "{}")), "run_id": t.user_attrs.get("run_id"),
               "retry_of": t.system_attrs.get("retry_of")}
              for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)]
    write_json(u.state_dir / "selected.json", {
        "method": s.method, "metric": metric, "direction": "maximize" if maximize else "minimize",
        "best_trial": best.number, "best_value": best.value, "params": params,
        "trial_run_id": trial_run.run_id, "final_run_id": final_run.run_id, "final_config_hash": final_run.config_hash,
        "optuna_study": study.study_name, "trials": trials})
    ctx.log(f"[{u.name}] search done: best trial {best.number} {json.dumps(params)} "
            f"(validation {metric} {best.value:.6f}) -> {final_run.run_id}")
    return _Selected(params, final_run, trial_run, float(best.value), best.number)


# ------------------------------------------------------------------------------------------------ folds
def _ensure_folds(u: StudyUnit, ds: PreparedDataset, log: Logger) -> tuple[Any, str]:
    cv = u.spec.cross_validation
    assert cv is not None
    path = u.state_dir / "folds.csv"
    ids = [str(s) for s in ds.index["sample_id"]]
    with _lock(u, "folds"):
        if not path.is_file():
            s = u.cfg.data.split
            split = resolve_splits(ds.index, s.mode, s.val_fraction, s.test_fraction, s.seed, s.group_column,
                                   ds.root / "index.csv")
            write_split_file(u.state_dir / "split.csv", split)
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
            write_folds(path, folds)
            sizes = folds[folds["fold"] >= 0]["fold"].value_counts().sort_index()
            log(f"[{u.name}] {cv.k} folds drawn (seed {seed}): sizes {', '.join(str(int(n)) for n in sizes)}; "
                f"{int((folds['fold'] < 0).sum())} held-out test sample(s) -> {path}")
        folds = read_folds(path, known_ids=ids)
    return folds, sha256_file(path)


def _fold_run(sel: _Selected, j: int) -> GeneratedRun:
    r = sel.final_run
    return GeneratedRun(f"{r.run_id}-fold{j}", r.config, r.config_hash, r.dataset, r.architecture)


def _prepare_fold_dir(u: StudyUnit, run: GeneratedRun, run_dir: Path, folds: Any, j: int, folds_sha: str) -> None:
    write_run_config(run, run_dir)
    split = fold_split(folds, j)
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


def _internal_eval_enabled(u: StudyUnit) -> bool:
    cv = u.spec.cross_validation
    return not (cv is not None and cv.include_test and u.cfg.evaluation.split == "test")


def _evaluate_final(u: StudyUnit, run_dir: Path, ds: PreparedDataset, ctx: _Ctx) -> list[Path]:
    paths: list[Path] = []
    if _internal_eval_enabled(u):
        paths += evaluate_run(run_dir, u.roles(), ds, ctx.track, ctx.log)
    for ext in u.externals:
        paths += evaluate_external(run_dir, u.roles(), ext, ds, ctx.track, ctx.log)
    return paths


def _run_manifest_extra(u: StudyUnit, fold: int | None = None, folds_sha: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"study_unit": u.name, "spec_hash": u.spec_hash}
    if fold is not None:
        out.update({"fold": fold, "folds_sha256": folds_sha})
    if u.externals:
        out["external"] = [e.describe() for e in u.externals]
    return out


def _cross_validate(u: StudyUnit, sel: _Selected, ds: PreparedDataset, ctx: _Ctx) -> tuple[Any, str]:
    cv = u.spec.cross_validation
    assert cv is not None
    folds, folds_sha = _ensure_folds(u, ds, ctx.log)
    device = str(select_device(u.cfg.train.device))
    metric = u.cfg.checkpoint.metric
    items = [{"fold": j} for j in range(cv.k)]
    name = coord.phase_study_name(u.spec.study, u.name, "cv", u.spec_hash, u.instance)
    study = coord.get_or_create_study(ctx.storage, name, "minimize" if metric == "loss" else "maximize", items)

    def work(trial: optuna.trial.Trial) -> None:
        j = int(study._storage.get_trial(trial._trial_id).user_attrs["fold"])
        run = _fold_run(sel, j)
        run_dir = u.root / run.run_id
        trial.set_user_attr("run_id", run.run_id)
        ctx.log(f"[{u.name}] fold {j + 1}/{cv.k} (trial {trial.number}) -> {run.run_id}")
        with _lock(u, run.run_id):
            _prepare_fold_dir(u, run, run_dir, folds, j, folds_sha)
            res = train_run(run, run_dir, ds, ctx.track, ctx.log)
            _evaluate_final(u, run_dir, ds, ctx)
            write_manifest(run_dir, run, device, _run_manifest_extra(u, j, folds_sha))
        if math.isfinite(res.best_value):
            study.tell(trial, float(res.best_value))
        else:
            trial.set_user_attr("note", f"no finite validation {metric}")
            study.tell(trial, state=TrialState.PRUNED)

    _work_loop(u, study, cv.k, "cv", ctx, work)
    return folds, folds_sha


# ------------------------------------------------------------------------------------------------ final
def _final_single(u: StudyUnit, sel: _Selected, ds: PreparedDataset, ctx: _Ctx) -> RunOutcome:
    run = sel.trial_run or sel.final_run
    run_dir = u.root / run.run_id
    with _lock(u, run.run_id):
        res = train_run(run, run_dir, ds, ctx.track, ctx.log)
        paths = _evaluate_final(u, run_dir, ds, ctx)
        write_manifest(run_dir, run, str(select_device(u.cfg.train.device)), _run_manifest_extra(u))
    return RunOutcome(run.run_id, run_dir, res, paths)


def _eval_sets(u: StudyUnit) -> list[tuple[str, Callable[[Path, str], Path]]]:
    """(label, folder-of(run_dir, role)) of every evaluation set shared by all folds (ensemble targets)."""
    out: list[tuple[str, Callable[[Path, str], Path]]] = []
    if _internal_eval_enabled(u) and u.cfg.evaluation.split == "test":
        out.append(("test", lambda d, r: d / "evaluation" / r))
    for ext in u.externals:
        out.append((ext.name, lambda d, r, n=ext.name: external_eval_dir(d, n, r)))
    return out


def _finalize(u: StudyUnit, sel: _Selected, ds: PreparedDataset, ctx: _Ctx, folds: Any, folds_sha: str
              ) -> list[RunOutcome]:
    cv = u.spec.cross_validation
    assert cv is not None
    outcomes = []
    device = str(select_device(u.cfg.train.device))
    fold_dirs = []
    with _lock(u, "finalize"):
        for j in range(cv.k):
            run = _fold_run(sel, j)
            run_dir = u.root / run.run_id
            with _lock(u, run.run_id):
                paths = _evaluate_final(u, run_dir, ds, ctx)  # skipped when done; new external sets are added
                write_manifest(run_dir, run, device, _run_manifest_extra(u, j, folds_sha))
            outcomes.append(RunOutcome(run.run_id, run_dir, None, paths))
            fold_dirs.append(run_dir)
        ens_info: dict[str, Any] | None = None
        final = u.spec.final
        if (final is None or final.ensemble) and cv.k >= 2:
            ens_id = ensemble_run_id(sel.final_run.run_id)
            ens_dir = u.root / ens_id
            model = ensemble_model_name(u.cfg.model.arch, cv.k)
            paths = []
            for label, folder in _eval_sets(u):
                for role in u.roles():
                    paths.append(ensemble_evaluation(
                        [folder(d, role) for d in fold_dirs], folder(ens_dir, role), ens_id, model,
                        u.cfg.evaluation.compute_metrics, u.cfg.evaluation.metrics))
                    ctx.log(f"[{u.name}] ensemble of {cv.k} folds ({role}) on '{label}' -> {paths[-1]}")
            ens_info = {"run_id": ens_id, "model": model, "rule": "strict majority (2 * votes > K)",
                        "members": [d.name for d in fold_dirs],
                        "counts": [str(p.relative_to(u.root)) for p in paths]}
            if paths:
                write_json(ens_dir / "manifest.json", {**ens_info, "config_hash": sel.final_run.config_hash,
                                                       "folds_sha256": folds_sha, "spec_hash": u.spec_hash,
                                                       "versions": package_versions(), "device": device})
                outcomes.append(RunOutcome(ens_id, ens_dir, None, paths))
        _write_unit_manifest(u, sel, ctx, folds_sha, fold_dirs, outcomes, ens_info)
    return outcomes


def _write_unit_manifest(u: StudyUnit, sel: _Selected, ctx: _Ctx, folds_sha: str | None, run_dirs: list[Path],
                         outcomes: list[RunOutcome], ens_info: dict[str, Any] | None) -> None:
    runs = []
    for d in run_dirs:
        rec = read_records(d)
        split = d / "split.csv"
        runs.append({"run_id": d.name, "fold": (read_json(d / "fold.json") or {}).get("fold", -1),
                     "config_hash": (d / "config.sha256").read_text().strip(),
                     "split_sha256": sha256_file(split) if split.is_file() else None,
                     "checkpoints": {k: v.sha256 for k, v in rec.items()}})
    cv = u.spec.cross_validation
    manifest = {
        "study": u.spec.study, "unit": u.name, "study_file": str(u.study_file), "spec_hash": u.spec_hash,
        "storage": safe_url(ctx.url), "base_config_hash": u.base.config_hash,
        "search": read_json(u.state_dir / "selected.json"),
        "selected": {"params": sel.params, "run_id": sel.final_run.run_id, "config_hash": sel.final_run.config_hash},
        "cross_validation": None if cv is None else {
            **cv.model_dump(mode="json"), "folds_file": "folds.csv", "folds_sha256": folds_sha,
            "split_file": "split.csv", "split_sha256": sha256_file(u.state_dir / "split.csv")},
        "runs": runs, "ensemble": ens_info,
        "external": [e.describe() for e in u.externals],
        "counts": [str(p.relative_to(u.root)) for o in outcomes for p in o.counts_paths],
        "versions": package_versions(), "device": str(select_device(u.cfg.train.device)),
    }
    write_json(u.state_dir / "manifest.json", manifest)
    _write_state(u, phase="done")


def _write_study_manifest(units: list[StudyUnit], url: str) -> None:
    if not units:
        return
    root = units[0].root
    write_json(root / "_study" / "manifest.json", {
        "study": units[0].spec.study, "study_file": str(units[0].study_file), "storage": safe_url(url),
        "units": {u.name: {"manifest": str((u.state_dir / "manifest.json").relative_to(root)),
                           "sha256": sha256_file(u.state_dir / "manifest.json")}
                  for u in units if (u.state_dir / "manifest.json").is_file()}})


def _resolve_externals(u: StudyUnit, ds: PreparedDataset, log: Logger) -> None:
    final = u.spec.final
    u.externals = []
    for i, e in enumerate(final.external if final else []):
        with coord.file_lock(u.root / "_study" / "locks" / "external.lock"):  # prepared on first use
            u.externals.append(resolve_external(e, ds.classes, u.configs_root, u.study_file.parent,
                                                str(u.study_file), log))


# ------------------------------------------------------------------------------------------------ entry points
def run_study_spec(study_path: str | Path, track: Tracker = no_track, log: Logger = no_log,
                   run_root: str | None = None, worker: bool = False, storage: str | None = None,
                   heartbeat_interval: int = 30, grace_period: int = 120, poll_s: float = 2.0) -> list[RunOutcome]:
    """Run (or resume, or join as a worker) every unit of a study file (module docstring).

    Args:
        study_path: the study YAML.
        track, log: progress wrapper and line logger (the CLI passes rich ones).
        run_root: overrides ``run_root`` of every run config.
        worker: cooperate with other processes on the same storage (``msb run --worker``): never re-attach a
            trial another process may own; wait for items others are running.
        storage: optuna RDB URL (default: SQLite ``<run_root>/<study>/_study/optuna.db``).
        heartbeat_interval, grace_period: seconds between heartbeats / before a silent trial is stale.
        poll_s: seconds between checks while waiting for other processes.

    Returns:
        One :class:`RunOutcome` per evaluated run (fold runs, the ensemble, or the single final run).

    Raises:
        MSBError: config errors, a changed study spec, failed work items, unreachable storage, data errors.
    """
    units = study_units(study_path, run_root)
    if not units:
        return []
    url = storage or coord.default_storage_url(units[0].root)
    st = coord.open_storage(url, heartbeat_interval, grace_period)
    ctx = _Ctx(st, url, not worker, heartbeat_interval, poll_s, track, log)
    outcomes: list[RunOutcome] = []
    for u in units:
        u.state_dir.mkdir(parents=True, exist_ok=True)
        with _prepare_lock(u):
            ds = ensure_dataset(u.cfg, log)
        # checks that need the data come before anything is recorded or trained: external sets and their
        # class maps, and whether the k folds can be drawn (k <= number of groups)
        _resolve_externals(u, ds, log)
        if u.spec.cross_validation is not None:
            _ensure_folds(u, ds, log)
        _check_spec(u)
        _write_state(u, phase="search")
        sel = _search(u, ds, ctx)
        if u.spec.cross_validation is None:
            _write_state(u, phase="final")
            with _lock(u, "finalize"):
                o = _final_single(u, sel, ds, ctx)
                _write_unit_manifest(u, sel, ctx, None, [o.run_dir], [o], None)
            outcomes.append(o)
            continue
        _write_state(u, phase="cv")
        folds, folds_sha = _cross_validate(u, sel, ds, ctx)
        _write_state(u, phase="final")
        outcomes += _finalize(u, sel, ds, ctx, folds, folds_sha)
    _write_study_manifest(units, url)
    with contextlib.suppress(Exception):
        st.remove_session()
        st.engine.dispose()
    return outcomes


def fold_run_dirs(u: StudyUnit) -> tuple[list[Path], str]:
    """Fold run folders of a finished (or running) unit, from ``selected.json``/``spec.json`` and the
    cross-validation settings; also the selected run id. Raises :class:`MSBError` when the study has not been
    run."""
    cv = u.spec.cross_validation
    if cv is None:
        raise MSBError(f"{u.study_file}: the study has no cross_validation; evaluate a run folder instead")
    sel = read_json(u.state_dir / "selected.json")
    if u.spec.search is None or u.spec.search.method == "none":
        run_id = u.make_run(u.cfg).run_id
    elif sel is None:
        raise MSBError(f"{u.state_dir / 'selected.json'}: not found; run the study (msb run) first")
    else:
        run_id = sel["final_run_id"]
    dirs = [u.root / f"{run_id}-fold{j}" for j in range(cv.k)]
    missing = [str(d) for d in dirs if not (d / "checkpoints" / "records.json").is_file()]
    if missing:
        raise MSBError(f"fold run(s) not trained yet: {', '.join(missing)}; run the study (msb run) first")
    return dirs, run_id


def evaluate_study_external(study_path: str | Path, dataset: str, class_map: dict[str, list[str]] | None = None,
                            split: str | None = None, name: str | None = None, roles: list[str] | None = None,
                            run_root: str | None = None, track: Tracker = no_track, log: Logger = no_log,
                            force: bool = False, ensemble: bool = True) -> list[Path]:
    """``msb evaluate STUDY.yaml --external DATASET``: evaluate every fold checkpoint of every unit on the
    external dataset (no retraining, no threshold tuning) and build the strict-majority fold ensemble.

    A ``final.external`` entry whose ``name`` or ``dataset`` equals ``dataset`` supplies the defaults
    (``split``, ``class_map``, ``max_samples``); the arguments override them.

    Returns:
        Counts paths (every fold, then the ensemble, per unit and role).

    Raises:
        MSBError: the study was not run, unknown dataset, bad class mapping.
    """
    out: list[Path] = []
    for u in study_units(study_path, run_root):
        from msb.engine.runner import ensure_dataset as _ensure

        ds = _ensure(u.cfg, log)
        declared = [e for e in (u.spec.final.external if u.spec.final else []) if dataset in (e.name, e.dataset)]
        base = declared[0] if declared else ExternalSpec(dataset=dataset)
        spec = base.model_copy(update={k: v for k, v in (("class_map", class_map), ("split", split), ("name", name))
                                       if v is not None})
        spec = ExternalSpec.model_validate(spec.model_dump())
        ext = resolve_external(spec, ds.classes, u.configs_root, u.study_file.parent,
                               "--class-map" if class_map is not None else str(u.study_file), log)
        dirs, run_id = fold_run_dirs(u)
        use_roles = roles or u.roles()
        for d in dirs:
            out += evaluate_external(d, use_roles, ext, ds, track, log, force)
        if ensemble and len(dirs) >= 2:
            ens_id = ensemble_run_id(run_id)
            model = ensemble_model_name(u.cfg.model.arch, len(dirs))
            for role in use_roles:
                out.append(ensemble_evaluation([external_eval_dir(d, ext.name, role) for d in dirs],
                                               external_eval_dir(u.root / ens_id, ext.name, role), ens_id, model,
                                               u.cfg.evaluation.compute_metrics, u.cfg.evaluation.metrics, force))
                log(f"[{u.name}] ensemble of {len(dirs)} folds ({role}) on '{ext.name}' -> {out[-1]}")
    return out


def evaluate_external_cli(target: str | Path, dataset: str, class_map_items: list[str], split: str | None,
                          roles: list[str], run_root: str | None = None, track: Tracker = no_track,
                          log: Logger = no_log, force: bool = False) -> list[Path]:
    """``msb evaluate TARGET --external DATASET [--class-map M=E,...] [--split S]``.

    ``TARGET`` is a study YAML (every fold checkpoint and the fold ensemble, :func:`evaluate_study_external`) or
    a run folder (its checkpoints only; dataset names are looked up in ``./configs/datasets``).

    Raises:
        MSBError: a target that is neither, or the errors of the evaluations.
    """
    from msb.config.layering import load_yaml

    cmap = parse_class_map_option(class_map_items)
    target = Path(target)
    if target.is_file():
        return evaluate_study_external(target, dataset, cmap, split, None, roles, run_root, track, log, force)
    if (target / "config.yaml").is_file():
        cfg = RunConfig.model_validate(load_yaml(target / "config.yaml"))
        ds = ensure_dataset(cfg, log)
        spec = ExternalSpec(dataset=dataset, split=split or "all", class_map=cmap)
        ext = resolve_external(spec, ds.classes, Path("configs") if Path("configs").is_dir() else None, None,
                               "--class-map" if cmap is not None else "--external", log)
        return evaluate_external(target, roles, ext, ds, track, log, force)
    raise MSBError(f"{target}: neither a study YAML nor a run folder (no config.yaml); give runs/<study>/<run_id> "
                   f"or the study file")
