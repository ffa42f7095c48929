"""Evaluation of one trained run folder of a study: the internal test split and every external set.

Reads: the run folder (``config.yaml``, checkpoints), the prepared datasets. Writes (through
:mod:`msb.engine.runner` and :mod:`msb.study.external`): ``evaluation/<role>/`` and
``evaluation/external/<name>/<role>/`` (counts, predictions, metrics, ``DONE``), and ``evaluation/selection/<role>/``
when the study asks for the threshold analysis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from msb.data.schema import PreparedDataset
from msb.engine.runner import evaluate_run
from msb.study.external import evaluate_external
from msb.study.selection_eval import evaluate_selection, wants_selection_maps
from msb.study.units import StudyContext, StudyUnit

__all__ = ["internal_eval_enabled", "evaluate_final", "run_manifest_extra"]


def internal_eval_enabled(u: StudyUnit) -> bool:
    """False when the folds cover the test split (``cross_validation.include_test`` with
    ``evaluation.split: test``): every test image was trained on by some fold, so none is scored internally."""
    cv = u.spec.cross_validation
    return not (cv is not None and cv.include_test and u.cfg.evaluation.split == "test")


def evaluate_final(u: StudyUnit, run_dir: Path, ds: PreparedDataset, ctx: StudyContext) -> list[Path]:
    """Evaluate the unit's checkpoint roles of ``run_dir`` on the evaluation split (unless
    :func:`internal_eval_enabled` says no) and on every external set; finished evaluations are skipped. When the
    study's ``analyses:`` names ``threshold``, also on the selection split with probabilities kept
    (:mod:`msb.study.selection_eval`; not in the returned paths).

    Returns:
        The counts paths written or found (internal first, then external sets in declaration order).

    Raises:
        MSBError: missing checkpoints, data or class-map errors.
    """
    paths: list[Path] = []
    if internal_eval_enabled(u):
        paths += evaluate_run(run_dir, u.roles(), ds, ctx.track, ctx.log)
        if wants_selection_maps(u.spec.analyses.names if u.spec.analyses else None):
            # the threshold analysis's selection-split maps; their counts are not returned (no leaderboard)
            evaluate_selection(run_dir, u.roles(), ds, ctx.track, ctx.log, strict=False)
    for ext in u.externals:
        paths += evaluate_external(run_dir, u.roles(), ext, ds, ctx.track, ctx.log)
    return paths


def run_manifest_extra(u: StudyUnit, fold: int | None = None, folds_sha: str | None = None) -> dict[str, Any]:
    """Study keys added to a run folder's ``manifest.json``: unit, spec hash, fold and external sets."""
    out: dict[str, Any] = {"study_unit": u.name, "spec_hash": u.spec_hash}
    if fold is not None:
        out.update({"fold": fold, "folds_sha256": folds_sha})
    if u.externals:
        out["external"] = [e.describe() for e in u.externals]
    return out
