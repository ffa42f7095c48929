"""``msb evaluate``: reload a run's checkpoint (SHA-256 verified), predict, write counts and predictions."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from msb.cli.common import log
from msb.cli.format import FORMAT_HELP, print_scores, resolve_format, status_log, status_track
from msb.errors import MSBError


app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`


def _study_of_run_locked(run_dir: Path, log=log):
    """The study lock of the study folder holding run folder ``run_dir`` (``msb evaluate`` / ``msb metrics``
    never write into a run while a plain ``msb run`` of its study runs, nor two at once); a no-op context for a
    path that is not a run folder (the command's own check names it)."""
    import contextlib

    from msb.study.units import study_lock

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        return contextlib.nullcontext()
    return study_lock(run_dir.resolve().parent, wait=False, log=log)


@app.command()
def evaluate(run_dir: Path = typer.Argument(..., help="Run folder runs/<study>/<run_id> (with --external also a "
                                             "study YAML: every fold checkpoint + the fold ensemble)."),
             checkpoint: str = typer.Option("best", help="best | latest | both"),
             force: bool = typer.Option(False, help="Re-evaluate even if counts exist for this checkpoint."),
             external: Optional[str] = typer.Option(None, help="Evaluate on this other prepared dataset instead "
                                                    "(a name in configs/datasets/ or a prepared-dataset folder)."),
             class_map: Optional[List[str]] = typer.Option(None, help="With --external: MODEL_CLASS=EXT[,EXT...] "
                                                           "(ids or names; repeat per model class), e.g. 1=1,2."),
             split: Optional[str] = typer.Option(None, help="With --external: 'all' (default) or a split of its "
                                                 "index.csv."),
             run_root: Optional[str] = typer.Option(None, help="With a study YAML: override run_root."),
             selection: bool = typer.Option(False, "--selection", help="Evaluate on the run's "
                                            "checkpoint.selection_split instead, probabilities kept, into "
                                            "evaluation/selection/<role>/ (the threshold analysis's maps; in no "
                                            "leaderboard)."),
             format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP)) -> None:
    """Reload a checkpoint (SHA-256 verified), predict the test split, write counts and predictions."""
    from msb.analysis.counts.aggregate import reaggregate
    from msb.analysis.counts.counts_io import read_counts_with_report
    from msb.engine.runner import evaluate_run

    if checkpoint not in ("best", "latest", "both"):
        raise MSBError(f"--checkpoint must be best, latest or both, not '{checkpoint}'")
    roles = ["best", "latest"] if checkpoint == "both" else [checkpoint]
    fmt = resolve_format(format)
    log, track = status_log(fmt), status_track(fmt)  # stdout carries the scores table only unless fmt is table
    if selection and (external is not None or class_map or split):
        raise MSBError("--selection evaluates the run's own selection split; drop --external/--class-map/--split")
    if selection:
        from msb.study.selection_eval import evaluate_selection

        with _study_of_run_locked(run_dir, log):
            paths = evaluate_selection(run_dir, roles, track=track, log=log, force=force)
    elif external is not None:
        from msb.study.external_eval import evaluate_external_cli

        paths = evaluate_external_cli(run_dir, external, class_map or [], split, roles, run_root, track, log, force)
    elif class_map or split:
        raise MSBError("--class-map and --split apply to --external evaluations only; add --external DATASET")
    else:
        with _study_of_run_locked(run_dir, log):
            paths = evaluate_run(run_dir, roles, track=track, log=log, force=force)
    df, report = read_counts_with_report(paths)  # digests verified
    for note in report.notes:
        log(note)
    print_scores(reaggregate(df), fmt)
