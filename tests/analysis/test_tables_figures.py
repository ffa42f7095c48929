"""LaTeX / Markdown / HTML tables (best per column marked, CIs, escaping) and figure files / overlay colours."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from msb.analysis.report.figures import OVERLAY_COLORS, overlay_grid, overlay_rgb, save_figure, score_distributions
from msb.analysis.report.tables import ci_table, frame_to_markdown, scores_ci_table, to_html, to_latex, to_markdown


def tidy() -> pd.DataFrame:
    rows = []
    for sys_, gm, im in (("unet_r18", 0.80, 0.70), ("unet_r34", 0.85, 0.65)):
        for rule, v in (("global-micro", gm), ("image-macro", im)):
            rows.append({"system": sys_, "aggregation": rule, "metric": "dice", "value": v,
                         "ci_low": v - 0.02, "ci_high": v + 0.03, "ci_level": 0.95})
        rows.append({"system": sys_, "aggregation": "image-macro", "metric": "hd95", "value": 10.0 if gm < 0.82
                     else 12.5, "ci_low": np.nan, "ci_high": np.nan, "ci_level": np.nan})
    return pd.DataFrame(rows)


def test_scores_table_marks_best_per_column_with_cis():
    t = scores_ci_table(tidy(), "dice")
    assert list(t.display.columns) == ["global-micro", "image-macro"]
    assert t.display.loc["unet_r18", "global-micro"] == "0.8000 [0.7800, 0.8300]"
    assert t.best.to_numpy().tolist() == [[False, True], [True, False]]
    assert "95% percentile bootstrap CI" in t.caption
    tex = to_latex(t, label="tab:dice")
    assert r"\textbf{0.8500 [0.8300, 0.8800]}" in tex and r"\textbf{0.7000 [0.6800, 0.7300]}" in tex
    assert tex.count(r"\textbf") == 2 and r"unet\_r18" in tex and r"\label{tab:dice}" in tex
    assert r"\toprule" in tex and r"\begin{tabular}{lrr}" in tex
    md = to_markdown(t)
    header, body = parse_markdown_table(md)
    assert header == ["system", "global-micro", "image-macro"]
    assert body[1] == ["unet_r34", "**0.8500 [0.8300, 0.8800]**", "0.6500 [0.6300, 0.6800]"]
    assert body[0] == ["unet_r18", "0.8000 [0.7800, 0.8300]", "**0.7000 [0.6800, 0.7300]**"]
    assert md.startswith(f"*{t.caption}*\n\n")
    html = to_html(t)
    assert "font-weight: bold" in html and "0.8500 [0.8300, 0.8800]" in html


def parse_markdown_table(md: str) -> tuple[list[str], list[list[str]]]:
    """Header and body cells of the (single) pipe table in ``md``: rows are the lines starting with ``|``,
    cells split on unescaped ``|`` and stripped; the alignment row (only ``-`` and ``:``) is checked and
    dropped."""
    rows = [line.strip() for line in md.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", r[1:-1])] for r in rows]
    assert all(re.fullmatch(r":?-+:?", c) for c in cells[1]), rows[1]
    return cells[0], cells[2:]


def test_frame_to_markdown_cells_parse_back():
    """Every cell reads back as ``str(value)`` (pipes escaped, newlines as spaces, no number reformatting),
    the index name heads the first column and ``bold`` wraps cells in ``**``."""
    df = pd.DataFrame({"value": ["0.8000", "1e-05", "a|b"], "n": [3, 10, 0], "p": [0.25, np.nan, 1e-12],
                       "note": ["x", "two\nlines", ""]}, index=pd.Index(["s1", "s2", "s|3"], name="system"))
    bold = pd.DataFrame(False, index=df.index, columns=df.columns)
    bold.iloc[1, 0] = True
    header, body = parse_markdown_table(frame_to_markdown(df, index=True, bold=bold))
    assert header == ["system", "value", "n", "p", "note"]
    expected = [["s1", "0.8000", "3", "0.25", "x"], ["s2", "**1e-05**", "10", "nan", "two lines"],
                ["s|3", "a|b", "0", "1e-12", ""]]
    assert [[c.replace("\\|", "|") for c in row] for row in body] == expected
    header, body = parse_markdown_table(frame_to_markdown(df.iloc[:0], index=False))
    assert header == ["value", "n", "p", "note"] and body == []
    with pytest.raises(ValueError, match="shape"):
        frame_to_markdown(df, bold=bold.iloc[:1])


def test_lower_is_better_for_distances_and_ties():
    t = scores_ci_table(tidy(), "hd95")
    assert t.best.to_numpy().ravel().tolist() == [True, False]  # 10.0 px beats 12.5 px
    assert t.display.loc["unet_r34", "image-macro"] == "12.5000"  # no CI -> value only
    v = pd.DataFrame({"x": [0.5, 0.5, np.nan]}, index=["a", "b", "c"])
    tie = ci_table(v)
    assert tie.best["x"].tolist() == [True, True, False] and tie.display.loc["c", "x"] == "n/a"


def test_overlay_colours_on_grey_and_on_image():
    pred = np.array([[1, 1, 0, 0]], dtype=bool)
    ref = np.array([[1, 0, 1, 0]], dtype=bool)
    out = overlay_rgb(pred, ref)
    # 0.45 * 128 + 0.55 * colour, rounded: TP (58, 168, 58), FP (184, 58, 58), FN (58, 102, 198), TN grey
    assert out[0].tolist() == [[58, 168, 58], [184, 58, 58], [58, 102, 198], [128, 128, 128]]
    assert OVERLAY_COLORS["tp"] == (0, 200, 0)
    img = np.zeros((1, 4, 3), dtype=np.uint8)
    img[..., 0] = 120  # grey level = mean of RGB = 40; TP = 0.45 * 40 + 0.55 * (0, 200, 0)
    out = overlay_rgb(pred, ref, img)
    assert out[0, 3].tolist() == [40, 40, 40] and out[0, 0].tolist() == [18, 128, 18]


def test_save_figure_writes_png_and_svg_atomically(tmp_path: Path):
    fig = score_distributions({"A": np.array([0.5, 0.7, np.nan]), "B": np.array([0.2, 0.4])},
                              {"A": (0.6, 0.5, 0.7)}, "Dice")
    png, svg = save_figure(fig, tmp_path / "figs" / "dist")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in svg.read_text()
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["dist.png", "dist.svg"]
    cell = overlay_rgb(np.ones((8, 8), bool), np.ones((8, 8), bool))
    png, _ = save_figure(overlay_grid(["img1"], ["A", "B"], [[cell, cell]], "grey background"), tmp_path / "grid")
    assert png.stat().st_size > 0
