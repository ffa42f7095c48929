"""Known groups as a calibration of the near-duplicate screens, clusters that join groups, two predicates.

When the audited rows carry a group (video, patient: the ``group`` column or ``--group-pattern``), frames of
different groups are presumed independent recordings, so a *confirmed* pair of two different non-empty groups (a
*cross-group link*) is an upper bound on the screens' false positives, and confirmed pairs within one group are
what the screens are for. Rows without a group take part in neither count.

* :func:`group_census_rows`: census rows (relation ``near_duplicate``) ``cross_group_pairs`` (confirmed pairs of
  two groups, of all row pairs of two different groups), ``within_group_pairs`` (of all row pairs within a
  group) and ``clusters_joining_groups`` (near-duplicate clusters holding rows of >= 2 groups, of clusters with
  >= 2 rows);
* :func:`calibration_table`: per screen (NCC, SSIM, pHash, dHash distance) and threshold, the cross-group and
  within-group pairs among the candidate pairs that the screen alone would confirm; :func:`safe_ranges`: per
  screen the threshold range that confirms no cross-group pair and the within-group pairs it keeps;
* :func:`group_links` / :func:`spanning_clusters`: the cross-group links and the clusters that join several
  groups, with the linking pairs' NCC, SSIM and hash distances;
* :func:`predicates_table`: the default confirmation rule and a strict one (:data:`STRICT_RULE`) side by side,
  each with its counts and denominators (ReuScope reports its audit with two predicates the same way).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from msb.audit.search import component_labels
from msb.audit.verdict import audit_verdict

#: NCC threshold of the strict predicate
STRICT_NCC = 0.99
STRICT_RULE = (f"byte-identical files, or identical pHash (distance 0; on the content crop when the frame is left "
               f"out), or NCC >= {STRICT_NCC}")


def _groups(rows: pd.DataFrame) -> np.ndarray:
    return rows["group"].to_numpy().astype(str)


def pair_kinds(rows: pd.DataFrame, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(cross, within)`` bool ``(P,)`` arrays: both rows have a group and the groups differ / are equal."""
    g = _groups(rows)
    ga, gb = g[np.asarray(a, int)], g[np.asarray(b, int)]
    both = (ga != "") & (gb != "")
    return both & (ga != gb), both & (ga == gb)


