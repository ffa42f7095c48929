"""Report sections of the rank distributions and the post-hoc analyses:

* ``ranks``: per block the bootstrap rank table (rank-1 share, median rank, rank interval, Kendall τ) and the blob
  plot, from the same :class:`~msb.analysis.stats.rank_boot.RankDistribution` as the summary's verdict;
* ``posthoc``: the tables that ``msb reaggregate --analyses rank_stability,calibration,threshold`` wrote into
  ``<study>/posthoc/`` (seed stability, calibration, threshold), with the reliability diagram and the threshold
  curves redrawn from their CSV files; omitted when nothing was written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from msb.analysis.report.figures_posthoc import blob_plot, reliability_diagram, threshold_curves
from msb.analysis.report.report_doc import ReportDoc
from msb.analysis.stats.rank_boot import RankDistribution

__all__ = ["write_rank_section", "write_posthoc_section"]

_RANK_COLS = ["system", "value", "rank", "rank1_share", "median_rank", "rank_low", "rank_high", "tau_median",
              "tau_p05"]


def write_rank_section(doc: ReportDoc, dists: Mapping[tuple[str, str], RankDistribution | None]) -> None:
    """Section ``ranks``: per block with a distribution, its table (``data/rank_stability_bootstrap[-block].csv``)
    and blob plot (``figures/rank-blob[-block]``)."""
    doc.section("ranks", "Bootstrap rank distributions: how often is each system the best?")
    n = len(dists)
    shown = False
    for key, d in dists.items():
        if d is None:
            continue
        sfx = "" if n == 1 else f"-{key[0]}-{key[1]}"
        tab = d.table()
        doc.frame(tab[_RANK_COLS], caption=f"{key[0]}/{key[1]}: ranks over {d.n_boot:,} image bootstrap replicates "
                  f"(image-macro Dice, higher is better; rank interval at level {d.level:g}; Kendall τ-b of each "
                  f"replicate ranking vs the full-data ranking)", name=f"rank_stability_bootstrap{sfx}")
        doc.figure("rank-blob", f"rank-blob{sfx}", blob_plot(d), f"Blob plot {key[0]}/{key[1]}: dot area = share of "
                   f"replicates with that rank; bar = {d.level:.0%} rank interval, cross = median rank")
        shown = True
    if not shown:
        doc.text("No block has two systems sharing images with bootstrap replicates: no rank distribution.", "note")


def _read(folder: Path, name: str) -> pd.DataFrame | None:
    p = folder / f"{name}.csv"
    return pd.read_csv(p) if p.is_file() else None


def write_posthoc_section(doc: ReportDoc, study_dirs: Sequence[Path]) -> None:
    """Section ``posthoc`` from ``<study>/posthoc/*.csv`` of each study folder (nothing when none exists)."""
    folders = [Path(s) / "posthoc" for s in study_dirs if (Path(s) / "posthoc").is_dir()]
    if not folders:
        return
    doc.section("posthoc", "Post-hoc analyses: seeds and splits, calibration, threshold")
    for f in folders:
        seeds = _read(f, "rank_stability_seeds")
        if seeds is not None:
            doc.frame(seeds, caption="Rank stability across seeds / splits / folds: share of replicates won, "
                      "image-macro Dice mean ± SD (higher is better)", name="rank_stability_seeds")
            pairs = _read(f, "rank_stability_seed_pairs")
            if pairs is not None and pairs["changes_order"].any():
                doc.frame(pairs[pairs["changes_order"]], caption="Pairs whose order changes between replicates")
        cal = _read(f, "calibration")
        if cal is not None:
            cols = [c for c in ("dataset", "split", "system", "class_name", "ece", "ece_low", "ece_high", "mce", "brier",
                                "brier_low", "brier_high", "image_ece_mean", "n_images", "bins") if c in cal.columns]
            doc.frame(cal[cols], caption="Calibration of the stored probability maps (every pixel; ECE, MCE, Brier: "
                      "lower is better; CIs from image bootstrap replicates)", name="calibration")
            rel = _read(f, "calibration_reliability")
            if rel is not None:
                for (ds, sp), g in rel.groupby(["dataset", "split"], sort=True):
                    curves = {f"{s} ({c})": h for (s, c), h in g.groupby(["system", "class_name"], sort=False)}
                    doc.figure("reliability", f"reliability-{ds}-{sp}", reliability_diagram(curves),
                               f"Reliability diagram {ds}/{sp}: observed foreground frequency vs mean predicted "
                               f"probability per bin (diagonal = perfectly calibrated)")
        thr = _read(f, "threshold")
        if thr is not None:
            doc.frame(thr, caption="Threshold analysis: threshold chosen on the selection split, test scores at it "
                      "beside the declared threshold (image-macro; Dice, IoU, recall: higher is better)",
                      name="threshold")
            cur = _read(f, "threshold_curves")
            if cur is not None:
                doc.figure("threshold", "threshold-curves", threshold_curves(
                    {f"{r}@{k}": g for (r, k), g in cur.groupby(["run_id", "checkpoint_role"], sort=True)}),
                    "Selection-split image-macro Dice against the decision threshold (dot: chosen; dotted: 0.5)")
