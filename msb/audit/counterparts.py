"""Counterpart rules: for each evaluation row, which training rows count as its counterpart.

Rows on the *reference* side are the training rows: side ``train`` for a split audit, the ``--against``
dataset for a two-dataset audit. Every other row with a side (``val``, ``test``; the audited dataset) is an
*evaluation row*. Under relation ``r`` (cluster labels of :mod:`msb.audit.core`) the counterparts of an evaluation
row ``e`` are ``C_r(e)`` = the training rows with the same label as ``e``.

Relations are tried in the fixed order :data:`ORDER` (those the audit has):
``identical_bytes`` (equal SHA-256) > ``identical_phash`` (equal 64-bit pHash) > ``near_duplicate`` (same
component of confirmed candidate pairs) > ``shared_group`` (same non-empty group value / ``--group-pattern`` id).

Rules:

* ``first``: ``e``'s counterparts are ``C_r*(e)`` for the first relation ``r*`` in :data:`ORDER` with
  ``C_r*(e)`` non-empty; ``e`` is counted under ``r*`` only (the relations' row counts add up to the total);
* ``any``: ``e``'s counterparts are the union of ``C_r(e)`` over all relations; ``e`` is counted under every
  relation that gives it one (relations overlap).

Table (:func:`counterpart_table`, one row per rule x relation x quantity, relation ``all`` = the rule's
union): ``rule, relation, quantity, count, unit, denominator, denominator_unit, share``.

==========================  ===========  ===============================================================
quantity                    unit         denominator
==========================  ===========  ===============================================================
``eval_rows``               rows         evaluation rows (rows with a side other than the reference)
``counterpart_pairs``       row pairs    evaluation rows x training rows
``training_rows``           rows         training rows (distinct counterparts)
``eval_sources``            sources      sources of evaluation rows (a source = a group value, or the row
                                         alone when it has none)
==========================  ===========  ===============================================================

Whether an evaluation row has a counterpart at all does not depend on the rule (relation ``all``, ``eval_rows``);
pairs and training rows do (``any`` >= ``first``), and so do the per-relation counts.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

ORDER = ("identical_bytes", "identical_phash", "near_duplicate", "shared_group")
RULES = ("first", "any")
COLUMNS = ("rule", "relation", "quantity", "count", "unit", "denominator", "denominator_unit", "share")


def rule_text(reference: str) -> str:
    """Human-readable statement of the rules (recorded in ``audit.json`` and the reports)."""
    return (f"evaluation rows = rows with a side other than '{reference}'; counterparts = '{reference}' rows with "
            f"the same cluster; first: the first of {' > '.join(ORDER)} that matches; any: every relation")


def _pairs(relations: Mapping[str, np.ndarray], order: Sequence[str], is_eval: np.ndarray, is_ref: np.ndarray
           ) -> pd.DataFrame:
    """All (eval row, training row, relation rank) triples with equal labels (``e``, ``t``, ``rank``)."""
    ev, rf = np.flatnonzero(is_eval), np.flatnonzero(is_ref)
    frames = []
    for rank, name in enumerate(order):
        lab = np.asarray(relations[name])
        m = pd.DataFrame({"e": ev, "label": lab[ev]}).merge(pd.DataFrame({"t": rf, "label": lab[rf]}), on="label")
        m["rank"] = rank
        frames.append(m[["e", "t", "rank"]])
    if not frames:
        return pd.DataFrame({"e": [], "t": [], "rank": []}, dtype=np.int64)
    return pd.concat(frames, ignore_index=True)


def counterpart_table(relations: Mapping[str, np.ndarray], side: np.ndarray, source: np.ndarray,
                      reference: str = "train", rules: Sequence[str] = RULES) -> pd.DataFrame:
    """Counts of the counterpart rules (module docstring) with denominators.

    Args:
        relations: relation name -> ``(N,)`` cluster labels (only names in :data:`ORDER` are used, in that order).
        side: ``(N,)`` str side per row (``''`` = unassigned: neither evaluation nor training row).
        source: ``(N,)`` str source id per row (group value; ``''`` = the row is a source of its own).
        reference: the side whose rows are the training rows.
        rules: subset of :data:`RULES`.

    Returns:
        DataFrame with :data:`COLUMNS`; rows per rule: relation ``all`` first, then each relation of the order.
    """
    side = np.asarray(side, dtype=object).astype(str)
    n = len(side)
    src = np.asarray(source, dtype=object).astype(str)
    src = np.where(src != "", np.char.add("s:", src.astype(str)), np.char.add("row:", np.arange(n).astype(str)))
    is_ref = side == reference
    is_eval = (side != "") & ~is_ref
    order = [r for r in ORDER if r in relations]
    trip = _pairs(relations, order, is_eval, is_ref)
    n_eval, n_ref = int(is_eval.sum()), int(is_ref.sum())
    n_src = len(set(src[is_eval]))
    first_rank = trip.groupby("e")["rank"].min() if len(trip) else pd.Series(dtype=np.int64)
    out: list[dict] = []

    def add(rule: str, rel: str, sel: pd.DataFrame) -> None:
        e = sel["e"].unique()
        pairs = len(sel.drop_duplicates(["e", "t"]))
        for q, cnt, unit, den, den_unit in (
                ("eval_rows", len(e), "rows", n_eval, "evaluation rows"),
                ("counterpart_pairs", pairs, "row pairs", n_eval * n_ref, "evaluation rows x training rows"),
                ("training_rows", sel["t"].nunique(), "rows", n_ref, f"training rows ('{reference}')"),
                ("eval_sources", len(set(src[e.astype(np.int64)])), "sources", n_src,
                 "sources of evaluation rows")):
            out.append({"rule": rule, "relation": rel, "quantity": q, "count": int(cnt), "unit": unit,
                        "denominator": int(den), "denominator_unit": den_unit,
                        "share": cnt / den if den else float("nan")})

    for rule in rules:
        if rule == "first":
            sel = trip[trip["rank"].to_numpy() == trip["e"].map(first_rank).to_numpy()] if len(trip) else trip
        else:
            sel = trip
        add(rule, "all", sel)
        for rank, name in enumerate(order):
            add(rule, name, sel[sel["rank"] == rank])
    return pd.DataFrame(out, columns=list(COLUMNS))


def rule_comparison(table: pd.DataFrame, quantity: str = "eval_rows") -> pd.DataFrame:
    """Wide view of one quantity: ``relation, first, any, denominator, unit`` ("540 vs 799 rows")."""
    t = table[table["quantity"] == quantity]
    wide = t.pivot_table(index="relation", columns="rule", values="count", sort=False, aggfunc="first")
    den = t.groupby("relation", sort=False)["denominator"].first()
    out = pd.DataFrame({"relation": wide.index})
    for rule in RULES:
        if rule in wide.columns:
            out[rule] = wide[rule].astype(int).to_numpy()
    out["denominator"] = den.reindex(wide.index).to_numpy()
    out["unit"] = t["unit"].iat[0] if len(t) else ""
    return out


_SHORT = {"eval_rows": "evaluation rows", "counterpart_pairs": "row pairs", "training_rows": "training rows",
          "eval_sources": "sources"}


def rule_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Compact view for the console and the HTML report: one row per relation, one column per quantity, cells
    ``"first · any of denominator"`` (``"n of denominator"`` with one rule), e.g. ``"41 · 66 of 66"``.

    Columns: ``relation`` and the quantities' short names (``evaluation rows``, ``row pairs``, ``training rows``,
    ``sources``); the header of the first column names the rules shown.
    """
    rules = [r for r in RULES if r in set(table["rule"])]
    out = []
    for rel in dict.fromkeys(table["relation"]):
        row = {"relation": rel}
        for q, name in _SHORT.items():
            t = table[(table["relation"] == rel) & (table["quantity"] == q)].set_index("rule")
            if not len(t):
                continue
            counts = " · ".join(str(int(t.loc[r, "count"])) for r in rules)
            row[name] = f"{counts} of {int(t['denominator'].iat[0])}"
        out.append(row)
    return pd.DataFrame(out).rename(columns={"relation": f"relation ({' · '.join(rules)})"})


__all__ = ["counterpart_table", "rule_comparison", "rule_summary", "rule_text", "ORDER", "RULES", "COLUMNS"]
