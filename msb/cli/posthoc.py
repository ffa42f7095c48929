"""The post-hoc analyses from the command line: ``msb reaggregate STUDY --analyses rank_stability,calibration,threshold``
(:mod:`msb.analysis.report.posthoc_run`); the remaining names go on to the protocol analyses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Optional

from msb.errors import MSBError

__all__ = ["posthoc_analyses_cli"]


def posthoc_analyses_cli(paths: Sequence[Path], analyses: str, bootstrap: Optional[int], seed: Optional[int],
                         log: Callable[[str], None]) -> Optional[str]:
    """Run the post-hoc names of ``analyses`` on the one study folder in ``paths`` under the study's statistics
    setting (``--bootstrap`` / ``--seed`` override it for this command); return the other names (None if none).

    Raises:
        MSBError: not exactly one study folder; as :func:`~msb.analysis.report.posthoc_run.write_posthoc_analyses`.
    """
    from msb.analysis.report.posthoc_run import split_analysis_names, write_posthoc_analyses
    from msb.analysis.stats.setting import find_setting, with_overrides

    mine, rest = split_analysis_names(analyses)
    if not mine:
        return rest
    folders = [Path(p) for p in paths if Path(p).is_dir()]
    if len(folders) != 1 or len(paths) != 1:
        raise MSBError(f"--analyses needs one study folder (runs/<study>), got {[str(p) for p in paths]}")
    setting = with_overrides(find_setting(folders)[0], bootstrap, seed)
    write_posthoc_analyses(folders[0], mine, setting, log=log)
    return rest
