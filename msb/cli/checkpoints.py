"""``msb checkpoints upgrade``: rewrite an older run folder's checkpoints and resume states as weights-only files
(:mod:`msb.models.checkpoint_upgrade`), after the user confirms with ``--trust-pickle`` that they trust it."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer

from msb.cli.common import log

app = typer.Typer(no_args_is_help=True, help="Run-folder checkpoints: upgrade older files to the weights-only "
                                             "format that loads without running code.")

__all__ = ["upgrade"]


@app.command("upgrade")
def upgrade(paths: List[Path] = typer.Argument(..., help="Run folder(s) runs/<study>/<run_id> or study folder(s)."),
            trust_pickle: bool = typer.Option(False, "--trust-pickle",
                                              help="Read files the restricted unpickler refuses with the full "
                                                   "unpickler (runs any code they name): only for folders whose "
                                                   "author you trust.")) -> None:
    """Rewrite checkpoints and resume states that need the full unpickler as weights-only files (digests
    verified first, weights unchanged); files already weights-only are left as they are."""
    from msb.models.checkpoint_upgrade import run_folders, upgrade_run

    runs = [r for p in paths for r in run_folders(p)]
    done = safe = 0
    for run_dir in runs:
        res = upgrade_run(run_dir, trust_pickle, log=log)
        done, safe = done + len(res.upgraded), safe + len(res.already_safe)
    log(f"{len(runs)} run folder(s): {done} file(s) upgraded, {safe} already weights-only")
