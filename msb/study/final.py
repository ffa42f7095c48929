"""Phase 3 of a study: the final run(s), the fold ensemble and the manifests.

- Without cross-validation the final run is the best trial's run (or, with no search, the run config's run):
  trained (skipped when finished) and evaluated on the evaluation split and every external set. This is all a
  plain study does.
- With cross-validation every fold is (re-)evaluated (new external sets are added), then the strict-majority
  ensemble of the folds is built on every evaluation set they share (:mod:`msb.study.ensemble`, folder
  ``<selected run id>-ensemble``).
- Manifests: ``_study/<unit>/manifest.json`` (settings, selection, folds, run folders and their checkpoint
  SHA-256s, ensemble, external sets, counts files, versions) and ``_study/manifest.json`` (the units).

Reads: run folders (records, splits, stored predictions). Writes: the ensemble folder, the manifests,
``state.json``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from msb.engine.runner import RunOutcome, train_run, write_manifest
from msb.data.schema import PreparedDataset
from msb.models.checkpoint import read_records
from msb.study.crossval import fold_run
from msb.study.ensemble import ensemble_evaluation, ensemble_model_name, ensemble_run_id
from msb.study.evaluate import evaluate_final, internal_eval_enabled, run_manifest_extra
from msb.study.external import external_eval_dir
from msb.study.manifest import package_versions, read_json, safe_url, write_json
from msb.study.search import Selected
from msb.study.units import StudyContext, StudyUnit, unit_lock, write_state
from msb.utils.device import select_device
from msb.utils.hashing import sha256_file

__all__ = ["final_single", "finalize_folds", "write_unit_manifest", "write_study_manifest"]


def final_single(u: StudyUnit, sel: Selected, ds: PreparedDataset, ctx: StudyContext) -> RunOutcome:
    """Train (or resume) and evaluate the unit's one final run; write its manifest and the unit manifest.

    Raises:
        MSBError: training, data or evaluation errors.
    """
    run = sel.trial_run or sel.final_run
    run_dir = u.root / run.run_id
    with unit_lock(u, "finalize"):
        with unit_lock(u, run.run_id):
            res = train_run(run, run_dir, ds, ctx.track, ctx.log)
            paths = evaluate_final(u, run_dir, ds, ctx)
            write_manifest(run_dir, run, str(select_device(u.cfg.train.device)), run_manifest_extra(u))
        outcome = RunOutcome(run.run_id, run_dir, res, paths)
        write_unit_manifest(u, sel, ctx, None, [run_dir], [outcome], None)
    return outcome


def _eval_sets(u: StudyUnit) -> list[tuple[str, Callable[[Path, str], Path]]]:
    """(label, folder-of(run_dir, role)) of every evaluation set shared by all folds (ensemble targets)."""
    out: list[tuple[str, Callable[[Path, str], Path]]] = []
    if internal_eval_enabled(u) and u.cfg.evaluation.split == "test":
        out.append(("test", lambda d, r: d / "evaluation" / r))
    for ext in u.externals:
        out.append((ext.name, lambda d, r, n=ext.name: external_eval_dir(d, n, r)))
    return out


def finalize_folds(u: StudyUnit, sel: Selected, ds: PreparedDataset, ctx: StudyContext, folds_sha: str
                   ) -> list[RunOutcome]:
    """Evaluate every fold (skipped when done), build the fold ensemble, write the manifests.

    Returns:
        One :class:`RunOutcome` per fold, then the ensemble's (when built).
    """
    cv = u.spec.cross_validation
    assert cv is not None
    outcomes = []
    device = str(select_device(u.cfg.train.device))
    fold_dirs = []
    with unit_lock(u, "finalize"):
        for j in range(cv.k):
            run = fold_run(sel, j, cv.inner_val is not None)
            run_dir = u.root / run.run_id
            with unit_lock(u, run.run_id):
                paths = evaluate_final(u, run_dir, ds, ctx)  # skipped when done; new external sets are added
                write_manifest(run_dir, run, device, run_manifest_extra(u, j, folds_sha))
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
                members_hash = fold_run(sel, 0, cv.inner_val is not None).config_hash  # the folds' config
                write_json(ens_dir / "manifest.json", {**ens_info, "config_hash": members_hash,
                                                       "folds_sha256": folds_sha, "spec_hash": u.spec_hash,
                                                       "versions": package_versions(), "device": device})
                outcomes.append(RunOutcome(ens_id, ens_dir, None, paths))
        write_unit_manifest(u, sel, ctx, folds_sha, fold_dirs, outcomes, ens_info)
    return outcomes


def write_unit_manifest(u: StudyUnit, sel: Selected, ctx: StudyContext, folds_sha: str | None,
                        run_dirs: list[Path], outcomes: list[RunOutcome], ens_info: dict[str, Any] | None) -> None:
    """``_study/<unit>/manifest.json`` (module docstring) and ``state.json`` phase ``done``."""
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
        "storage": safe_url(ctx.url) if ctx.url else None, "base_config_hash": u.base.config_hash,
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
    write_state(u, phase="done")


def write_study_manifest(units: list[StudyUnit], url: str | None) -> None:
    """``_study/manifest.json``: the study file, storage URL (no password) and each unit manifest's SHA-256."""
    if not units:
        return
    root = units[0].root
    write_json(root / "_study" / "manifest.json", {
        "study": units[0].spec.study, "study_file": str(units[0].study_file),
        "storage": safe_url(url) if url else None,
        "units": {u.name: {"manifest": str((u.state_dir / "manifest.json").relative_to(root)),
                           "sha256": sha256_file(u.state_dir / "manifest.json")}
                  for u in units if (u.state_dir / "manifest.json").is_file()}})
