"""``msb models``: the command that lists the architecture configs a study can name (the catalogue itself is
:func:`msb.cli.catalog.architecture_catalog`; kept apart so that ``msb --help`` imports no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from msb.cli.format import FORMAT_HELP, resolve_format, status_log

app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`

__all__ = ["list_models"]


@app.command("models")
def list_models(configs: Path = typer.Option(Path("configs"), help="Configs root (holds architectures/)."),
                params: bool = typer.Option(False, "--params", help="Also build each model and count its parameters "
                                            "(slow for the PVT-based ones)."),
                num_classes: int = typer.Option(3, "--num-classes", help="Output maps of the models --params "
                                                "builds (3 as in the MSB paper's Table 3)."),
                gmacs_at: Optional[List[int]] = typer.Option(None, "--gmacs-at", help="With --params: also GMACs per "
                                                             "image at this square size in px (repeatable)."),
                format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP)) -> None:
    """List the architecture configs a study can name, with registry adapter, encoder and input-size rule."""
    from msb.cli.format import emit_frame
    from msb.cli.catalog import architecture_catalog
    from msb.models.registry import architecture_class, available_architectures

    fmt = resolve_format(format)
    if num_classes < 1:
        from msb.errors import MSBError

        raise MSBError(f"--num-classes {num_classes}: give a positive number of output maps")
    frame = architecture_catalog(configs, params, num_classes, tuple(gmacs_at or ()))
    emit_frame(frame, fmt, f"Architecture configs in {configs}")
    log = status_log(fmt)
    if params:
        from msb.profiling.flops import CONVENTION_TEXT
        from msb.profiling.tree_macs import TREE_CONVENTION

        log(f"params (M) = sum(p.numel()) / 1e6 at {num_classes} output maps"
            + (f"; {CONVENTION_TEXT}; GMACs_calflops = {TREE_CONVENTION}" if gmacs_at else ""))
    for name in available_architectures():  # generic adapters (msb/models/generic/) say how a config names them
        example = getattr(architecture_class(name), "config_example", None)
        if example:
            log(f"generic adapter {name}: {example}")
    log(f"registry adapters: {', '.join(available_architectures())}")
