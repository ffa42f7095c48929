"""``msb models``: the command that lists the architecture configs a study can name (the catalogue itself is
:func:`msb.cli.catalog.architecture_catalog`; kept apart so that ``msb --help`` imports no pandas)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from msb.cli.format import FORMAT_HELP, resolve_format, status_log

app = typer.Typer()  # merged into the ``msb`` app by :mod:`msb.cli.app`

__all__ = ["list_models"]


@app.command("models")
def list_models(configs: Path = typer.Option(Path("configs"), help="Configs root (holds architectures/)."),
                params: bool = typer.Option(False, "--params", help="Also build each model and count its parameters "
                                            "(slow for the PVT-based ones)."),
                format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP)) -> None:
    """List the architecture configs a study can name, with registry adapter, encoder and input-size rule."""
    from msb.cli.format import emit_frame
    from msb.cli.catalog import architecture_catalog
    from msb.models.registry import architecture_class, available_architectures

    fmt = resolve_format(format)
    emit_frame(architecture_catalog(configs, params), fmt, f"Architecture configs in {configs}")
    for name in available_architectures():  # generic adapters (msb/models/generic/) say how a config names them
        example = getattr(architecture_class(name), "config_example", None)
        if example:
            status_log(fmt)(f"generic adapter {name}: {example}")
    status_log(fmt)(f"registry adapters: {', '.join(available_architectures())}")
