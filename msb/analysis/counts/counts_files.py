"""Finding ``counts.parquet`` files (pandas-free, shared by :mod:`msb.analysis.counts.counts_io` and the columnar
``msb reaggregate`` path :mod:`msb.analysis.counts.reaggregate_fast`)."""

from __future__ import annotations

import os
from pathlib import Path

from msb.errors import MSBError

__all__ = ["COUNTS_FILENAME", "OPTIONAL_COLUMNS", "SELECTION_EVAL_FOLDER", "find_counts_files", "in_selection_eval"]

#: File name searched for when a folder is given.
COUNTS_FILENAME = "counts.parquet"

#: ``<run>/evaluation/<this>/<role>/``: the selection-split evaluation kept for the threshold analysis
#: (:mod:`msb.study.selection_eval`); a folder search skips it, so it enters no leaderboard or score table.
SELECTION_EVAL_FOLDER = "selection"


def in_selection_eval(f: Path, root: Path) -> bool:
    """True when ``f`` lies in an ``evaluation/selection/`` folder below (not at or above) ``root``."""
    parts, n = f.parent.parts, len(root.parts)
    return any(parts[i] == "evaluation" and parts[i + 1] == SELECTION_EVAL_FOLDER
               for i in range(max(n - 1, 0), len(parts) - 1))


def find_counts_files(paths: list[str | os.PathLike] | str | os.PathLike) -> list[Path]:
    """Expand files and folders into a list of count files.

    Args:
        paths: one path or a list; a file is taken as is, a folder contributes every
            ``counts.parquet`` below it (recursively, sorted), except those inside hidden folders
            (``.<name>...``: staging folders of interrupted writes, caches) and selection-split evaluations
            (``evaluation/selection/``, :data:`SELECTION_EVAL_FOLDER`; give that folder itself to read one).

    Returns:
        List of file paths in argument order.

    Raises:
        MSBError: a path does not exist; a folder holds no ``counts.parquet``; no paths given.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise MSBError("no count files given; pass one or more counts.parquet files or run folders")
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.rglob(COUNTS_FILENAME))
            found = [f for f in found if f.is_file()
                     and not any(part.startswith(".") for part in f.relative_to(p).parts[:-1])
                     and not in_selection_eval(f, p)]
            if not found:
                raise MSBError(f"{p}: folder contains no {COUNTS_FILENAME} (searched recursively); "
                               f"run the evaluator first or pass the right folder")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        else:
            raise MSBError(f"{p}: no such file or folder (the path does not exist); pass an existing "
                           f"{COUNTS_FILENAME} file or a folder containing one")
    return files


#: Columns that :func:`msb.analysis.counts.counts_io.read_counts_with_report` may leave unread when asked for fewer columns: they take no
#: part in the row checks or the duplicate keys (the two SHA-256 columns alone are 128 bytes a row).
OPTIONAL_COLUMNS: tuple[str, ...] = ("checkpoint_sha256", "config_hash", "class_name", "source", "model")
