"""``msb explain``: Grad-CAM overlays per run or fold checkpoint and the fold average."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from msb.cli.format import FORMAT_HELP, emit_frame, resolve_format, status_log
from msb.errors import MSBError


app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`


@app.command()
def explain(paths: List[str] = typer.Argument(..., help="Run folder(s) runs/<study>/<run_id> (e.g. the folds of a "
                                                        "model) or a study folder runs/<study>."),
            images: List[str] = typer.Option(..., help="sample_ids: --images ID [ID ...] (or ID,ID)."),
            checkpoint: str = typer.Option("best", help="best | latest"),
            target_layer: Optional[List[str]] = typer.Option(None, help="Layer path(s) overriding the default, "
                                                                        "e.g. net.decoder.blocks[-1]."),
            device: str = typer.Option("auto", help="auto | cpu | cuda"),
            out: Optional[Path] = typer.Option(None, help="Output folder (default <run>/explain or <study>/explain)."),
            format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP)) -> None:
    """Grad-CAM overlays (image, prediction, CAM) per run/fold checkpoint and the fold average."""
    from msb.xai.explain import explain as _explain

    fmt = resolve_format(format)
    log = status_log(fmt)  # stdout carries the table only unless fmt is table
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
    cols = ["model_group", "image_id", "run", "class_name", "target_region", "image_split", "cam_mean",
            "pred_area_px"]
    table = Table(title=f"Grad-CAM ({checkpoint} checkpoint)")
    for col in cols:
        table.add_column(col, justify="right" if col in ("cam_mean", "pred_area_px") else "left")
    for _, r in t.iterrows():
        table.add_row(r["model_group"], r["image_id"], r["run"], r["class_name"], r["target_region"],
                      r["image_split"], f"{r['cam_mean']:.3f}", str(r["pred_area_px"]))
    emit_frame(t[cols], fmt, f"Grad-CAM ({checkpoint} checkpoint)", table)
    log(f"overlays and CAMs written under {res.out_dir} (summary: {res.out_dir / 'explain.csv'})")
