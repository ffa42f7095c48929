"""The scores table on a terminal narrower than its longest words: printed as one block per row instead of a
rich table that folds words mid-way (``global-micr│o``); on a wide terminal the table itself."""

from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "analysis"))
from test_aggregate import make_counts  # noqa: E402


@pytest.mark.parametrize("width", [40, 200])
def test_scores_table_never_breaks_a_word(monkeypatch, width: int):
    import pandas as pd

    import msb.cli.format as fmt
    from msb.analysis.counts.aggregate import reaggregate, scores_wide

    counts = pd.concat([make_counts(), make_counts(run_id="r2", model="segformer_b0_long_name")], ignore_index=True)
    table = reaggregate(counts)
    buf = io.StringIO()
    monkeypatch.setattr(fmt, "console", Console(file=buf, width=width, force_terminal=True, color_system=None))
    fmt.print_scores(table, "table")
    out = buf.getvalue()
    wide = scores_wide(table)
    if width == 200:
        assert "│" in out or "┃" in out  # the rich table fits
    else:
        assert "one block per row" in out and "│" not in out
        blocks = out.split("-- row ")[1:]
        assert len(blocks) == len(wide)
        for block, (_, row) in zip(blocks, wide.iterrows()):  # every value of every row, whole
            for col, value in row.items():
                assert re.search(rf"^{re.escape(str(col))}\s+{re.escape(str(value))}$", block, re.M), (col, value)
    for word in ("global-micro", "image-macro", "segformer_b0_long_name"):
        assert word in out  # never folded across lines


@pytest.mark.parametrize("width", [80, 160])
def test_leaderboard_ci_cells_never_wrap(monkeypatch, width: int, tmp_path: Path):
    """`msb run`'s closing leaderboard on an 80-column and a wide terminal: each "value [low, high]" cell stays on
    one line, as the data holds it (a table too wide for the terminal is printed as one block per row)."""
    import pandas as pd

    import msb.cli.common as common
    import msb.cli.format as fmt
    from msb.analysis.report.leaderboard import study_leaderboards
    from msb.config.analysis_schema import AnalysisConfig

    counts = pd.concat([make_counts(), make_counts(run_id="r2", model="segformer_b0_long_name_for_width")],
                       ignore_index=True)
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=True, color_system=None)
    monkeypatch.setattr(fmt, "console", con)
    monkeypatch.setattr(common, "console", con)
    monkeypatch.setattr(fmt, "log", lambda m: con.print(m, soft_wrap=True, markup=False, highlight=False))
    setting = AnalysisConfig(bootstrap=50)
    fmt.print_leaderboards(counts, tmp_path, "table", setting)
    out = buf.getvalue()
    (board,) = study_leaderboards(counts, setting)
    cells = [v for c in board.table.columns if "CI" in str(c) for v in board.table[c].astype(str)]
    assert cells and all(cell in out for cell in cells), (cells, out)
    assert "statistics setting: 50 percentile bootstrap replicates" in out
