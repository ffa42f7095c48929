"""The ``msb`` command line (typer + rich).

A user error (:class:`msb.errors.MSBError`: bad config, bad data, missing file) prints one line
``error: ...`` and exits with status 2; ``msb --debug ...`` shows the traceback instead.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from msb.cli_common import app, console, err_console, log, state as _state, track
from msb.cli_protocol import ANALYSES_HELP, protocol_analyses_cli
from msb.cli_format import FORMAT_HELP, print_leaderboards as _print_leaderboards, print_scores as _print_scores, resolve_format
from msb.errors import MSBError


def _study_of_run_locked(run_dir: Path):
    """The study lock of the study folder holding run folder ``run_dir`` (``msb evaluate`` / ``msb metrics``
    never write into a run while a plain ``msb run`` of its study runs, nor two at once); a no-op context for a
    path that is not a run folder (the command's own check names it)."""
    import contextlib

    from msb.study.units import study_lock

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        return contextlib.nullcontext()
    return study_lock(run_dir.resolve().parent, wait=False, log=log)


@app.callback()
def _main(debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors.")) -> None:
    _state["debug"] = debug


# --------------------------------------------------------------------------------------------- studies
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
    table = Table(title=f"runs of {study}")
    for col in ("run_id", "dataset", "architecture", "config_hash", "folder"):
        table.add_column(col)
    for r in runs:
        cfg = r.config if run_root is None else r.config.model_copy(update={"run_root": run_root})
        folder = study_dir(cfg) / r.run_id
        write_run_config(r, folder)
        table.add_row(r.run_id, r.dataset, r.architecture, r.config_hash[:16], str(folder))
    console.print(table)


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
        format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP)) -> None:
    """generate -> train -> evaluate -> reaggregate every run of a study; rerun to resume."""
    from msb.engine.distributed import init_from_env, relaunch_with_torchrun, serve, stop_followers

    if nproc_per_node and "WORLD_SIZE" not in os.environ:
        raise typer.Exit(relaunch_with_torchrun(nproc_per_node, sys.argv[1:]))
    ctx = init_from_env()
    if ctx is not None and not ctx.is_main:
        from msb.engine.runner import follow_train

        serve(ctx, follow_train)  # ranks > 0 train what rank 0 sends until it stops
        return
    from msb.analysis.aggregate import reaggregate, write_scores
    from msb.analysis.counts_io import read_counts
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
    _print_scores(table, fmt)
    log(f"scores written to {', '.join(str(p) for p in written)}")
    _print_leaderboards(counts, out_dir, fmt)
    from msb.config.generate import load_study
    from msb.study.analyses import run_declared_analyses

    if not worker:  # the study file's `analyses:` (docs/protocols.md); workers leave them to a plain run
        run_declared_analyses(load_study(study)[0], out_dir, log)


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
             run_root: Optional[str] = typer.Option(None, help="With a study YAML: override run_root.")) -> None:
    """Reload a checkpoint (SHA-256 verified), predict the test split, write counts and predictions."""
    from msb.analysis.aggregate import reaggregate, render_scores_table
    from msb.analysis.counts_io import read_counts_with_report
    from msb.engine.runner import evaluate_run

    if checkpoint not in ("best", "latest", "both"):
        raise MSBError(f"--checkpoint must be best, latest or both, not '{checkpoint}'")
    roles = ["best", "latest"] if checkpoint == "both" else [checkpoint]
    if external is not None:
        from msb.study.external_eval import evaluate_external_cli

        paths = evaluate_external_cli(run_dir, external, class_map or [], split, roles, run_root, track, log, force)
    elif class_map or split:
        raise MSBError("--class-map and --split apply to --external evaluations only; add --external DATASET")
    else:
        with _study_of_run_locked(run_dir):
            paths = evaluate_run(run_dir, roles, track=track, log=log, force=force)
    df, report = read_counts_with_report(paths)  # digests verified
    for note in report.notes:
        log(note)
    console.print(render_scores_table(reaggregate(df)))


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
                bootstrap: int = typer.Option(0, help="Image-level percentile bootstrap replicates for 95% CIs "
                                                      "(0: none)."),
                compare: bool = typer.Option(False, help="Compare systems: paired Wilcoxon (BH), paired bootstrap "
                                                         "differences, Friedman, ranking sensitivity."),
                seed: int = typer.Option(0, help="Bootstrap seed."),
                system_by: str = typer.Option("run", help="What --compare compares: run | model."),
                posthoc: str = typer.Option("nemenyi", help="With --compare, >= 3 systems: post-hoc test after "
                                                            "Friedman, nemenyi | conover."),
                format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP),
                analyses: Optional[str] = typer.Option(None, help=ANALYSES_HELP + " Needs one study folder."),
                allow_mixed_protocols: bool = typer.Option(False, "--allow-mixed-protocols",
                                                           help="Let --analyses rank rows of different split policies.")
                ) -> None:
    """Dice, IoU, precision, recall under global-micro, image-macro and class-macro from stored counts."""
    from msb.analysis.aggregate_core import DEFAULT_GROUP, POOL_FOLDS_GROUP

    fmt = resolve_format(format)
    if analyses is not None and not compare:  # only the protocol analyses of one study folder
        protocol_analyses_cli(paths, analyses, out, allow_mixed_protocols, seed, bootstrap, console.print, log)
        return
    extended = rules is not None or population or bootstrap or compare
    group = POOL_FOLDS_GROUP if pool else DEFAULT_GROUP
    if by_threshold:
        group = (*group, "threshold", "threshold_on")
    if not extended:  # the columnar path (no pandas); None: something to report or resolve, the pandas path below
        from msb.analysis.reaggregate_fast import fast_reaggregate

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
    from msb.analysis.aggregate import reaggregate as _reagg, write_scores
    from msb.analysis.counts_io import read_counts_with_report

    # the basic table needs no hash, name or source column: columnar read of the others (docs/performance.md)
    df, report = read_counts_with_report(paths, None if extended else ["model"])
    for note in report.notes:  # on stderr when stdout carries data (csv / json / markdown)
        log(note) if fmt == "table" else err_console.print(note, highlight=False, markup=False, soft_wrap=True)
    if extended:
        from msb.analysis.compare import run_extended

        run_extended(df, group, rules, population or [], bootstrap, compare, seed, system_by, out, console.print, log,
                     posthoc)
        if analyses is not None:
            protocol_analyses_cli(paths, analyses, None, allow_mixed_protocols, seed, bootstrap, console.print, log)
        return
    table = _reagg(df, group_by=group)
    _print_scores(table, fmt)
    if out is not None:
        written = write_scores(table, out)
        log(f"written: {', '.join(str(p) for p in written)}")


