"""Conversion results and staged output folders, shared by every converter (and by :mod:`msb.data.synth`).

:class:`ConversionReport` says what a conversion produced; :func:`staged_output` builds a dataset in a hidden
temporary sibling of the output folder and swaps it in only on success.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from msb.data.converters.provenance import write_record
from msb.errors import MSBError
from msb.utils.atomic import current_umask, replace_dir

__all__ = ["ConversionReport", "staged_output"]


@dataclass
class ConversionReport:
    """What a conversion produced.

    Attributes:
        n_samples: number of samples written to ``index.csv``.
        n_changed_mask_pixels: mask pixels whose written value differs from the source value (binarisation of
            lossy masks); 0 when masks were copied unchanged.
        notes: human-readable remarks (threshold used, skipped files, dataset pitfalls).
        out: the prepared dataset folder (absolute).
        name: converter name.
        n_mask_pixels: total number of mask pixels processed (denominator for ``n_changed_mask_pixels``).
        headline: the summary's line about ``n_changed_mask_pixels`` as a :meth:`str.format` template with
            ``n``, ``total`` and ``pct`` (default: mask binarisation; BUSI says it merged extra lesion mask
            files, BKAI-IGH that its colour rule classified off-colour pixels).
    """

    n_samples: int
    n_changed_mask_pixels: int
    notes: list[str] = field(default_factory=list)
    out: Path | None = None
    name: str = ""
    n_mask_pixels: int = 0
    headline: str = "Mask binarisation changed {n:,} of {total:,} mask pixels ({pct:.3f} %)."

    def summary(self) -> str:
        """One paragraph for the CLI: samples, destination, changed pixels (count and %), then the notes."""
        lines = [f"Prepared {self.n_samples} sample(s)" + (f" ({self.name})" if self.name else "")
                 + (f" in {self.out}" if self.out is not None else "") + "."]
        if self.n_mask_pixels:
            pct = 100.0 * self.n_changed_mask_pixels / self.n_mask_pixels
            lines.append(self.headline.format(n=self.n_changed_mask_pixels, total=self.n_mask_pixels, pct=pct))
        else:
            lines.append(f"Mask pixels changed: {self.n_changed_mask_pixels:,}.")
        lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines)


def _check_no_overlap(source: Path | None, out: Path) -> None:
    if source is None:
        return
    s, o = source.resolve(), out.resolve()
    if s == o or o in s.parents or s in o.parents:
        raise MSBError(f"output folder {o} and source folder {s} overlap; write the prepared dataset to a separate "
                       f"folder (e.g. datasets/<name>).")


@contextlib.contextmanager
def staged_output(out: str | os.PathLike, overwrite: bool = False, source: str | os.PathLike | None = None
                  ) -> Iterator[Path]:
    """Build a folder in a temporary sibling of ``out`` and move it onto ``out`` on success.

    Args:
        out: final dataset folder.
        overwrite: replace an existing non-empty ``out``; otherwise that is an error.
        source: the source folder, if any; ``out`` must not overlap it (so ``overwrite`` can never delete the
            source).

    Yields:
        The temporary folder (``<parent>/.<name>.tmp-XXXX``) to write into.

    Raises:
        MSBError: ``out`` is a file, is non-empty without ``overwrite``, or overlaps ``source``. Any exception in
            the body deletes the temporary folder and propagates.
    """
    out = Path(out).expanduser().absolute()
    _check_no_overlap(Path(source) if source is not None else None, out)
    if out.exists() and not out.is_dir():
        raise MSBError(f"output {out} exists and is not a folder; choose another output folder.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise MSBError(f"output folder {out} already exists and is not empty; pass --overwrite to replace it, "
                       f"or choose another output folder.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        write_record(tmp)  # prepare.json of the active recording (msb.data.converters.provenance), if any
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp creates 0700; a dataset folder gets the usual mode
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
