"""Output helpers of the post-hoc analyses (:mod:`msb.analysis.report.posthoc_run`): tables as CSV, LaTeX and
Markdown, and the checkpoint-role suffix of threshold-analysis evaluations."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from msb.utils.atomic import atomic_write_text

__all__ = ["THRESHOLD_SUFFIX", "write_table"]

#: Suffix of the checkpoint role of a threshold-analysis evaluation (``best`` -> ``best-threshold``).
THRESHOLD_SUFFIX = "-threshold"


def write_table(df: pd.DataFrame, folder: Path, name: str, digits: int = 4) -> list[Path]:
    """``folder/<name>.csv`` (full precision), ``.tex`` and ``.md`` (floats to ``digits`` decimals)."""
    from msb.analysis.report.tables import frame_to_markdown

    folder.mkdir(parents=True, exist_ok=True)
    shown = df.copy()
    for c in shown.columns:
        if shown[c].dtype.kind == "f":
            shown[c] = [("n/a" if not np.isfinite(v) else f"{v:.{digits}f}") for v in shown[c]]
    paths = [folder / f"{name}.csv", folder / f"{name}.tex", folder / f"{name}.md"]
    atomic_write_text(paths[0], df.to_csv(index=False))
    esc = shown.astype(str).apply(lambda col: col.str.replace("_", r"\_", regex=False).str.replace("%", r"\%"))
    esc.columns = [str(c).replace("_", r"\_") for c in esc.columns]
    atomic_write_text(paths[1], esc.to_latex(index=False))
    atomic_write_text(paths[2], frame_to_markdown(shown, index=False))
    return paths
