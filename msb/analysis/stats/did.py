"""Local-versus-distant removal: ReuScope's step four as a difference-in-differences over paired seeds.

**Exploratory**, as the ReuScope paper labels it (its design and endpoint were chosen with access to results;
its intervals are not adjusted for that selection). Two pools of one study (:mod:`msb.config.pools_schema`):
``L`` = ``remove_neighbours`` (the training neighbours of the evaluation frames with a close training match
removed) and ``D`` = ``remove_distant`` (as many distant training rows removed, matched by stratum). The pairs
file and the training split are those of ``L``'s runs (``data.pool.pairs_file``, ``split.csv``), read with
:mod:`msb.data.neighbours`, so the frames are the ones the pools were built from.

* **exposed** ``E``: the evaluated images with at least one training neighbour;
* **matched unflagged** ``U``: as many evaluated images without a neighbour, drawn per stratum of ``E``
  (``match_on``: ``source`` and/or ``empty`` = reference mask empty or not; ``numpy.random.default_rng(seed)``
  over the sorted candidate ids), so both sets have the same source / empty-frame make-up;
* per seed ``s`` (seeds present for both pools): ``d_s = [M(L,s;E) - M(D,s;E)] - [M(L,s;U) - M(D,s;U)]``,
  ``M`` = the chosen metric and aggregation rule (:func:`msb.analysis.counts.rules.rule_values`) from the stored
  counts; ``did = mean_s d_s``; **paired-t interval over seeds**: ``did ± t_{(1+level)/2, n-1} · sd(d, ddof=1) /
  sqrt(n)`` (``scipy.stats.t``); ``n_negative`` = seeds with ``d_s < 0``.

A negative ``did`` says the local removal lowered the score on exposed frames more than the distant removal did,
relative to matched unflagged frames (the paper: -0.355 percentage points of true-class probability,
negative in ten of ten seeds). The interval describes seed-to-seed variation on fixed lists (one split, fixed
pools, fixed evaluation rows), not sampling of patients.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from msb.analysis.counts.rules import ImageTable, image_table, rule_values
from msb.errors import MSBError

__all__ = ["DID_COLUMNS", "DID_NOTE", "EXPLORATORY", "matched_sets", "did_table", "local_inputs", "per_seed_did"]

EXPLORATORY = "exploratory"
DID_NOTE = ("Local-versus-distant removal (ReuScope step four) is EXPLORATORY: one pre-chosen design, intervals "
            "over seeds on fixed lists, not adjusted for any selection of the design.")
DID_COLUMNS = ["local", "distant", "metric", "rule", "did", "ci_low", "ci_high", "interval", "n_seeds",
               "n_negative", "n_exposed", "n_unflagged", "match_on", "label"]
_MATCH_KEYS = ("source", "empty")


def local_inputs(runs: pd.DataFrame, local: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The pairs and training ids behind pool ``local`` (from its first run folder's config and split).

    Args:
        runs: :func:`msb.analysis.stats.contrasts.pool_runs` output.
        local: the ``remove_neighbours`` pool name.

    Raises:
        MSBError: no run of ``local``; its ``data.pool`` is not ``remove_neighbours``; no ``split.csv``.
    """
    from msb.data.neighbours import read_pairs

    mine = runs[runs["pool"] == local]
    if mine.empty:
        raise MSBError(f"local-versus-distant: no run of pool {local!r}; pools with runs: {sorted(set(runs['pool']))}")
    run_dir = Path(mine["counts"].iloc[0]).parents[2]
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    pool = (cfg.get("data") or {}).get("pool") or {}
    if pool.get("kind") != "remove_neighbours":
        raise MSBError(f"local-versus-distant: pool {local!r} is kind {pool.get('kind')!r}; the local arm must be a "
                       f"remove_neighbours pool")
    split = run_dir / "split.csv"
    if not split.is_file():
        raise MSBError(f"{run_dir}: no split.csv; rerun the study")
    sp = pd.read_csv(split, dtype=str, keep_default_na=False)
    return read_pairs(pool["pairs_file"]), sp.loc[sp["split"] == "train", "sample_id"].tolist()


def _labels(t: ImageTable, match_on: Sequence[str]) -> np.ndarray:
    parts = []
    for k in match_on:
        if k == "source":
            parts.append("source=" + t.keys["source"].astype(str).to_numpy().astype(object))
        else:
            empty = (t.tp + t.fn).sum(axis=1) == 0
            parts.append(np.where(empty, "empty", "non-empty").astype(object))
    if not parts:
        return np.full(len(t.keys), "all", dtype=object)
    out = parts[0]
    for p in parts[1:]:
        out = out + "|" + p
    return out


