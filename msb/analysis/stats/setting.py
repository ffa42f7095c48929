"""Where a study's statistics setting (:class:`msb.config.analysis_schema.AnalysisConfig`) is kept and found.

``msb run`` writes the resolved ``analysis`` section of the study's configs to ``<study>/_study/analysis.json``
(:func:`write_setting`); ``msb reaggregate --compare`` and ``msb report`` read it back (:func:`find_setting`)
so that the three print the same CIs and p-values. A command's own ``--bootstrap`` / ``--seed`` override it for
that command only (:func:`with_overrides`); the printed setting line then shows the values used.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Optional

from msb.config.analysis_schema import AnalysisConfig
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text

__all__ = ["SETTING_FILE", "write_setting", "find_setting", "with_overrides"]

#: the recorded setting, relative to a study folder
SETTING_FILE = Path("_study") / "analysis.json"


def write_setting(study_dir: Path, setting: AnalysisConfig) -> Path:
    """Record ``setting`` as ``<study_dir>/_study/analysis.json`` (atomic write). Returns the path."""
    path = Path(study_dir) / SETTING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(setting.model_dump(mode="json"), indent=2) + "\n")
    return path


def find_setting(paths: Iterable[Path]) -> tuple[AnalysisConfig, Optional[Path]]:
    """The setting recorded for the study that holds ``paths`` (a study folder, a run folder or a counts file:
    the nearest ``_study/analysis.json`` in the path or above it), else the defaults of
    :class:`AnalysisConfig` (which equal the shipped ``configs/global.yaml``).

    Returns:
        (setting, the file it came from or None for the defaults).

    Raises:
        MSBError: a recorded setting is unreadable or invalid (names the file; rerun ``msb run`` to rewrite it).
    """
    for p in paths:
        p = Path(p).resolve()
        for folder in [p, *p.parents] if p.is_dir() else list(p.parents):
            f = folder / SETTING_FILE
            if f.is_file():
                try:
                    return AnalysisConfig.model_validate(json.loads(f.read_text())), f
                except (ValueError, OSError) as exc:
                    raise MSBError(f"{f}: unreadable statistics setting ({type(exc).__name__}); rerun msb run on "
                                   f"the study to rewrite it") from None
    return AnalysisConfig(), None


def with_overrides(setting: AnalysisConfig, bootstrap: Optional[int] = None,
                   seed: Optional[int] = None) -> AnalysisConfig:
    """``setting`` with a command's ``--bootstrap`` / ``--seed`` (None: keep the recorded value).

    Raises:
        MSBError: a negative ``bootstrap``.
    """
    if bootstrap is not None and (isinstance(bootstrap, bool) or bootstrap < 0):
        raise MSBError(f"--bootstrap must be a non-negative integer, got {bootstrap!r}")
    upd = {k: v for k, v in (("bootstrap", bootstrap), ("seed", seed)) if v is not None}
    return setting.model_copy(update=upd) if upd else setting
