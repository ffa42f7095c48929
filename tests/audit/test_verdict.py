"""Audit verdict (``msb audit --fail-on``): exit 3 with one line when the chosen relation crosses the split, exit 0
otherwise; ``verdict.json`` and the report's first lines.

Expected numbers are hand-derived from the planted table (conftest.py; 12 rows: 6 train, 2 val, 4 test):
byte-identical groups {a, copy_a} (train|test) and {d, d_dup} (train only); near-duplicate groups those two plus
{b, b_small} (train|val) and {c, c_shift} (train|test); shared groups patient7 {e (train), f (val)} and patient9
{g, h} (both test).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from msb.cli.app import app
from msb.errors import MSBError


def run(*args: str):
    return CliRunner().invoke(app, ["audit", *args, "--format", "table"], env={"COLUMNS": "200"})  # verdict last on stdout


def last_line(r) -> str:
    return r.stdout.strip().splitlines()[-1]


def test_crossing_identical_fails_with_exit_3(planted: Path, tmp_path: Path) -> None:
    out = tmp_path / "a"
    r = run(str(planted), "--out", str(out), "--fail-on", "crossing-identical")
    assert r.exit_code == 3, r.stdout
    assert last_line(r) == ("audit verdict: FAIL — 1 of 2 byte-identical groups cross the split (train↔test 1), "
                            "2 of 12 rows [crossing-identical]")
    v = json.loads((out / "verdict.json").read_text())
    assert v["status"] == "FAIL" and v["checked"] == ["crossing-identical"] and v["failed"] == ["crossing-identical"]
    by = {c["check"]: c for c in v["checks"]}
    assert (by["crossing-near-duplicate"]["crossing_groups"], by["crossing-near-duplicate"]["groups"]) == (3, 4)
    assert by["crossing-near-duplicate"]["side_pairs"] == {"train|val": 1, "train|test": 2}
    assert (by["crossing-group"]["crossing_groups"], by["crossing-group"]["groups"]) == (1, 2)
    assert (by["crossing-group"]["crossing_rows"], by["crossing-group"]["rows_with_side"]) == (2, 12)
    # the whole report is still written, and the HTML opens with the verdict, before the census
    html = (out / "contact_sheet.html").read_text()
    assert "Hash prefilter recall: k = 4: 2 of 2 (100.0 %)" in html  # {b, b_small}, {c, c_shift} (not bytes)
    assert html.index("audit verdict: FAIL") < html.index("<h2>Summary</h2>") < html.index("<h2>Counterparts") \
        < html.index("<h2>Census")


def test_crossing_group_and_comma_list(planted: Path, tmp_path: Path) -> None:
    r = run(str(planted), "--out", str(tmp_path / "a"), "--fail-on", "crossing-group,crossing-near-duplicate",
            "--fail-on", "crossing-group")
    assert r.exit_code == 3, r.stdout
    assert last_line(r) == (
        "audit verdict: FAIL — 1 of 2 shared-group groups cross the split (train↔val 1), 2 of 12 rows "
        "[crossing-group]; 3 of 4 near-duplicate groups cross the split (train↔val 1, train↔test 2), 6 of 12 rows "
        "[crossing-near-duplicate]")


def test_clean_split_passes_with_exit_0(planted: Path, tmp_path: Path, helpers) -> None:
    split = tmp_path / "split.csv"  # everything in train except patient9 (g, h), related to nothing else
    split.write_text("sample_id,split\n" + "".join(f"{r[0]},{'test' if r[0] in ('g', 'h') else 'train'}\n"
                                                   for r in helpers.rows))
    out = tmp_path / "a"
    r = run(str(planted), "--out", str(out), "--split-file", str(split), "--fail-on",
            "crossing-identical,crossing-near-duplicate,crossing-group")
    assert r.exit_code == 0, r.stdout
    assert last_line(r) == (
        "audit verdict: PASS — 0 of 2 byte-identical groups cross the split, 0 of 12 rows [crossing-identical]; "
        "0 of 4 near-duplicate groups cross the split, 0 of 12 rows [crossing-near-duplicate]; 0 of 2 shared-group "
        "groups cross the split, 0 of 12 rows [crossing-group]")
    assert json.loads((out / "verdict.json").read_text())["status"] == "PASS"


def test_no_fail_on_exits_0_and_says_nothing_is_gated(planted: Path, tmp_path: Path) -> None:
    r = run(str(planted), "--out", str(tmp_path / "a"))
    assert r.exit_code == 0, r.stdout
    assert last_line(r) == "audit verdict: PASS — no --fail-on check requested (nothing gated)"
    v = json.loads((tmp_path / "a" / "verdict.json").read_text())
    assert v["checked"] == [] and [c["crosses"] for c in v["checks"]] == [True, True, True]


def test_group_pattern_sources_from_file_names(planted: Path, tmp_path: Path) -> None:
    # first letter of the file name: b.png/b.jpg (train|val), c.png/copy_of_a.png (train|test), d.png/d_dup.png
    # (train only); the rest alone
    r = run(str(planted), "--out", str(tmp_path / "a"), "--group-pattern", "^([a-z])", "--fail-on",
            "crossing-group")
    assert r.exit_code == 3, r.stdout
    assert last_line(r) == ("audit verdict: FAIL — 2 of 3 shared-group groups cross the split (train↔val 1, "
                            "train↔test 1), 4 of 12 rows [crossing-group]")


def test_bad_checks_fail_before_anything_is_written(planted: Path, tmp_path: Path) -> None:
    r = run(str(planted), "--out", str(tmp_path / "a"), "--fail-on", "crossing-everything")
    assert isinstance(r.exception, MSBError) and "unknown check 'crossing-everything'" in str(r.exception)
    assert "crossing-identical, crossing-near-duplicate, crossing-group" in str(r.exception)
    r = run(str(planted), "--out", str(tmp_path / "b"), "--against", str(planted), "--fail-on", "crossing-group")
    assert isinstance(r.exception, MSBError) and "groups are only audited across the splits" in str(r.exception)
    r = run(str(planted), "--apply", str(tmp_path / "d.csv"), "--fail-on", "crossing-identical")
    assert isinstance(r.exception, MSBError) and "--apply alone runs none" in str(r.exception)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_group_pattern_errors() -> None:
    from msb.audit.sources import groups_from_pattern

    assert groups_from_pattern(["seq3_0012.png", "seq10_7.png", "x.png"], r"^(?:(seq\d+)_)?") == ["seq3", "seq10", ""]
    with pytest.raises(MSBError, match=r"does not match 1 of 2 file names \(e.g. x.png\)"):
        groups_from_pattern(["seq3_1.png", "x.png"], r"^(seq\d+)_")
    with pytest.raises(MSBError, match="has no capture group"):
        groups_from_pattern(["a.png"], r"^seq")
    with pytest.raises(MSBError, match="is not a valid regular expression"):
        groups_from_pattern(["a.png"], r"^(seq")
