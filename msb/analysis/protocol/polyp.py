"""(e) The polyp-segmentation audit's protocol tables ("Metrics or Mirage?", §6): P1 (Table 3), P2 (Table 4) and
P3 (Table 6 and its per-centre breakdown).

Every score is the mean over test images of the per-image value (the audit's mDice convention): Dice and recall
from the stored counts (per image, classes averaged; images with an undefined value excluded), HD95 and NSD from
``metrics.parquet`` (``msb metrics``; distances in the spacing unit, px without a spacing; a missed or false-alarm
image carries the diagonal penalty, docs/metrics.md). Systems are architectures x input sizes; fold runs are
pooled as distinct image rows, fold ensembles are left out.

* **P1** rows = models, column groups = test sets (internal test split and every external set; a split whose
  images come from several sources, like the PraNet test split of Kvasir and CVC-ClinicDB, one group per
  source: :func:`split_by_source`), columns Dice, Rec, HD95.
* **P2** random-split replicates: per split seed (the ``seed=`` of ``split_policy``, else the training ``seed``)
  the mean Dice and HD95 of each model, then mean ± sample SD over seeds; ``flips`` says whether the model and
  the next one in the mean-Dice order swap places in some seed (and in which).
* **P3** per centre (``source`` of ``index.csv``): pooled over the test set(s) and per source: Dice, Recall,
  HD95, NSD (``nsd_tau3px`` when present, the audit's NSD@3px, else the first ``nsd_tau*`` column; named in the
  caption).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from msb.analysis.protocol.common import (AnalysisOutput, AnalysisSkipped, PaperTable, evaluation_rows, fmt_num,
                                          fmt_pm, image_mean, nanmean, per_image, system_tables)
from msb.analysis.protocol.inputs import check_one_protocol, protocol_family, split_seed
from msb.analysis.counts.rules import ImageTable

__all__ = ["test_set_tables", "split_by_source", "nsd_column", "p1_table", "p2_seeds", "p2_table", "p3_tables"]


def nsd_column(metrics: pd.DataFrame | None) -> str | None:
    """The NSD column used: ``nsd_tau3px`` if present, else the ``nsd_tau*`` column of smallest tolerance."""
    if metrics is None:
        return None
    cols = [c for c in metrics.columns if c.startswith("nsd_tau")]
    if "nsd_tau3px" in cols:
        return "nsd_tau3px"
    tau = [(float(m.group(1)), c) for c in cols if (m := re.match(r"nsd_tau([0-9.]+)", c))]
    return sorted(tau)[0][1] if tau else None


def _attach(t: ImageTable, metrics: pd.DataFrame | None) -> ImageTable:
    if metrics is None:
        return t
    cols = [c for c in ("hd95", nsd_column(metrics)) if c and c in metrics.columns]
    return t.with_metrics(metrics, cols) if cols else t


def test_set_label(dataset: str, split: str, kind: str) -> str:
    """How a test set is named in the tables: the dataset, with the split when it is not ``test``/``all``."""
    return dataset if split in ("test", "all") else f"{dataset} ({split})"


def test_set_tables(counts: pd.DataFrame, metrics: pd.DataFrame | None, what: str,
                    allow_mixed_protocols: bool = False, ensembles: bool = False) -> dict[str, dict[tuple, ImageTable]]:
    """``{test set label: {(architecture, input_size): ImageTable with hd95/NSD attached}}`` of the non-ensemble
    rows (best checkpoint) of every test set; ``what`` names the table in a protocol refusal.

    A test set is one (dataset, split, evaluation kind) under one training split protocol
    (``train_split_policy``): the test splits of different random-split seeds are different image sets, so each
    becomes its own test set, labelled ``<test set> [<policy>]``; the seeds of one random-split protocol are one
    protocol family and are accepted together, different families (``fixed`` beside ``random(...)``) are refused
    unless ``allow_mixed_protocols``. Order: the internal test split first, then the external sets by name.

    ``ensembles=True``: the same labels (fixed by the non-ensemble rows) with the fold-ensemble rows
    (``-ensemble`` run ids) instead; test sets and models without an ensemble are absent.

    Raises:
        AnalysisSkipped: no non-ensemble test rows. MSBError: mixed protocol families (unless allowed).
    """
    rows = evaluation_rows(counts, None)
    if rows.empty:
        raise AnalysisSkipped("no evaluated test set")
    check_one_protocol(rows, what, allow_mixed_protocols, family=True)  # one column/test set per policy below
    pcol = "train_split_policy" if "train_split_policy" in rows.columns else "split_policy"
    n_pol = rows.assign(_policy=rows[pcol].astype(str)).groupby(["dataset", "split", "eval_kind"])["_policy"].nunique()
    if ensembles:
        rows = evaluation_rows(counts, None, ensembles=True)
        rows = rows[rows["is_ensemble"]]
    rows = rows.assign(_policy=rows[pcol].astype(str))
    out = {}
    groups = sorted(rows.groupby(["dataset", "split", "eval_kind", "_policy"], sort=True),
                    key=lambda kv: kv[0][2] != "internal")
    for (ds, sp, kind, pol), g in groups:
        label = test_set_label(ds, sp, kind) + (f" [{pol}]" if n_pol.get((ds, sp, kind), 1) > 1 else "")
        out[label] = {k: _attach(t, metrics) for k, t in system_tables(g, ("architecture", "input_size")).items()}
    return out


def split_by_source(sets: dict[str, dict[tuple, ImageTable]]) -> dict[str, dict[tuple, ImageTable]]:
    """Each test set whose images come from several sources (``index.csv`` ``source``, e.g. the PraNet test split:
    Kvasir, CVC-ClinicDB, ...) as one test set per source, labelled ``<source> (<test set>)``; test sets with one
    source are kept as they are. Order: test sets as given, sources sorted."""
    out: dict[str, dict[tuple, ImageTable]] = {}
    for name, tabs in sets.items():
        src = {k: (t.keys["source"].astype(str).to_numpy() if "source" in t.keys.columns
                   else np.full(t.n_images, "")) for k, t in tabs.items()}
        values = sorted({s for v in src.values() for s in v})
        if len(values) < 2:
            out[name] = tabs
            continue
        for s in values:
            out[f"{s} ({name})"] = {k: t.subset(src[k] == s) for k, t in tabs.items() if (src[k] == s).any()}
    return out


def _model(key: tuple) -> str:
    arch, size = key
    return arch if size < 0 else f"{arch} ({size})"


def _models(sets: dict[str, dict[tuple, ImageTable]]) -> list[tuple]:
    return sorted({k for tabs in sets.values() for k in tabs})


def p1_table(sets: dict[str, dict[tuple, ImageTable]]) -> PaperTable:
    """P1: rows = models, per test set Dice / Rec / HD95 (image means)."""
    names = list(sets)
    cols = pd.MultiIndex.from_tuples([("", "Model")] + [(n, m) for n in names for m in ("Dice", "Rec", "HD95")])
    vals, disp = [], []
    for key in _models(sets):
        v, d = [_model(key)], [_model(key)]
        for n in names:
            t = sets[n].get(key)
            x = [image_mean(t, m) if t is not None else np.nan for m in ("dice", "recall", "hd95")]
            v += x
            d += [fmt_num(x[0]), fmt_num(x[1]), fmt_num(x[2], 1)]
        vals.append(v)
        disp.append(d)
    cap = ("P1: per test set, mean over images of Dice, recall (Rec) and HD95 (px, lower is better; "
           "metrics.parquet, – when absent); best-checkpoint test rows, folds pooled; a test split holding several "
           "sources (index.csv source) is one test set per source")
    return PaperTable("p1", pd.DataFrame(vals, columns=cols), pd.DataFrame(disp, columns=cols), cap)


def p2_seeds(counts: pd.DataFrame, metrics: pd.DataFrame | None,
             allow_mixed_protocols: bool = False) -> pd.DataFrame:
    """Per random-split seed and model: mean Dice and HD95 on that seed's internal test split.

    Returns:
        ``seed, architecture, input_size, dice, hd95, n_images``.

    Raises:
        AnalysisSkipped: no internal test rows under a ``random`` split policy or fewer than two seeds.
        MSBError: several random-split protocol families (unless allowed).
    """
    rows = evaluation_rows(counts, "internal")
    rows = rows[rows["split_policy"].astype(str).map(protocol_family).str.startswith("random")]
    if rows.empty:
        raise AnalysisSkipped("no internal test counts under a random split policy (split_policy random(...))")
    check_one_protocol(rows, "P2 (random-split seeds)", allow_mixed_protocols, family=True)
    seeds = [split_seed(p) if split_seed(p) is not None else int(s)
             for p, s in zip(rows["split_policy"].astype(str), rows["seed"])]
    rows = rows.assign(_rep=seeds)
    if rows["_rep"].nunique() < 2:
        raise AnalysisSkipped(f"P2 needs at least two random-split seeds, found {sorted(set(seeds))}")
    out = []
    for rep, g in rows.groupby("_rep", sort=True):
        for key, t in system_tables(g, ("architecture", "input_size")).items():
            t = _attach(t, metrics)
            out.append({"seed": int(rep), "architecture": key[0], "input_size": int(key[1]),
                        "dice": image_mean(t, "dice"), "hd95": image_mean(t, "hd95"), "n_images": t.n_images})
    return pd.DataFrame(out)


def p2_table(per_seed: pd.DataFrame) -> PaperTable:
    """P2: mean ± SD over seeds of mDice and mHD95 per model, best mean Dice first, and the adjacent-pair flips."""
    g = per_seed.groupby(["architecture", "input_size"], sort=True)
    summ = g.agg(dice_mean=("dice", "mean"), dice_sd=("dice", lambda v: v.std(ddof=1)),
                 hd_mean=("hd95", "mean"), hd_sd=("hd95", lambda v: v.std(ddof=1)),
                 n_seeds=("seed", "nunique")).reset_index().sort_values("dice_mean", ascending=False, kind="stable")
    piv = per_seed.pivot_table(index="seed", columns=["architecture", "input_size"], values="dice")
    keys = list(zip(summ["architecture"], summ["input_size"]))
    flips = []
    for a, b in zip(keys, keys[1:] + [None]):
        if b is None:
            flips.append("")
            continue
        swapped = [int(s) for s in piv.index if piv.loc[s, a] < piv.loc[s, b]]
        flips.append(f"yes (seed {', '.join(map(str, swapped))})" if swapped else "no")
    names = [_model(k) for k in keys]
    vals = pd.DataFrame({"Model": names, "mDice": summ["dice_mean"].to_numpy(), "mDice SD": summ["dice_sd"].to_numpy(),
                         "mHD95 (px)": summ["hd_mean"].to_numpy(), "mHD95 SD": summ["hd_sd"].to_numpy(),
                         "Seeds": summ["n_seeds"].to_numpy(), "Flips with next": flips})
    disp = pd.DataFrame({"Model": names, "mDice": [fmt_pm(m, s) for m, s in zip(summ["dice_mean"], summ["dice_sd"])],
                         "mHD95 (px)": [fmt_pm(m, s, 1) for m, s in zip(summ["hd_mean"], summ["hd_sd"])],
                         "Seeds": summ["n_seeds"].astype(str).to_numpy(), "Flips with next": flips})
    cap = (f"P2: random splits, mean ± sample SD over {int(summ['n_seeds'].max())} split seeds of the per-image "
           "mean Dice and HD95 (px); 'Flips with next': whether this model and the next in the table swap order "
           "in some seed")
    return PaperTable("p2", vals, disp, cap)


def p3_tables(sets: dict[str, dict[tuple, ImageTable]], nsd: str | None) -> tuple[PaperTable, PaperTable]:
    """P3: pooled table (rows = models; Dice, Recall, HD95, NSD over all images of the given test sets) and the
    per-centre table (rows = model x source)."""
    metrics = ("dice", "recall", "hd95", nsd or "nsd")
    heads = ["Dice", "Recall", "HD95", "NSD"]
    pooled_v, centre_v = [], []
    for key in _models(sets):
        parts = [tabs[key] for tabs in sets.values() if key in tabs]
        vals = {m: np.concatenate([per_image(t, m) for t in parts]) for m in metrics}
        src = np.concatenate([t.keys["source"].astype(str).to_numpy() if "source" in t.keys.columns
                              else np.full(t.n_images, "") for t in parts])
        pooled_v.append([_model(key), int(src.size)] + [nanmean(vals[m]) for m in metrics])
        for s in sorted(set(src)):
            sel = src == s
            centre_v.append([_model(key), s, int(sel.sum())] + [nanmean(vals[m][sel]) for m in metrics])
    pv = pd.DataFrame(pooled_v, columns=["Model", "Images", *heads])
    cv = pd.DataFrame(centre_v, columns=["Model", "Centre", "Images", *heads])

    def show(df):
        d = df.copy()
        for h in heads:
            d[h] = [fmt_num(x, 1 if h == "HD95" else 3) for x in df[h]]
        return d.astype(str)
    what = f"NSD = {nsd}" if nsd else "NSD n/a (no metrics.parquet)"
    cap = (f"P3: pooled over {', '.join(sets)}: per-image means of Dice, recall, HD95 (px) and NSD ({what})")
    cap_c = f"P3 per centre (index.csv source) of {', '.join(sets)}: per-image means, {what}"
    return PaperTable("p3", pv, show(pv), cap), PaperTable("p3_centres", cv, show(cv), cap_c)


def run_p1(art, options: dict) -> AnalysisOutput:
    """Registry entry of P1."""
    sets = test_set_tables(art.counts, art.metrics, "P1 table", options.get("allow_mixed_protocols", False))
    return AnalysisOutput(tables=[p1_table(split_by_source(sets))])


def run_p2(art, options: dict) -> AnalysisOutput:
    """Registry entry of P2."""
    per_seed = p2_seeds(art.counts, art.metrics, options.get("allow_mixed_protocols", False))
    return AnalysisOutput(tables=[p2_table(per_seed)], data={"p2_per_seed": per_seed})


def run_p3(art, options: dict) -> AnalysisOutput:
    """Registry entry of P3: the external sets when there are any (the audit's unseen centres), else all sets."""
    counts = art.counts
    if (counts["eval_kind"] == "external").any() and not options.get("p3_all_sets", False):
        counts = counts[counts["eval_kind"] == "external"]
    sets = test_set_tables(counts, art.metrics, "P3 table", options.get("allow_mixed_protocols", False))
    a, b = p3_tables(sets, nsd_column(art.metrics))
    return AnalysisOutput(tables=[a, b])
