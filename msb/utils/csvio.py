"""Reading user-supplied CSV files with one clear error."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from msb.errors import MSBError

__all__ = ["read_user_csv"]


def read_user_csv(path: str | os.PathLike, label: str, missing_hint: str = "") -> pd.DataFrame:
    """Read a CSV as strings (empty cells stay ``""``, never NaN).

    Args:
        path: the file.
        label: what the file is, for messages (e.g. ``"split file"``).
        missing_hint: what to do when the file is missing, appended to that message.

    Raises:
        MSBError: ``"<label> <path> not found; <hint>"`` or ``"<label> <path> cannot be parsed as CSV (...)"``.
    """
    path = Path(path)
    if not path.is_file():
        raise MSBError(f"{label} {path} not found" + (f"; {missing_hint}" if missing_hint else "."))
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise MSBError(f"{label} {path} cannot be parsed as CSV ({e}).") from e
