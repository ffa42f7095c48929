"""``msb metrics``: boundary (HD95, NSD), lesion, legacy and card metrics from stored predictions (registered on
the app of :mod:`msb.cli.common` when :mod:`msb.cli` imports this module)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from msb.cli.format import FORMAT_HELP, emit_frame, resolve_format, status_log
from msb.errors import MSBError

app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`


@app.command()
def metrics(run_dir: Path = typer.Argument(..., help="Run folder runs/<study>/<run_id>, ensemble folder "
                                                   "runs/<study>/<run_id>-ensemble, or an evaluation folder inside "
                                                   "one (evaluation/external/<name>\\[/<role>])."),
            legacy: bool = typer.Option(False, "--legacy", help="Also the LEGACY PraNet-template metrics (from the "
                                        "stored probability maps) and their six-metric table."),
            table_out: Optional[Path] = typer.Option(None, help="With --legacy: folder of the six-metric table "
                                                     "(default RUN_DIR/legacy_table)."),
            card: bool = typer.Option(False, "--card", help="Also the card recipe as written (card_*_as_written), "
                                      "beside the real HD95; docs/metrics.md."),
            format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP + " csv / json: one table, "
                                                 "a metrics_file column naming each metrics.parquet.")) -> None:
    """Boundary (HD95, NSD) and lesion metrics from stored predictions, without re-running inference.

    The target is a run folder, a fold-ensemble folder, or one evaluation folder inside either (an external set
    or one role of it); every evaluation folder with predictions at or below it is computed, with the metric
    settings of the run's config.yaml (an ensemble's: its first member's; msb/evaluation/metrics_target.py).
    Before anything is computed, every evaluation folder is checked: ``counts.parquet`` and each prediction
    file against the folder's ``digests.json``, and the predictions against the counts' images (a missing or
    extra prediction file is refused with the ids and the command that regenerates the evaluation). The new
    ``metrics.parquet``'s digest is recorded after it is written. ``--card`` adds the published card's recipe
    (``evaluation.metrics.card``) for this computation."""
    import pandas as pd

    fmt = resolve_format(format)
    log = status_log(fmt)  # stdout carries the tables only unless fmt is table

    from msb.analysis.counts.counts_io import read_counts_with_report
    from msb.evaluation.image_metrics import summarize_metrics, write_metrics_table
    from msb.evaluation.metrics_target import resolve_metrics_target
    from msb.study.units import study_lock
    from msb.utils.digests import drop_digest, set_digest
    from msb.utils.evaluation_folder import check_predictions, regenerate_command, unverified_note
    from msb.utils.fault_points import fault_point
    from msb.utils.hashing import sha256_file
    from msb.utils.interrupted import clean_interrupted_writes

    clean_interrupted_writes(resolve_metrics_target(run_dir).owner, log)
    target = resolve_metrics_target(run_dir)  # listed again after leftovers of killed writes are gone
    cfg, eval_dirs = target.config, list(target.eval_dirs)
    metrics_cfg = cfg.evaluation.metrics.model_copy(update={**({"legacy": True} if legacy else {}),
                                                            **({"card": True} if card else {})})
    unverified = []
    for d in eval_dirs:  # the folders written below
        if not (d / "counts.parquet").is_file():
            raise MSBError(f"{d / 'counts.parquet'}: missing, so the predictions cannot be checked against it; "
                           f"regenerate the evaluation: {regenerate_command(d)}")
        counts, _ = read_counts_with_report(d / "counts.parquet")  # refuses a digest mismatch
        if not check_predictions(d, counts["image_id"].astype(str).unique()):
            unverified.append(d)
    if unverified:
        log(unverified_note(unverified))
    # no `msb run` of the study writes into the run (or ensemble) meanwhile
    with study_lock(target.owner.resolve().parent, wait=False, log=log):
        for d in eval_dirs:  # no stale digest for a metrics.parquet about to be replaced
            drop_digest(d, "metrics.parquet")
        written = []
        for d in eval_dirs:
            path = write_metrics_table(d, metrics_cfg)
            written.append(path)
            fault_point("metrics.written")
            set_digest(path.parent, path.name, sha256_file(path))  # the digest of the file just written here
    from msb.analysis.report.summary import distance_unit

    frames = []
    for path in written:
        mt = pd.read_parquet(path)
        summary = summarize_metrics(mt)
        unit = distance_unit(mt)  # px without a dataset spacing, mm with one
        tag = unit.replace(" ", "_")  # hd95_px / hd95_mm: the unit in the name (rich would eat "[px]" as markup)
        summary["metric"] = [f"{m}_{tag}" if str(m).startswith(("hd", "assd", "masd", "asd", "directed")) else m
                             for m in summary["metric"]]
        title = f"{path} (convention: {cfg.evaluation.metrics.hd_convention}; distances in {unit})"
        if fmt in ("csv", "json"):  # one table for a pipe: the file as a column, raw floats
            frames.append(summary.assign(metrics_file=str(path))[["metrics_file", *summary.columns]])
            continue
        table = Table(title=title)
        for col in summary.columns:
            table.add_column(str(col), justify="right" if summary[col].dtype.kind in "fi" else "left",
                             overflow="fold")
        for _, row in summary.iterrows():
            table.add_row(*[f"{v:.4f}" if isinstance(v, float) else str(v) for v in row])
        emit_frame(summary, fmt, title, table)
    if frames:
        emit_frame(pd.concat(frames, ignore_index=True), fmt)
    if legacy:
        from msb.cli.score import print_six_metric_table

        paths = print_six_metric_table(written, table_out or run_dir / "legacy_table", fmt)
        log(f"LEGACY six-metric table written to {', '.join(str(p) for p in paths)}")
