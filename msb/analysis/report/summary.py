"""The first screen of the study report: the question, the protocol, a leaderboard per test set with 95 % CIs,
the paired-test result and (>= 3 systems) the critical-difference diagram.

Everything here is read from what :mod:`msb.analysis.report.report` already computed (:class:`BlockData`, the paired
tests, the Friedman result) and from the run folders (``config.yaml``, ``split.csv``,
``evaluation/<role>/prediction_semantics.json``); nothing is recomputed differently from the detail sections.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from msb.analysis.report.contract import RunInfo
from msb.analysis.counts.identical import IdenticalGroup

__all__ = ["BlockTests", "distance_unit", "protocol_rows", "leaderboard", "significance_sentences",
           "question"]

#: The leaderboard's ranking score: the image-macro Dice (mean over images of the per-image Dice).
RANK_BY: tuple[str, str] = ("image-macro", "dice")


@dataclass
class BlockTests:
    """The paired analyses of one block, kept for the summary: ``wilcoxon`` (:func:`paired_tests` rows),
    ``differences`` (:func:`paired_differences_table` rows), ``friedman`` (result or None), ``friedman_note``."""

    wilcoxon: pd.DataFrame
    differences: pd.DataFrame
    friedman: object = None
    friedman_note: str = ""


def distance_unit(metrics_df: pd.DataFrame | None) -> str:
    """Unit of the stored distances (HD95, ASSD): ``"px"`` when every row was computed with spacing (1, 1)
    (``index.csv`` without ``spacing_row/col``), ``"mm"`` when all rows carry a real spacing, else
    ``"mm or px"``; ``"px"`` without a metrics table (the evaluator's default spacing)."""
    if metrics_df is None or metrics_df.empty or "spacing_row" not in metrics_df.columns:
        return "px"
    ones = (metrics_df["spacing_row"].astype(float) == 1.0) & (metrics_df["spacing_col"].astype(float) == 1.0)
    return "px" if ones.all() else ("mm" if not ones.any() else "mm or px")


def _fmt_ci(v: float, lo: float, hi: float, digits: int = 3) -> str:
    if not np.isfinite(v):
        return "n/a"
    if np.isfinite(lo) and np.isfinite(hi):
        return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{v:.{digits}f}"


def question(key: tuple[str, str], labels: Sequence[str], classes: Sequence[str], n_images: int) -> str:
    """The study question for one block, in words."""
    who = " or ".join(labels) if len(labels) <= 3 else f"the {len(labels)} systems"
    return (f"Which model segments {', '.join(classes)} better on {key[0]}/{key[1]} ({n_images} images): {who}? "
            f"And how sure are we?")


def _semantics(eval_dirs: Mapping[tuple[str, str], Path]) -> list[str]:
    seen = []
    for ev in eval_dirs.values():
        p = ev / "prediction_semantics.json"
        if p.is_file():
            try:
                s = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            txt = (f"{s.get('model')}: outputs '{s.get('test_time_rule')}', adjustment "
                   f"{s.get('test_time_adjustment')}, normalisation {s.get('test_time_normalisation')}, "
                   f"threshold {s.get('threshold')} on {s.get('threshold_on')}")
            if txt not in seen:
                seen.append(txt)
    return seen


def _kfold_text(policy: str) -> str:
    """``kfold(k=3,folds=1a7b9f52)`` -> ``3-fold cross-validation (k = 3, folds file SHA-256 1a7b9f52...)``."""
    import re

    m = re.match(r"kfold\(k=(\d+|\?),folds=([0-9a-f?]+)\)", policy)
    return (f"{m.group(1)}-fold cross-validation (k = {m.group(1)}, folds file SHA-256 {m.group(2)}...)" if m
            else policy)


_UNIT_SKIP = ("run_id", "folds_file", "split_file", "split_sha256", "config_hash")


def _unit_rows(runs: Sequence[RunInfo]) -> list[tuple[str, str]]:
    """Search, cross-validation and ensemble rows from the unit manifests of the study holding ``runs``."""
    study_dirs = sorted({r.run_dir.parent for r in runs})
    rows: dict[str, list[str]] = {"Search": [], "Cross-validation": [], "Ensemble": []}
    for sd in study_dirs:
        for mf in sorted((sd / "_study").glob("*/manifest.json")):
            try:
                m = json.loads(mf.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            for field, key in (("Search", "search"), ("Cross-validation", "cross_validation"),
                               ("Ensemble", "ensemble")):
                v = m.get(key)
                if isinstance(v, dict):
                    items = [f"{k} {str(x)[:8] + '...' if k.endswith('sha256') else x}" for k, x in v.items()
                             if isinstance(x, (str, int, float, bool)) and k not in _UNIT_SKIP]
                    txt = f"{m.get('unit', mf.parent.name)}: {', '.join(items)}"
                    if txt not in rows[field]:
                        rows[field].append(txt)
    return [(f, "; ".join(v)) for f, v in rows.items() if v]


def protocol_rows(runs: Sequence[RunInfo], counts: pd.DataFrame, eval_dirs: Mapping[tuple[str, str], Path],
                  n_boot: int, level: float) -> list[tuple[str, str]]:
    """``(field, value)`` rows: datasets, split policy, checkpoint rule, test-time rule, aggregation rule, and
    (read from the study's unit manifests ``_study/<unit>/manifest.json``) search, cross-validation and ensemble.

    The split policy is what the counts say ran (their ``split_policy`` column, e.g. ``kfold(k=3,folds=1a7b9f52)``:
    k and the first 8 hex of the folds file's SHA-256), with the config's group column, stratification and
    fractions; the configs alone would state the split a K-fold study replaced.

    Args:
        runs: the study's runs; counts: their counts rows; eval_dirs: evaluation folders (for
            ``prediction_semantics.json``); n_boot, level: the bootstrap of every CI.
    """
    trained = sorted({str((r.config.get("data") or {}).get("name", "?")) for r in runs})
    sizes = []
    for r in runs[:1]:
        if r.split is not None:
            vc = r.split["split"].astype(str).value_counts()
            sizes.append(", ".join(f"{s} {int(vc.get(s, 0))}" for s in ("train", "val", "test")))
    tested = "; ".join(f"{d}/{s} ({g['image_id'].nunique()} images)"
                       for (d, s), g in counts.groupby(["dataset", "split"], sort=True))
    splits = sorted({json.dumps((r.config.get("data") or {}).get("split") or {}, sort_keys=True) for r in runs
                     if ((r.config.get("data") or {}).get("split") or {}).get("mode")})
    split_txt = "; ".join(
        f"{d.get('mode', '?')}" + (f", whole groups of '{d['group_column']}'" if d.get("group_column") else "")
        + (f", val {d['val_fraction']}" if d.get("val_fraction") is not None else "")
        + (f", test {d['test_fraction']}" if d.get("test_fraction") is not None else "")
        + f", seed {d.get('seed')}" for d in map(json.loads, splits))
    ck = sorted({(str(r.config["checkpoint"].get("metric")), str(r.config["checkpoint"].get("selection_split")))
                 for r in runs if isinstance(r.config.get("checkpoint"), dict)})
    roles = sorted(set(counts["checkpoint_role"].astype(str)))
    epochs = sorted({str((r.config.get("train") or {}).get("epochs", "(not stated)")) for r in runs})
    sem = _semantics(eval_dirs) or [
        "threshold " + ", ".join(f"{v:g}" for v in sorted(set(counts["threshold"].astype(float))))
        + " on " + ", ".join(sorted(set(counts["threshold_on"].astype(str))))]
    ci = (f"{level:.0%} percentile bootstrap over images ({n_boot} replicates)" if n_boot else "no CI (bootstrap off)")
    policies = (sorted(set(counts["split_policy"].dropna().astype(str)) - {""}) if "split_policy" in counts.columns
                else [])
    if any(pol.startswith("kfold(") for pol in policies):
        groups = sorted({str(d["group_column"]) for d in map(json.loads, splits) if d.get("group_column")})
        split_txt = "; ".join(_kfold_text(pol) for pol in policies) + (
            f", whole groups of {', '.join(repr(g) for g in groups)}" if groups else "") + " (from the counts)"
    return [
        ("Datasets", f"trained on {', '.join(trained)}" + (f" ({sizes[0]} images)" if sizes else "")
         + f"; tested on {tested}"),
        ("Split policy", split_txt or "not stated in config.yaml"),
        *_unit_rows(runs),
        ("Checkpoint rule", ("; ".join(f"best {m} on '{s}'" for m, s in ck) + f" within {'/'.join(epochs)} epoch(s)"
                             if ck else "selection rule not stated in config.yaml")
         + f"; evaluated checkpoint(s): {', '.join(roles)}"),
        ("Test-time rule", "; ".join(sem)),
        ("Aggregation rule", f"ranked by image-macro Dice (mean of per-image Dice; 0/0 images excluded), also "
                             f"global-micro Dice (pooled counts); {ci}"),
    ]


def leaderboard(scores: pd.DataFrame, boundary: pd.DataFrame, unit: str) -> pd.DataFrame:
    """One block's leaderboard, best first by :data:`RANK_BY` (ties share the lower rank).

    Args:
        scores: :func:`msb.analysis.report.report_data.system_scores` rows of the block.
        boundary: :func:`msb.analysis.report.report_data.boundary_scores` rows (may be empty).
        unit: distance unit for the HD95 column header (:func:`distance_unit`).

    Returns:
        Columns ``rank, system, image-macro Dice [95 % CI], global-micro Dice [95 % CI]``, then
        ``HD95 (<unit>) [95 % CI]`` when available, ``images``; cells are text.
    """
    def pick(agg: str, metric: str, frame: pd.DataFrame) -> pd.DataFrame:
        return frame[(frame["aggregation"] == agg) & (frame["metric"] == metric)].set_index("system")

    main = pick(*RANK_BY, scores)
    gm = pick("global-micro", "dice", scores)
    hd = pick("image-macro", "hd95", boundary) if not boundary.empty else pd.DataFrame()
    order = main["value"].sort_values(ascending=False, kind="stable")
    ranks = order.rank(ascending=False, method="min")
    lvl = main["ci_level"].dropna()
    tag = f"[{lvl.iloc[0]:.0%} CI]" if len(lvl) else ""
    rows = []
    for s in order.index:
        r = {"rank": int(ranks[s]) if np.isfinite(ranks[s]) else "n/a", "system": s,
             f"image-macro Dice {tag}".strip(): _fmt_ci(main.at[s, "value"], main.at[s, "ci_low"], main.at[s, "ci_high"]),
             f"global-micro Dice {tag}".strip(): _fmt_ci(gm.at[s, "value"], gm.at[s, "ci_low"], gm.at[s, "ci_high"])
             if s in gm.index else "n/a"}
        if not hd.empty:
            r[f"HD95 ({unit}) {tag}".strip()] = (_fmt_ci(hd.at[s, "value"], hd.at[s, "ci_low"], hd.at[s, "ci_high"], 2)
                                                 if s in hd.index else "n/a")
        r["images"] = int(main.at[s, "n_images"])
        rows.append(r)
    return pd.DataFrame(rows)


def significance_sentences(tests: BlockTests | None, n_systems: int,
                           identical: Sequence[IdenticalGroup] = ()) -> list[str]:
    """The paired-test result in words: per pair the image-macro Dice difference with its paired-bootstrap CI,
    the Wilcoxon p (BH-adjusted) and the rank-biserial effect size; the Friedman line for >= 3 systems.

    Args:
        tests: the block's analyses (None for a single system); n_systems: systems in the block;
        identical: identical groups of the block (named, never tested).
    """
    out = [g.sentence() + "." for g in identical]
    if tests is None or n_systems < 2:
        return out + [f"not applicable: {n_systems} system(s) on this test set, nothing to compare"]
    w = tests.wilcoxon
    w = w[w["metric"] == "dice"] if len(w) else w
    d = tests.differences
    d = d[d["aggregation"] == "image-macro"] if len(d) else d
    for r in w.itertuples():
        dd = d[(d["system_a"] == r.system_a) & (d["system_b"] == r.system_b)]
        a, b, sign = r.system_a, r.system_b, 1.0
        if len(dd) and float(dd["difference"].iloc[0]) < 0:  # state the better system first (a − b > 0)
            a, b, sign = b, a, -1.0
        lo, hi = (sign * float(dd["ci_low"].iloc[0]), sign * float(dd["ci_high"].iloc[0])) if len(dd) else (0, 0)
        diff = (f"Dice {a} − {b} = " + _fmt_ci(sign * float(dd["difference"].iloc[0]), min(lo, hi), max(lo, hi))
                if len(dd) else f"{a} vs {b}")
        if not np.isfinite(r.p_value):
            out.append(f"{diff}: not testable: all {int(r.n)} paired differences are zero.")
            continue
        verdict = "significant" if r.p_adjusted < 0.05 else "not significant"
        out.append(f"{diff} (image-macro, paired bootstrap); Wilcoxon signed-rank p = {r.p_value:.3g}, "
                   f"BH-adjusted p = {r.p_adjusted:.3g} ({verdict} at 0.05), rank-biserial r = "
                   f"{sign * r.rank_biserial:+.2f} (> 0: {a} higher), n = {int(r.n)} images.")
    fr = tests.friedman
    if fr is not None:
        out.append(f"{fr.test}: chi2 = {fr.statistic:.3g}, p = {fr.p_value:.3g} (n = {fr.n} images, k = {fr.k}); "
                   f"{fr.posthoc_test} post-hoc in the diagram.")
    elif tests.friedman_note:
        out.append(tests.friedman_note)
    return out
