"""Docs that match a run: README.md's quickstart block equals what a fresh `msb run configs/study.yaml` prints
(run in a temporary copy of configs/, through scripts/docs_outputs.py; nothing is written into the tree)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _docs_outputs():
    spec = importlib.util.spec_from_file_location("_docs_outputs", REPO / "scripts" / "docs_outputs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_block_extraction_and_replacement_round_trip():
    d = _docs_outputs()
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = d.readme_block(text)
    assert block.strip().startswith("Leaderboard synthetic/test") and "full report" in block
    assert d.replace_block(text, block) == text
    out = "noise\n  Leaderboard x/y (t)  \n| 1 | a |\nDice a − b = 1\nfull report (...): msb report runs/q\nafter\n"
    assert d.closing_block(out) == "  Leaderboard x/y (t)\n| 1 | a |\nDice a − b = 1\nfull report (...): msb report runs/q\n"


@pytest.mark.slow
def test_readme_quickstart_block_is_what_a_fresh_run_prints(tmp_path: Path):
    d = _docs_outputs()
    fresh = d.quickstart_block(tmp_path)
    shown = d.readme_block((REPO / "README.md").read_text(encoding="utf-8"))
    assert fresh == shown, "README.md is stale: run `python scripts/docs_outputs.py`\n" + "".join(
        __import__("difflib").unified_diff(shown.splitlines(True), fresh.splitlines(True), "README.md", "fresh"))
