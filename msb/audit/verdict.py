"""Audit verdict: does a chosen relationship cross the boundary? (``msb audit --fail-on``, ``data.require_audit``)

A *check* names a relation of the census (:mod:`msb.audit.census`) and fails when at least one of that
relation's groups (>= 2 rows) holds rows on two or more sides of the boundary:

=============================  ==================  ============================================================
check                          relation            a group is
=============================  ==================  ============================================================
``crossing-identical``         ``identical_bytes`` files with equal SHA-256
``crossing-near-duplicate``    ``near_duplicate``  a connected component of confirmed candidate pairs
``crossing-group``             ``shared_group``    rows with the same non-empty group (group column or
                                                   ``--group-pattern``; single-dataset audits only)
=============================  ==================  ============================================================

The verdict is ``FAIL`` when any requested check fails, else ``PASS`` (with no check requested: ``PASS`` and
``"checked": []``, nothing gated). Every check is evaluated and reported either way, with its counting unit and
denominator: crossing groups of groups with >= 2 rows, crossing rows of rows with a side, and the side pairs
(``train|test`` ...) the groups cross. :func:`verdict_line` is the one-line summary the CLI prints; the CLI
exits with :data:`FAIL_EXIT` on ``FAIL``.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import pandas as pd

from msb.errors import MSBError

#: check name -> census relation
CHECKS: dict[str, str] = {"crossing-identical": "identical_bytes", "crossing-near-duplicate": "near_duplicate",
                          "crossing-group": "shared_group"}
#: words used in the summary line per relation
_NOUN = {"identical_bytes": "byte-identical", "near_duplicate": "near-duplicate", "shared_group": "shared-group"}
#: exit status of ``msb audit --fail-on`` when the verdict is FAIL
FAIL_EXIT = 3


def parse_checks(values: Iterable[str] | None) -> list[str]:
    """Normalise ``--fail-on`` values: repeatable and/or comma-separated, duplicates dropped, order kept.

    Args:
        values: e.g. ``["crossing-identical,crossing-group", "crossing-near-duplicate"]``; ``None`` = none.

    Returns:
        Check names (keys of :data:`CHECKS`).

    Raises:
        MSBError: an unknown name (listing the known ones).
    """
    out: list[str] = []
    for v in values or []:
        for name in str(v).split(","):
            name = name.strip()
            if not name:
                continue
            if name not in CHECKS:
                raise MSBError(f"--fail-on / data.require_audit: unknown check {name!r}; choose from "
                               f"{', '.join(CHECKS)}.")
            if name not in out:
                out.append(name)
    return out


def _value(census: pd.DataFrame, relation: str, quantity: str, scope: str = "all") -> tuple[int, int]:
    r = census[(census["relation"] == relation) & (census["quantity"] == quantity) & (census["scope"] == scope)]
    if not len(r):
        return 0, 0
    return int(r["count"].iat[0]), int(r["denominator"].iat[0])


def check_result(census: pd.DataFrame, check: str) -> dict[str, Any]:
    """One check evaluated on a census table.

    Returns:
        ``{"check", "relation", "available", "crossing_groups", "groups" (with >= 2 rows), "crossing_rows",
        "rows_with_side", "crossing_pairs" (row pairs of one group on two sides), "pairs_in_groups" (row pairs
        within groups, both with a side), "side_pairs" ({"train|test": crossing groups, ...} for pairs with >= 1),
        "crosses"}``; ``available`` is False when the audit has no such relation (e.g. ``shared_group`` in an
        ``--against`` audit), and then ``crosses`` is False.
    """
    rel = CHECKS[check]
    available = bool((census["relation"] == rel).any())
    cg, groups = _value(census, rel, "crossing_groups")
    cr, rows = _value(census, rel, "crossing_rows")
    cp, pairs = _value(census, rel, "crossing_pairs")
    sp = census[(census["relation"] == rel) & (census["quantity"] == "crossing_groups") & (census["scope"] != "all")]
    side_pairs = {str(s): int(c) for s, c in zip(sp["scope"], sp["count"]) if int(c) > 0}
    return {"check": check, "relation": rel, "available": available, "crossing_groups": cg, "groups": groups,
            "crossing_rows": cr, "rows_with_side": rows, "crossing_pairs": cp, "pairs_in_groups": pairs,
            "side_pairs": side_pairs, "crosses": cg > 0}


def audit_verdict(census: pd.DataFrame, boundary: str, fail_on: Sequence[str] = (),
                  notes: Sequence[str] = ()) -> dict[str, Any]:
    """The verdict of one audit (module docstring).

    Args:
        census: :func:`msb.audit.census.census_table` output.
        boundary: ``"split"`` or ``"dataset"`` (wording of the summary line).
        fail_on: requested checks (:func:`parse_checks` output).
        notes: extra remarks recorded with the verdict (e.g. "no group values").

    Returns:
        ``{"status": "PASS"|"FAIL", "checked": [...], "failed": [...], "boundary", "checks": [check_result,
        ...], "notes": [...], "line": verdict_line}`` (JSON-serialisable).

    Raises:
        MSBError: a requested check whose relation the audit does not have (``crossing-group`` with
            ``--against``).
    """
    fail_on = parse_checks(fail_on)
    checks = [check_result(census, c) for c in CHECKS]
    by_name = {c["check"]: c for c in checks}
    for name in fail_on:
        if not by_name[name]["available"]:
            raise MSBError(f"--fail-on {name}: this audit has no '{CHECKS[name]}' relation (groups are only "
                           f"audited across the splits of one dataset); drop it or audit without --against.")
    notes = list(notes)
    if "crossing-group" in fail_on and by_name["crossing-group"]["groups"] == 0:
        notes.append("no group holds 2 or more rows: crossing-group checks nothing; give a group column or "
                     "--group-pattern")
    failed = [n for n in fail_on if by_name[n]["crosses"]]
    out = {"status": "FAIL" if failed else "PASS", "checked": list(fail_on), "failed": failed,
           "boundary": boundary, "checks": checks, "notes": notes}
    out["line"] = verdict_line(out)
    return out


def _describe(c: dict[str, Any], boundary: str) -> str:
    pairs = ", ".join(f"{k.replace('|', '↔')} {v}" for k, v in c["side_pairs"].items())
    return (f"{c['crossing_groups']} of {c['groups']} {_NOUN[c['relation']]} groups cross the {boundary}"
            + (f" ({pairs})" if pairs else "") + f", {c['crossing_rows']} of {c['rows_with_side']} rows")


def verdict_line(verdict: dict[str, Any]) -> str:
    """One line: ``audit verdict: FAIL — 4 of 5 near-duplicate groups cross the split (train↔test 3, ...), 8 of
    1000 rows [crossing-near-duplicate]`` (failed checks; on PASS the checked ones, or that nothing was checked)."""
    by_name = {c["check"]: c for c in verdict["checks"]}
    shown = verdict["failed"] if verdict["status"] == "FAIL" else verdict["checked"]
    if not shown:
        body = "no --fail-on check requested (nothing gated)"
    else:
        body = "; ".join(f"{_describe(by_name[n], verdict['boundary'])} [{n}]" for n in shown)
    notes = f" ({'; '.join(verdict['notes'])})" if verdict.get("notes") else ""
    return f"audit verdict: {verdict['status']} — {body}{notes}"


__all__ = ["CHECKS", "FAIL_EXIT", "parse_checks", "check_result", "audit_verdict", "verdict_line"]
