"""``msb generate`` and ``msb run``: a study's hashed run configs, and the whole pipeline (generate -> train -> evaluate -> reaggregate -> declared analyses) ending with the leaderboard; ``msb submit`` / ``msb status``: the same pipeline as a Slurm job array of workers, and where it stands (:mod:`msb.cluster`)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from msb.cli.common import console, log, track
from msb.cli.format import FORMAT_HELP, print_leaderboards as _print_leaderboards, print_scores as _print_scores, resolve_format


app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`


@app.command()
def generate(study: Path = typer.Argument(..., help="Study YAML (e.g. configs/study.yaml)."),
             run_root: Optional[str] = typer.Option(None, help="Override run_root (default: from config).")) -> None:
    """Merge the config layers into one explicit, hashed run config per dataset x architecture."""
    from msb.config.generate import generate_runs, write_run_config
    from msb.engine.runner import study_dir

    excluded: list = []  # an architecture that cannot run a size of the input-size axis (docs/protocols.md)
    runs = generate_runs(study, excluded)
    for e in excluded:
        log(f"excluded {e['unit']}: {e['reason']}")
    table, written = Table(title=f"runs of {study}"), []
    for col in ("run_id", "dataset", "architecture", "config_hash", "folder"):
        table.add_column(col)
    for r in runs:
        cfg = r.config if run_root is None else r.config.model_copy(update={"run_root": run_root})
        folder = study_dir(cfg) / r.run_id
        write_run_config(r, folder)
        table.add_row(r.run_id, r.dataset, r.architecture, r.config_hash[:16], str(folder))
        written.append(folder)
    console.print(table)
    log(plan_size_line(study, runs, excluded))
    if written:
        log(f"wrote {len(written)} config-only run folder(s) (config.yaml, config.sha256) under "
            f"{written[0].parent}; `msb run {study}` trains them, `msb report` lists them as generated, not run "
            f"until then; to remove them: rm -r {' '.join(str(w) for w in written)}")


def plan_size_line(study: Path, runs: list, excluded: list) -> str:
    """``run plan: U units, T trainings (...), E excluded``: units = generated run configs (dataset x architecture
    x axis values), trainings per unit = search trials (grid points, or Hyperband's n_trials) + K folds (or 1
    final run without cross-validation); ``excluded`` = exclusion records (:func:`msb.config.generate.generate_runs`).
    """
    from msb.config.generate import load_study
    from msb.config.study_spec import grid_points

    spec, _ = load_study(study)
    s = spec.search
    trials = 0 if s is None or s.method == "none" else (len(grid_points(s.params)) if s.method == "grid"
                                                         else int(s.n_trials or 0))
    final = spec.cross_validation.k if spec.cross_validation else 1
    excl_archs = sorted({e["architecture"] for e in excluded})
    return (f"run plan: {len(runs)} units, {len(runs) * (trials + final)} trainings ({trials} search trial(s) + "
            f"{final} {'fold' if spec.cross_validation else 'final'} run(s) per unit); {len(excluded)} unit(s) "
            f"excluded" + (f" (architectures {', '.join(excl_archs)})" if excl_archs else ""))


@app.command()
def run(study: Path = typer.Argument(..., help="Study YAML."),
        run_root: Optional[str] = typer.Option(None, help="Override run_root (default: from config)."),
        worker: bool = typer.Option(False, "--worker", help="Join the study as one of several worker processes "
                                    "(docs/studies.md); start as many as you like, on one or several machines."),
        storage: Optional[str] = typer.Option(None, help="Optuna RDB storage URL shared by the workers, e.g. "
                                              "postgresql://user:pass@host/db (default: SQLite in the study folder)."),
        heartbeat_interval: int = typer.Option(30, help="Seconds between a trial's heartbeats (--worker recovery)."),
        grace_period: int = typer.Option(120, help="Seconds without heartbeat before a trial counts as dead."),
        wait: bool = typer.Option(False, "--wait", help="If another plain 'msb run' of this study is running, wait "
                                  "for it to end instead of stopping."),
        nproc_per_node: int = typer.Option(0, "--nproc-per-node", min=0, help="Train every run with DDP on this many "
                                           "processes (GPUs) of this machine, launched through torchrun "
                                           "(docs/training.md); train.batch_size is the global batch."),
        format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP),
        verbose: bool = typer.Option(False, "--verbose", help="Also print the full scores table (every metric x "
                                     "rule; always written to scores.csv).")) -> None:
    """generate -> train -> evaluate -> reaggregate every run of a study; rerun to resume."""
    from msb.engine.distributed import init_from_env, relaunch_with_torchrun, serve, stop_followers

    if nproc_per_node and "WORLD_SIZE" not in os.environ:
        raise typer.Exit(relaunch_with_torchrun(nproc_per_node, sys.argv[1:]))
    ctx = init_from_env()
    if ctx is not None and not ctx.is_main:
        from msb.engine.runner import follow_train

        serve(ctx, follow_train)  # ranks > 0 train what rank 0 sends until it stops
        return
    from msb.analysis.counts.aggregate import reaggregate, write_scores
    from msb.analysis.counts.counts_io import read_counts
    from msb.study.pipeline import run_study

    fmt = resolve_format(format)

    outcomes = run_study(study, track=track, log=log, run_root=run_root, worker=worker, storage=storage,
                         heartbeat_interval=heartbeat_interval, grace_period=grace_period, wait=wait)
    if ctx is not None:  # after a failure rank 0 just exits: torchrun then stops the other ranks
        stop_followers(ctx)
    paths = [p for o in outcomes for p in o.counts_paths]
    counts = read_counts(paths)
    table = reaggregate(counts)
    out_dir = outcomes[0].run_dir.parent
    written = write_scores(table, out_dir)
    if verbose:
        _print_scores(table, fmt)
    log(f"scores written to {', '.join(str(p) for p in written)}")
    from msb.analysis.stats.setting import write_setting
    from msb.config.generate import load_study
    from msb.study.analyses import run_declared_analyses, study_setting
    from msb.study.disk import disk_use_line

    setting = study_setting(study)
    write_setting(out_dir, setting)  # msb report / reaggregate --compare read it: one setting, same numbers
    if not worker:  # the study file's `analyses:` (docs/protocols.md); workers leave them to a plain run
        run_declared_analyses(load_study(study)[0], out_dir, log)
    log(disk_use_line(out_dir))
    _print_leaderboards(counts, out_dir, fmt, setting)  # the last thing msb run prints


@app.command()
def submit(study: Path = typer.Argument(..., help="Study YAML."),
           storage: Optional[str] = typer.Option(None, help="Optuna RDB storage URL the workers share, e.g. "
                                                 "postgresql://user@host/db (SQLite: one worker only)."),
           workers: int = typer.Option(1, "--workers", help="Number of workers (Slurm array tasks)."),
           slurm: list[str] = typer.Option([], "--slurm", help="KEY=VALUE over the cluster section (partition, "
                                           "time, cpus_per_task, gpus_per_task, mem, sbatch, setup, ...); repeat."),
           dry_run: bool = typer.Option(False, "--dry-run", help="Write the sbatch script, do not submit it."),
           requeue: bool = typer.Option(False, "--requeue", help="Ask Slurm to requeue a preempted (or failed-node) "
                                        "worker; it continues the study."),
           run_root: Optional[str] = typer.Option(None, help="Override run_root (default: from config).")) -> None:
    """Run a study on a Slurm cluster: a job array of 'msb run --worker' processes (docs/studies.md)."""
    from msb.cluster.slurm import submit as submit_study

    res = submit_study(study, storage, workers, slurm, dry_run, requeue, run_root, log)
    if res.job_id is not None:
        console.print(res.job_id, highlight=False)  # the last line: the job id alone (scripts read it)


@app.command()
def status(study: Path = typer.Argument(..., help="Study YAML, or the study folder runs/<study>."),
           storage: Optional[str] = typer.Option(None, help="Optuna storage URL (default: the one of the last "
                                                 "msb submit, else the study's SQLite file)."),
           run_root: Optional[str] = typer.Option(None, help="Override run_root (default: from config)."),
           format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP)) -> None:
    """Work items of a study by state (waiting, running with heartbeat age, done, failed) and what is left;
    reads the optuna storage and the study folder only. csv / markdown: the work-items table on stdout, the
    running items and the summary on stderr; json: one object."""
    import json

    import pandas as pd

    from msb.cli.format import emit_frame, status_log
    from msb.cluster.status import PhaseRow, RunningRow, study_status

    fmt = resolve_format(format)
    st = study_status(study, storage, run_root)
    if fmt == "json":  # one object: units, phases, running items, what is left
        console.print_json(json.dumps(st.as_dict()))
        return
    out = status_log(fmt)
    out(f"study {st.root} (storage {st.storage}): " + ", ".join(f"{u} {s}" for u, s in st.units.items()))
    cols = list(PhaseRow.__dataclass_fields__)
    if st.phases or fmt != "table":
        emit_frame(pd.DataFrame([vars(p) for p in st.phases], columns=cols), fmt, "work items")
    if st.running and fmt == "table":
        df = pd.DataFrame([vars(r) for r in st.running], columns=list(RunningRow.__dataclass_fields__))
        df["heartbeat_age_s"] = [("-" if a is None else f"{a:.0f}") for a in df["heartbeat_age_s"]]
        emit_frame(df, fmt, "running")
    for r in st.running if fmt != "table" else []:  # csv / markdown: stdout holds one table
        out(f"running: {r.unit} {r.phase} item {r.item} (trial {r.trial}) on {r.worker} {r.owner}, last heartbeat "
            + ("none yet" if r.heartbeat_age_s is None else f"{r.heartbeat_age_s:.0f} s ago"))
    n = sum(p.items for p in st.phases)
    out(f"left: {st.left} of {n} work item(s) ({sum(p.running for p in st.phases)} running, "
        f"{sum(p.waiting for p in st.phases)} waiting, {sum(p.failed for p in st.phases)} failed); units finished: "
        f"{sum(s == 'finished' for s in st.units.values())}/{len(st.units)}")
