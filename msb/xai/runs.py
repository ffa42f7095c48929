"""Finding the run folders to explain and grouping the k folds of one model.

A path is a run folder (it holds ``config.yaml``) or a study folder (its direct sub-folders holding
``config.yaml``). In a study folder that holds cross-validation fold runs (a ``fold.json``, written by
:mod:`msb.study`: run folders ``<selected run id>-fold<j>``), only the fold runs are taken: search trials are
skipped (they are counted in :class:`RunSelection`). Run folders named explicitly are always taken.

Runs are grouped by (folder name without a trailing ``-fold<j>``, config hash): the k folds of one
cross-validation share the selected run id and the resolved config (only ``split.csv`` differs), so they form one
group and their CAMs are averaged ("fold average"); any other run is a group of its own unless an identical
config ran under the same name elsewhere.

The fold index of a run is read, in this order, from ``fold.json`` (``fold``), a ``fold`` key anywhere in
``config.yaml``, ``manifest.json`` (``fold``), or the ``fold`` column of its ``evaluation/*/counts.parquet``;
negative values and absent keys mean "not a fold run" (``None``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from msb.config.layering import load_yaml
from msb.config.schema import RunConfig
from msb.errors import MSBError
from msb.utils.hashing import sha256_json

__all__ = ["ExplainRun", "RunSelection", "find_runs", "group_runs"]

_FOLD_SUFFIX = re.compile(r"-fold\d+$")


@dataclass(frozen=True)
class ExplainRun:
    """One run folder: path, validated config, fold index (``None`` when not a fold run), group label and
    config hash (``config.sha256``, or the SHA-256 of the config's canonical JSON when that file is absent)."""

    run_dir: Path
    config: RunConfig
    fold: int | None
    label: str
    config_hash: str


@dataclass
class RunSelection:
    """The runs found and how many search-trial runs of study folders were skipped."""

    runs: list[ExplainRun] = field(default_factory=list)
    skipped_trials: int = 0


def _find_key(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        v = obj.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        for v in obj.values():
            found = _find_key(v, key)
            if found is not None:
                return found
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except ValueError:
        return None


def _fold_of(run_dir: Path, raw_cfg: dict[str, Any]) -> int | None:
    for source in (_read_json(run_dir / "fold.json"), raw_cfg, _read_json(run_dir / "manifest.json")):
        fold = _find_key(source, "fold")
        if fold is not None:
            return int(fold) if fold >= 0 else None
    for counts in sorted((run_dir / "evaluation").glob("*/counts.parquet")):
        import pandas as pd

        try:
            vals = pd.read_parquet(counts, columns=["fold"])["fold"].unique()
        except Exception:  # an unreadable counts file does not decide the fold
            continue
        if len(vals) == 1 and int(vals[0]) >= 0:
            return int(vals[0])
    return None


def _load_run(run_dir: Path) -> ExplainRun:
    raw = load_yaml(run_dir / "config.yaml")
    try:
        cfg = RunConfig.model_validate(raw)
    except Exception as exc:  # pydantic ValidationError
        raise MSBError(f"{run_dir / 'config.yaml'}: not a valid run config ({str(exc).splitlines()[0]}); "
                       f"regenerate it with msb generate") from exc
    sha_file = run_dir / "config.sha256"
    chash = sha_file.read_text().strip() if sha_file.is_file() else sha256_json(raw)
    return ExplainRun(run_dir, cfg, _fold_of(run_dir, raw), _FOLD_SUFFIX.sub("", run_dir.name), chash)


def find_runs(paths: Sequence[str | Path]) -> RunSelection:
    """Run folders named by ``paths`` (run folders or study folders), de-duplicated, in argument order.

    Raises:
        MSBError: no path; a path that does not exist; a folder that is neither a run folder nor holds any.
    """
    if not paths:
        raise MSBError("give at least one run folder (runs/<study>/<run_id>) or study folder (runs/<study>)")
    sel = RunSelection()
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.is_dir():
            raise MSBError(f"{p}: run folder not found; give runs/<study>/<run_id> or a study folder runs/<study>")
        if (p / "config.yaml").is_file():
            dirs = [p]
        else:
            dirs = sorted(d for d in p.iterdir() if (d / "config.yaml").is_file())
            if not dirs:
                raise MSBError(f"{p}: neither a run folder (no config.yaml) nor a study folder (no sub-folder "
                               f"with config.yaml)")
            folds = [d for d in dirs if (d / "fold.json").is_file()]
            if folds:
                sel.skipped_trials += len(dirs) - len(folds)
                dirs = folds
        for d in dirs:
            key = d.resolve()
            if key not in seen:
                seen.add(key)
                sel.runs.append(_load_run(d))
    return sel


def group_runs(runs: Sequence[ExplainRun]) -> dict[str, list[ExplainRun]]:
    """Runs grouped by (label, config hash) in first-seen order, keyed by the label (plus ``-<hash8>`` when two
    groups share a label); each group sorted by fold, then folder name."""
    keyed: dict[tuple[str, str], list[ExplainRun]] = {}
    for r in runs:
        keyed.setdefault((r.label, r.config_hash), []).append(r)
    labels = [k[0] for k in keyed]
    out: dict[str, list[ExplainRun]] = {}
    for (label, chash), group in keyed.items():
        group.sort(key=lambda r: (r.fold if r.fold is not None else 1 << 30, r.run_dir.name))
        out[label if labels.count(label) == 1 else f"{label}-{chash[:8]}"] = group
    return out
