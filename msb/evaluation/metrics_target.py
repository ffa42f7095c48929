"""What ``msb metrics TARGET`` computes metrics for: the evaluation folders of a run, of a fold ensemble, or
one evaluation folder inside either (an external set ``evaluation/external/<name>``, or one role below it).

Owners (the folder that says how the predictions were made):

* a **run folder** ``runs/<study>/<run_id>/``: holds ``config.yaml``; its metric settings are
  ``evaluation.metrics`` of that config;
* an **ensemble folder** ``runs/<study>/<run_id>-ensemble/`` (:mod:`msb.study.ensemble`): holds
  ``manifest.json`` with ``members`` (the fold run ids) and no ``config.yaml``; its metric settings are those of
  its first member's ``config.yaml`` (the folds share one evaluation config). Without a readable manifest the
  members are taken from the first ``evaluation/**/ensemble.json``.

An evaluation folder is a folder with ``predictions/`` (and ``counts.parquet``): ``evaluation/<role>``,
``evaluation/external/<name>/<role>``. ``TARGET`` = an owner gives every evaluation folder below its
``evaluation/``; ``TARGET`` inside ``<owner>/evaluation/`` gives the evaluation folders at or below it. This
module reads artifacts only (no study or training code).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from msb.config.layering import load_yaml
from msb.config.schema import RunConfig
from msb.errors import MSBError

__all__ = ["MetricsTarget", "resolve_metrics_target", "evaluation_dirs"]


@dataclass(frozen=True)
class MetricsTarget:
    """Resolved ``msb metrics`` target.

    Attributes:
        owner: the run or ensemble folder.
        kind: ``"run"`` or ``"ensemble"``.
        config: the run config whose ``evaluation.metrics`` applies (an ensemble's first member's).
        config_file: where ``config`` was read.
        eval_dirs: the evaluation folders to compute (sorted, each holding ``predictions/``).
    """

    owner: Path
    kind: str
    config: RunConfig
    config_file: Path
    eval_dirs: tuple[Path, ...]


def evaluation_dirs(folder: Path) -> list[Path]:
    """Folders at or below ``folder`` that hold a ``predictions/`` folder (hidden staging folders skipped),
    sorted."""
    folder = Path(folder)
    found = [p.parent for p in folder.rglob("predictions") if p.is_dir()
             and not any(part.startswith(".") for part in p.relative_to(folder).parts)]
    return sorted(set(found))


def _ensemble_members(owner: Path) -> list[str] | None:
    """Member run ids of an ensemble folder, or ``None`` when ``owner`` is not one."""
    if (owner / "config.yaml").is_file():
        return None
    manifest = owner / "manifest.json"
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and isinstance(data.get("members"), list) and data["members"]:
            return [str(m) for m in data["members"]]
    for ens in sorted((owner / "evaluation").rglob("ensemble.json")) if (owner / "evaluation").is_dir() else []:
        try:
            members = json.loads(ens.read_text()).get("members") or []
            # member dirs are <fold run>/evaluation/<role> or <fold run>/evaluation/external/<name>/<role>
            return [next(p.name for p in Path(m["dir"]).parents if p.parent == owner.parent) for m in members]
        except (OSError, ValueError, AttributeError, KeyError, TypeError, StopIteration):
            continue
    return None


def _owner_of(path: Path) -> tuple[Path, str] | None:
    for p in (path, *path.parents):
        if (p / "config.yaml").is_file():
            return p, "run"
        if _ensemble_members(p) is not None:
            return p, "ensemble"
    return None


def resolve_metrics_target(path: str | Path) -> MetricsTarget:
    """Resolve ``msb metrics PATH`` (module docstring).

    Args:
        path: a run folder, an ensemble folder, or a folder inside ``<owner>/evaluation/``.

    Returns:
        The :class:`MetricsTarget`.

    Raises:
        MSBError: no owner at or above ``path``; ``path`` inside the owner but outside its ``evaluation/``;
            an ensemble whose member config is missing; no ``predictions/`` at or below the target.
    """
    path = Path(path)
    if not path.is_dir():
        raise MSBError(f"{path}: not found; give a run folder runs/<study>/<run_id>, an ensemble folder "
                       f"runs/<study>/<run_id>-ensemble, or an evaluation folder inside one")
    found = _owner_of(path.resolve())
    if found is None:
        raise MSBError(f"{path}: not a run folder (no config.yaml), not an ensemble folder (no manifest.json with "
                       f"members) and not inside one; give runs/<study>/<run_id>, runs/<study>/<run_id>-ensemble or "
                       f"a folder under their evaluation/ (e.g. evaluation/external/<name>)")
    owner, kind = found
    resolved = path.resolve()
    if resolved != owner and (owner / "evaluation") not in (resolved, *resolved.parents):
        raise MSBError(f"{path}: inside {owner} but not under its evaluation/ folder; give {owner} or a folder "
                       f"under {owner / 'evaluation'}")
    if kind == "run":
        cfg_file = owner / "config.yaml"
    else:
        members = _ensemble_members(owner) or []
        cfg_file = owner.parent / members[0] / "config.yaml"
        if not cfg_file.is_file():
            raise MSBError(f"{owner}: ensemble folder whose first member's config {cfg_file} is missing; the metric "
                           f"settings come from it (restore the fold run folder {members[0]})")
    cfg = RunConfig.model_validate(load_yaml(cfg_file))
    dirs = evaluation_dirs(owner / "evaluation" if resolved == owner else resolved)
    if not dirs:
        raise MSBError(f"{path}: no evaluation folder with predictions/ at or below it; run the evaluation with "
                       f"prediction saving enabled first")
    return MetricsTarget(owner, kind, cfg, cfg_file, tuple(dirs))
