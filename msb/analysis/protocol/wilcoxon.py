"""(e) Paired tests between models per test set, as the polyp audit reports them ("Metrics or Mirage?", §6.2 and
"Single-seed training and statistical power"): two-sided Wilcoxon signed-rank tests on per-image scores
(:func:`msb.analysis.significance.paired_wilcoxon`), Benjamini-Hochberg FDR over all model pairs x metrics of one
test set (:func:`msb.analysis.significance.bh_adjust`), the matched-pairs rank-biserial correlation (Kerby 2014)
and a percentile bootstrap CI of the mean per-image difference (:func:`msb.analysis.bootstrap.bootstrap_mean`;
unit = image, stratified by fold when the rows hold several folds; the seed and replicate count are printed).

Images are paired on ``(fold, image_id)``; only units every model of the test set has are used (the number
dropped is reported). Metrics: Dice (counts) and HD95 (``metrics.parquet``, when present).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from msb.analysis.bootstrap import bootstrap_mean
from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable, fmt_num, per_image
from msb.analysis.protocol.polyp import test_set_tables
from msb.analysis.significance import WILCOXON, bh_adjust, paired_wilcoxon

__all__ = ["pairwise_tests", "wilcoxon_table"]


def _aligned(tabs: dict) -> tuple[dict, int]:
    keys = {k: pd.MultiIndex.from_frame(t.keys[["fold", "image_id"]].astype(object)) for k, t in tabs.items()}
    common = None
    for idx in keys.values():
        common = idx if common is None else common.intersection(idx, sort=False)
    first = next(iter(keys.values()))
    common = first[np.sort(first.get_indexer(common))]
    dropped = sum(len(idx) - len(common) for idx in keys.values())
    return {k: tabs[k].subset(keys[k].get_indexer(common)) for k in tabs}, dropped


def pairwise_tests(sets: dict, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """All model pairs of every test set.

    Args:
        sets: ``{test set: {(architecture, input_size): ImageTable}}`` (:func:`~msb.analysis.protocol.polyp.
            test_set_tables`).
        n_boot, seed, level: bootstrap of the mean difference.

    Returns:
        ``test_set, model_a, model_b, metric, n, n_dropped, statistic, p_value, p_adjusted`` (BH within the test
        set), ``rank_biserial`` (> 0: a scores higher), ``median_difference, mean_difference, ci_low, ci_high``
        (a − b), ``n_boot, seed, test, correction``.

    Raises:
        AnalysisSkipped: no test set with two models.
    """
    out = []
    for name, tabs in sets.items():
        if len(tabs) < 2:
            continue
        al, dropped = _aligned(tabs)
        if not al or next(iter(al.values())).n_images == 0:
            continue
        first = next(iter(al.values()))
        strata = first.keys["fold"].to_numpy() if first.keys["fold"].nunique() > 1 else None
        metrics = ["dice"] + (["hd95"] if all("hd95" in t.extra for t in al.values()) else [])
        block = []
        for (ka, kb), m in itertools.product(itertools.combinations(sorted(al), 2), metrics):
            a, b = per_image(al[ka], m), per_image(al[kb], m)
            r = paired_wilcoxon(a, b)
            d = a - b
            bs = bootstrap_mean(d, n_boot, level, seed, strata) if np.isfinite(d).any() else None
            block.append({"test_set": name, "model_a": _name(ka), "model_b": _name(kb), "metric": m, "n": r.n,
                          "n_dropped": r.n_dropped + dropped, "statistic": r.statistic, "p_value": r.p_value,
                          "rank_biserial": r.rank_biserial, "median_difference": r.median_difference,
                          "mean_difference": r.mean_difference, "ci_low": bs.low if bs else np.nan,
                          "ci_high": bs.high if bs else np.nan, "n_boot": n_boot, "seed": seed, "test": WILCOXON})
        p_adj = bh_adjust([row["p_value"] for row in block])
        m_tests = int(np.isfinite([row["p_value"] for row in block]).sum())
        for row, pa in zip(block, p_adj):
            row.update(p_adjusted=float(pa), correction=f"Benjamini-Hochberg within {name} (m={m_tests})")
        out.extend(block)
    if not out:
        raise AnalysisSkipped("no test set with at least two models evaluated on the same images")
    return pd.DataFrame(out)


def _name(key: tuple) -> str:
    return key[0] if key[1] < 0 else f"{key[0]} ({key[1]})"


def wilcoxon_table(tidy: pd.DataFrame, alpha: float = 0.05) -> PaperTable:
    """Rows = test set x model pair x metric: n, mean difference [CI], rank-biserial r, p, p (BH), significant."""
    n_boot, seed = int(tidy["n_boot"].iloc[0]), int(tidy["seed"].iloc[0])
    vals = pd.DataFrame({"Test set": tidy["test_set"], "Model A": tidy["model_a"], "Model B": tidy["model_b"],
                         "Metric": tidy["metric"], "n": tidy["n"], "Mean diff (A−B)": tidy["mean_difference"],
                         "CI low": tidy["ci_low"], "CI high": tidy["ci_high"], "Rank-biserial r": tidy["rank_biserial"],
                         "p": tidy["p_value"], "p (BH)": tidy["p_adjusted"],
                         "Significant": tidy["p_adjusted"] < alpha})
    disp = pd.DataFrame({"Test set": tidy["test_set"], "Model A": tidy["model_a"], "Model B": tidy["model_b"],
                         "Metric": tidy["metric"], "n": tidy["n"].astype(str),
                         "Mean diff (A−B) [95% CI]": [f"{fmt_num(m, 4)} [{fmt_num(lo, 4)}, {fmt_num(hi, 4)}]" for m, lo, hi
                                                      in zip(tidy["mean_difference"], tidy["ci_low"], tidy["ci_high"])],
                         "Rank-biserial r": [fmt_num(v) for v in tidy["rank_biserial"]],
                         "p": [("–" if not np.isfinite(v) else f"{v:.3g}") for v in tidy["p_value"]],
                         "p (BH)": [("–" if not np.isfinite(v) else f"{v:.3g}") for v in tidy["p_adjusted"]],
                         "Significant": ["yes" if v < alpha else "no" for v in tidy["p_adjusted"]]})
    cap = (f"Paired two-sided Wilcoxon signed-rank tests on per-image scores between models, per test set; "
           f"p (BH): Benjamini-Hochberg FDR within each test set (all pairs x metrics), significant at {alpha}; "
           f"rank-biserial r > 0: A scores higher; 95% percentile bootstrap CI of the mean difference from "
           f"{n_boot} replicates (unit = image, fold-stratified, seed {seed}); HD95 in px, lower is better")
    return PaperTable("wilcoxon", vals, disp, cap)


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry."""
    sets = test_set_tables(art.counts, art.metrics, "Wilcoxon tests", options.get("allow_mixed_protocols", False))
    tidy = pairwise_tests(sets, int(options.get("n_boot", 1000)), int(options.get("seed", 0)),
                          float(options.get("level", 0.95)))
    return AnalysisOutput(tables=[wilcoxon_table(tidy)], data={"wilcoxon": tidy})