@app.command(context_settings={"allow_extra_args": True})
def profile(ctx: typer.Context,
            device: str = typer.Option("cpu", help="cpu | cuda (fails with one line when no GPU is usable)."),
            arch: Optional[List[str]] = typer.Option(None, help="Architecture configs as a study names them "
                                                     "(--arch unet_r18 segformer_b0; `msb models` lists them) or "
                                                     "registry adapters; default: every architecture config."),
            configs: Path = typer.Option(Path("configs"), help="Configs root holding architectures/."),
            study: Optional[Path] = typer.Option(None, help="Study folder runs/<study>/: its models + Dice scatter."),
            input_size: Optional[List[str]] = typer.Option(None, help="Sizes in px: --input-size 256 512 (or HxW)."),
            batch_size: int = typer.Option(1, help="Images per forward pass."),
            precision: Optional[List[str]] = typer.Option(None, help="fp32 | amp (--precision fp32 amp); default fp32."),
            warmup: Optional[int] = typer.Option(None, help="Untimed warm-up passes (default 100 cuda, 10 cpu)."),
            timed_passes: Optional[int] = typer.Option(None, help="Timed passes per repeat (1000 cuda, 100 cpu)."),
            repeats: Optional[int] = typer.Option(None, help="Repeats; median, SD over them (5 cuda, 3 cpu)."),
            cudnn_benchmark: bool = typer.Option(True, help="torch.backends.cudnn.benchmark during timing."),
            num_classes: int = typer.Option(1, help="Output classes for --arch models."),
            out: Optional[Path] = typer.Option(None, help="Output folder (default <study>/profile or profiles/)."),
            role: str = typer.Option("best", help="Study: checkpoint role whose counts give Dice."),
            rule: str = typer.Option("image-macro", help="Study: aggregation rule of Dice."),
            x: str = typer.Option("gmacs", help="Study scatter x axis: gmacs | latency.")) -> None:
    """Params, GMACs (FlopCounterMode), latency, throughput and peak memory per architecture and input size."""
    from msb.profiling.measure import parse_input_size
    from msb.profiling.pipeline import run_profile
    from msb.profiling.timing import TimingProtocol, protocol_defaults

    archs, sizes, precs = list(arch or []), list(input_size or []), list(precision or [])
    d = protocol_defaults(device)  # on cuda the MSB paper's protocol: 100 + 5 x 1,000 passes at 256 and 512
    warmup = d["warmup"] if warmup is None else warmup
    timed_passes = d["timed_passes"] if timed_passes is None else timed_passes
    repeats = d["repeats"] if repeats is None else repeats
    for tok in ctx.args:  # values after the first of a multi-value option (--input-size 256 512)
        if tok.lower().replace("x", "").isdigit():
            sizes.append(tok)
        elif tok in ("fp32", "amp"):
            precs.append(tok)
        elif archs:
            archs.append(tok)
        else:
            raise MSBError(f"msb profile: unexpected argument '{tok}'; name architectures with --arch {tok}")
    if not sizes and not input_size and study is None:
        sizes = list(d["sizes"])
    protocols = [TimingProtocol(warmup, timed_passes, repeats, batch_size, p, cudnn_benchmark)  # type: ignore[arg-type]
                 for p in (precs or ["fp32"])]
    from msb.cli_models import architecture_model_configs

    res = run_profile(device, archs, study, [parse_input_size(s) for s in sizes], protocols, out, num_classes,
                      role, rule, x, log=log,
                      model_configs=architecture_model_configs(configs) if study is None else None)
    t = res.table
    table = Table(title=f"profile on {t['device_name'].iloc[0]} ({t['device'].iloc[0]}), batch {batch_size}, "
                        f"{warmup} warm-up + {repeats}x{timed_passes} timed passes, forward only")
    for col in ("model", "input", "precision", "params (M)", "GMACs", "latency ms (median ± SD)", "images/s",
                "peak MiB", "status"):
        table.add_column(col, justify="left" if col in ("model", "input", "precision", "status") else "right")
    for _, r in t.iterrows():
        mem = r["peak_mem_mib"] if r["device"] == "cuda" else r["peak_mem_delta_mib"]
        table.add_row(r["model"], f"{r['input_h']}x{r['input_w']}", r["precision"], f"{r['params_m']:.2f}",
                      f"{r['gmacs']:.3f}", f"{r['latency_ms_median']:.2f} ± {r['latency_ms_sd']:.2f}",
                      f"{r['throughput_ips']:.1f}", f"{mem:.1f}", r["status"])
    console.print(table)
    uncounted = sorted({o.strip() for s in t["uncounted_ops"] for o in str(s).split(",") if o.strip()})
    log(f"GMACs = FlopCounterMode FLOPs / 2 per image; operators not counted: {', '.join(uncounted) or 'none'}")
    log(f"peak memory: {t['mem_method'].iloc[0]}")
    log(f"written: {', '.join(str(p) for p in res.paths)}")


