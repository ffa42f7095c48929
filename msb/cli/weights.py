"""``msb weights list`` and ``msb weights fetch``: the ImageNet encoder files of the architectures
(:mod:`msb.models.pretrained`), for compute nodes without internet."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from msb.cli.common import console, log
from msb.cli.format import FORMAT_HELP, emit_frame, resolve_format, status_log
from msb.errors import MSBError

weights_app = typer.Typer(no_args_is_help=True, help="ImageNet encoder weights: what each architecture needs, "
                                                     "pre-download for offline nodes.")
app = weights_app  # ``msb weights``, added by :mod:`msb.cli.app`


#: Columns of ``msb weights list`` (one row per file; one ``none published`` row per architecture without one).
LIST_COLUMNS: tuple[str, ...] = ("config", "arch", "library", "repo / file", "revision", "cached SHA-256")
#: The ``repo / file`` cell of an architecture whose encoder has no ImageNet weights known to timm/smp.
NONE_PUBLISHED = "none published (encoder_weights: imagenet unavailable)"


def _targets(names: List[str], configs: Path) -> list[tuple[str, str, Optional[str]]]:
    """(label, model.arch, model.encoder) for each name: an architecture config (``configs/architectures/
    <name>.yaml``), a study YAML (its ``architectures``), or a registry / backbone name. No names: every
    architecture config.

    Raises:
        MSBError: a name that is none of these.
    """
    from msb.config.layering import load_layer

    arch_dir = configs / "architectures"
    if not names:
        names = sorted(p.stem for p in arch_dir.glob("*.yaml"))
    out = []
    for name in names:
        if name.endswith((".yaml", ".yml")) and Path(name).is_file():
            from msb.config.generate import load_study

            spec, root = load_study(name)
            out.extend(_targets(list(spec.architectures), root))
            continue
        path = arch_dir / f"{name}.yaml"
        if path.is_file():
            model = load_layer(path).data.get("model") or {}
            out.append((name, str(model.get("arch", name)), model.get("encoder")))
        else:
            from msb.models.pretrained import imagenet_files

            imagenet_files(name)  # raises MSBError for a name without ImageNet weights
            out.append((name, name, None))
    return out


@weights_app.command("list")
def list_weights(names: List[str] = typer.Argument(None, help="Architecture configs, study YAMLs or arch names "
                                                              "(default: every config in configs/architectures)."),
                 configs: Path = typer.Option(Path("configs"), help="The configs root."),
                 cache: Optional[Path] = typer.Option(None, help="HF_HOME to look in (default: the current one)."),
                 format: Optional[str] = typer.Option(None, "--format", help=FORMAT_HELP)) -> None:
    """Show the ImageNet file each architecture needs (`encoder_weights: imagenet`) and whether it is cached;
    an architecture whose encoder has no published ImageNet weights is listed with "none published"."""
    import pandas as pd

    from msb.models.pretrained import cache_dir, cached_path, imagenet_files
    from msb.utils.hashing import sha256_file

    fmt = resolve_format(format)
    hub = (cache / "hub") if cache else cache_dir()
    rows = []
    for label, arch, encoder in _targets(names or [], configs):
        try:
            files = imagenet_files(arch, encoder)
        except MSBError:  # e.g. smp lists no ImageNet weights for tu-mobilenetv3_small_100: a row says so
            rows.append((label, arch, "-", NONE_PUBLISHED, "-", "-"))
            continue
        for f in files:
            p = cached_path(f, hub)
            rows.append((label, arch, f.library, f"{f.repo_id}/{f.filename}", (f.revision or "main")[:12],
                         sha256_file(p) if p else "- (not cached)"))
    emit_frame(pd.DataFrame(rows, columns=list(LIST_COLUMNS)), fmt, f"ImageNet encoder files (hub cache {hub})")
    status_log(fmt)(f"{len({r[0] for r in rows})} architecture(s); "
                    f"{sum(r[3] == NONE_PUBLISHED for r in rows)} without published ImageNet weights")


@weights_app.command("fetch")
def fetch_weights(names: List[str] = typer.Argument(None, help="Architecture configs, study YAMLs or arch names "
                                                               "(default: every config in configs/architectures)."),
                  to: Path = typer.Option(..., "--to", help="Folder to download into; use it as HF_HOME offline."),
                  configs: Path = typer.Option(Path("configs"), help="The configs root.")) -> None:
    """Download every ImageNet encoder file the architectures need into DIR (Hugging Face cache layout), checked
    against the SHA-256 the Hub publishes."""
    from msb.models.pretrained import fetch

    seen = set()
    table = Table(title=f"fetched into {to}/hub")
    for col in ("arch", "repo / file", "SHA-256", "published"):
        table.add_column(col)
    for _, arch, encoder in _targets(names or [], configs):
        if (arch, encoder) in seen:
            continue
        seen.add((arch, encoder))
        for f, path, digest, published in fetch(arch, encoder, to):
            table.add_row(arch, f"{f.repo_id}/{f.filename}", digest,
                          "match" if published == digest else "not published")
    console.print(table)
    log(f"on the offline node: export HF_HOME={to.resolve()} HF_HUB_OFFLINE=1")


__all__ = ["weights_app", "list_weights", "fetch_weights"]
