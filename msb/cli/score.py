"""``msb score PRED_DIR``: score external prediction folders (``msb.evaluation.score``), and the LEGACY
six-metric table shared with ``msb metrics --legacy`` (``msb.analysis.report.legacy_table``)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import List, Optional

import typer

from msb.cli.common import console
from msb.cli.format import FORMAT_HELP, print_scores, resolve_format, status_log, status_track

app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`

__all__ = ["score", "print_six_metric_table"]


def print_six_metric_table(metrics_paths: List[Path], out_dir: Path, fmt: str = "table") -> list[Path]:
    """Build the LEGACY six-metric table from ``metrics.parquet`` files, write it (CSV, LaTeX, Markdown) and
    ``legacy_scores.csv`` into ``out_dir``, and print it as Markdown (one line per table row, never wrapped)
    when ``fmt`` is ``table`` or ``markdown``; with ``csv`` / ``json`` stdout keeps the command's main table only
    (the six-metric table is in the written files). Returns the written paths."""
    import pandas as pd

    from msb.analysis.report.legacy_table import legacy_scores, six_metric_table, write_six_metric_table

    frames = [pd.read_parquet(p) for p in metrics_paths]
    scores = legacy_scores(pd.concat(frames, ignore_index=True))
    table = six_metric_table(scores)
    paths = write_six_metric_table(table, out_dir)
    if fmt in ("table", "markdown"):  # soft_wrap: a Markdown row wider than the terminal stays one line
        console.print(paths[2].read_text(encoding="utf-8"), highlight=False, markup=False, soft_wrap=True)
    scores_path = out_dir / "legacy_scores.csv"
    from msb.utils.atomic import atomic_write_text

    atomic_write_text(scores_path, scores.to_csv(index=False, float_format="%.12g"))
    return [*paths, scores_path]


@app.command()
def score(pred_dir: Path = typer.Argument(..., help="Prediction folder: <id>.png|.npy|.npz files (--layout flat) or "
                                                    "<model>/<dataset>/<id>.png (--layout pranet)."),
          dataset: List[str] = typer.Option(..., help="Prepared dataset folder; NAME=FOLDER names the dataset "
                                                      "(with --layout pranet NAME is the dataset folder name; "
                                                      "repeatable)."),
          semantics: str = typer.Option(..., help="binary (hard masks) | probability (maps, value / scale)."),
          layout: str = typer.Option("flat", help="flat | pranet (<model>/<dataset>/<id>.png)."),
          model: Optional[str] = typer.Option(None, help="Model label (flat; default: the folder name) or the one "
                                                         "model folder to score (pranet)."),
          split: Optional[str] = typer.Option(None, help="Score only this split (index.csv, or --split-file); "
                                                         "default: every sample."),
          split_file: Optional[Path] = typer.Option(None, help="sample_id,split file (e.g. a run's split.csv)."),
          threshold: float = typer.Option(0.5, help="Probability maps: foreground = p >= threshold."),
          scale: str = typer.Option("auto", help="Value meaning p = 1: auto (uint8 255, uint16 65535, float 1) "
                                                 "or a number."),
          minmax: bool = typer.Option(False, "--minmax", help="Min-max normalise each map before the threshold "
                                                              "(old polyp test scripts); recorded in the counts."),
          resize: str = typer.Option("none", help="Maps not at the native size: none (error) | nearest | "
                                                  "bilinear."),
          id_rule: str = typer.Option("stem", help="File name -> sample: stem (= sample_id) | mask-name | "
                                                   "image-name (stem of the index.csv file)."),
          allow_missing: bool = typer.Option(False, "--allow-missing", help="Score samples without a file as empty "
                                                                            "predictions (listed) instead of "
                                                                            "refusing."),
          legacy: bool = typer.Option(False, "--legacy", help="Also compute the LEGACY PraNet-template metrics and "
                                                              "write the six-metric table into OUT."),
          out: Path = typer.Option(Path("runs/scored"), help="Study folder receiving one run folder per "
                                                             "model x dataset."),
          force: bool = typer.Option(False, help="Replace existing scored run folders."),
          format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP)) -> None:
    """Score external predictions into run folders (counts, predictions, metrics) that reaggregate, metrics,
    report and significance read unchanged."""
    from msb.analysis.counts.aggregate import reaggregate
    from msb.analysis.counts.counts_io import read_counts_with_report
    from msb.config.metrics_schema import MetricsConfig
    from msb.evaluation.score import find_targets, score_target
    from msb.evaluation.score_io import Semantics

    fmt = resolve_format(format)
    log, track = status_log(fmt), status_track(fmt)  # stdout carries the tables only unless fmt is table
    sem = Semantics(semantics, threshold, scale, minmax, resize)  # type: ignore[arg-type]
    targets = find_targets(pred_dir, dataset, layout, model)
    command = "msb score " + " ".join(shlex.quote(a) for a in sys.argv[2:]) + ("" if force else " --force")
    metrics_cfg = MetricsConfig(legacy=legacy)
    results = []
    for t in targets:
        res = score_target(t, sem, out, split=split, split_file=split_file, id_rule=id_rule,
                           allow_missing=allow_missing, metrics=metrics_cfg, force=force, command=command,
                           track=track)
        note = f"; {len(res.missing)} sample(s) without a file scored as empty: {', '.join(res.missing[:5])}" \
            if res.missing else ""
        log(f"scored {t.model} on {t.dataset_name}: {res.n_images} image(s) -> {res.eval_dir}{note}")
        results.append(res)
    df, report = read_counts_with_report([r.eval_dir / "counts.parquet" for r in results])
    for n in report.notes:
        log(n)
    print_scores(reaggregate(df), fmt)
    if legacy:
        written = print_six_metric_table([r.eval_dir / "metrics.parquet" for r in results], out, fmt)
        log(f"LEGACY six-metric table written to {', '.join(str(p) for p in written)}")