@app.command()
def report(study_dir: Path = typer.Argument(..., help="Study folder runs/<study>."),
           out: Optional[Path] = typer.Option(None, help="Report folder (default STUDY_DIR/report)."),
           bootstrap: int = typer.Option(2000, help="Bootstrap replicates for every CI (0: none)."),
           seed: int = typer.Option(0, help="Bootstrap seed."),
           population: Optional[List[str]] = typer.Option(None, help="Extra population: source:A,B | ids:FILE | "
                                                                     "flag:FILE[:COLUMN] (repeatable)."),
           system_by: str = typer.Option("run", help="What a compared system is: run | model."),
           posthoc: str = typer.Option("nemenyi", help="Post-hoc test after Friedman (>= 3 systems): "
                                                       "nemenyi | conover."),
           analyses: Optional[str] = typer.Option("all", help=ANALYSES_HELP + " 'none' omits the section."),
           allow_mixed_protocols: bool = typer.Option(False, "--allow-mixed-protocols",
                                                      help="Let the protocol section rank rows of different split "
                                                           "policies.")) -> None:
    """Self-contained HTML + Markdown report of a study from stored artifacts: contract, scores with CIs,
    significance, ranking sensitivity, figures, LaTeX tables and a reporting checklist."""
    from msb.analysis.populations import parse_population
    from msb.analysis.protocol import parse_analyses
    from msb.analysis.report import build_report
    from msb.analysis.significance import check_posthoc

    check_posthoc(posthoc)
    pops = [parse_population(p) for p in population or []]
    names = () if analyses == "none" else parse_analyses(analyses)
    res = build_report(study_dir, out, n_boot=bootstrap, seed=seed, populations=pops, system_by=system_by,
                       posthoc=posthoc, protocol={"analyses": names, "seed": seed,
                                                  "allow_mixed_protocols": allow_mixed_protocols})
    for item in res.checklist:
        log(f"{item.status:<4}  {item.item}: {item.evidence}")
    for note in res.notes:
        log(f"note: {note}")
    log(f"report written to {res.html} and {res.markdown} ({len(res.figures)} figure files, "
        f"{len(res.tables)} table files)")


