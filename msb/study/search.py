"""Phase 1 of a study, the hyperparameter search (grid / Hyperband), on the run config's own train/val split.

Every trial is an ordinary run folder ``runs/<study>/<dataset>-<arch>-<hash8>/`` (hash of the trial's config),
trained for the search budget; trials are not evaluated on the test split. The objective is the best per-epoch
validation value of ``search.metric`` (epochs numbered from 1); Hyperband reports it every epoch (step = epoch)
and stops pruned trials. The best COMPLETE trial (ties: lowest trial number) gives the selected parameters,
written to ``_study/<unit>/selected.json``. ``method: none`` (or no ``search``) selects the run config as is.

Reads: the prepared dataset, run folders of earlier trials (resume). Writes: trial run folders,
``selected.json``; the optuna study ``<study>/<unit>/search/...``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from msb.config.generate import GeneratedRun
from msb.config.study_spec import ParamDistribution, apply_params, grid_points, param_distributions
from msb.data.schema import PreparedDataset
from msb.engine.runner import train_run, write_manifest
from msb.errors import MSBError
from msb.models.checkpoint import load_state
from msb.study import coord
from msb.study.evaluate import run_manifest_extra
from msb.study.manifest import write_json
from msb.study.units import StudyContext, StudyUnit, unit_lock, write_state
from msb.utils.device import select_device

__all__ = ["Selected", "run_search", "METRIC_KEYS"]

METRIC_KEYS = {"dice": "val_dice", "iou": "val_iou", "loss": "val_loss"}


@dataclass
class Selected:
    """Outcome of the search phase.

    Attributes:
        params: the selected parameters (``{}`` without search).
        final_run: base config + params, full epochs (the fold runs' / final run's config).
        trial_run: the best trial's own run (None without search).
        value: its best validation value; trial_number: its optuna trial number.
    """

    params: dict[str, Any]
    final_run: GeneratedRun
    trial_run: GeneratedRun | None
    value: float = float("nan")
    trial_number: int | None = None


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


def run_search(u: StudyUnit, ds: PreparedDataset, ctx: StudyContext) -> Selected:
    """Run (or resume, or join) the search phase of unit ``u`` and return the selection (module docstring).

    Raises:
        MSBError: no trial completed with a finite validation value; failed trials; data/config errors.
    """
    s = u.spec.search
    where = str(u.study_file)
    if s is None or s.method == "none":
        return Selected({}, u.make_run(u.cfg), None)
    metric = s.metric or u.cfg.checkpoint.metric
    maximize = metric != "loss"
    key = METRIC_KEYS[metric]
    max_epochs = s.max_epochs or u.cfg.train.epochs
    extra = {"train": {"epochs": s.max_epochs}} if s.max_epochs else None
    seed = s.sampler.seed if s.sampler.seed is not None else u.cfg.random_seed
    if s.method == "grid":
        items = [{"params_json": json.dumps(p)} for p in grid_points(s.params)]
        sampler: optuna.samplers.BaseSampler = optuna.samplers.RandomSampler(seed=0)  # never asked: params fixed
        pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()
        dists: dict[str, ParamDistribution] = {}
    else:
        dists = param_distributions(s.params)
        sampler = _make_sampler(s.sampler.name, seed)
        pruner = optuna.pruners.HyperbandPruner(min_resource=s.min_epochs, max_resource=max_epochs,
                                                reduction_factor=s.reduction_factor)
        items = [{} for _ in range(int(s.n_trials or 0))]
    device = str(select_device(u.cfg.train.device))
    name = coord.phase_study_name(u.spec.study, u.name, "search", u.spec_hash, u.instance)
    study = coord.get_or_create_study(ctx.storage, name, "maximize" if maximize else "minimize", items,
                                      sampler, pruner)

    def reseed(number: int) -> None:
        if s.method == "hyperband":  # the draw of trial n depends on n only, whichever process runs it
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
        reported = set(coord.frozen_trial(study, trial.number).intermediate_values)

        def report(row: dict[str, Any]) -> bool:
            step, v = int(row["epoch"]), float(row[key])
            if step not in reported and math.isfinite(v):
                trial.report(v, step)
                reported.add(step)
            return trial.should_prune()

        with unit_lock(u, run.run_id):
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
            write_manifest(run_dir, run, device, {**run_manifest_extra(u), "search_trial": trial.number,
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

    st = coord.work_loop(study, ctx.storage, len(items), f"[{u.name}] search", work,
                         claim_lock=u.state_dir / "locks" / "claim-search.lock", exclusive=ctx.exclusive,
                         heartbeat_interval=ctx.heartbeat_interval, poll_s=ctx.poll_s,
                         on_status=lambda st: write_state(u, search=st.as_dict()), reseed=reseed, log=ctx.log)
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
               "retry_of": (t.system_attrs.get("retry_history") or [None])[-1]}
              for t in sorted(study.get_trials(deepcopy=False), key=lambda t: t.number) if "item" in t.user_attrs]
    write_json(u.state_dir / "selected.json", {
        "method": s.method, "metric": metric, "direction": "maximize" if maximize else "minimize",
        "best_trial": best.number, "best_value": best.value, "params": params,
        "trial_run_id": trial_run.run_id, "final_run_id": final_run.run_id, "final_config_hash": final_run.config_hash,
        "optuna_study": study.study_name, "trials": trials})
    ctx.log(f"[{u.name}] search done: best trial {best.number} {json.dumps(params)} "
            f"(validation {metric} {best.value:.6f}) -> {final_run.run_id}")
    return Selected(params, final_run, trial_run, float(best.value), best.number)
