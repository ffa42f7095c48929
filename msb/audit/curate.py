"""Decisions -> curated dataset: drop rows and merge groups without touching any file.

Decisions file (CSV, header required; one row per sample):

=========== ====================================================================================================
column      meaning
=========== ====================================================================================================
sample_id   a sample of the audited dataset
action      ``drop`` (leave the row out of the curated index), ``group`` (put the row into group ``target``) or
            ``keep`` (reviewed, no change; recorded)
reason      free text, required (it is recorded in ``curation.csv``)
target      group name for ``group`` (rows with the same target end up in one group); ignored otherwise
=========== ====================================================================================================

Group merging: groups must never be split, so the curated ``group`` of a row is the connected component of
"same existing non-empty ``group``" or "same ``target``" over the kept rows. A component with one label keeps it;
a component holding several labels gets their ``+``-joined sorted names (or ``merged_<k>`` when longer than 64
characters). Every changed row is recorded with its old and new group and the reason.

Output: a *curated dataset folder* (default ``<parent>/<name>_curated``) with ``index.csv`` (image/mask paths
rewritten relative to the new folder, pointing at the original files: nothing is copied or deleted),
``classes.csv`` (copied), ``curation.csv`` (one row per dropped, regrouped or kept sample) and
``curation.json`` (source dataset, SHA-256 of its ``index.csv`` and of the decisions file, counts). It is a
normal prepared dataset: ``resolve_splits(..., group_column="group")`` and any group-aware K-fold keep
near-copies together.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Mapping

import numpy as np
import pandas as pd

from msb.audit.search import component_labels
from msb.data.converters.staging import staged_output
from msb.data.schema import INDEX_FILE, load_prepared_dataset, write_prepared_dataset
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text
from msb.utils.hashing import sha256_file
from msb.utils.csvio import read_user_csv

ACTIONS = ("drop", "group", "keep")
DECISION_COLUMNS = ("sample_id", "action", "reason", "target")
CURATION_COLUMNS = ("sample_id", "action", "old_group", "new_group", "reason", "decision_line")
_MAX_LISTED = 10
_MAX_NAME = 64


def _listed(items: list[str]) -> str:
    s = "; ".join(items[:_MAX_LISTED])
    return s + (f"; ... and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def read_decisions(source: str | os.PathLike | pd.DataFrame, known_ids: list[str] | None = None) -> pd.DataFrame:
    """Read and check a decisions table.

    Args:
        source: CSV path or a DataFrame with :data:`DECISION_COLUMNS` (``target`` optional).
        known_ids: the dataset's sample ids; every decision must name one of them.

    Returns:
        DataFrame ``sample_id, action, reason, target, line`` (``line`` = 1-based CSV line).

    Raises:
        MSBError: missing file/columns, unknown action, empty reason, ``group`` without target, unknown or
            repeated sample id (naming the lines).
    """
    where = "decisions"
    if isinstance(source, pd.DataFrame):
        df = source.astype(str).copy()
    else:
        where = str(source)
        df = read_user_csv(source, "decisions file",
                           f"write a CSV with columns {', '.join(DECISION_COLUMNS)} "
                           f"(msb audit writes decisions_template.csv).")
    missing = [c for c in ("sample_id", "action", "reason") if c not in df.columns]
    if missing:
        raise MSBError(f"{where}: missing column(s) {missing}; expected {list(DECISION_COLUMNS)}.")
    if "target" not in df.columns:
        df["target"] = ""
    df = df[list(DECISION_COLUMNS)].apply(lambda c: c.str.strip())
    df["line"] = np.arange(len(df)) + 2
    known = set(known_ids) if known_ids is not None else None
    problems = []
    for r in df.itertuples(index=False):
        if r.action not in ACTIONS:
            problems.append(f"line {r.line}: action {r.action!r} is not one of {', '.join(ACTIONS)}")
        if r.reason == "":
            problems.append(f"line {r.line}: empty reason (every decision is recorded with its reason)")
        if r.action == "group" and r.target == "":
            problems.append(f"line {r.line}: action 'group' needs a target group name")
        if known is not None and r.sample_id not in known:
            problems.append(f"line {r.line}: sample_id {r.sample_id!r} is not in the dataset")
    dup = df["sample_id"].duplicated(keep="first").to_numpy()
    for pos in np.flatnonzero(dup):
        first = int(df["line"][df["sample_id"] == df["sample_id"].iat[pos]].iat[0])
        problems.append(f"line {int(df['line'].iat[pos])}: sample_id {df['sample_id'].iat[pos]!r} already decided on "
                        f"line {first}")
    if problems:
        raise MSBError(f"{where}: {len(problems)} problem(s): {_listed(problems)}. Fix the decisions file.")
    return df.reset_index(drop=True)


def merge_groups(sample_ids: list[str], groups: list[str], targets: Mapping[str, str]
                 ) -> tuple[list[str], dict[str, list[str]]]:
    """Curated groups: components of "same non-empty group" or "same target" (module docstring).

    Args:
        sample_ids: ``(N,)`` ids of the kept rows.
        groups: ``(N,)`` existing ``group`` values (``''`` = none).
        targets: sample id -> target group for rows with a ``group`` decision.

    Returns:
        ``(new group per row, {new group: sorted merged labels}`` for groups built from several labels``)``.
    """
    n = len(sample_ids)
    labels = [set() for _ in range(n)]
    members: dict[str, list[int]] = {}
    for r, (sid, g) in enumerate(zip(sample_ids, groups)):
        for lab in (g, targets.get(sid, "")):
            if lab:
                labels[r].add(lab)
                members.setdefault(lab, []).append(r)
    ei, ej = [], []
    for rows in members.values():
        ei += rows[:-1]
        ej += rows[1:]
    comp = component_labels(n, np.asarray(ei, np.int64), np.asarray(ej, np.int64))
    comp_labels: dict[int, set[str]] = {}
    for r in range(n):
        comp_labels.setdefault(int(comp[r]), set()).update(labels[r])
    names: dict[int, str] = {}
    merged: dict[str, list[str]] = {}
    k = 0
    for c in sorted(comp_labels):
        labs = sorted(comp_labels[c])
        if not labs:
            names[c] = ""
        elif len(labs) == 1:
            names[c] = labs[0]
        else:
            joined = "+".join(labs)
            if len(joined) > _MAX_NAME:
                k += 1
                joined = f"merged_{k}"
            names[c] = joined
            merged[joined] = labs
    return [names[int(comp[r])] for r in range(n)], merged


def groups_from_clusters(index: pd.DataFrame, cluster_of: Mapping[str, str]) -> tuple[pd.Series, dict]:
    """Put audit clusters into the ``group`` column, merging with existing groups (nothing is split).

    Args:
        index: prepared-dataset index (``sample_id``, ``group``).
        cluster_of: sample id -> cluster name (e.g. ``audit-near_duplicate-3``) for rows in clusters of >= 2.

    Returns:
        ``(new group Series aligned with index, merged-label map)``.
    """
    sids = index["sample_id"].astype(str).tolist()
    new, merged = merge_groups(sids, index["group"].astype(str).tolist(), dict(cluster_of))
    return pd.Series(new, index=index.index, name="group", dtype=object), merged


def accepted_links(user: pd.DataFrame | None) -> dict[str, str]:
    """Sample id -> target of the decisions' ``group`` rows: a cross-group link ``(a, b)`` is *accepted* when both
    ``a`` and ``b`` are there with the same target (the reviewer put them into one group)."""
    if user is None:
        return {}
    g = user[user["action"] == "group"]
    return dict(zip(g["sample_id"].astype(str), g["target"].astype(str)))


def cluster_decisions(result, relation: str = "near_duplicate", accepted: Mapping[str, str] | None = None
                      ) -> pd.DataFrame:
    """Decisions that put every member of each ``relation`` cluster (>= 2 rows) into one group.

    A near-duplicate cluster is cut at its cross-group links (confirmed pairs of two different non-empty groups,
    ``pairs.cross_group``) that ``accepted`` (:func:`accepted_links`) does not accept: the connected components of
    its other confirmed pairs become groups ``audit-near_duplicate-<cluster>.<k>`` (parts of >= 2 rows); an uncut
    cluster stays ``audit-near_duplicate-<cluster>``.

    Args:
        result: :class:`msb.audit.core.AuditResult` of a single-dataset audit.
        relation: audited relation (default ``near_duplicate``).
        accepted: sample id -> target of the reviewer's ``group`` decisions.

    Returns:
        DataFrame with :data:`DECISION_COLUMNS`: ``action = group``, ``target`` as above, a reason naming the
        cluster size, the sides it spans, the rule used and the links not followed.
    """
    col = f"cluster_{relation}"
    rows = result.rows
    if col not in rows.columns:
        raise MSBError(f"unknown relation {relation!r}; audited relations: "
                       f"{[c[8:] for c in rows.columns if c.startswith('cluster_')]}.")
    rule = result.params.get("confirmation_rule", "")
    part = rows[col].to_numpy()
    cut: dict[int, list[str]] = {}
    pairs = result.pairs
    if relation == "near_duplicate" and "cross_group" in pairs.columns and len(pairs):
        acc = dict(accepted or {})
        sid = rows["sample_id"].astype(str).to_numpy()
        a, b = pairs["a"].to_numpy(int), pairs["b"].to_numpy(int)
        ok = np.array([x in acc and acc[x] == acc.get(y) for x, y in zip(sid[a], sid[b])], dtype=bool)
        link = pairs["confirmed"].to_numpy(bool) & pairs["cross_group"].to_numpy(bool) & ~ok
        keep = pairs["confirmed"].to_numpy(bool) & ~link
        part = component_labels(len(rows), a[keep], b[keep])
        for t in np.flatnonzero(link):
            cut.setdefault(int(rows[col].iat[a[t]]), []).append(f"{sid[a[t]]}-{sid[b[t]]}")
    out = []
    for lab, g in rows.groupby(col, sort=True):
        if len(g) < 2:
            continue
        sides = sorted({s for s in g["side"] if s})
        parts = pd.Series(part[g.index.to_numpy()], index=g.index)
        sizes = parts.value_counts()
        names = {p: k + 1 for k, p in enumerate(sorted(sizes.index[sizes.to_numpy() >= 2]))}
        not_followed = f"; cross-group link(s) not followed: {', '.join(cut[int(lab)])}" if int(lab) in cut else ""
        reason = (f"{relation} cluster {int(lab)} ({len(g)} rows; sides {','.join(sides) or 'none'}; "
                  f"{result.params.get('candidate_rule', '')}; confirmed by {rule}{not_followed})")
        for sid_, p in zip(g["sample_id"], parts):
            if p not in names:
                continue
            target = f"audit-{relation}-{int(lab)}" if len(names) == 1 and int(lab) not in cut \
                else f"audit-{relation}-{int(lab)}.{names[p]}"
            out.append({"sample_id": sid_, "action": "group", "reason": reason, "target": target})
    return pd.DataFrame(out, columns=list(DECISION_COLUMNS))


def combine_decisions(audit: pd.DataFrame, user: pd.DataFrame) -> pd.DataFrame:
    """The audit's cluster decisions with the reviewer's (:func:`read_decisions`) taking precedence for the samples
    they name; an audit group holding a sample the reviewer put into group ``T`` is renamed ``T`` (the smallest
    such name), so an accepted link merges both sides' clusters."""
    named = set(user["sample_id"])
    g = user[user["action"] == "group"].set_index("sample_id")["target"]
    rename = {}
    for t, members in audit.groupby("target")["sample_id"]:
        hit = sorted({g[s] for s in members if s in g.index})
        if hit:
            rename[t] = hit[0]
    rest = audit[~audit["sample_id"].isin(named)].copy()
    rest["target"] = rest["target"].map(lambda t: rename.get(t, t))
    return pd.concat([rest, user.drop(columns=["line"])], ignore_index=True)


