"""The published protocols' analyses as functions of a study's stored artifacts, and their one entry point.

MSB case study (MedSegBenchmarker, §4): ``ranking_sensitivity`` (G/I/C, Table 2), ``resolution_delta`` (paired
ΔDSC with fold-stratified bootstrap CIs, Figure 3), ``efficiency`` (Table 3, from ``msb profile`` tables),
``external_transfer`` (folds + strict-majority ensemble on an external set, Figure 4).
Polyp audit ("Metrics or Mirage?"): ``p1``, ``p2``, ``p3`` (Tables 3, 4, 6), ``lesion`` (Table 5 + IoU
robustness), ``wilcoxon`` (BH-corrected paired tests with rank-biserial effect sizes and bootstrap CIs),
``checklist`` (the five-point PSRC). docs/protocols.md, section "Analyses".
Semi-supervised cards: ``semi_supervised`` (methods x labelled fractions x seeds, paired differences against
supervised-only; :mod:`msb.analysis.protocol.semi_supervised`, docs/semi_supervised.md).

:func:`write_protocol_analyses` finds the artifacts (:func:`~msb.analysis.protocol.inputs.load_study`), runs the
named analyses, and writes ``tables/<name>.csv|tex|md``, ``figures/<name>.png|svg``, ``data/<name>.csv`` (tidy
numbers) and ``skipped.json`` (analyses whose inputs are missing, each with a one-line reason) into ``out_dir``,
which is built beside its destination and swapped in whole (:func:`msb.utils.atomic.replace_dir`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from msb.analysis.protocol import (checklist, efficiency, lesion_detection, polyp, ranking_gic, resolution,
                                   transfer, wilcoxon)
from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable
from msb.analysis.protocol.inputs import StudyArtifacts, load_study
from msb.analysis.protocol.writers import write_figure, write_frame, write_table
from msb.analysis.protocol.semi_supervised import run as semi_supervised_run
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text, current_umask, replace_dir

__all__ = ["ANALYSES", "AnalysisOutput", "AnalysisSkipped", "PaperTable", "StudyArtifacts", "load_study",
           "parse_analyses", "run_analyses", "write_outputs", "write_protocol_analyses"]

#: Analysis name -> function ``(StudyArtifacts, options) -> AnalysisOutput`` (raises AnalysisSkipped).
ANALYSES: dict[str, Callable[[StudyArtifacts, dict], AnalysisOutput]] = {
    "ranking_sensitivity": ranking_gic.run,
    "resolution_delta": resolution.run,
    "efficiency": efficiency.run,
    "external_transfer": transfer.run,
    "p1": polyp.run_p1,
    "p2": polyp.run_p2,
    "p3": polyp.run_p3,
    "lesion": lesion_detection.run,
    "wilcoxon": wilcoxon.run,
    "checklist": checklist.run,
    "semi_supervised": semi_supervised_run,
}


def parse_analyses(text: str | Sequence[str] | None) -> list[str]:
    """Analysis names from ``"a,b"`` or a list; ``None``/``"all"`` = every analysis of :data:`ANALYSES`.

    Raises:
        MSBError: an unknown name (the known ones are listed).
    """
    if text is None:
        return list(ANALYSES)
    items = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    if items in (["all"], []):
        return list(ANALYSES)
    bad = [a for a in items if a not in ANALYSES]
    if bad:
        raise MSBError(f"unknown protocol analysis {bad}; choose from {list(ANALYSES)} or 'all'")
    return list(dict.fromkeys(items))


def run_analyses(art: StudyArtifacts, analyses: Sequence[str], options: dict | None = None,
                 refusals_as_skips: bool = False) -> tuple[dict[str, AnalysisOutput], dict[str, str]]:
    """Run analyses on loaded artifacts.

    Args:
        art: the study's artifacts.
        analyses: names (:data:`ANALYSES`).
        options: ``allow_mixed_protocols`` (bool), ``n_boot`` (Wilcoxon bootstrap, default 1000),
            ``n_boot_resolution`` (default 1000), ``seed`` (0), ``level`` (0.95), ``sizes`` ((small, big) px),
            ``i_rule`` (``image-foreground``), ``lesion_sets`` (datasets), ``p3_all_sets`` (bool).
        refusals_as_skips: record a protocol refusal (MSBError) as a skip instead of raising it (the report).

    Returns:
        ``(outputs by name, skipped: name -> one-line reason)``.

    Raises:
        MSBError: mixed split protocols (unless allowed or ``refusals_as_skips``), damaged artifacts.
    """
    options = dict(options or {})
    outputs, skipped = {}, {}
    for name in parse_analyses(list(analyses)):
        try:
            outputs[name] = ANALYSES[name](art, options)
            if name == "wilcoxon":  # the checklist's significance item reuses these tests
                options["wilcoxon_tests"] = outputs[name].data["wilcoxon"]
        except AnalysisSkipped as e:
            skipped[name] = str(e)
        except MSBError as e:
            if not refusals_as_skips:
                raise
            skipped[name] = f"refused: {e}"
    return outputs, skipped


def write_outputs(outputs: dict[str, AnalysisOutput], skipped: dict[str, str], out_dir: Path) -> list[Path]:
    """Write every table, figure, tidy frame and ``skipped.json`` of :func:`run_analyses` into ``out_dir``
    (file by file, atomically). Returns the paths written."""
    paths: list[Path] = []
    notes = {}
    for name, o in outputs.items():
        for t in o.tables:
            paths += write_table(t, out_dir / "tables")
        for fname, fig, _ in o.figures:
            paths += write_figure(fig, fname, out_dir / "figures")
        for dname, df in o.data.items():
            paths.append(write_frame(df, dname, out_dir / "data"))
        if o.notes:
            notes[name] = o.notes
    p = out_dir / "skipped.json"
    atomic_write_text(p, json.dumps({"skipped": skipped, "notes": notes}, indent=2, ensure_ascii=False) + "\n")
    return [*paths, p]


def write_protocol_analyses(study_dir: Path, analyses: Sequence[str] = tuple(ANALYSES), out_dir: Path | None = None,
                            refusals_as_skips: bool = False, **options) -> list[Path]:
    """Run the named protocol analyses on a study's stored artifacts and write their tables and figures.

    Args:
        study_dir: ``runs/<study>``.
        analyses: names of :data:`ANALYSES` (default all).
        out_dir: destination folder (default ``study_dir/protocol``), replaced as a whole when complete.
        refusals_as_skips: record a protocol refusal in ``skipped.json`` (``refused: ...``) instead of raising
            (``msb run`` with ``analyses:``, so that a finished study does not end with an error).
        **options: as :func:`run_analyses` (e.g. ``allow_mixed_protocols=True``, ``n_boot=1000``, ``seed=0``).

    Returns:
        The files written (final paths), ``skipped.json`` last.

    Raises:
        MSBError: unknown analysis; no counts below ``study_dir``; mixed split protocols (unless
            ``allow_mixed_protocols``); damaged artifacts. Nothing is written then.
    """
    study_dir = Path(study_dir)
    out_dir = Path(out_dir) if out_dir is not None else study_dir / "protocol"
    names = parse_analyses(list(analyses))
    art = load_study(study_dir, exclude=(out_dir,))
    outputs, skipped = run_analyses(art, names, options, refusals_as_skips)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    os.chmod(tmp, 0o777 & ~current_umask())
    try:
        written = write_outputs(outputs, skipped, tmp)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out_dir / p.relative_to(tmp) for p in written]