def matched_sets(t: ImageTable, exposed_ids: set[str], match_on: Sequence[str], seed: int
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Positions (in ``t``) of the exposed images and of as many matched unflagged images (module docstring).

    Raises:
        MSBError: an unknown ``match_on`` key; no exposed image evaluated; a stratum with fewer unflagged images
            than exposed ones (named, with the counts).
    """
    bad = [k for k in match_on if k not in _MATCH_KEYS]
    if bad:
        raise MSBError(f"local-versus-distant: match_on {bad} unknown; use {list(_MATCH_KEYS)}")
    ids = t.keys["image_id"].astype(str).to_numpy()
    is_exp = np.isin(ids, sorted(exposed_ids))
    if not is_exp.any():
        raise MSBError("local-versus-distant: no evaluated image has a close training match in the pairs file")
    labels = _labels(t, match_on)
    rng = np.random.default_rng(seed)
    chosen = []
    for stratum in sorted(set(labels[is_exp])):
        k = int(np.sum(is_exp & (labels == stratum)))
        cand = np.flatnonzero(~is_exp & (labels == stratum))
        cand = cand[np.argsort(ids[cand], kind="stable")]
        if len(cand) < k:
            raise MSBError(f"local-versus-distant: stratum {stratum!r} has {k} exposed but {len(cand)} unflagged "
                           f"evaluation images; match on fewer keys (match_on)")
        chosen.append(np.sort(cand[rng.choice(len(cand), size=k, replace=False)]))
    return np.flatnonzero(is_exp), np.sort(np.concatenate(chosen))


def per_seed_did(tables: dict[tuple[str, int], ImageTable], local: str, distant: str, seeds: Sequence[int],
                 exp: np.ndarray, unf: np.ndarray, metric: str, rule: str) -> np.ndarray:
    """``d_s`` for each seed (module docstring), from image tables that list the same images in the same order."""
    def m(pool: str, s: int, rows: np.ndarray) -> float:
        return float(rule_values(tables[(pool, s)].subset(rows), rule, metric)[0])

    return np.array([(m(local, s, exp) - m(distant, s, exp)) - (m(local, s, unf) - m(distant, s, unf))
                     for s in seeds])


def did_table(counts: dict[tuple[str, int], pd.DataFrame], local: str, distant: str,
              pairs: Sequence[tuple[str, str]], train_ids: Sequence[str], metric: str = "dice",
              rule: str = "image-macro", level: float = 0.95, match_on: Sequence[str] = ("source", "empty"),
              seed: int = 0) -> pd.DataFrame:
    """One row of :data:`DID_COLUMNS` for the pools ``local`` (remove_neighbours) and ``distant``.

    Args:
        counts: ``(pool, seed)`` -> counts rows of that run (one checkpoint role).
        pairs, train_ids: from :func:`local_inputs`.
        metric, rule, level: score and interval level; match_on, seed: the matching of unflagged images.

    Raises:
        MSBError: a pool without runs; fewer than two shared seeds; runs evaluated on different images; see
            :func:`matched_sets`.
    """
    from msb.analysis.stats.contrasts import _paired_t
    from msb.data.neighbours import training_neighbours

    pools = {p for p, _ in counts}
    for p in (local, distant):
        if p not in pools:
            raise MSBError(f"local-versus-distant {local} / {distant}: no run of pool {p!r}; pools: {sorted(pools)}")
    seeds = sorted({s for p, s in counts if p == local} & {s for p, s in counts if p == distant})
    if len(seeds) < 2:
        raise MSBError(f"local-versus-distant {local} / {distant}: {len(seeds)} shared seed(s); the paired interval "
                       f"needs at least 2")
    tables = {}
    for p in (local, distant):
        for s in seeds:
            t = image_table(counts[(p, s)], f"pool {p!r} seed {s}")
            tables[(p, s)] = t.subset(np.argsort(t.keys["image_id"].astype(str).to_numpy(), kind="stable"))
    first = tables[(local, seeds[0])]
    ids = first.keys["image_id"].astype(str).to_numpy()
    for key, t in tables.items():
        if not np.array_equal(t.keys["image_id"].astype(str).to_numpy(), ids):
            raise MSBError(f"local-versus-distant: pool {key[0]!r} seed {key[1]} was evaluated on other images; the "
                           f"pools must share one split and evaluation set")
    exposed = set(training_neighbours(pairs, train_ids))
    exp, unf = matched_sets(first, exposed, match_on, seed)
    d = per_seed_did(tables, local, distant, seeds, exp, unf, metric, rule)
    lo, hi = _paired_t(d, level)
    return pd.DataFrame([{
        "local": local, "distant": distant, "metric": metric, "rule": rule, "did": float(d.mean()), "ci_low": lo,
        "ci_high": hi, "interval": "paired-t over seeds", "n_seeds": len(seeds), "n_negative": int(np.sum(d < 0)),
        "n_exposed": int(len(exp)), "n_unflagged": int(len(unf)), "match_on": "+".join(match_on) or "none",
        "label": EXPLORATORY}], columns=DID_COLUMNS)