def group_pair_denominators(rows: pd.DataFrame) -> tuple[int, int]:
    """``(row pairs within one group, row pairs of two different groups)`` over the rows with a group."""
    g = _groups(rows)
    sizes = pd.Series(g[g != ""]).value_counts().to_numpy().astype(np.int64)
    m = int(sizes.sum())
    within = int((sizes * (sizes - 1) // 2).sum())
    return within, m * (m - 1) // 2 - within


def group_census_rows(rows: pd.DataFrame, pairs: pd.DataFrame) -> list[dict]:
    """The three census rows of the module docstring (columns of :data:`msb.audit.census.CENSUS_COLUMNS`)."""
    conf = pairs["confirmed"].to_numpy(bool)
    cross, within = pair_kinds(rows, pairs["a"].to_numpy(), pairs["b"].to_numpy())
    den_w, den_c = group_pair_denominators(rows)
    span = spanning_clusters(rows, pairs)
    lab = rows["cluster_near_duplicate"].to_numpy()
    multi = int((pd.Series(lab).value_counts() >= 2).sum())

    def row(q: str, c: int, unit: str, den: int, den_unit: str) -> dict:
        return {"relation": "near_duplicate", "quantity": q, "scope": "all", "count": int(c), "unit": unit,
                "denominator": int(den), "denominator_unit": den_unit, "share": c / den if den else float("nan")}

    return [row("cross_group_pairs", int((conf & cross).sum()), "confirmed pairs", den_c,
                "row pairs of two different groups"),
            row("within_group_pairs", int((conf & within).sum()), "confirmed pairs", den_w,
                "row pairs within one group"),
            row("clusters_joining_groups", len(span), "groups", multi, "groups with >= 2 rows")]


def group_links(rows: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Confirmed pairs of two different non-empty groups: ``cluster, key_a, key_b, group_a, group_b, side_a,
    side_b, ncc, ssim, phash_distance, dhash_distance, same_bytes`` (ordered by cluster, then NCC descending)."""
    cross, _ = pair_kinds(rows, pairs["a"].to_numpy(), pairs["b"].to_numpy())
    p = pairs[pairs["confirmed"].to_numpy(bool) & cross]
    g = _groups(rows)
    out = pd.DataFrame({"cluster": p["near_duplicate_cluster"].to_numpy(), "a": p["a"].to_numpy(),
                        "b": p["b"].to_numpy(), "key_a": p["key_a"].to_numpy(), "key_b": p["key_b"].to_numpy(),
                        "group_a": g[p["a"].to_numpy()], "group_b": g[p["b"].to_numpy()],
                        "side_a": p["side_a"].to_numpy(), "side_b": p["side_b"].to_numpy(),
                        "ncc": p["ncc"].to_numpy(), "ssim": p["ssim"].to_numpy(),
                        "phash_distance": p["phash_distance"].to_numpy(),
                        "dhash_distance": p["dhash_distance"].to_numpy(), "same_bytes": p["same_bytes"].to_numpy()})
    return out.sort_values(["cluster", "ncc"], ascending=[True, False], kind="stable").reset_index(drop=True)


def _fmt(v: Any) -> str:
    return "n/a" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.3f}"


def link_text(r: Any) -> str:
    """``"key_a (group_a) - key_b (group_b): NCC 0.961, SSIM 0.512, pHash 6, dHash 9"``."""
    return (f"{r.key_a} ({r.group_a}) - {r.key_b} ({r.group_b}): NCC {_fmt(r.ncc)}, SSIM {_fmt(r.ssim)}, "
            f"pHash {int(r.phash_distance)}, dHash {int(r.dhash_distance)}")


def spanning_clusters(rows: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Near-duplicate clusters holding rows of >= 2 non-empty groups: ``cluster, n_rows, n_groups, groups,
    sides, linking_pairs`` (:func:`link_text` of its cross-group links, ``" | "``-joined; a cluster joined only
    through rows without a group says so), most groups first."""
    g = _groups(rows)
    lab = rows["cluster_near_duplicate"].to_numpy()
    links = group_links(rows, pairs)
    out = []
    for c in np.unique(lab):
        members = lab == c
        gs = sorted(set(g[members]) - {""})
        if len(gs) < 2:
            continue
        lk = links[links["cluster"] == c]
        text = " | ".join(link_text(r) for r in lk.itertuples(index=False)) or "through rows without a group"
        out.append({"cluster": int(c), "n_rows": int(members.sum()), "n_groups": len(gs), "groups": ";".join(gs),
                    "sides": ";".join(sorted(set(rows["side"].to_numpy().astype(str)[members]) - {""})),
                    "linking_pairs": text})
    df = pd.DataFrame(out, columns=["cluster", "n_rows", "n_groups", "groups", "sides", "linking_pairs"])
    return df.sort_values(["n_groups", "n_rows", "cluster"], ascending=[False, False, True]).reset_index(drop=True)


def _screens(pairs: pd.DataFrame, k: int, ncc_min: float | None) -> list[tuple[str, str, np.ndarray, list]]:
    lo = max(0.9, float(ncc_min)) if ncc_min is not None and float(ncc_min) > -1 else 0.9
    ncc_grid = sorted({round(float(x), 2) for x in np.arange(np.ceil(lo * 100) / 100, 1.0001, 0.01)}
                      | ({round(float(ncc_min), 4)} if ncc_min is not None and float(ncc_min) > -1 else set()))
    return [("ncc", ">=", pairs["ncc"].to_numpy(float), ncc_grid),
            ("ssim", ">=", pairs["ssim"].to_numpy(float), [round(0.5 + 0.05 * i, 2) for i in range(11)]),
            ("phash_distance", "<=", pairs["phash_distance"].to_numpy(float), list(range(k + 1))),
            ("dhash_distance", "<=", pairs["dhash_distance"].to_numpy(float), list(range(k + 1)))]


def calibration_table(rows: pd.DataFrame, pairs: pd.DataFrame, k: int, ncc_min: float | None) -> pd.DataFrame:
    """Per screen and threshold: ``screen, rule, threshold, cross_group_pairs, cross_group_denominator,
    within_group_pairs, within_group_denominator`` among the candidate pairs the screen alone confirms (NCC from
    ``max(0.9, ncc_min)`` to 1 in steps of 0.01, SSIM 0.5 to 1 by 0.05, hash distances 0 to ``k``). Pairs that are
    not candidates (NCC below ``ncc_min`` and hash distances above ``k``) are not counted."""
    cross, within = pair_kinds(rows, pairs["a"].to_numpy(), pairs["b"].to_numpy())
    den_w, den_c = group_pair_denominators(rows)
    out = []
    for name, op, v, grid in _screens(pairs, k, ncc_min):
        for t in grid:
            ok = (v >= t) if op == ">=" else (v <= t)
            out.append({"screen": name, "rule": f"{name} {op} {t}", "threshold": t,
                        "cross_group_pairs": int((ok & cross).sum()), "cross_group_denominator": den_c,
                        "within_group_pairs": int((ok & within).sum()), "within_group_denominator": den_w})
    return pd.DataFrame(out, columns=["screen", "rule", "threshold", "cross_group_pairs", "cross_group_denominator",
                                      "within_group_pairs", "within_group_denominator"])


def safe_ranges(rows: pd.DataFrame, pairs: pd.DataFrame, k: int) -> list[dict]:
    """Per screen: ``{"screen", "no_cross_group": range text, "edge": the tightest cross-group value (None when
    no cross-group pair is a candidate), "within_kept": within-group candidate pairs confirmed anywhere in the
    range, "within_candidates"}``. NCC/SSIM: the range is ``> edge`` (the highest cross-group value); hash
    distances: ``< edge`` (the smallest cross-group distance)."""
    cross, within = pair_kinds(rows, pairs["a"].to_numpy(), pairs["b"].to_numpy())
    out = []
    for name, op, v, _ in _screens(pairs, k, None):
        cv, wv = v[cross & ~np.isnan(v)], v[within & ~np.isnan(v)]
        if op == ">=":
            edge = float(cv.max()) if len(cv) else None
            kept = int((wv > edge).sum()) if edge is not None else len(wv)
            text = f"{name} > {edge:.4f}" if edge is not None else f"any {name} (no cross-group candidate)"
        else:
            edge = int(cv.min()) if len(cv) else None
            kept = int((wv < edge).sum()) if edge is not None else int((wv <= k).sum())
            text = ((f"{name} <= {edge - 1}" if edge > 0 else f"none ({name} 0 joins two groups)")
                    if edge is not None else f"{name} <= {k} (no cross-group candidate)")
        out.append({"screen": name, "no_cross_group": text, "edge": edge, "within_kept": kept,
                    "within_candidates": int(len(wv))})
    return out


def _predicate_counts(name: str, rule: str, ok: np.ndarray, rows: pd.DataFrame, pairs: pd.DataFrame) -> dict:
    n = len(rows)
    a, b = pairs["a"].to_numpy(int), pairs["b"].to_numpy(int)
    lab = component_labels(n, a[ok], b[ok])
    side = rows["side"].to_numpy().astype(str)
    df = pd.DataFrame({"lab": lab, "side": side})
    size = df.groupby("lab").size()
    sides = df[df["side"] != ""].groupby("lab")["side"].nunique()
    cross, within = pair_kinds(rows, a, b)
    den_w, den_c = group_pair_denominators(rows)
    crosses = pairs["crosses"].to_numpy(bool)
    return {"predicate": name, "rule": rule, "confirmed_pairs": int(ok.sum()), "pairs": n * (n - 1) // 2,
            "clusters": int((size >= 2).sum()), "crossing_clusters": int((sides >= 2).sum()),
            "crossing_pairs": int((ok & crosses).sum()), "cross_group_pairs": int((ok & cross).sum()),
            "cross_group_denominator": den_c, "within_group_pairs": int((ok & within).sum()),
            "within_group_denominator": den_w}


def predicates_table(rows: pd.DataFrame, pairs: pd.DataFrame, default_rule: str) -> pd.DataFrame:
    """The default (``pairs.confirmed``) and the strict predicate (:data:`STRICT_RULE`), one row each: confirmed
    pairs of all ``N(N-1)/2`` pairs, clusters (>= 2 rows) and crossing clusters, confirmed pairs across the
    boundary, cross-group and within-group confirmed pairs with their denominators."""
    strict = (pairs["same_bytes"].to_numpy(bool) | (pairs["phash_distance"].to_numpy() == 0)
              | (pairs["ncc"].to_numpy(float) >= STRICT_NCC))
    return pd.DataFrame([_predicate_counts("default", default_rule, pairs["confirmed"].to_numpy(bool), rows, pairs),
                         _predicate_counts("strict", STRICT_RULE, strict, rows, pairs)])


def verdict_extras(result) -> dict[str, Any]:
    """What :mod:`msb.audit.verdict` records beside the checks (``verdict.json``): ``predicate`` (rule,
    thresholds, content mask, cross- and within-group confirmed pairs with denominators, per-screen safe ranges),
    ``predicates`` (:func:`predicates_table`), ``group_links`` (cross-group pairs, clusters joining groups, groups
    joined) and ``warnings`` (cross-group links found).

    Args:
        result: :class:`msb.audit.core.AuditResult` of a single-dataset audit.
    """
    rows, pairs, p = result.rows, result.pairs, result.params
    cfg = p["config"]
    preds = predicates_table(rows, pairs, p["confirmation_rule"])
    d = preds.iloc[0]
    span = spanning_clusters(rows, pairs)
    links = group_links(rows, pairs)
    n_grouped = int((_groups(rows) != "").sum())
    joined = sorted({g for gs in span["groups"] for g in gs.split(";")})
    extras = {
        "predicate": {"name": "default", "rule": p["confirmation_rule"],
                      "thresholds": {"ncc_min": cfg["ncc_min"], "ssim_min": cfg["ssim_min"],
                                     "hamming_k": cfg["hamming_k"], "screen_size": cfg["screen_size"]},
                      "fov": p.get("fov"), "rows_with_group": n_grouped,
                      "cross_group_pairs": int(d["cross_group_pairs"]),
                      "cross_group_denominator": int(d["cross_group_denominator"]),
                      "within_group_pairs": int(d["within_group_pairs"]),
                      "within_group_denominator": int(d["within_group_denominator"]),
                      "calibration": safe_ranges(rows, pairs, int(cfg["hamming_k"])) if n_grouped else []},
        "predicates": preds.to_dict("records"),
        "group_links": {"cross_group_pairs": int(len(links)), "clusters_joining_groups": int(len(span)),
                        "groups_joined": len(joined)},
        "warnings": [],
    }
    if len(links):
        extras["warnings"].append(
            f"{len(links)} confirmed pair(s) link different groups ({len(span)} cluster(s) joining {len(joined)} "
            f"groups): an upper bound on false positives, frames of different recordings being presumed "
            f"independent; review group_links.csv, or msb audit --calibrate for thresholds that confirm none")
    return extras


def judged(result, checks=()) -> dict[str, Any]:
    """:func:`msb.audit.verdict.audit_verdict` of ``result`` (an :class:`msb.audit.core.AuditResult`) plus, across
    splits, :func:`verdict_extras` (its ``warnings`` are printed apart from the verdict line)."""
    if result.boundary != "split":
        return audit_verdict(result.census, result.boundary, checks)
    return {**audit_verdict(result.census, result.boundary, checks), **verdict_extras(result)}


__all__ = ["judged", "STRICT_NCC", "STRICT_RULE", "pair_kinds", "group_pair_denominators", "group_census_rows",
           "group_links",
           "spanning_clusters", "calibration_table", "safe_ranges", "predicates_table", "verdict_extras",
           "link_text"]
