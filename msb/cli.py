"""The ``msb`` command line (typer + rich).

A user error (:class:`msb.errors.MSBError`: bad config, bad data, missing file) prints one line
``error: ...`` and exits with status 2; ``msb --debug ...`` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Iterator, List, Optional, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from msb.errors import MSBError

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="MedSegBenchmarker: configuration-driven, raw-count-first segmentation benchmarks.")
data_app = typer.Typer(no_args_is_help=True, help="Prepare, synthesise and validate datasets.")
app.add_typer(data_app, name="data")

console = Console()
err_console = Console(stderr=True)
_state = {"debug": False}
T = TypeVar("T")


def track(it: Iterable[T], desc: str, total: int) -> Iterator[T]:
    """Rich progress bar over ``it`` (transient; disabled when stdout is not a terminal)."""
    with Progress(TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=console, transient=True,
                  disable=not console.is_terminal) as progress:
        yield from progress.track(it, total=total, description=desc)


def log(msg: str) -> None:
    """One status line."""
    console.print(msg, highlight=False, markup=False)


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

    runs = generate_runs(study)
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
        run_root: Optional[str] = typer.Option(None, help="Override run_root (default: from config).")) -> None:
    """generate -> train -> evaluate -> reaggregate every run of a study; rerun to resume."""
    from msb.analysis.aggregate import reaggregate, render_scores_table, write_scores
    from msb.analysis.counts_io import read_counts
    from msb.engine.runner import run_study

    outcomes = run_study(study, track=track, log=log, run_root=run_root)
    paths = [p for o in outcomes for p in o.counts_paths]
    table = reaggregate(read_counts(paths))
    out_dir = outcomes[0].run_dir.parent
    written = write_scores(table, out_dir)
    console.print(render_scores_table(table))
    log(f"scores written to {', '.join(str(p) for p in written)}")


@app.command()
def evaluate(run_dir: Path = typer.Argument(..., help="Run folder runs/<study>/<run_id>."),
             checkpoint: str = typer.Option("best", help="best | latest | both"),
             force: bool = typer.Option(False, help="Re-evaluate even if counts exist for this checkpoint.")) -> None:
    """Reload a checkpoint (SHA-256 verified), predict the test split, write counts and predictions."""
    from msb.analysis.aggregate import reaggregate, render_scores_table
    from msb.analysis.counts_io import read_counts
    from msb.engine.runner import evaluate_run

    if checkpoint not in ("best", "latest", "both"):
        raise MSBError(f"--checkpoint must be best, latest or both, not '{checkpoint}'")
    roles = ["best", "latest"] if checkpoint == "both" else [checkpoint]
    paths = evaluate_run(run_dir, roles, track=track, log=log, force=force)
    console.print(render_scores_table(reaggregate(read_counts(paths))))


@app.command()
def reaggregate(paths: List[Path] = typer.Argument(..., help="counts.parquet files or folders holding them."),
                out: Optional[Path] = typer.Option(None, help="Folder for scores.csv/.parquet (default: none)."),
                pool: bool = typer.Option(False, help="Pool runs/folds: group by dataset, split, model, role only.")) -> None:
    """Dice, IoU, precision, recall under global-micro, image-macro and class-macro from stored counts."""
    from msb.analysis.aggregate import DEFAULT_GROUP, POOL_FOLDS_GROUP, reaggregate as _reagg, render_scores_table, write_scores
    from msb.analysis.counts_io import read_counts_with_report

    df, report = read_counts_with_report(paths)
    for note in report.notes:
        log(note)
    group = POOL_FOLDS_GROUP if pool else DEFAULT_GROUP
    table = _reagg(df, group_by=group)
    console.print(render_scores_table(table))
    if out is not None:
        written = write_scores(table, out)
        log(f"written: {', '.join(str(p) for p in written)}")


@app.command()
def metrics(run_dir: Path = typer.Argument(..., help="Run folder runs/<study>/<run_id>.")) -> None:
    """Boundary (HD95, NSD) and lesion metrics from stored predictions, without re-running inference."""
    import pandas as pd

    from msb.config.layering import load_yaml
    from msb.config.schema import RunConfig
    from msb.evaluation.image_metrics import summarize_metrics, write_run_metrics

    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise MSBError(f"{run_dir}: not a run folder (no config.yaml); give runs/<study>/<run_id>")
    cfg = RunConfig.model_validate(load_yaml(cfg_path))
    for path in write_run_metrics(run_dir, cfg.evaluation.metrics):
        summary = summarize_metrics(pd.read_parquet(path))
        table = Table(title=f"{path} (convention: {cfg.evaluation.metrics.hd_convention})")
        for col in summary.columns:
            table.add_column(str(col), justify="right" if summary[col].dtype.kind in "fi" else "left")
        for _, row in summary.iterrows():
            table.add_row(*[f"{v:.4f}" if isinstance(v, float) else str(v) for v in row])
        console.print(table)


@app.command(context_settings={"allow_extra_args": True})
def profile(ctx: typer.Context,
            device: str = typer.Option("cpu", help="cpu | cuda (fails with one line when no GPU is usable)."),
            arch: Optional[List[str]] = typer.Option(None, help="Registry names (--arch a b); default: all."),
            study: Optional[Path] = typer.Option(None, help="Study folder runs/<study>/: its models + Dice scatter."),
            input_size: Optional[List[str]] = typer.Option(None, help="Sizes in px: --input-size 256 512 (or HxW)."),
            batch_size: int = typer.Option(1, help="Images per forward pass."),
            precision: Optional[List[str]] = typer.Option(None, help="fp32 | amp (--precision fp32 amp); default fp32."),
            warmup: int = typer.Option(10, help="Untimed warm-up passes."),
            timed_passes: int = typer.Option(100, help="Timed passes per repeat."),
            repeats: int = typer.Option(3, help="Repeats (median and SD are over repeats)."),
            cudnn_benchmark: bool = typer.Option(True, help="torch.backends.cudnn.benchmark during timing."),
            num_classes: int = typer.Option(1, help="Output classes for --arch models."),
            out: Optional[Path] = typer.Option(None, help="Output folder (default <study>/profile or profiles/)."),
            role: str = typer.Option("best", help="Study: checkpoint role whose counts give Dice."),
            rule: str = typer.Option("image-macro", help="Study: aggregation rule of Dice."),
            x: str = typer.Option("gmacs", help="Study scatter x axis: gmacs | latency.")) -> None:
    """Params, GMACs (FlopCounterMode), latency, throughput and peak memory per architecture and input size."""
    from msb.profiling.measure import parse_input_size
    from msb.profiling.pipeline import run_profile
    from msb.profiling.timing import TimingProtocol

    archs, sizes, precs = list(arch or []), list(input_size or []), list(precision or [])
    for tok in ctx.args:  # values after the first of a multi-value option (--input-size 256 512)
        if tok.lower().replace("x", "").isdigit():
            sizes.append(tok)
        elif tok in ("fp32", "amp"):
            precs.append(tok)
        elif archs:
            archs.append(tok)
        else:
            raise MSBError(f"msb profile: unexpected argument '{tok}'; name architectures with --arch {tok}")
    protocols = [TimingProtocol(warmup, timed_passes, repeats, batch_size, p, cudnn_benchmark)  # type: ignore[arg-type]
                 for p in (precs or ["fp32"])]
    res = run_profile(device, archs, study, [parse_input_size(s) for s in sizes], protocols, out, num_classes,
                      role, rule, x, log=log)
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


@app.command("models")
def list_models() -> None:
    """List the registered architectures."""
    from msb.models.registry import available_architectures

    for name in available_architectures():
        console.print(name)


# ------------------------------------------------------------------------------------------------ data
@data_app.command("prepare")
def data_prepare(name: str = typer.Argument(..., help="Converter: kvasir-seg | folder | synthetic."),
                 source: Optional[Path] = typer.Option(None, help="Raw dataset folder."),
                 out: Optional[Path] = typer.Option(None, help="Output folder (default datasets/<name>)."),
                 limit: Optional[int] = typer.Option(None, help="Convert only the first N samples (tests)."),
                 overwrite: bool = typer.Option(False, help="Replace an existing prepared dataset.")) -> None:
    """Convert a raw dataset into the prepared layout (index.csv + classes.csv)."""
    from msb.data.converters import prepare_dataset

    out = out or Path("datasets") / name.replace("-", "_")
    opts = {"overwrite": overwrite}
    if limit is not None:
        opts["limit"] = limit
    report = prepare_dataset(name, str(source) if source else None, out, **opts)
    log(report.summary())


@data_app.command("synth")
def data_synth(out: Path = typer.Option(Path("datasets/synthetic"), help="Output folder."),
               n: int = typer.Option(120, help="Number of images."),
               seed: int = typer.Option(0, help="Random seed.")) -> None:
    """Write the small deterministic synthetic dataset (no download needed)."""
    from msb.data.synth import make_synthetic_dataset

    log(make_synthetic_dataset(out, n_samples=n, seed=seed).summary())


@data_app.command("validate")
def data_validate(root: Path = typer.Argument(..., help="Prepared dataset folder.")) -> None:
    """Validate a prepared dataset fully (files, sizes, every mask value against classes.csv)."""
    from msb.data.schema import load_prepared_dataset, mask_to_onehot, read_mask

    ds = load_prepared_dataset(root)
    for sid in track(list(ds.index["sample_id"]), "checking masks", len(ds.index)):
        mask_to_onehot(read_mask(ds.mask_path(sid)), ds.classes, ds.mask_path(sid))
    log(f"{root}: {len(ds.index)} samples, {len(ds.foreground_classes)} foreground class(es): OK")


def main() -> None:
    """Console-script entry point: runs the typer app and turns :class:`MSBError` into one line + exit 2."""
    try:
        app(standalone_mode=False)
    except MSBError as exc:
        if _state["debug"]:
            raise
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("aborted")
        sys.exit(130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # click usage errors
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