@dataclass
class CurationReport:
    """What :func:`apply_decisions` wrote.

    Attributes:
        out: curated dataset folder.
        n_rows_in: rows of the source index.
        n_dropped: rows left out.
        n_regrouped: kept rows whose group changed.
        n_kept_decisions: ``keep`` decisions recorded.
        n_groups_before / n_groups_after: distinct non-empty groups among kept rows before/after.
    """

    out: Path
    n_rows_in: int
    n_dropped: int
    n_regrouped: int
    n_kept_decisions: int
    n_groups_before: int
    n_groups_after: int

    def summary(self) -> str:
        """One line for the CLI."""
        return (f"curated dataset {self.out}: {self.n_rows_in - self.n_dropped} of {self.n_rows_in} rows kept "
                f"({self.n_dropped} dropped), {self.n_regrouped} row(s) regrouped, non-empty groups "
                f"{self.n_groups_before} -> {self.n_groups_after}; see curation.csv")


def apply_decisions(dataset: str | os.PathLike, decisions: str | os.PathLike | pd.DataFrame,
                    out: str | os.PathLike | None = None, overwrite: bool = False) -> CurationReport:
    """Write a curated dataset folder from ``dataset`` and ``decisions`` (module docstring).

    Args:
        dataset: prepared dataset folder.
        decisions: decisions CSV path or DataFrame.
        out: curated folder (default ``<parent>/<name>_curated``); must not overlap ``dataset``.
        overwrite: replace an existing non-empty ``out``.

    Returns:
        :class:`CurationReport`.

    Raises:
        MSBError: invalid dataset or decisions, every row dropped, existing ``out`` without ``overwrite``,
            overlapping folders. Nothing is left at ``out`` after an error; ``dataset`` is never modified.
    """
    ds = load_prepared_dataset(dataset, check_files=True)
    dec = read_decisions(decisions, ds.sample_ids)
    out_path = Path(out).expanduser().absolute() if out is not None else ds.root.parent / f"{ds.name}_curated"
    by_id = {r.sample_id: r for r in dec.itertuples(index=False)}
    idx = ds.index.copy()
    drop = idx["sample_id"].map(lambda s: s in by_id and by_id[s].action == "drop").to_numpy(dtype=bool)
    if drop.all():
        raise MSBError(f"{decisions}: every row of {ds.root / INDEX_FILE} would be dropped; nothing to curate.")
    kept = idx[~drop].copy()
    targets = {s: r.target for s, r in by_id.items() if r.action == "group"}
    old = kept["group"].astype(str).tolist()
    new, merged = merge_groups(kept["sample_id"].astype(str).tolist(), old, targets)
    kept["group"] = new
    log = []
    for s, g in zip(idx.loc[drop, "sample_id"], idx.loc[drop, "group"]):
        r = by_id[s]
        log.append({"sample_id": s, "action": "dropped", "old_group": g, "new_group": "", "reason": r.reason,
                    "decision_line": r.line})
    n_regrouped = 0
    for s, o, n_ in zip(kept["sample_id"], old, new):
        r = by_id.get(s)
        if o != n_:
            n_regrouped += 1
            reason = r.reason if r is not None and r.action == "group" else ""
            if n_ in merged:
                reason = (reason + "; " if reason else "") + f"merged labels {', '.join(merged[n_])}"
            log.append({"sample_id": s, "action": "regrouped", "old_group": o, "new_group": n_, "reason": reason,
                        "decision_line": r.line if r is not None else ""})
        elif r is not None:
            log.append({"sample_id": s, "action": "kept" if r.action == "keep" else "unchanged", "old_group": o,
                        "new_group": n_, "reason": r.reason, "decision_line": r.line})
    for col in ("image_path", "mask_path"):
        kept[col] = [Path(os.path.relpath(ds.root / PurePosixPath(p), out_path)).as_posix() for p in kept[col]]
    # optional spacing columns come back from the loader as floats (empty cells as the documented default 1.0)
    n_before = len({g for g in old if g})
    n_after = len({g for g in new if g})
    info = {"source_dataset": str(ds.root), "source_index_sha256": sha256_file(ds.root / INDEX_FILE),
            "decisions": str(decisions) if not isinstance(decisions, pd.DataFrame) else "<DataFrame>",
            "decisions_sha256": sha256_file(decisions) if not isinstance(decisions, pd.DataFrame) else None,
            "n_rows_in": len(idx), "n_dropped": int(drop.sum()), "n_regrouped": n_regrouped,
            "n_groups_before": n_before, "n_groups_after": n_after, "merged_groups": merged,
            "rule": "curated group = connected component of same existing group or same decision target"}
    with staged_output(out_path, overwrite=overwrite, source=ds.root) as tmp:
        write_prepared_dataset(tmp, kept.reset_index(drop=True), ds.classes)
        atomic_write_text(tmp / "curation.csv", pd.DataFrame(log, columns=list(CURATION_COLUMNS)).to_csv(
            index=False, lineterminator="\n"))
        atomic_write_text(tmp / "curation.json", json.dumps(info, indent=2, sort_keys=True) + "\n")
        # validate against the final location: relative paths resolve identically from the sibling temp folder
        load_prepared_dataset(tmp, check_files=True)
    return CurationReport(out=out_path, n_rows_in=len(idx), n_dropped=int(drop.sum()), n_regrouped=n_regrouped,
                          n_kept_decisions=int((dec["action"] == "keep").sum()), n_groups_before=n_before,
                          n_groups_after=n_after)


__all__ = ["read_decisions", "apply_decisions", "merge_groups", "groups_from_clusters", "cluster_decisions",
           "accepted_links", "combine_decisions",
           "CurationReport", "ACTIONS", "DECISION_COLUMNS"]
