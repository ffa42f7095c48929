"""``msb reaggregate``: scores (and with ``--bootstrap``/``--compare`` CIs and tests) from stored counts, no inference."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import List, Optional

import typer

from msb.cli.common import console, err_console, log
from msb.cli.format import FORMAT_HELP, print_scores as _print_scores, resolve_format
from msb.cli.protocol import ANALYSES_HELP, protocol_analyses_cli


app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`


@app.command()
def reaggregate(paths: List[Path] = typer.Argument(..., help="counts.parquet files or folders holding them."),
                out: Optional[Path] = typer.Option(None, help="Folder for scores.csv/.parquet (default: none)."),
                pool: bool = typer.Option(False, help="Pool runs/folds: group by dataset, split, model, role only."),
                by_threshold: bool = typer.Option(False, "--by-threshold",
                                                  help="Score each threshold / threshold_on separately instead of "
                                                       "refusing to pool rows that differ in them."),
                rules: Optional[str] = typer.Option(None, help="Comma-separated aggregation rules (default: the basic "
                                                               "three); 'all' adds image-class-mean, image-foreground, "
                                                               "pooled-foreground, pooled-class (docs/analysis.md)."),
                population: Optional[List[str]] = typer.Option(None, help="Also score a sub-population, predictions "
                                                                          "fixed: source:A,B | ids:FILE | "
                                                                          "flag:FILE[:COLUMN] (repeatable)."),
                bootstrap: Optional[int] = typer.Option(None, help="Image-level percentile bootstrap replicates "
                                                          "for CIs (default: none; with --compare the study's "
                                                          "statistics setting, _study/analysis.json)."),
                compare: bool = typer.Option(False, help="Compare systems: paired Wilcoxon (BH), paired bootstrap "
                                                         "differences, Friedman, ranking sensitivity."),
                seed: Optional[int] = typer.Option(None, help="Bootstrap seed (default: the study's statistics "
                                                              "setting, else 0)."),
                system_by: str = typer.Option("run", help="What --compare compares: run | model."),
                posthoc: str = typer.Option("nemenyi", help="With --compare, >= 3 systems: post-hoc test after "
                                                            "Friedman, nemenyi | conover."),
                format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP),
                analyses: Optional[str] = typer.Option(None, help=ANALYSES_HELP + " Post-hoc (docs/analysis.md): "
                                                   "rank_stability, calibration, threshold. Needs one study folder."),
                allow_mixed_protocols: bool = typer.Option(False, "--allow-mixed-protocols",
                                                           help="Let --analyses rank rows of different split policies.")
                ) -> None:
    """Dice, IoU, precision, recall under global-micro, image-macro and class-macro from stored counts."""
    from msb.analysis.counts.aggregate_core import DEFAULT_GROUP, POOL_FOLDS_GROUP

    fmt = resolve_format(format)
    if analyses is not None:  # rank_stability, calibration, threshold: post-hoc analyses of stored artifacts
        analyses = _posthoc_analyses(paths, analyses, bootstrap, seed, log)
        if analyses is None and not compare:
            return
    if analyses is not None and not compare:  # only the protocol analyses of one study folder
        protocol_analyses_cli(paths, analyses, out, allow_mixed_protocols, seed or 0, bootstrap or 0, console.print,
                              log)
        return
    extended = rules is not None or population or bootstrap or compare
    group = POOL_FOLDS_GROUP if pool else DEFAULT_GROUP
    if by_threshold:
        group = (*group, "threshold", "threshold_on")
    if not extended:  # the columnar path (no pandas); None: something to report or resolve, the pandas path below
        from msb.analysis.counts.reaggregate_fast import fast_reaggregate

        fast = fast_reaggregate(paths, group)
        if fast is not None:
            for note in fast.notes:
                log(note) if fmt == "table" else err_console.print(note, highlight=False, markup=False, soft_wrap=True)
            if fmt == "csv":
                console.print(fast.wide_csv(), highlight=False, markup=False, soft_wrap=True, end="")
            else:
                _print_scores(fast.to_frame(), fmt)
            if out is not None:
                log(f"written: {', '.join(str(p) for p in fast.write(out))}")
            return
    from msb.analysis.counts.aggregate import reaggregate as _reagg, write_scores
    from msb.analysis.counts.counts_io import read_counts_with_report

    # the basic table needs no hash, name or source column: columnar read of the others (docs/performance.md)
    df, report = read_counts_with_report(paths, None if extended else ["model"])
    for note in report.notes:  # on stderr when stdout carries data (csv / json / markdown)
        log(note) if fmt == "table" else err_console.print(note, highlight=False, markup=False, soft_wrap=True)
    if extended:
        from msb.analysis.stats.compare import run_extended
        from msb.analysis.stats.setting import find_setting, with_overrides

        setting, source = find_setting(paths)  # one statistics setting: the study's, as msb run and msb report use
        # without --compare and --bootstrap no CIs (as before); --bootstrap / --seed override for this command only
        setting = with_overrides(setting, 0 if bootstrap is None and not compare else bootstrap, seed)
        if compare and source is not None:
            log(f"statistics setting from {source}" + (" (overridden by --bootstrap/--seed)"
                                                       if bootstrap is not None or seed is not None else ""))
        run_extended(df, group, rules, population or [], setting.bootstrap, compare, setting.seed, system_by, out,
                     console.print, log, posthoc, setting)
        if analyses is not None:
            protocol_analyses_cli(paths, analyses, None, allow_mixed_protocols, setting.seed, setting.bootstrap,
                                  console.print, log)
        return
    table = _reagg(df, group_by=group)
    _print_scores(table, fmt)
    if out is not None:
        written = write_scores(table, out)
        log(f"written: {', '.join(str(p) for p in written)}")


def _posthoc_analyses(paths: Sequence[Path], analyses: str, bootstrap: Optional[int], seed: Optional[int],
                      log: Callable[[str], None]) -> Optional[str]:
    """Run the post-hoc names of ``analyses`` on the one study folder in ``paths`` under the study's statistics
    setting (``--bootstrap`` / ``--seed`` override it for this command); return the other names (None if none).

    Raises:
        MSBError: not exactly one study folder; as :func:`~msb.analysis.report.posthoc_run.write_posthoc_analyses`.
    """
    from msb.analysis.report.posthoc_run import split_analysis_names, write_posthoc_analyses
    from msb.analysis.stats.setting import find_setting, with_overrides
    from msb.errors import MSBError

    mine, rest = split_analysis_names(analyses)
    if not mine:
        return rest
    folders = [Path(p) for p in paths if Path(p).is_dir()]
    if len(folders) != 1 or len(paths) != 1:
        raise MSBError(f"--analyses needs one study folder (runs/<study>), got {[str(p) for p in paths]}")
    setting = with_overrides(find_setting(folders)[0], bootstrap, seed)
    write_posthoc_analyses(folders[0], mine, setting, log=log)
    return rest
