"""``msb evaluate TARGET --external DATASET``: score trained fold checkpoints (or one run folder) on an external
dataset after the fact, with the fold ensemble; nothing is retrained or tuned.

Reads: the study's ``_study/<unit>/selected.json`` and fold run folders (or one run folder). Writes:
``evaluation/external/<name>/<role>/`` of every fold and of the ensemble folder.
"""

from __future__ import annotations

from pathlib import Path

from msb.config.layering import load_yaml
from msb.config.schema import RunConfig
from msb.config.study_spec import ExternalSpec
from msb.data.prepare import ensure_dataset
from msb.errors import MSBError
from msb.study.ensemble import ensemble_evaluation, ensemble_model_name, ensemble_run_id
from msb.study.external import evaluate_external, external_eval_dir, parse_class_map_option, resolve_external
from msb.study.manifest import read_json
from msb.study.units import StudyUnit, study_units
from msb.utils.progress import Logger, Tracker, no_log, no_track

__all__ = ["fold_run_dirs", "evaluate_study_external", "evaluate_external_cli"]


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
        ds = ensure_dataset(u.cfg, log)
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
