"""Output formats of the CLI's result tables: ``--format table|csv|json|markdown``.

``table`` is a rich table for a terminal; when stdout is not a terminal (a pipe, a log file, CI) the default
is ``csv``, so that no table is ever wrapped mid-word at 80 columns and every value stays machine-readable.
``markdown`` is a GitHub pipe table (:func:`msb.analysis.report.tables.frame_to_markdown`), ``json`` one object per
row. Lines are written without hard wrapping.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Optional, TypeVar

from rich.table import Table

from msb.cli.common import console, err_console, log, track
from msb.errors import MSBError

if TYPE_CHECKING:  # pandas is imported by the callers that build frames (the columnar reaggregate path never does)
    import pandas as pd

__all__ = ["FORMATS", "FORMAT_HELP", "resolve_format", "emit_frame", "print_scores", "print_leaderboards",
           "err_log", "status_log", "status_track"]

T = TypeVar("T")

#: Accepted ``--format`` values.
FORMATS: tuple[str, ...] = ("table", "csv", "json", "markdown")
FORMAT_HELP = ("Result tables as table | csv | json | markdown (default: table on a terminal, csv when stdout is "
               "not a terminal).")


def resolve_format(fmt: Optional[str]) -> str:
    """The output format: ``fmt``, or ``table`` on a terminal and ``csv`` otherwise.

    Raises:
        MSBError: ``fmt`` is not one of :data:`FORMATS` (the message lists them).
    """
    if fmt is None:
        return "table" if console.is_terminal else "csv"
    if fmt not in FORMATS:
        raise MSBError(f"--format must be one of {', '.join(FORMATS)}, not '{fmt}'")
    return fmt


def err_log(msg: str) -> None:
    """One status line on stderr (never hard-wrapped): stdout stays pure data."""
    err_console.print(msg, highlight=False, markup=False, soft_wrap=True)


def status_log(fmt: str) -> Callable[[str], None]:
    """The status-line logger for output format ``fmt``: stdout (:func:`msb.cli.common.log`) for ``table``,
    stderr (:func:`err_log`) for ``csv`` / ``json`` / ``markdown`` so that stdout carries the table only."""
    return log if fmt == "table" else err_log


def status_track(fmt: str) -> Callable[[Iterable[T], str, int], Iterator[T]]:
    """The progress wrapper for output format ``fmt``: :func:`msb.cli.common.track` for ``table``; otherwise the
    progress goes to stderr (a rich bar when stderr is a terminal, else one line per 10 %)."""
    if fmt == "table":
        return track

    def _track(it: Iterable[T], desc: str, total: int) -> Iterator[T]:
        if not err_console.is_terminal:
            from msb.cli.progress import progress_lines

            yield from progress_lines(it, desc, total, err_log)
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        with Progress(TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=True) as progress:
            yield from progress.track(it, total=total, description=desc)

    return _track


def _write(text: str) -> None:
    console.print(text, highlight=False, markup=False, soft_wrap=True, end="")


def emit_frame(df: pd.DataFrame, fmt: str, title: str = "", rich_table: Table | None = None) -> None:
    """Print one result table in ``fmt``.

    Args:
        df: the table (cells as they should appear; the index is not printed).
        fmt: one of :data:`FORMATS` (:func:`resolve_format`).
        title: shown above ``table`` / ``markdown`` output (``csv`` / ``json`` stay pure data).
        rich_table: a ready rich table for ``table`` (default: one built from ``df``, long cells wrapped at
            spaces only).
    """
    if fmt == "csv":
        _write(df.to_csv(index=False))
    elif fmt == "json":
        _write(df.to_json(orient="records", force_ascii=False, double_precision=15) + "\n")
    elif fmt == "markdown":
        from msb.analysis.report.tables import frame_to_markdown

        _write((f"**{title}**\n\n" if title else "") + frame_to_markdown(df.astype(str), index=False) + "\n")
    else:
        if rich_table is None:
            rich_table = Table(title=title or None)
            for c in df.columns:
                rich_table.add_column(str(c), overflow="fold" if df[c].astype(str).str.len().max() > 40 else "ellipsis")
            for row in df.itertuples(index=False):
                rich_table.add_row(*(str(v) for v in row))
        if _fits(rich_table):
            console.print(rich_table)
        else:  # narrower than its longest words: one block per row, never a word broken mid-way
            _print_vertical(df, title)


def _fits(table: Table) -> bool:
    """Whether ``table`` fits the console without breaking a word: rich's minimum width of a table is the sum
    of its columns' longest words (plus borders and padding); below it rich folds words mid-way."""
    from rich.measure import Measurement

    wide = console.options.update_width(1 << 16)  # measured unclamped (rich clamps to the options' width)
    return Measurement.get(console, wide, table).minimum <= console.width


def _print_vertical(df: pd.DataFrame, title: str) -> None:
    """``df`` as one ``column: value`` block per row (the terminal is too narrow for the table)."""
    width = max((len(str(c)) for c in df.columns), default=0)
    lines = [f"{title} (one block per row: the terminal is too narrow for the table)"] if title else []
    for k, row in enumerate(df.itertuples(index=False), 1):
        lines.append(f"-- row {k} of {len(df)}")
        lines += [f"{str(c).ljust(width)}  {v}" for c, v in zip(df.columns, row)]
    _write("\n".join(lines) + "\n")


def print_scores(table, fmt: str) -> None:
    """A :func:`msb.analysis.counts.aggregate.reaggregate` result: the rich table for ``table``, else one row per
    group with a ``<metric>_<rule>`` column per score (:func:`msb.analysis.counts.aggregate.scores_wide`; floats,
    NaN where undefined)."""
    from msb.analysis.counts.aggregate import render_scores_table, scores_wide

    emit_frame(scores_wide(table), fmt, "Scores", render_scores_table(table) if fmt == "table" else None)


def print_leaderboards(counts, out_dir: Path, fmt: str = "table", setting=None) -> None:
    """The closing leaderboard of ``msb run`` (:mod:`msb.analysis.report.leaderboard`) under the study's statistics
    setting (:class:`msb.config.analysis_schema.AnalysisConfig`, printed after each block) and where the report
    goes."""
    from msb.analysis.report.leaderboard import study_leaderboards
    from msb.config.analysis_schema import AnalysisConfig

    setting = setting or AnalysisConfig()
    for lb in study_leaderboards(counts, setting):
        title = (f"Leaderboard {lb.dataset}/{lb.split} (rank by image-macro Dice; {setting.bootstrap} bootstrap "
                 f"replicates over images)")
        t = Table(title=title)
        for c in lb.table.columns:
            t.add_column(str(c), no_wrap=True, justify="right" if c != "system" else "left")  # narrow: row blocks
        for row in lb.table.itertuples(index=False):
            t.add_row(*(str(v) for v in row))
        emit_frame(lb.table, fmt, title, t)
        if lb.verdict:
            log(lb.verdict)
        for line in lb.lines:
            log(line)
        log(f"statistics setting: {setting.describe(lb.n_tests if lb.n_tests else None)}")
    log(f"full report (CIs, tests, figures, checklist): msb report {out_dir}")