@app.command()
def explain(paths: List[str] = typer.Argument(..., help="Run folder(s) runs/<study>/<run_id> (e.g. the folds of a "
                                                        "model) or a study folder runs/<study>."),
            images: List[str] = typer.Option(..., help="sample_ids: --images ID [ID ...] (or ID,ID)."),
            checkpoint: str = typer.Option("best", help="best | latest"),
            target_layer: Optional[List[str]] = typer.Option(None, help="Layer path(s) overriding the default, "
                                                                        "e.g. net.decoder.blocks[-1]."),
            device: str = typer.Option("auto", help="auto | cpu | cuda"),
            out: Optional[Path] = typer.Option(None, help="Output folder (default <run>/explain or <study>/explain).")
            ) -> None:
    """Grad-CAM overlays (image, prediction, CAM) per run/fold checkpoint and the fold average."""
    from msb.xai.explain import explain as _explain

    run_paths, ids = [], list(images)
    for p in paths:  # click gives every positional token to PATHS: --images a b puts b here
        if Path(p).is_dir():
            run_paths.append(p)
        elif "/" in p or os.sep in p:
            raise MSBError(f"{p}: run folder not found; give runs/<study>/<run_id> or a study folder runs/<study>")
        else:
            ids.append(p)
    if not run_paths:
        raise MSBError(f"no run folder among {paths}; give runs/<study>/<run_id> or a study folder runs/<study>")
    res = _explain(run_paths, ids, out, checkpoint, tuple(target_layer or ()), device, log=log)
    t = res.table
    table = Table(title=f"Grad-CAM ({checkpoint} checkpoint)")
    for col in ("model_group", "image_id", "run", "class_name", "target_region", "image_split", "cam_mean",
                "pred_area_px"):
        table.add_column(col, justify="right" if col in ("cam_mean", "pred_area_px") else "left")
    for _, r in t.iterrows():
        table.add_row(r["model_group"], r["image_id"], r["run"], r["class_name"], r["target_region"],
                      r["image_split"], f"{r['cam_mean']:.3f}", str(r["pred_area_px"]))
    console.print(table)
    log(f"overlays and CAMs written under {res.out_dir} (summary: {res.out_dir / 'explain.csv'})")


import msb.cli_data  # noqa: E402,F401 - registers ``msb data ...`` (after the commands above)
import msb.cli_audit  # noqa: E402,F401 - registers ``msb audit``
import msb.cli_metrics  # noqa: E402,F401 - registers ``msb metrics`` (boundary/lesion/legacy metrics)
import msb.cli_score  # noqa: E402,F401 - registers ``msb score`` (external prediction folders)
import msb.cli_weights  # noqa: E402,F401 - registers ``msb weights list|fetch``
import msb.cli_contrasts  # noqa: E402,F401 - registers ``msb contrasts`` (training-pool contrasts)
import msb.cli_catalog  # noqa: E402,F401 - registers ``msb models`` (architecture configs)


def _click_exception_types() -> tuple[type[BaseException], ...]:
    """Usage-error classes: click's, and the private click copy that recent typer releases ship."""
    types: list[type[BaseException]] = []
    try:
        import click

        types.append(click.ClickException)
    except ImportError:  # pragma: no cover - typer without click
        pass
    try:
        from typer._click.exceptions import ClickException as TyperClickException

        types.append(TyperClickException)
    except ImportError:
        pass
    return tuple(types)


_TERMINATED: dict[str, int] = {}
#: Exit status after SIGTERM (128 + 15, the shell convention) and its message.
SIGTERM_EXIT = 143
SIGTERM_MESSAGE = ("terminated (SIGTERM): stopped like Ctrl-C; finished epochs, runs and evaluations are saved "
                   "(resume state, checkpoints); run the same command again to continue")


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    _TERMINATED["signal"] = signum
    raise KeyboardInterrupt(f"signal {signum}")


def _interrupted() -> None:
    """Print the interruption message and exit: 143 after SIGTERM, 130 after Ctrl-C."""
    if _TERMINATED:
        err_console.print(SIGTERM_MESSAGE, highlight=False, soft_wrap=True)
        sys.exit(SIGTERM_EXIT)
    err_console.print("aborted")
    sys.exit(130)


def main() -> None:
    """Console-script entry point.

    A :class:`MSBError` prints one line and exits 2; a usage error (unknown command/option, bad value) prints
    click's short usage message and exits 2; Ctrl-C prints ``aborted`` and exits 130; SIGTERM is handled the
    same way (a study re-opens its running trial, the resume state is kept) but prints
    :data:`SIGTERM_MESSAGE` and exits 143 (a rerun of ``msb run`` resumes). ``msb --debug ...``
    re-raises errors with their traceback.
    """
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        rc = app(standalone_mode=False)
    except MSBError as exc:
        if _state["debug"]:
            raise
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except _click_exception_types() as exc:
        exc.show()  # type: ignore[attr-defined]
        sys.exit(getattr(exc, "exit_code", 2))
    if isinstance(rc, int) and rc != 0:  # typer returns the code of an interrupted command instead of raising
        if rc == 130:
            _interrupted()
        sys.exit(rc)


if __name__ == "__main__":
    main()
