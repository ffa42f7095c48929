"""(e) The five-point Polyp Segmentation Reporting Checklist (PSRC) of the polyp audit ("Metrics or Mirage?", §7),
filled from the study's own artifacts. The five points, in the audit's order (paraphrased):

1. HD95 is reported beside Dice (boundary accuracy);
2. recall (sensitivity) is reported as a primary metric;
3. the split protocol is stated and numbers of different protocols are not put in one column;
4. at least one external / out-of-distribution test set (an unseen centre or dataset) is evaluated;
5. statistical significance is tested on per-image scores (Wilcoxon signed-rank or Friedman).

Evidence per point: 1 ``metrics.parquet`` with a defined ``hd95`` per evaluation; 2 recall computable from the
counts (defined per-image values); 3 the ``split_policy`` context of every counts row (known, one protocol
family); 4 evaluations under ``evaluation/external/``; 5 the Wilcoxon tests of :mod:`~msb.analysis.protocol.
wilcoxon` on this study (N/A with a single model).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from msb.analysis.counts.aggregate import score_from_counts
from msb.analysis.report.contract import ChecklistItem
from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable, evaluation_rows
from msb.analysis.protocol.inputs import protocol_family
from msb.analysis.protocol.polyp import test_set_tables
from msb.analysis.protocol.wilcoxon import pairwise_tests

__all__ = ["PSRC_ITEMS", "psrc_checklist", "checklist_table"]

#: The checklist's five items (short names).
PSRC_ITEMS: tuple[str, ...] = ("HD95 reported alongside Dice", "Recall / sensitivity reported",
                               "Split protocol stated, protocols not mixed", "External / OOD test set",
                               "Statistical significance tested")


def _hd95_item(counts: pd.DataFrame, metrics: pd.DataFrame | None) -> ChecklistItem:
    dirs = sorted(set(counts["eval_dir"]))
    if metrics is None or "hd95" not in metrics.columns:
        return ChecklistItem(PSRC_ITEMS[0], False, "no metrics.parquet with hd95 beside the counts; run "
                                                   "`msb metrics RUN_DIR` (and on external/ensemble folders)")
    have = metrics.loc[metrics["hd95"].notna(), ["run_id", "dataset", "split"]].drop_duplicates()
    keys = counts[["run_id", "dataset", "split"]].drop_duplicates()
    miss = keys.merge(have, how="left", indicator=True)
    miss = miss[miss["_merge"] == "left_only"]
    conv = sorted(set(metrics["hd_convention"].astype(str))) if "hd_convention" in metrics.columns else []
    return ChecklistItem(PSRC_ITEMS[0], miss.empty,
                         f"defined hd95 for {len(keys) - len(miss)}/{len(keys)} evaluation(s) in {len(dirs)} "
                         f"folder(s), convention {conv}"
                         + (f"; missing: {sorted(set(miss['run_id']))[:5]}" if len(miss) else ""))


def _recall_item(counts: pd.DataFrame) -> ChecklistItem:
    rec = score_from_counts("recall", counts["tp"].to_numpy(np.float64), counts["fp"].to_numpy(np.float64),
                            counts["fn"].to_numpy(np.float64))
    n = int(np.isfinite(rec).sum())
    return ChecklistItem(PSRC_ITEMS[1], n > 0, f"recall recomputed from the stored counts: {n} defined image x "
                                              f"class value(s) of {len(rec)}; reported in the P1/P3 tables")


def _split_item(counts: pd.DataFrame) -> ChecklistItem:
    pol = sorted(set(counts["split_policy"].astype(str)))
    # external sets are "external-only" by definition: beside one training protocol that is not a second protocol
    fam = sorted({protocol_family(p) for p in pol if p != "external-only"})
    if "unknown" in pol or "unspecified" in pol:
        return ChecklistItem(PSRC_ITEMS[2], False, f"split policy not recorded for some counts rows (found {pol}); "
                                                   f"re-evaluate with this msb to record split_policy")
    if len(fam) > 1:
        return ChecklistItem(PSRC_ITEMS[2], False, f"several split protocols in one study: {pol}; keep them in "
                                                   f"separate tables (the analyses refuse to mix them)")
    return ChecklistItem(PSRC_ITEMS[2], True, f"every counts row records its split policy: {pol}")


def _external_item(counts: pd.DataFrame) -> ChecklistItem:
    ext = sorted(set(counts.loc[counts["eval_kind"] == "external", "dataset"].astype(str)))
    if ext:
        return ChecklistItem(PSRC_ITEMS[3], True, f"external test set(s) evaluated without retraining: {ext}")
    return ChecklistItem(PSRC_ITEMS[3], False, "only internal test splits; declare final.external in the study")


def _significance_item(art, tests: pd.DataFrame | None = None) -> ChecklistItem:
    try:
        if tests is None:
            tests = pairwise_tests(test_set_tables(art.counts, art.metrics, "PSRC significance", True), n_boot=1)
    except AnalysisSkipped:
        n = evaluation_rows(art.counts, None)["architecture"].nunique()
        return ChecklistItem(PSRC_ITEMS[4], False, f"not applicable: {n} model(s), no pair on the same images",
                             applicable=n >= 2)
    ok = tests["p_value"].notna()
    sig = int((tests["p_adjusted"] < 0.05).sum())
    return ChecklistItem(PSRC_ITEMS[4], bool(ok.any()),
                         f"{int(ok.sum())} paired Wilcoxon signed-rank test(s) on per-image scores over "
                         f"{tests['test_set'].nunique()} test set(s), BH-adjusted per test set; {sig} significant "
                         f"at 0.05 (table wilcoxon)")


def psrc_checklist(art, tests: pd.DataFrame | None = None) -> list[ChecklistItem]:
    """The five PSRC items of a study's artifacts (:class:`~msb.analysis.protocol.inputs.StudyArtifacts`);
    ``tests``: the tidy output of :func:`~msb.analysis.protocol.wilcoxon.pairwise_tests` when already computed
    (else the tests are run here)."""
    counts = art.counts
    return [_hd95_item(counts, art.metrics), _recall_item(counts), _split_item(counts), _external_item(counts),
            _significance_item(art, tests)]


def checklist_table(items: list[ChecklistItem]) -> PaperTable:
    """Rows = the five points: ``#, Item, Status`` (PASS/FAIL/N/A), ``Evidence``."""
    df = pd.DataFrame({"#": [str(i + 1) for i in range(len(items))], "Item": [i.item for i in items],
                       "Status": [i.status for i in items], "Evidence": [i.evidence for i in items]})
    return PaperTable("checklist", df, df.copy(), "Polyp Segmentation Reporting Checklist (five points of the polyp "
                                                  "evaluation audit), filled from this study's artifacts")


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry."""
    return AnalysisOutput(tables=[checklist_table(psrc_checklist(art, options.get("wilcoxon_tests")))])
