"""The console leaderboard that ends ``msb run``: per test set, the systems ranked by image-macro Dice with
95 % bootstrap CIs, and the paired test of every pair (the report's first screen, in text).

Same analyses as the report (:func:`msb.analysis.report.report_data.analyse_blocks`,
:func:`msb.analysis.stats.compare.family_tests`, :func:`msb.analysis.stats.compare.paired_differences_table`) under
the same statistics setting (:class:`msb.config.analysis_schema.AnalysisConfig`: replicates, level, seed, test
family, correction), on the counts only (no metrics tables, so no HD95 column), identical systems named once
(:mod:`msb.analysis.counts.identical`). The CIs and p-values are therefore identical to the report's.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from msb.analysis.stats.compare import family_tests, paired_differences_table
from msb.analysis.counts.identical import drop_identical
from msb.analysis.report.report_data import analyse_blocks
from msb.analysis.report.summary import BlockTests, leaderboard, significance_sentences
from msb.analysis.report.verdict import block_ranks, verdict_sentence
from msb.analysis.counts.systems import comparison_blocks, find_systems
from msb.config.analysis_schema import AnalysisConfig

__all__ = ["Leaderboard", "study_leaderboards"]

@dataclass(frozen=True)
class Leaderboard:
    """One test set's leaderboard: ``dataset``, ``split``, ``table`` (:func:`msb.analysis.report.summary.leaderboard`
    columns, text cells), ``lines`` (paired-test sentences), ``verdict`` (:mod:`msb.analysis.report.verdict`),
    ``ranks`` (the bootstrap rank table, :meth:`RankDistribution.table`, or None)."""

    dataset: str
    split: str
    table: pd.DataFrame
    lines: tuple[str, ...]
    n_tests: int = 0
    verdict: str = ""
    ranks: pd.DataFrame | None = None


def study_leaderboards(counts: pd.DataFrame, setting: AnalysisConfig | None = None) -> list[Leaderboard]:
    """Leaderboards of every (dataset, split) of a study's counts.

    Args:
        counts: the study's counts rows (:func:`msb.analysis.counts.counts_io.read_counts`).
        setting: the study's statistics setting (default: :class:`AnalysisConfig`'s defaults): bootstrap
            replicates (image-level percentile CIs; paired for differences), level, seed, test family, correction.

    Returns:
        One :class:`Leaderboard` per block, sorted by dataset and split.

    Raises:
        MSBError: invalid counts rows (as the report).
    """
    st = setting or AnalysisConfig()
    n_boot, level, seed = st.bootstrap, st.level, st.seed
    blocks, identical = drop_identical(comparison_blocks(find_systems(counts, "run")), {})
    notes: list[str] = []
    data = analyse_blocks(blocks, None, ("image-macro", "global-micro"), ("dice",), n_boot, level, seed, notes)
    out = []
    for key, b in data.items():
        tests = None
        n_tests = 0
        if len(b.aligned) >= 2:
            tests = BlockTests(family_tests(b.aligned, st.test_family, (), st.correction),
                               paired_differences_table(b.aligned, ("image-macro",), "dice", n_boot, level, seed))
            n_tests = int(tests.wilcoxon["p_value"].notna().sum()) if len(tests.wilcoxon) else 0
        lines = significance_sentences(tests, len(b.systems), identical.get(key, ()))
        dist = block_ranks(b.aligned, n_boot, level, seed)
        verdict = verdict_sentence(dist, tests.wilcoxon if tests else None, tests.differences if tests else None,
                                   len(b.systems))
        out.append(Leaderboard(key[0], key[1], leaderboard(b.scores, b.boundary, "px"), tuple(lines + notes),
                               n_tests, verdict, dist.table() if dist is not None else None))
    return out
