"""The console leaderboard that ends ``msb run``: per test set, the systems ranked by image-macro Dice with
95 % bootstrap CIs, and the paired test of every pair (the report's first screen, in text).

Same analyses as the report (:func:`msb.analysis.report.report_data.analyse_blocks`,
:func:`msb.analysis.stats.compare.paired_tests`, :func:`msb.analysis.stats.compare.paired_differences_table`), on the
counts only (no metrics tables, so no HD95 column), identical systems named once
(:mod:`msb.analysis.counts.identical`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from msb.analysis.stats.bootstrap import DEFAULT_LEVEL
from msb.analysis.stats.compare import paired_differences_table, paired_tests
from msb.analysis.counts.identical import drop_identical
from msb.analysis.report.report_data import analyse_blocks
from msb.analysis.report.summary import BlockTests, leaderboard, significance_sentences
from msb.analysis.counts.systems import comparison_blocks, find_systems

__all__ = ["Leaderboard", "study_leaderboards"]

#: Bootstrap replicates of the console leaderboard (the report uses its own ``--bootstrap``).
N_BOOT = 1000


@dataclass(frozen=True)
class Leaderboard:
    """One test set's leaderboard: ``dataset``, ``split``, ``table`` (:func:`msb.analysis.report.summary.leaderboard`
    columns, text cells), ``lines`` (paired-test sentences)."""

    dataset: str
    split: str
    table: pd.DataFrame
    lines: tuple[str, ...]


def study_leaderboards(counts: pd.DataFrame, n_boot: int = N_BOOT, level: float = DEFAULT_LEVEL,
                       seed: int = 0) -> list[Leaderboard]:
    """Leaderboards of every (dataset, split) of a study's counts.

    Args:
        counts: the study's counts rows (:func:`msb.analysis.counts.counts_io.read_counts`).
        n_boot: bootstrap replicates (image-level percentile CIs; paired for differences); level, seed.

    Returns:
        One :class:`Leaderboard` per block, sorted by dataset and split.

    Raises:
        MSBError: invalid counts rows (as the report).
    """
    blocks, identical = drop_identical(comparison_blocks(find_systems(counts, "run")), {})
    notes: list[str] = []
    data = analyse_blocks(blocks, None, ("image-macro", "global-micro"), ("dice",), n_boot, level, seed, notes)
    out = []
    for key, b in data.items():
        tests = None
        if len(b.aligned) >= 2:
            tests = BlockTests(paired_tests(b.aligned, ("dice",)),
                               paired_differences_table(b.aligned, ("image-macro",), "dice", n_boot, level, seed))
        lines = significance_sentences(tests, len(b.systems), identical.get(key, ()))
        out.append(Leaderboard(key[0], key[1], leaderboard(b.scores, b.boundary, "px"), tuple(lines + notes)))
    return out
