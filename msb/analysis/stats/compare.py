"""Scores with bootstrap CIs per group, and comparisons between systems (``msb reaggregate --bootstrap N
--compare``; the report uses the same functions).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
from rich.table import Table

from msb.analysis.counts.aggregate import ALL_METRICS, DEFAULT_GROUP
from msb.analysis.stats.bootstrap import DEFAULT_LEVEL, bootstrap_rule, bootstrap_rules
from msb.analysis.stats.ranking import ranking_sensitivity
from msb.analysis.counts.rules import BASE_RULES, ImageTable, aggregate_rules, image_table, unit_scores
from msb.analysis.stats.significance import bh_adjust, check_posthoc, friedman_test, pairwise_wilcoxon
from msb.analysis.counts.systems import align_tables, comparison_blocks, find_systems
from msb.errors import MSBError
from msb.config.analysis_schema import AnalysisConfig

__all__ = ["scores_with_ci", "paired_tests", "family_tests", "paired_differences_table", "Comparison", "compare_systems",
           "rich_frame", "ci_display", "run_extended"]


def scores_with_ci(df: pd.DataFrame, group_by: Sequence[str] = DEFAULT_GROUP, rules: Sequence[str] = BASE_RULES,
                   metrics: Sequence[str] = ALL_METRICS, n_boot: int = 0, level: float = DEFAULT_LEVEL,
                   seed: int = 0) -> pd.DataFrame:
    """:func:`msb.analysis.counts.rules.aggregate_rules` plus image-level percentile bootstrap CIs per group.

    Args:
        df: counts rows; group_by, rules, metrics: as ``aggregate_rules``.
        n_boot: replicates (0: no CI columns are added); level: CI level; seed: RNG seed (the same for
            every group). Groups holding several folds are resampled within folds.

    Returns:
        The ``aggregate_rules`` table, with ``ci_low, ci_high, ci_level, n_boot`` when ``n_boot > 0``.
    """
    table = aggregate_rules(df, group_by, rules, metrics)
    if n_boot <= 0:
        return table
    group_by = list(group_by)
    lows, highs = np.full(len(table), np.nan), np.full(len(table), np.nan)
    groups = ([(k if isinstance(k, tuple) else (k,), g) for k, g in df.groupby(group_by, sort=True, dropna=False)]
              if group_by else [((), df)])
    for key, g in groups:
        sel = np.ones(len(table), dtype=bool)
        for c, v in zip(group_by, key):
            sel &= (table[c] == v).to_numpy()
        idx = np.flatnonzero(sel)
        t = image_table(g)
        pairs = list(zip(table["aggregation"].iloc[idx], table["metric"].iloc[idx]))
        res = bootstrap_rules(t, pairs, n_boot, level, seed)
        for i, p in zip(idx, pairs):
            lows[i], highs[i] = res[p].low, res[p].high
    table["ci_low"], table["ci_high"] = lows, highs
    table["ci_level"] = level
    table["n_boot"] = int(n_boot)
    return table


def paired_tests(aligned: dict[str, ImageTable], metrics: Sequence[str] = ("dice",), correction: str = "bh"
                 ) -> pd.DataFrame:
    """Pairwise Wilcoxon tests on per-image scores for each metric, adjusted over all rows together (one family).

    Args:
        aligned: label -> table, aligned on the same images (:func:`align_tables`).
        metrics: counts metrics or attached ``extra`` columns (a metric missing from a system is skipped).
        correction: ``bh`` (Benjamini-Hochberg over every pair x metric of this call) or ``none``
            (``p_adjusted`` = ``p_value``).

    Returns:
        :func:`msb.analysis.stats.significance.pairwise_wilcoxon` rows for every metric, ``p_adjusted`` and
        ``correction`` recomputed over all of them.
    """
    labels = list(aligned)
    parts = []
    for m in metrics:
        if m not in ALL_METRICS and not all(m in aligned[lab].extra for lab in labels):
            continue
        parts.append(pairwise_wilcoxon({lab: unit_scores(aligned[lab], m, "image") for lab in labels}, m))
    if not parts:
        return pd.DataFrame()
    tab = pd.concat(parts, ignore_index=True)
    n = int(tab["p_value"].notna().sum())
    if correction == "none":
        tab["p_adjusted"] = tab["p_value"]
        tab["correction"] = f"none (m={n})"
    else:
        tab["p_adjusted"] = bh_adjust(tab["p_value"].to_numpy())
        tab["correction"] = f"Benjamini-Hochberg (m={n})"
    return tab


def family_tests(aligned: dict[str, ImageTable], family: Sequence[str], others: Sequence[str] = (),
                 correction: str = "bh") -> pd.DataFrame:
    """The paired tests of one statistics setting: the metrics of ``family`` corrected together
    (:func:`paired_tests`), then each metric of ``others`` that is not in the family as a family of its own
    (its ``correction`` column says so). The family's rows are identical whatever ``others`` holds, so the console
    leaderboard, ``reaggregate --compare`` and the report print the same p-values for it.

    Args:
        aligned: label -> aligned image table. family: :attr:`AnalysisConfig.test_family`.
        others: further metrics tested (e.g. ``hd95`` in the report), each corrected on its own.
        correction: ``bh`` or ``none``.

    Returns:
        The rows of :func:`paired_tests`, family first.
    """
    parts = [paired_tests(aligned, family, correction)]
    for m in others:
        t = paired_tests(aligned, (m,), correction) if m not in family else pd.DataFrame()
        if len(t):
            parts.append(t.assign(correction=t["correction"] + f" ({m} alone)"))
    parts = [t for t in parts if len(t)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def paired_differences_table(aligned: dict[str, ImageTable], rules: Sequence[str] = ("image-macro", "global-micro"),
                             metric: str = "dice", n_boot: int = 2000, level: float = DEFAULT_LEVEL,
                             seed: int = 0) -> pd.DataFrame:
    """Difference ``a − b`` of every pair under each rule, with paired (fold-stratified) bootstrap CIs.

    Returns:
        ``system_a, system_b, aggregation, metric, difference, ci_low, ci_high, ci_level, n_images, n_strata,
        method``; CIs NaN when ``n_boot == 0``.
    """
    rows = []
    for la, lb in itertools.combinations(list(aligned), 2):
        for rule in rules:
            ra, rb = bootstrap_rule([aligned[la], aligned[lb]], rule, metric, max(n_boot, 1), level, seed)
            d = ra.replicates - rb.replicates
            ok = np.isfinite(d)
            if n_boot > 0 and ok.any():
                lo, hi = np.percentile(d[ok], [100 * (1 - level) / 2, 100 * (1 + level) / 2])
            else:
                lo = hi = np.nan
            rows.append({"system_a": la, "system_b": lb, "aggregation": rule, "metric": metric,
                         "difference": ra.estimate - rb.estimate, "ci_low": float(lo), "ci_high": float(hi),
                         "ci_level": level if n_boot > 0 else np.nan, "n_images": ra.n_images,
                         "n_strata": ra.n_strata, "method": "paired percentile bootstrap"})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Comparison:
    """Comparisons of the systems of one (dataset, split) block."""

    dataset: str
    split: str
    systems: tuple[str, ...]
    n_images: int
    wilcoxon: pd.DataFrame
    differences: pd.DataFrame
    friedman: str
    ranking: pd.DataFrame


def compare_systems(df: pd.DataFrame, system_by: str = "run", rules: Sequence[str] = BASE_RULES,
                    metrics: Sequence[str] = ALL_METRICS, n_boot: int = 2000, level: float = DEFAULT_LEVEL,
                    seed: int = 0, posthoc: str = "nemenyi", family: Sequence[str] = ("dice",),
                    correction: str = "bh") -> list[Comparison]:
    """Compare the systems of each (dataset, split) block on their common images (``posthoc``: the test after
    Friedman for >= 3 systems, ``"nemenyi"`` or ``"conover"``; ``family``/``correction``: the statistics setting's
    test family, :func:`family_tests`; IoU and recall are tested as families of their own).

    Returns:
        One :class:`Comparison` per block with at least two systems.

    Raises:
        MSBError: no block holds two systems (nothing to compare), or a system's rows are invalid.
    """
    out = []
    for (ds, sp), systems in comparison_blocks(find_systems(df, system_by)).items():
        if len(systems) < 2:
            continue
        aligned = align_tables({s.label: s.table() for s in systems}, "intersect")
        labels = list(aligned)
        tests = family_tests(aligned, [m for m in family if m in metrics] or list(metrics)[:1],
                             [m for m in ("dice", "iou", "recall") if m in metrics], correction)
        diffs = paired_differences_table(aligned, [r for r in ("image-macro", "global-micro") if r in rules]
                                         or list(rules)[:1], "dice" if "dice" in metrics else metrics[0],
                                         n_boot, level, seed)
        if len(labels) >= 3:
            fr = friedman_test({lab: unit_scores(aligned[lab], "dice", "image") for lab in labels}, posthoc)
            friedman = (f"{fr.test}: chi2 = {fr.statistic:.4g}, p = {fr.p_value:.4g} (n = {fr.n} images, k = {fr.k}); "
                        f"{fr.posthoc_test} p-values: " + "; ".join(
                            f"{a} vs {b}: {fr.posthoc.loc[a, b]:.4g}" for a, b in itertools.combinations(labels, 2)))
        else:
            friedman = "Friedman test: not applicable (2 systems)"
        sub = pd.concat([aggregate_rules(s.rows, [], rules, metrics).assign(system=s.label) for s in systems],
                        ignore_index=True)
        out.append(Comparison(ds, sp, tuple(labels), aligned[labels[0]].n_images, tests, diffs, friedman,
                              ranking_sensitivity(sub)))
    if not out:
        raise MSBError("--compare needs at least two systems evaluated on the same dataset split; found "
                       + ", ".join(f"{s.label} ({s.dataset}/{s.split})" for s in find_systems(df, system_by)))
    return out


def rich_frame(df: pd.DataFrame, title: str = "", digits: int = 4) -> Table:
    """A :class:`rich.table.Table` of any DataFrame (floats with ``digits`` decimals, p-values as ``.4g``)."""
    t = Table(title=title or None)
    for c in df.columns:
        t.add_column(str(c), justify="right" if df[c].dtype.kind in "fi" else "left")
    for row in df.itertuples(index=False):
        cells = []
        for c, v in zip(df.columns, row):
            if isinstance(v, (float, np.floating)):
                cells.append("n/a" if not np.isfinite(v) else
                             (f"{v:.4g}" if str(c).startswith("p_") else f"{v:.{digits}f}"))
            else:
                cells.append(str(v))
        t.add_row(*cells)
    return t


def ci_display(table: pd.DataFrame, digits: int = 4) -> pd.DataFrame:
    """Compact view of a :func:`scores_with_ci` table: the varying group columns, ``aggregation``, ``images``
    and one ``"value [low, high]"`` column per metric (``(-k)`` marks k excluded undefined units)."""
    from msb.analysis.counts.aggregate import SCORE_COLUMNS

    extra = {"ci_low", "ci_high", "ci_level", "n_boot"}
    group_cols = [c for c in table.columns if c not in SCORE_COLUMNS and c not in extra]
    varying = [c for c in group_cols if table[c].nunique(dropna=False) > 1]
    rows = {}
    for r in table.itertuples(index=False):
        rec = r._asdict()
        key = tuple(rec[c] for c in varying) + (rec["aggregation"],)
        row = rows.setdefault(key, {**{c: rec[c] for c in varying}, "aggregation": rec["aggregation"],
                                    "images": str(rec["n_images"])})
        v = rec["value"]
        cell = "n/a" if not np.isfinite(v) else f"{v:.{digits}f}"
        lo, hi = rec.get("ci_low", np.nan), rec.get("ci_high", np.nan)
        if np.isfinite(lo) and np.isfinite(hi):
            cell += f" [{lo:.{digits}f}, {hi:.{digits}f}]"
        if rec["n_excluded"]:
            cell += f" (-{rec['n_excluded']})"
        row[str(rec["metric"])] = cell
    return pd.DataFrame(list(rows.values()))


def run_extended(df: pd.DataFrame, group_by: Sequence[str], rules: str | None, populations: Sequence[str],
                 n_boot: int, compare: bool, seed: int, system_by: str, out, show, log, posthoc: str = "nemenyi",
                 setting: AnalysisConfig | None = None) -> None:
    """Body of ``msb reaggregate`` with ``--rules``, ``--population``, ``--bootstrap`` or ``--compare``.

    Args:
        df: counts rows; group_by: pooling columns; rules: ``--rules`` text (None = the basic three);
        populations: ``--population`` specs; n_boot: ``--bootstrap``; compare: ``--compare``; seed: ``--seed``;
        system_by: ``--system-by``; out: output folder or None; show: prints a rich renderable; log: prints a line;
        posthoc: ``--posthoc`` (nemenyi | conover).

    Writes (with ``out``): ``scores.csv``/``scores.parquet`` (with CI columns when bootstrapped),
    ``populations.csv``, ``wilcoxon.csv``, ``paired_differences.csv``, ``ranking_sensitivity.csv``.

    Raises:
        MSBError: bad rules, population specs or bootstrap count; nothing to compare.
    """
    from msb.analysis.counts.aggregate import write_scores
    from msb.analysis.stats.populations import compare_populations, parse_population
    from msb.analysis.counts.rules import parse_rules
    from msb.utils.atomic import atomic_write_text

    if isinstance(n_boot, bool) or n_boot < 0:
        raise MSBError(f"--bootstrap must be a non-negative integer, got {n_boot!r}")
    rule_list = parse_rules(rules)
    pops = [parse_population(p) for p in populations]  # parse all before computing anything
    # compute everything first, so that an error leaves no output file behind
    setting = (setting or AnalysisConfig()).model_copy(update={"bootstrap": n_boot, "seed": seed})
    level = setting.level
    table = scores_with_ci(df, group_by, rule_list, ALL_METRICS, n_boot, level, seed)
    comp = compare_populations(df, pops, group_by, rule_list, ["dice"]) if pops else None
    check_posthoc(posthoc)
    comps = compare_systems(df, system_by, rule_list, ALL_METRICS, n_boot, level, seed, posthoc,
                            setting.test_family, setting.correction) if compare else []
    title = "Scores" + (f" with {100 * level:.0f}% percentile bootstrap CIs ({n_boot} replicates, "
                        f"seed {seed})" if n_boot else "")
    show(rich_frame(ci_display(table), title))
    files = []
    if out is not None:
        files += write_scores(table, out)
    if comp is not None:
        varying = [c for c in group_by if comp[c].nunique(dropna=False) > 1]
        show(rich_frame(comp[[*varying, "population", "aggregation", "metric", "value_all", "value_subset",
                              "value_complement", "delta", "n_images_all", "n_images_subset"]],
                        "Populations (same predictions; delta = subset - all)"))
        if out is not None:
            atomic_write_text(out / "populations.csv", comp.to_csv(index=False))
            files.append(out / "populations.csv")
    if comps:
        for c in comps:
            where = f"{c.dataset}/{c.split}, {c.n_images} common images"
            fam = c.wilcoxon["metric"].isin(setting.test_family)
            show(rich_frame(c.wilcoxon[["system_a", "system_b", "metric", "test", "n", "statistic", "p_value",
                                        "p_adjusted", "correction", "rank_biserial", "median_difference"]],
                            f"Paired tests ({where})"))
            log(f"statistics setting: {setting.describe(int(c.wilcoxon.loc[fam, 'p_value'].notna().sum()))}")
            show(rich_frame(c.differences[["system_a", "system_b", "aggregation", "metric", "difference", "ci_low",
                                           "ci_high"]], f"Differences a - b ({where})"))
            log(c.friedman)
            show(rich_frame(c.ranking[["aggregation", "metric", "winner", "ranking", "spearman_rho",
                                       "n_rank_changes", "winner_changed"]],
                            f"Ranking sensitivity ({where}; reference {c.ranking['reference'].iloc[0]})"))
        if out is not None:
            for name, attr in (("wilcoxon", "wilcoxon"), ("paired_differences", "differences"),
                               ("ranking_sensitivity", "ranking")):
                frame = pd.concat([getattr(c, attr).assign(dataset=c.dataset, split=c.split) for c in comps],
                                  ignore_index=True)
                atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
                files.append(out / f"{name}.csv")
    if files:
        log(f"written: {', '.join(str(p) for p in files)}")
