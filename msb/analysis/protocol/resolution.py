"""(b) Paired input-resolution change ``ΔDSC = DSC_big − DSC_small`` (global-micro foreground Dice), the MSB
paper's Figure 3 (MedSegBenchmarker, §4.2 "Input-Resolution Sensitivity").

Units are matched by dataset, architecture, fold and test image: the internal test rows of an architecture at
the two input sizes are paired on ``(fold, image_id)``; units present at one size only are dropped and counted.
The interval is the 95 % percentile interval of ``n_boot`` (default 1,000) paired, fold-stratified bootstrap
replicates: each replicate draws, within every fold, as many units as the fold has, with replacement
(:func:`msb.analysis.stats.bootstrap.resample_weights`, ``numpy.random.default_rng(seed)``), scores both sizes on the
same draw, and the interval is taken on the replicate differences (Efron & Tibshirani 1993, percentile
interval; Davison & Hinkley 1997, §3.8 stratified resampling). The seed and the replicate count are printed with
every interval.

Architectures without counts at one of the sizes, and those recorded in ``_study/exclusions.csv`` or ``_study/**/excluded.json``, are listed
as excluded (with the reason) in the table's notes and the tidy CSV.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from msb.analysis.stats.bootstrap import bootstrap_rule, percentile_interval
from msb.analysis.report.figures import _figure, color
from msb.analysis.protocol.common import (AnalysisOutput, AnalysisSkipped, PaperTable, evaluation_rows, fmt_num,
                                          system_tables)
from msb.analysis.protocol.inputs import check_one_protocol

__all__ = ["resolution_delta", "resolution_delta_table", "resolution_delta_figure"]


def _pair(small, big):
    """Reorder two ImageTables of one architecture on their common ``(fold, image_id)`` units."""
    ks = pd.MultiIndex.from_frame(small.keys[["fold", "image_id"]].astype(object))
    kb = pd.MultiIndex.from_frame(big.keys[["fold", "image_id"]].astype(object))
    common = ks.intersection(kb, sort=False)
    order = np.sort(ks.get_indexer(common))
    common = ks[order]
    return small.subset(ks.get_indexer(common)), big.subset(kb.get_indexer(common)), len(ks) - len(common), \
        len(kb) - len(common)


def resolution_delta(counts: pd.DataFrame, sizes: tuple[int, int] | None = None, n_boot: int = 1000,
                     seed: int = 0, level: float = 0.95, excluded: pd.DataFrame | None = None,
                     allow_mixed_protocols: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """ΔDSC with paired fold-stratified bootstrap CIs per dataset x architecture.

    Args:
        counts: study counts rows (internal test rows of non-ensemble runs, best checkpoint, are used).
        sizes: ``(small, big)`` input sizes in px; default the smallest and largest size of each dataset.
        n_boot, seed, level: bootstrap replicates, ``default_rng`` seed, interval level.
        excluded: recorded exclusions (``architecture, input_size, reason``).
        allow_mixed_protocols: pair rows of different split policies.

    Returns:
        ``(tidy, notes)``: one row per matched (dataset, architecture): ``dataset, architecture, size_small,
        size_big, n_folds, n_units`` (matched fold x image units), ``n_unmatched_small, n_unmatched_big,
        dsc_small, dsc_big, delta, ci_low, ci_high`` (fractions, not pp), ``level, n_boot, seed, n_undefined``;
        ``notes``: one line per excluded or unmatched architecture.

    Raises:
        MSBError: mixed split protocols (unless allowed).
        AnalysisSkipped: fewer than two input sizes, or no architecture at both.
    """
    rows = evaluation_rows(counts, "internal")
    rows = rows[rows["input_size"] >= 0]
    if rows["input_size"].nunique() < 2:
        raise AnalysisSkipped(f"needs internal test counts at two input sizes, found "
                              f"{sorted(set(rows['input_size']))} px (input_size -1 = unknown)")
    out, notes = [], []
    for r in (excluded.itertuples() if excluded is not None else ()):
        notes.append(f"{r.architecture} at {r.input_size} px excluded by the study: {r.reason}")
    for ds, block in rows.groupby("dataset", sort=True):
        check_one_protocol(block, f"resolution change on {ds}", allow_mixed_protocols)
        found = sorted(set(block["input_size"]))
        small, big = sizes if sizes is not None else (found[0], found[-1])
        if small == big or small not in found or big not in found:
            notes.append(f"{ds}: sizes {small}/{big} px not both evaluated (found {found}); skipped")
            continue
        tabs = system_tables(block[block["input_size"].isin([small, big])], ("architecture", "input_size"))
        for arch in sorted({a for a, _ in tabs}):
            if (arch, small) not in tabs or (arch, big) not in tabs:
                miss = small if (arch, small) not in tabs else big
                notes.append(f"{ds}: {arch} unmatched, no counts at {miss} px; not in the ΔDSC figure")
                continue
            ts, tb, us, ub = _pair(tabs[(arch, small)], tabs[(arch, big)])
            if ts.n_images == 0:
                notes.append(f"{ds}: {arch} has no (fold, image) unit at both sizes; not in the ΔDSC figure")
                continue
            if us or ub:
                notes.append(f"{ds}: {arch}: {us} unit(s) only at {small} px and {ub} only at {big} px dropped")
            rb, rs = bootstrap_rule([tb, ts], "global-micro", "dice", n_boot, level, seed, stratify_by_fold=True)
            lo, hi, bad = percentile_interval(rb.replicates - rs.replicates, level)
            out.append({"dataset": ds, "architecture": arch, "size_small": int(small), "size_big": int(big),
                        "n_folds": int(ts.keys["fold"].nunique()), "n_units": ts.n_images,
                        "n_unmatched_small": us, "n_unmatched_big": ub, "dsc_small": rs.estimate,
                        "dsc_big": rb.estimate, "delta": rb.estimate - rs.estimate, "ci_low": lo, "ci_high": hi,
                        "level": level, "n_boot": n_boot, "seed": seed, "n_undefined": bad})
    if not out:
        raise AnalysisSkipped("no architecture has internal test counts at both input sizes; "
                              + ("; ".join(notes) if notes else "nothing to pair"))
    return pd.DataFrame(out), notes


def resolution_delta_table(tidy: pd.DataFrame) -> PaperTable:
    """Table: ``Dataset, Architecture, DSC_small, DSC_big, ΔDSC (pp) [95 % CI], units, folds``."""
    s, b = int(tidy["size_small"].iloc[0]), int(tidy["size_big"].iloc[0])
    n_boot, seed = int(tidy["n_boot"].iloc[0]), int(tidy["seed"].iloc[0])
    vals = pd.DataFrame({"Dataset": tidy["dataset"], "Architecture": tidy["architecture"],
                         f"DSC {s}": tidy["dsc_small"], f"DSC {b}": tidy["dsc_big"],
                         "ΔDSC (pp)": 100 * tidy["delta"], "CI low (pp)": 100 * tidy["ci_low"],
                         "CI high (pp)": 100 * tidy["ci_high"], "Units": tidy["n_units"], "Folds": tidy["n_folds"]})
    disp = pd.DataFrame({"Dataset": tidy["dataset"], "Architecture": tidy["architecture"],
                         f"DSC {s}": [fmt_num(v, 4) for v in tidy["dsc_small"]],
                         f"DSC {b}": [fmt_num(v, 4) for v in tidy["dsc_big"]],
                         "ΔDSC (pp) [95% CI]": [f"{100 * d:+.2f} [{100 * lo:+.2f}, {100 * hi:+.2f}]" for d, lo, hi in
                                                zip(tidy["delta"], tidy["ci_low"], tidy["ci_high"])],
                         "Units": tidy["n_units"].astype(str), "Folds": tidy["n_folds"].astype(str)})
    cap = (f"Paired change in global-micro foreground Dice from {s} to {b} px, matched by dataset, architecture, "
           f"fold and test image; 95% percentile CI from {n_boot} paired fold-stratified bootstrap replicates "
           f"(unit = image, seed {seed}); pp = percentage points")
    return PaperTable("resolution_delta", vals, disp, cap)


def resolution_delta_figure(tidy: pd.DataFrame):
    """One horizontal interval per architecture (rows grouped by dataset), ΔDSC in percentage points, zero line;
    the title states the replicates and the seed."""
    n = len(tidy)
    fig = _figure(6.4, 1.2 + 0.35 * n)
    ax = fig.add_subplot(1, 1, 1)
    y = np.arange(n)[::-1]
    for i, (yy, r) in enumerate(zip(y, tidy.itertuples())):
        k = sorted(set(tidy["dataset"])).index(r.dataset)
        ax.errorbar([100 * r.delta], [yy], xerr=[[100 * (r.delta - r.ci_low)], [100 * (r.ci_high - r.delta)]],
                    fmt="o", color=color(k), capsize=3, label=r.dataset if r.dataset not in
                    set(tidy["dataset"].iloc[:i]) else None)
    ax.axvline(0.0, color="#555555", lw=0.8, ls="--")
    ax.set_yticks(y, [f"{r.dataset} / {r.architecture}" for r in tidy.itertuples()])
    s, b = int(tidy["size_small"].iloc[0]), int(tidy["size_big"].iloc[0])
    ax.set_xlabel(f"ΔDSC = DSC{b} − DSC{s} (global-micro, percentage points)")
    ax.set_title(f"Paired resolution change, 95% CI: {int(tidy['n_boot'].iloc[0])} fold-stratified bootstrap "
                 f"replicates, seed {int(tidy['seed'].iloc[0])}", fontsize=8)
    if tidy["dataset"].nunique() > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, title="dataset")
    return fig


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry."""
    tidy, notes = resolution_delta(art.counts, options.get("sizes"), int(options.get("n_boot_resolution", 1000)),
                                   int(options.get("seed", 0)), float(options.get("level", 0.95)), art.excluded,
                                   options.get("allow_mixed_protocols", False))
    t = resolution_delta_table(tidy)
    return AnalysisOutput(tables=[t], figures=[("resolution_delta", resolution_delta_figure(tidy), t.caption)],
                          notes=notes, data={"resolution_delta": tidy,
                                             "resolution_delta_notes": pd.DataFrame({"note": notes})})
