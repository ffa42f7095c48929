"""The protocol analyses from the command line: ``msb reaggregate STUDY --analyses a,b`` (alone or with
``--compare``) writes them with :func:`msb.analysis.protocol.write_protocol_analyses` and prints each table as
Markdown; ``msb report`` shows them as the section ``protocol``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from msb.errors import MSBError

__all__ = ["ANALYSES_HELP", "protocol_analyses_cli"]

ANALYSES_HELP = ("Protocol analyses (docs/protocols.md), comma-separated or 'all': ranking_sensitivity, "
                 "resolution_delta, efficiency, external_transfer, p1, p2, p3, lesion, wilcoxon, checklist, semi_supervised.")


def protocol_analyses_cli(paths: Sequence[Path], analyses: str, out: Path | None, allow_mixed: bool, seed: int,
                          n_boot: int, echo: Callable[[str], None], log: Callable[[str], None]) -> list[Path]:
    """Run and write the named analyses of the one study folder in ``paths``; print tables and skip reasons.

    Args:
        paths: the command's paths; exactly one study folder.
        analyses: ``"a,b"`` or ``"all"``.
        out: output folder (default ``<study>/protocol``).
        allow_mixed: ``--allow-mixed-protocols``.
        seed, n_boot: bootstrap seed and replicates (``n_boot`` 0: the analyses' default, 1,000).
        echo: prints a table (stdout); log: prints a remark.

    Returns:
        The files written.

    Raises:
        MSBError: not exactly one folder; as :func:`~msb.analysis.protocol.write_protocol_analyses`.
    """
    from msb.analysis.protocol import parse_analyses, write_protocol_analyses
    from msb.analysis.protocol.writers import log_skipped

    folders = [Path(p) for p in paths if Path(p).is_dir()]
    if len(folders) != 1 or len(paths) != 1:
        raise MSBError(f"--analyses needs one study folder (runs/<study>), got {[str(p) for p in paths]}")
    names = parse_analyses(analyses)
    opts = {"allow_mixed_protocols": allow_mixed, "seed": seed}
    if n_boot:
        opts.update(n_boot=n_boot, n_boot_resolution=n_boot)
    written = write_protocol_analyses(folders[0], names, out, **opts)
    for p in written:
        if p.suffix == ".md":
            echo(p.read_text(encoding="utf-8"))
    log_skipped(written[-1], log)
    log(f"protocol analyses written to {written[-1].parent} ({len(written)} files)")
    return written
