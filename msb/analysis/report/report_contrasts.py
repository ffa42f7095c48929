"""The report section ``contrasts``: the training-pool contrast table, the pools' ranks per population and
Spearman's ρ of a pool-contrast study, read from the files ``msb contrasts`` wrote (``<study>/contrasts/``;
:mod:`msb.analysis.stats.contrasts`). Absent files = no section (every other study's report is unchanged)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from msb.analysis.stats.contrasts import INTERVAL_NOTE
from msb.analysis.report.report_doc import ReportDoc

__all__ = ["write_contrasts_section"]


def write_contrasts_section(doc: ReportDoc, study_dir: Path) -> bool:
    """Add the section when ``study_dir/contrasts/contrasts.csv`` exists; returns whether it was added.

    The tables are copied into the report's ``data/`` (``pool_contrasts.csv``, ``pool_ranks.csv``,
    ``pool_rho.csv``) as shown.
    """
    folder = Path(study_dir) / "contrasts"
    if not (folder / "contrasts.csv").is_file():
        return False
    doc.section("contrasts", "Training-pool contrasts: change the training data, hold the evaluation fixed")
    doc.text("Mean paired difference over seeds between training pools (pool_a − pool_b), per evaluation "
             "population, written by `msb contrasts` (docs/analysis.md). " + INTERVAL_NOTE)
    doc.frame(pd.read_csv(folder / "contrasts.csv"), caption="Training-pool contrasts", name="pool_contrasts",
              html_id="pool-contrasts")
    for fname, caption, name in (("population_ranks.csv", "Pools ranked on each population (fixed predictions, "
                                  "mean over seeds; rank 1 = best)", "pool_ranks"),
                                 ("population_rho.csv", "Spearman's ρ between the populations' pool scores",
                                  "pool_rho")):
        if (folder / fname).is_file():
            doc.frame(pd.read_csv(folder / fname), caption=caption, name=name, html_id=name.replace("_", "-"))
    return True
