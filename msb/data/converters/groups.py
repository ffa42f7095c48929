"""Groups CSVs: patient / video / lesion ids that a release does not ship, read from a user's table whose
columns are named by the user (``--groups FILE --group-id-column frame --group-column sequence``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from msb.errors import MSBError
from msb.utils.csvio import read_user_csv

__all__ = ["group_keys", "read_groups_csv"]


def _listed(items: Sequence[str], n: int = 10) -> str:
    return ", ".join(items[:n]) + (f" ... and {len(items) - n} more" if len(items) > n else "")


def group_keys(samples: Sequence[Any]) -> dict[str, str | None]:
    """Keys a groups CSV may use for each sample (anything with ``sample_id`` and ``image`` (a path), e.g.
    :class:`msb.data.converters._common.Sample` or :class:`msb.data.converters.folder.Pair`): its ``sample_id``,
    source image file name and stem (and the integer value of a numeric stem, so ``007`` and ``7`` match). A key shared by two samples maps to ``None``
    (ambiguous: the CSV must use the ``sample_id``)."""
    out: dict[str, str | None] = {}
    for s in samples:
        keys = {s.sample_id, s.image.name, s.image.stem}
        keys |= {str(int(k)) for k in list(keys) if k.isdigit()}
        for k in keys:
            out[k] = s.sample_id if out.get(k, s.sample_id) == s.sample_id else None
    for s in samples:
        out[s.sample_id] = s.sample_id
    return out


def read_groups_csv(path: str | os.PathLike, known: dict[str, str | None], id_column: str | None = None,
                    group_column: str = "group", skip_unknown: bool = False) -> dict[str, str]:
    """Read a user-supplied group table (patient / video / lesion ids that a release does not ship).

    Format: CSV with a header. ``id_column`` holds the sample key (default: ``sample_id``, else ``image``):
    a ``sample_id``, a source image file name, stem or relative path (``images/a.png``), or a frame number
    (``007`` matches ``7.png``);
    ``group_column`` (default ``group``) the group. Example: a public CVC-ClinicDB copy ships ``frame,sequence``:
    ``id_column="frame", group_column="sequence"``. Keys must be known; empty groups are allowed (= no group).

    Args:
        path: the CSV file.
        known: accepted key -> ``sample_id`` (``None`` = ambiguous key), e.g. from :func:`group_keys`.
        id_column: name of the key column (``None``: ``sample_id`` or ``image``).
        group_column: name of the group column.
        skip_unknown: ignore keys not in ``known`` (used when ``limit`` kept only part of the source).

    Returns:
        ``sample_id -> group`` for the listed rows.

    Raises:
        MSBError: missing file, missing columns (naming the columns found and the options to set), unknown,
            ambiguous or duplicate key (naming the 1-based line).
    """
    path = Path(path)
    how = "name the columns with --group-id-column COL --group-column COL (options group_id_column, group_column)"
    df = read_user_csv(path, "groups CSV", f"give a CSV with a sample key column and a group column; {how}")
    key_col = id_column or ("sample_id" if "sample_id" in df.columns else "image" if "image" in df.columns else None)
    missing = [c for c in (key_col, group_column) if c is None or c not in df.columns]
    if missing:
        need = f"'{id_column}'" if id_column else "'sample_id' (or 'image')"
        raise MSBError(f"groups CSV {path}: needs a key column {need} and a group column '{group_column}'; found "
                       f"{list(df.columns)}. {how[0].upper() + how[1:]}, e.g. --group-id-column frame "
                       f"--group-column sequence.")
    out: dict[str, str] = {}
    problems = []
    for pos, (k, g) in enumerate(zip(df[key_col], df[group_column])):
        key = k.strip()
        if key not in known:  # a relative path (images/a.png) or a zero-padded frame number (007)
            key = Path(key).name if Path(key).name in known else Path(key).stem if Path(key).stem in known else key
        if key not in known and key.isdigit():
            key = str(int(key))
        sid = known.get(key)
        if key not in known and skip_unknown:
            continue
        if key not in known:
            problems.append(f"line {pos + 2}: {key_col} {k!r} is not in the source")
        elif sid is None:
            problems.append(f"line {pos + 2}: {key_col} {k!r} matches several samples (use the sample_id)")
        elif sid in out:
            problems.append(f"line {pos + 2}: {key_col} {k!r} listed twice")
        else:
            out[sid] = g.strip()
    if problems:
        raise MSBError(f"groups CSV {path}: {_listed(problems)}. Fix the file.")
    if skip_unknown and len(df) and not out:
        raise MSBError(f"groups CSV {path}: none of its {len(df)} {key_col!r} values names a converted sample (e.g. "
                       f"{df[key_col].iloc[0]!r}); use sample ids, image file names or stems.")
    return out
