"""(e) Paired tests between models per test set, as the polyp audit reports them ("Metrics or Mirage?", §6.2 and
"Single-seed training and statistical power"): two-sided Wilcoxon signed-rank tests on per-image scores
(:func:`msb.analysis.stats.significance.paired_wilcoxon`), Benjamini-Hochberg FDR over all model pairs x metrics of one
test set (:func:`msb.analysis.stats.significance.bh_adjust`), the matched-pairs rank-biserial correlation (Kerby 2014)
and a percentile bootstrap CI of the mean per-image difference (:func:`msb.analysis.stats.bootstrap.bootstrap_mean`;
unit = image, stratified by fold when the rows hold several folds; the seed and replicate count are printed).

One paired unit per image: where a model has several fold rows of one image (every fold model predicts the
external set, or a test split all folds share), its value is the fold ensemble's (``-ensemble`` run) when the
study has one, else the mean over its folds; ``n`` is then the number of images, not K x images (column
``Values A/B`` says which). Test splits with disjoint images per fold are paired on ``(fold, image_id)``. Only
units every model of the test set has are used (the number dropped is reported). Metrics: Dice (counts) and HD95 (``metrics.parquet``, when present).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from msb.analysis.stats.bootstrap import bootstrap_mean
from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable, fmt_num, per_image
from msb.analysis.protocol.polyp import test_set_tables
from msb.analysis.counts.rules import ImageTable
from msb.analysis.stats.significance import WILCOXON, bh_adjust, paired_wilcoxon

__all__ = ["pairwise_tests", "wilcoxon_table"]


#: How a model's per-image value was formed (column ``values_a``/``values_b``).
ROWS, ENSEMBLE, FOLD_MEAN = "image rows", "fold ensemble", "mean over folds"


def _image_values(t: ImageTable, ens: ImageTable | None, metrics: list[str], collapse: bool
                  ) -> tuple[pd.DataFrame, str]:
    """One row per unit of a model on a test set: columns = metrics (per-image scores), index = unit key.

    ``collapse=False``: units are the ``(fold, image_id)`` rows as they are. ``collapse=True`` (some model of the
    test set has several fold rows of one image): one value per ``image_id``: the fold ensemble's when ``ens``
    covers every image of ``t``, else the mean over the model's fold rows of that image (NaN folds left out).
    """
    ids = t.keys["image_id"].astype(str).to_numpy()
    if not collapse:
        vals = pd.DataFrame({m: per_image(t, m) for m in metrics})
        vals.index = pd.MultiIndex.from_arrays([t.keys["fold"].to_numpy(), ids], names=["fold", "image_id"])
        return vals, ROWS
    if ens is not None:
        e_ids = ens.keys["image_id"].astype(str).to_numpy()
        if set(ids) <= set(e_ids) and not pd.Index(e_ids).duplicated().any():
            vals = pd.DataFrame({m: per_image(ens, m) for m in metrics}, index=pd.Index(e_ids, name="image_id"))
            return vals.loc[pd.unique(ids)], ENSEMBLE
    vals = pd.DataFrame({m: per_image(t, m) for m in metrics}).assign(image_id=ids)
    n_folds = t.keys["fold"].nunique()
    how = FOLD_MEAN if pd.Index(ids).duplicated().any() else ROWS
    return vals.groupby("image_id", sort=False).mean(), (f"{how} ({n_folds})" if how == FOLD_MEAN else how)


def _aligned(tabs: dict, ens: dict, metrics: list[str]) -> tuple[dict, dict, int, np.ndarray | None]:
    """Per model the unit values on the units every model has (first model's order), how they were formed, the
    number of unit rows dropped and the bootstrap strata (folds, only for uncollapsed several-fold rows)."""
    collapse = any(pd.Index(t.keys["image_id"].astype(str)).duplicated().any() for t in tabs.values())
    per = {k: _image_values(t, ens.get(k), metrics, collapse) for k, t in tabs.items()}
    common = None
    for v, _ in per.values():
        common = v.index if common is None else common.intersection(v.index, sort=False)
    first = next(iter(per.values()))[0].index
    common = first[np.sort(first.get_indexer(common))]
    dropped = sum(len(v) - len(common) for v, _ in per.values())
    vals = {k: v.loc[common] for k, (v, _) in per.items()}
    strata = None
    if not collapse and len(common) and common.get_level_values("fold").nunique() > 1:
        strata = common.get_level_values("fold").to_numpy()
    return vals, {k: how for k, (_, how) in per.items()}, dropped, strata


def pairwise_tests(sets: dict, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                   ensembles: dict | None = None) -> pd.DataFrame:
    """All model pairs of every test set, one paired unit per image.

    Where a model has several fold rows of one image (K fold models on an external set, or on a test split all
    folds predict), the units of that test set are images: the model's fold-ensemble value when ``ensembles``
    has it, else its mean over folds (never the K x images rows, which would be pseudo-replication); otherwise
    the units are the ``(fold, image_id)`` rows (disjoint per-fold test images) and the bootstrap is
    fold-stratified.

    Args:
        sets: ``{test set: {(architecture, input_size): ImageTable}}`` (:func:`~msb.analysis.protocol.polyp.
            test_set_tables`).
        n_boot, seed, level: bootstrap of the mean difference.
        ensembles: the same mapping of fold-ensemble tables (``test_set_tables(..., ensembles=True)``).

    Returns:
        ``test_set, model_a, model_b, metric, n`` (paired images), ``n_dropped, statistic, p_value, p_adjusted``
        (BH within the test set), ``rank_biserial`` (> 0: a scores higher), ``median_difference,
        mean_difference, ci_low, ci_high`` (a − b), ``values_a, values_b`` (``image rows``, ``fold ensemble`` or
        ``mean over folds (K)``), ``n_boot, seed, test, correction``.

    Raises:
        AnalysisSkipped: no test set with two models.
    """
    out = []
    ensembles = ensembles or {}
    for name, tabs in sets.items():
        if len(tabs) < 2:
            continue
        metrics = ["dice"] + (["hd95"] if all("hd95" in t.extra for t in tabs.values()) else [])
        ens = {k: e for k, e in ensembles.get(name, {}).items()
               if all(m in e.extra and np.isfinite(e.extra[m]).any() for m in metrics[1:])}
        al, how, dropped, strata = _aligned(tabs, ens, metrics)
        if not al or len(next(iter(al.values()))) == 0:
            continue
        block = []
        for (ka, kb), m in itertools.product(itertools.combinations(sorted(al), 2), metrics):
            a, b = al[ka][m].to_numpy(dtype=np.float64), al[kb][m].to_numpy(dtype=np.float64)
            r = paired_wilcoxon(a, b)
            d = a - b
            bs = bootstrap_mean(d, n_boot, level, seed, strata) if np.isfinite(d).any() else None
            block.append({"test_set": name, "model_a": _name(ka), "model_b": _name(kb), "metric": m, "n": r.n,
                          "n_dropped": r.n_dropped + dropped, "statistic": r.statistic, "p_value": r.p_value,
                          "rank_biserial": r.rank_biserial, "median_difference": r.median_difference,
                          "mean_difference": r.mean_difference, "ci_low": bs.low if bs else np.nan,
                          "ci_high": bs.high if bs else np.nan, "values_a": how[ka], "values_b": how[kb],
                          "n_boot": n_boot, "seed": seed, "test": WILCOXON})
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
                         "Significant": tidy["p_adjusted"] < alpha, "Values A": tidy["values_a"],
                         "Values B": tidy["values_b"]})
    disp = pd.DataFrame({"Test set": tidy["test_set"], "Model A": tidy["model_a"], "Model B": tidy["model_b"],
                         "Metric": tidy["metric"], "n": tidy["n"].astype(str),
                         "Mean diff (A−B) [95% CI]": [f"{fmt_num(m, 4)} [{fmt_num(lo, 4)}, {fmt_num(hi, 4)}]" for m, lo, hi
                                                      in zip(tidy["mean_difference"], tidy["ci_low"], tidy["ci_high"])],
                         "Rank-biserial r": [fmt_num(v) for v in tidy["rank_biserial"]],
                         "p": [("–" if not np.isfinite(v) else f"{v:.3g}") for v in tidy["p_value"]],
                         "p (BH)": [("–" if not np.isfinite(v) else f"{v:.3g}") for v in tidy["p_adjusted"]],
                         "Significant": ["yes" if v < alpha else "no" for v in tidy["p_adjusted"]],
                         "Values A": tidy["values_a"], "Values B": tidy["values_b"]})
    cap = (f"Paired two-sided Wilcoxon signed-rank tests on per-image scores between models, per test set; "
           f"p (BH): Benjamini-Hochberg FDR within each test set (all pairs x metrics), significant at {alpha}; "
           f"rank-biserial r > 0: A scores higher; 95% percentile bootstrap CI of the mean difference from "
           f"{n_boot} replicates (unit = image, seed {seed}; fold-stratified only where each fold has its own test "
           f"images); n = images: a model with several fold rows per image (external sets, a shared test split) "
           f"enters once per image, as its fold ensemble or its mean over folds (Values A/B); HD95 in px, "
           f"lower is better")
    return PaperTable("wilcoxon", vals, disp, cap)


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry."""
    mixed = options.get("allow_mixed_protocols", False)
    sets = test_set_tables(art.counts, art.metrics, "Wilcoxon tests", mixed)
    ens = test_set_tables(art.counts, art.metrics, "Wilcoxon tests", mixed, ensembles=True)
    tidy = pairwise_tests(sets, int(options.get("n_boot", 1000)), int(options.get("seed", 0)),
                          float(options.get("level", 0.95)), ens)
    return AnalysisOutput(tables=[wilcoxon_table(tidy)], data={"wilcoxon": tidy})
