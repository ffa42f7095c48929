"""The last step of ``msb run``: the study file's ``analyses`` key (docs/protocols.md).

With ``analyses:`` in the study file, ``msb run`` ends (after the scores) by

1. profiling the study's models when ``analyses.profile`` is set (:func:`msb.profiling.pipeline.run_profile`
   on the study folder: batch 1, the runs' training sizes; ``<study>/profile/profile_<device>.parquet``;
   skipped when that file already exists, delete it to measure again), then
2. writing the named protocol analyses (:func:`msb.analysis.protocol.write_protocol_analyses`) into
   ``<study>/protocol/`` (``tables/``, ``figures/``, ``data/``, ``skipped.json``), replaced as a whole.

Both read only stored artifacts (run folders, counts, checkpoints); nothing is retrained. The same outputs come
from ``msb profile --study runs/<study>`` and ``msb reaggregate runs/<study> --analyses all``.
"""

from __future__ import annotations

from pathlib import Path

from msb.config.analysis_schema import AnalysisConfig
from msb.config.generate import StudySpec
from msb.utils.progress import Logger, no_log

__all__ = ["run_declared_analyses", "study_setting"]


def run_declared_analyses(spec: StudySpec, study_dir: Path, log: Logger = no_log) -> list[Path]:
    """Profile (if asked) and write the protocol analyses a study file declares (module docstring).

    Args:
        spec: the study file's spec (``spec.analyses``; nothing happens when it is ``None``).
        study_dir: ``<run_root>/<study>``.
        log: line logger.

    Returns:
        The files written (profile tables first, ``protocol/skipped.json`` last); ``[]`` without ``analyses``.

    Raises:
        MSBError: an unknown analysis name, a profiling error (e.g. ``device: cuda`` without a GPU), damaged
            artifacts. A split-protocol refusal is logged and recorded in ``protocol/skipped.json`` instead.
    """
    a = spec.analyses
    if a is None:
        return []
    from msb.analysis.protocol import parse_analyses, write_protocol_analyses

    from msb.analysis.report.posthoc_run import split_analysis_names

    posthoc, rest = split_analysis_names(a.names)  # rank_stability, calibration, threshold (docs/analysis.md)
    names = parse_analyses(rest) if rest is not None or not posthoc else []  # an unknown name fails before the (slow) profiling
    written: list[Path] = []
    if a.profile is not None:
        prof = study_dir / "profile" / f"profile_{a.profile.device}.parquet"
        if prof.is_file():
            log(f"profile: {prof} exists, not measured again (delete it to re-measure)")
        else:
            from msb.profiling.pipeline import run_profile
            from msb.profiling.timing import TimingProtocol, protocol_defaults

            d = protocol_defaults(a.profile.device)
            p = TimingProtocol(d["warmup"] if a.profile.warmup is None else a.profile.warmup,
                               d["timed_passes"] if a.profile.timed_passes is None else a.profile.timed_passes,
                               d["repeats"] if a.profile.repeats is None else a.profile.repeats,
                               a.profile.batch_size, "fp32", True)
            log(f"profile: {p.warmup} warm-up + {p.repeats} x {p.timed_passes} timed passes, batch "
                f"{p.batch_size}, {a.profile.device}")
            res = run_profile(a.profile.device, (), study_dir, (), (p,), log=log)
            written += list(res.paths)
    if posthoc:
        from msb.analysis.report.posthoc_run import write_posthoc_analyses

        written += write_posthoc_analyses(study_dir, posthoc, log=log)
    if not names:
        return written
    opts = {"allow_mixed_protocols": a.allow_mixed_protocols, "seed": a.seed, "level": a.level,
            "n_boot": a.n_boot, "n_boot_resolution": a.n_boot, "efficiency_num_classes": a.efficiency_num_classes}
    out = write_protocol_analyses(study_dir, names, None, refusals_as_skips=True, **opts)
    written += out
    from msb.analysis.protocol.writers import log_skipped

    log_skipped(out[-1], log, prefix="analysis ")
    log(f"protocol analyses ({', '.join(names)}) written to {out[-1].parent}")
    return written


def study_setting(study: Path) -> AnalysisConfig:
    """The statistics setting of a study file: the ``analysis`` section its runs resolve from the config layers
    (``global.yaml``, then dataset, architecture and the study's ``overrides``).

    Raises:
        MSBError: the runs resolve different settings (a dataset or architecture config sets its own: a study has
            one setting; set it in ``global.yaml`` or the study's ``overrides``), or the study file is invalid.
    """
    import json

    from msb.config.generate import generate_runs
    from msb.errors import MSBError

    runs = generate_runs(study, [])
    found = {json.dumps(r.config.analysis.model_dump(mode="json"), sort_keys=True): r.run_id for r in runs}
    if len(found) > 1:
        raise MSBError(f"{study}: its runs resolve {len(found)} different `analysis` settings (e.g. "
                       f"{', '.join(list(found.values())[:2])}); a study has one statistics setting: set it in "
                       f"global.yaml or the study's overrides, not in a dataset or architecture config")
    return runs[0].config.analysis if runs else AnalysisConfig()
