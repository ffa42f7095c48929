"""(a) Ranking sensitivity to pairwise re-aggregation, the MSB paper's Table 2 (MedSegBenchmarker, §4.2-4.3).

Per dataset x input size, the architectures are ranked by foreground Dice under three rules and each pair of
rankings is compared: Spearman's ρ (:func:`scipy.stats.spearmanr` via :func:`msb.analysis.stats.ranking.
ranking_sensitivity`), ``nΔ/N`` (architectures whose rank differs / architectures ranked) and ``W`` (the leading
architecture changed, Yes/No). Ranks: 1 = highest Dice, ties share the smallest rank.

The three rules as the paper defines them:

* **G** global-micro: foreground counts pooled over every image (and class) before one Dice;
* **I** image-macro: per image the foreground classes' counts pooled, one Dice per image, averaged over the
  images with a defined Dice (0/0 excluded). In msb's rule names this is ``image-foreground``; it equals msb's
  ``image-macro`` for a binary task (``i_rule`` selects the other one);
* **C** class-macro: per foreground class the counts pooled over images, then the mean over classes.

Systems are architectures, the internal test rows of all their folds pooled (each fold's images are distinct
rows); ensembles and external sets are not ranked here. Columns: ``Dataset, Size`` then ``G vs. I``, ``G vs. C``,
``I vs. C`` x (``ρ``, ``nΔ/N``, ``W``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable, evaluation_rows, system_tables
from msb.analysis.protocol.inputs import check_one_protocol
from msb.analysis.stats.ranking import ranking_sensitivity
from msb.analysis.counts.rules import rule_values

__all__ = ["PAIRS", "ranking_sensitivity_gic", "ranking_sensitivity_table", "dice_by_rule_frame"]

#: The compared pairs, in the paper's column order.
PAIRS: tuple[tuple[str, str], ...] = (("G", "I"), ("G", "C"), ("I", "C"))


def ranking_sensitivity_gic(counts: pd.DataFrame, i_rule: str = "image-foreground",
                            allow_mixed_protocols: bool = False) -> pd.DataFrame:
    """The tidy ranking-sensitivity table.

    Args:
        counts: counts rows of a study (:class:`~msb.analysis.protocol.inputs.StudyArtifacts`); internal test
            rows of non-ensemble runs, best checkpoint, are used.
        i_rule: msb rule standing for "I" (``image-foreground`` as in the paper, or ``image-macro``).
        allow_mixed_protocols: rank rows of different ``split_policy`` values together.

    Returns:
        One row per (dataset, split, input_size, pair): ``dataset, split, input_size, pair`` (``"G vs. I"``),
        ``msb_rule_a, msb_rule_b`` (the msb rule behind each letter, e.g. ``image-foreground`` for I), ``rho,
        n_changed, n_systems, winner_changed`` (bool), ``winner_a, winner_b`` and the three Dice values per
        architecture in ``dice_by_rule`` (a ``{arch: {G, I, C}}`` JSON-able dict).

    Raises:
        MSBError: mixed split protocols in one block (unless allowed).
        AnalysisSkipped: no internal test rows, or no block with two architectures.
    """
    rows = evaluation_rows(counts, "internal")
    if rows.empty:
        raise AnalysisSkipped("no internal test evaluations (counts under evaluation/<role>/) to rank")
    rules = {"G": "global-micro", "I": i_rule, "C": "class-macro"}
    out = []
    for (ds, sp, size), block in rows.groupby(["dataset", "split", "input_size"], sort=True):
        check_one_protocol(block, f"ranking sensitivity {ds}/{sp} at {size} px", allow_mixed_protocols)
        tables = system_tables(block, ("architecture",))
        if len(tables) < 2:
            continue
        scores, dice = [], {}
        for (arch,), t in tables.items():
            dice[arch] = {}
            for short, rule in rules.items():
                v = float(rule_values(t, rule, "dice")[0])
                dice[arch][short] = v
                scores.append({"system": arch, "aggregation": short, "metric": "dice", "value": v})
        scores = pd.DataFrame(scores)
        for a, b in PAIRS:
            sens = ranking_sensitivity(scores, reference=(a, "dice")).set_index("aggregation")
            ra, rb = sens.loc[a], sens.loc[b]
            out.append({"dataset": ds, "split": sp, "input_size": int(size), "pair": f"{a} vs. {b}",
                        "msb_rule_a": rules[a], "msb_rule_b": rules[b],
                        "rho": float(rb["spearman_rho"]), "n_changed": int(rb["n_rank_changes"]),
                        "n_systems": int(rb["n_systems"]), "winner_changed": bool(rb["winner_changed"]),
                        "winner_a": ra["winner"], "winner_b": rb["winner"], "dice_by_rule": dice})
    if not out:
        raise AnalysisSkipped("no dataset x input size with at least two architectures to rank")
    return pd.DataFrame(out)


def _rho_text(v: float) -> str:
    if not np.isfinite(v):
        return "–"
    s = f"{v:.2f}"
    return s[1:] if s.startswith("0.") else ("-" + s[2:] if s.startswith("-0.") else s)


def ranking_sensitivity_table(tidy: pd.DataFrame, i_rule: str = "image-foreground") -> PaperTable:
    """The paper-layout table of :func:`ranking_sensitivity_gic` output (module docstring)."""
    cols = pd.MultiIndex.from_tuples([("", "Dataset"), ("", "Size")] + [(f"{a} vs. {b}", m) for a, b in PAIRS
                                                                        for m in ("ρ", "nΔ/N", "W")])
    vals, disp = [], []
    for (ds, sp, size), g in tidy.groupby(["dataset", "split", "input_size"], sort=True):
        name = ds if sp == "test" else f"{ds} ({sp})"
        v, d = [name, int(size)], [name, str(size) if size >= 0 else "?"]
        by = g.set_index("pair")
        for a, b in PAIRS:
            r = by.loc[f"{a} vs. {b}"]
            v += [r["rho"], f"{r['n_changed']}/{r['n_systems']}", "Yes" if r["winner_changed"] else "No"]
            d += [_rho_text(r["rho"]), f"{r['n_changed']}/{r['n_systems']}", "Yes" if r["winner_changed"] else "No"]
        vals.append(v)
        disp.append(d)
    caption = ("Ranking sensitivity to pairwise re-aggregation of foreground Dice: ρ Spearman correlation of the "
               "architecture rankings, nΔ/N changed ranks, W changed winner. G global-micro, I per-image "
               f"(msb rule {i_rule}: classes pooled per image, 0/0 images excluded), C class-macro; folds pooled, "
               "internal test split")
    return PaperTable("ranking_sensitivity", pd.DataFrame(vals, columns=cols), pd.DataFrame(disp, columns=cols),
                      caption)


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry: the table (and its tidy CSV) for a study's artifacts."""
    i_rule = options.get("i_rule", "image-foreground")
    tidy = ranking_sensitivity_gic(art.counts, i_rule, options.get("allow_mixed_protocols", False))
    return AnalysisOutput(tables=[ranking_sensitivity_table(tidy, i_rule)],
                          data={"ranking_sensitivity": tidy.drop(columns="dice_by_rule"),
                                "ranking_sensitivity_dice": dice_by_rule_frame(tidy, i_rule)})


def dice_by_rule_frame(tidy: pd.DataFrame, i_rule: str = "image-foreground") -> pd.DataFrame:
    """The ranked values: one row per dataset x split x input size x architecture with its foreground Dice under
    G, I and C (fractions), and the msb rule of each letter in the column names (``G global-micro``,
    ``I image-foreground``, ``C class-macro``), from :func:`ranking_sensitivity_gic`'s ``dice_by_rule``."""
    rules = {"G": "global-micro", "I": i_rule, "C": "class-macro"}
    rows = []
    for (ds, sp, size), g in tidy.groupby(["dataset", "split", "input_size"], sort=True):
        for arch, d in sorted(g["dice_by_rule"].iloc[0].items()):
            rows.append({"dataset": ds, "split": sp, "input_size": int(size), "architecture": arch,
                         **{f"{k} {rules[k]}": d[k] for k in ("G", "I", "C")}})
    return pd.DataFrame(rows)
