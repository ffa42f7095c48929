"""The semi-supervised protocol study (``configs/protocols/semi_supervised.yaml``) from its stored artifacts:
scores per method x labelled fraction x seed, paired differences against supervised-only, a score-vs-fraction
figure. Protocol analysis ``semi_supervised`` (``msb report``, ``msb reaggregate STUDY --analyses
semi_supervised``); docs/semi_supervised.md.

Inputs (no training code is imported): the internal best-checkpoint counts rows of every non-ensemble run
(:class:`~msb.analysis.protocol.inputs.StudyArtifacts`), their ``metrics.parquet`` rows (``msb metrics``, or
``evaluation.compute_metrics``; the card columns need ``evaluation.metrics.card: true`` or ``msb metrics --card``)
and the run configs. A run's **method** is its ``train.strategy.name`` (``supervised`` when the key is absent,
i.e. the supervised-only reference), its **labelled fraction** ``data.labelled_fraction`` (with
``data.labelled_ids``: the labelled share of ``labelled.csv``; neither: 1.0, every training image labelled),
its **seed** the counts' ``seed`` (the run's ``random_seed``). Without a run config these come from the
counts' ``variant`` (``train.strategy.name=...;data.labelled_fraction=...``). Other study axes in the variant
and a test-time rule that differs between runs of one method are appended to the method label (e.g.
``mean_teacher [average]``), so rows of different rules are never pooled.

Scores of one run (fractions in [0, 1]; distances in the dataset's spacing unit, px without one):

* ``dice_gm``, ``iou_gm``: global-micro (TP, FP, FN summed over images and classes, one ratio);
  ``dice_im``, ``iou_im``: image-macro (per image, then the mean; undefined images excluded)
  (:func:`msb.analysis.counts.rules.rule_values`);
* ``hd95``: image-macro mean of ``metrics.parquet`` ``hd95`` under its named ``hd_convention`` (one-sided empty
  pairs at the image-diagonal penalty, two empty masks excluded: docs/metrics.md);
* ``card_dice``, ``card_iou``, ``card_hd95``: the published card's per-image values as written
  (:mod:`msb.evaluation.card_metrics`: no smoothing; its "HD95" is the distance to the FARTHEST reference pixel,
  not a Hausdorff distance), averaged like the card's ``np.mean`` but over the images where the recipe is
  defined; ``n_card_hd95_refused`` counts the images the card's code would crash on (an empty mask).

Paired differences: each method's run minus the supervised-only run of the same block (dataset, split, input
size), labelled fraction and seed, on their common test images; ``Δ < 0`` is better for HD95. The interval is
the percentile interval of ``n_boot`` (default 1,000) image-level paired bootstrap replicates
(:func:`msb.analysis.stats.bootstrap.bootstrap_rule`: every replicate draws the images once with replacement,
``numpy.random.default_rng(seed)``, scores both runs on that draw; Efron & Tibshirani 1993, ch. 13). Every
metric uses the same seed, hence the same resamples.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from types import SimpleNamespace

import numpy as np
import pandas as pd

from msb.analysis.stats.bootstrap import bootstrap_rule, percentile_interval
from msb.analysis.report.figures import _figure, _record_errorbar, color
from msb.analysis.protocol.common import AnalysisOutput, AnalysisSkipped, PaperTable, evaluation_rows, fmt_num
from msb.analysis.protocol.inputs import check_one_protocol
from msb.analysis.counts.rules import ImageTable, image_table, rule_values
from msb.analysis.report.summary import distance_unit
from msb.analysis.counts.systems import align_tables
from msb.errors import MSBError

__all__ = ["BASELINE", "METHOD_NAMES", "SCORES", "PAIRED", "run_settings", "semi_supervised_rows",
           "semi_supervised_scores", "paired_vs_supervised", "seed_summary", "scores_table", "paired_table",
           "summary_table", "score_vs_fraction_figure", "run"]

#: The reference method (``train.strategy.name`` of supervised-only training on the labelled subset).
BASELINE = "supervised"
#: Display names of the strategies.
METHOD_NAMES: dict[str, str] = {"supervised": "Supervised only", "mean_teacher": "Mean teacher", "cps": "CPS"}
#: Score columns of one run -> label (module docstring).
SCORES: dict[str, str] = {"dice_gm": "Dice (global-micro)", "dice_im": "Dice (image-macro)",
                          "iou_gm": "IoU (global-micro)", "iou_im": "IoU (image-macro)", "hd95": "HD95",
                          "card_dice": "card Dice as written", "card_iou": "card IoU as written",
                          "card_hd95": "card \"HD95\" as written"}
#: Paired differences: column stem -> (metric, aggregation rule).
PAIRED: dict[str, tuple[str, str]] = {"dice_gm": ("dice", "global-micro"), "dice_im": ("dice", "image-macro"),
                                      "iou_gm": ("iou", "global-micro"), "iou_im": ("iou", "image-macro"),
                                      "hd95": ("hd95", "image-macro")}
_CARD = {"card_dice": "card_dice_as_written", "card_iou": "card_iou_as_written",
         "card_hd95": "card_hd95_as_written"}
_OWN_AXES = ("train.strategy.name", "data.labelled_fraction", "random_seed")
_BLOCK = ["dataset", "split", "input_size"]
_CELL = [*_BLOCK, "method", "method_label", "labelled_fraction", "seed"]


def _variant(text: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for tok in str(text).split(";"):
        if "=" in tok:
            k, v = tok.split("=", 1)
            try:
                out[k] = json.loads(v)
            except ValueError:
                out[k] = v
    return out


def run_settings(config: Mapping | None, variant: str = "", labelled_csv: pd.DataFrame | None = None) -> dict:
    """Method, labelled fraction and whether a run declares a semi-supervised setting (module docstring).

    Args:
        config: the run's ``config.yaml`` as a dict (None or ``{}``: unknown, the variant decides).
        variant: the counts' ``variant`` (``key=json;...``).
        labelled_csv: the run's ``labelled.csv`` (``sample_id, labelled``), used with ``data.labelled_ids``.

    Returns:
        ``{"method": str, "labelled_fraction": float in (0, 1], "declared": bool}`` (``declared``: the run sets a
        labelled subset or a strategy).
    """
    cfg = dict(config or {})
    axes = _variant(variant)
    data, train = dict(cfg.get("data") or {}), dict(cfg.get("train") or {})
    strategy = train.get("strategy")
    name = strategy.get("name") if isinstance(strategy, Mapping) else strategy
    name = name or axes.get("train.strategy.name")
    frac = data.get("labelled_fraction", axes.get("data.labelled_fraction"))
    declared = name is not None or frac is not None
    if frac is None and data.get("labelled_ids") is not None:
        declared = True
        if labelled_csv is not None and len(labelled_csv):
            frac = float(pd.to_numeric(labelled_csv["labelled"]).mean())
    return {"method": str(name or BASELINE), "labelled_fraction": float(frac) if frac is not None else 1.0,
            "declared": bool(declared)}


def semi_supervised_rows(counts: pd.DataFrame, runs: Mapping | None = None) -> pd.DataFrame:
    """Internal best-checkpoint counts rows of non-ensemble runs with ``method``, ``method_label`` and
    ``labelled_fraction`` columns (module docstring).

    Args:
        counts: study counts rows (:class:`~msb.analysis.protocol.inputs.StudyArtifacts` ``counts``).
        runs: run id -> :class:`~msb.analysis.report.contract.RunInfo` (``config``, ``run_dir``), or None.

    Raises:
        AnalysisSkipped: no run declares a labelled subset or a training strategy.
    """
    rows = evaluation_rows(counts, "internal").copy()
    runs = runs or {}
    settings = {}
    for rid, variant in rows[["run_id", "variant"]].drop_duplicates().itertuples(index=False):
        info = runs.get(rid)
        lab = None
        if info is not None and (info.run_dir / "labelled.csv").is_file():
            lab = pd.read_csv(info.run_dir / "labelled.csv")
        settings[rid] = run_settings(info.config if info is not None else None, variant, lab)
    if not any(s["declared"] for s in settings.values()):
        raise AnalysisSkipped("no run declares data.labelled_fraction / data.labelled_ids or train.strategy "
                              "(configs/protocols/semi_supervised.yaml)")
    rows["method"] = rows["run_id"].map(lambda r: settings[r]["method"])
    rows["labelled_fraction"] = rows["run_id"].map(lambda r: settings[r]["labelled_fraction"]).astype(float)
    other = rows["variant"].map(lambda v: ";".join(f"{k}={json.dumps(x, separators=(',', ':'))}" for k, x in
                                                   sorted(_variant(v).items()) if k not in _OWN_AXES))
    label = rows["method"].where(other == "", rows["method"] + " (" + other + ")")
    n_rules = rows.groupby([*_BLOCK, label])["test_time_rule"].transform("nunique")
    rows["method_label"] = label.where(n_rules <= 1, label + " [" + rows["test_time_rule"].astype(str) + "]")
    return rows


def _attach(table: ImageTable, metrics: pd.DataFrame | None) -> ImageTable:
    if metrics is None:
        return table
    m = metrics[metrics["run_id"].isin(set(table.keys["run_id"]))]
    cols = [c for c in ("hd95", *_CARD.values()) if c in m.columns]
    return table.with_metrics(m, cols) if len(m) and cols else table


def _cell_scores(t: ImageTable) -> dict[str, float | int]:
    out: dict[str, float | int] = {
        k: float(rule_values(t, rule, metric)[0]) if metric in ("dice", "iou") or metric in t.extra else np.nan
        for k, (metric, rule) in PAIRED.items()}
    for k, col in _CARD.items():
        out[k] = float(rule_values(t, "image-class-mean", col)[0]) if col in t.extra else np.nan
    hd = t.extra.get(_CARD["card_hd95"])
    out["n_card_hd95_refused"] = int(np.isnan(hd).sum()) if hd is not None else -1
    return out


def _tables(rows: pd.DataFrame, metrics: pd.DataFrame | None) -> dict[tuple, ImageTable]:
    out = {}
    for key, g in rows.groupby(_CELL, sort=True):
        ids = sorted(set(g["run_id"]))
        if len(ids) > 1:
            raise AnalysisSkipped(f"runs {ids} share one method x labelled fraction x seed cell {key}; the study "
                                  f"expects one run per cell (add the differing key to the study's axes)")
        out[key] = _attach(image_table(g, f"run {ids[0]}"), metrics)
    return out


def semi_supervised_scores(counts: pd.DataFrame, metrics: pd.DataFrame | None = None, runs: Mapping | None = None,
                           allow_mixed_protocols: bool = False) -> pd.DataFrame:
    """Scores per block x method x labelled fraction x seed.

    Args:
        counts: study counts rows; metrics: ``metrics.parquet`` rows (None: HD95 and card columns NaN);
        runs: run id -> RunInfo; allow_mixed_protocols: accept several split policies in one block.

    Returns:
        One row per run: ``dataset, split, input_size, method, method_label, labelled_fraction, seed, run_id,
        test_time_rule, n_images, dice_gm, dice_im, iou_gm, iou_im, hd95, card_dice, card_iou, card_hd95,
        n_card_hd95_refused`` (-1: no card columns), ``hd_convention``, ``distance_unit``.

    Raises:
        AnalysisSkipped: no semi-supervised run, or two runs in one cell. MSBError: mixed split protocols.
    """
    rows = semi_supervised_rows(counts, runs)
    for key, block in rows.groupby(_BLOCK, sort=True):
        check_one_protocol(block, f"semi-supervised study on {key[0]}/{key[1]} at {key[2]} px", allow_mixed_protocols)
    out = []
    for key, t in _tables(rows, metrics).items():
        rid = str(t.keys["run_id"].iloc[0])
        m = metrics[metrics["run_id"] == rid] if metrics is not None else None
        conv = sorted(set(m["hd_convention"].astype(str))) if m is not None and "hd_convention" in m else []
        rule = ",".join(sorted(set(rows.loc[rows["run_id"] == rid, "test_time_rule"].astype(str))))
        out.append({**dict(zip(_CELL, key)), "run_id": rid, "test_time_rule": rule, "n_images": t.n_images,
                    **_cell_scores(t),
                    "hd_convention": ",".join(conv), "distance_unit": distance_unit(m)})
    return pd.DataFrame(out)


def paired_vs_supervised(counts: pd.DataFrame, metrics: pd.DataFrame | None = None, runs: Mapping | None = None,
                         n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[pd.DataFrame, list[str]]:
    """Paired differences ``method − supervised-only`` with image-level paired bootstrap CIs (module docstring).

    Returns:
        ``(tidy, notes)``: one row per non-baseline run with a baseline: the cell columns, ``baseline_run_id,
        run_id, n_images`` (common test images), per stem of :data:`PAIRED` ``<stem>_delta, <stem>_low,
        <stem>_high`` (NaN where a run lacks the metric), ``level, n_boot, boot_seed``; ``notes``: runs without a
        baseline, images not in both runs.
    """
    rows = semi_supervised_rows(counts, runs)
    tabs = _tables(rows, metrics)
    base = {}
    for key, t in tabs.items():
        if key[3] == BASELINE:
            base.setdefault((*key[:3], key[5], key[6]), []).append((key[4], t))
    out, notes = [], []
    for key, t in tabs.items():
        if key[3] == BASELINE:
            continue
        cands = base.get((*key[:3], key[5], key[6]), [])
        if len(cands) != 1:
            notes.append(f"{key[4]} at labelled fraction {key[5]:g}, seed {key[6]}: "
                         f"{'no' if not cands else len(cands)} supervised-only run(s) of that fraction and seed; "
                         f"no paired difference")
            continue
        b = cands[0][1]
        try:
            al = align_tables({"m": t, "s": b}, "intersect")
        except MSBError as e:
            notes.append(f"{key[4]} at labelled fraction {key[5]:g}, seed {key[6]}: {e}")
            continue
        am, ab = al["m"], al["s"]
        if am.n_images < max(t.n_images, b.n_images):
            notes.append(f"{key[4]} at labelled fraction {key[5]:g}, seed {key[6]}: {am.n_images} common test "
                         f"images of {t.n_images} / {b.n_images}; the others are left out of the pairing")
        rec = {**dict(zip(_CELL, key)), "baseline_run_id": str(b.keys["run_id"].iloc[0]),
               "run_id": str(t.keys["run_id"].iloc[0]), "n_images": am.n_images}
        for stem, (metric, rule) in PAIRED.items():
            if metric not in ("dice", "iou") and (metric not in am.extra or metric not in ab.extra):
                rec.update({f"{stem}_delta": np.nan, f"{stem}_low": np.nan, f"{stem}_high": np.nan})
                continue
            rm, rb = bootstrap_rule([am, ab], rule, metric, n_boot, level, seed, stratify_by_fold=True)
            lo, hi, _ = percentile_interval(rm.replicates - rb.replicates, level)
            rec.update({f"{stem}_delta": rm.estimate - rb.estimate, f"{stem}_low": lo, f"{stem}_high": hi})
        out.append({**rec, "level": level, "n_boot": n_boot, "boot_seed": seed})
    return pd.DataFrame(out), notes


def seed_summary(scores: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample SD (ddof 1; NaN with one seed) over seeds per block x method x labelled fraction.

    Returns:
        ``dataset, split, input_size, method, method_label, labelled_fraction, n_seeds`` and ``<score>_mean``,
        ``<score>_sd`` for each score of :data:`SCORES`.
    """
    keys = [c for c in _CELL if c != "seed"]
    agg = {}
    for col in SCORES:
        agg[f"{col}_mean"] = (col, "mean")
        agg[f"{col}_sd"] = (col, lambda v: v.std(ddof=1) if v.notna().sum() > 1 else np.nan)
    out = scores.groupby(keys, sort=True).agg(n_seeds=("seed", "nunique"), **agg).reset_index()
    return out


def _method_name(label: str) -> str:
    head, sep, rest = label.partition(" ")
    return METHOD_NAMES.get(head, head) + (sep + rest if sep else "")


def _pct(f: float) -> str:
    return f"{100 * f:g} %"


def _hd_label(scores: pd.DataFrame) -> str:
    conv = ",".join(sorted({c for c in scores["hd_convention"].astype(str) if c})) or "n/a"
    unit = ",".join(sorted(set(scores["distance_unit"].astype(str))))
    return f"HD95 ({conv}, {unit})"


def _key_columns(frame: pd.DataFrame, extra: Mapping[str, str]) -> dict[str, pd.Series]:
    """The leading columns of every semi-supervised table (dataset, input size, method, labelled fraction),
    then ``extra`` (shown header -> column of ``frame``), in that order."""
    return {"Dataset": frame["dataset"], "Input (px)": frame["input_size"],
            "Method": frame["method_label"].map(_method_name), "Labelled": frame["labelled_fraction"].map(_pct),
            **{shown: frame[col] for shown, col in extra.items()}}


def scores_table(scores: pd.DataFrame) -> PaperTable:
    """Table ``semi_supervised_scores``: one row per run, the real metrics and the card's as written side by side."""
    hd = _hd_label(scores)
    unit = ",".join(sorted(set(scores["distance_unit"].astype(str))))
    base = _key_columns(scores, {"Seed": "seed", "Test-time rule": "test_time_rule", "Images": "n_images"})
    names = {**SCORES, "hd95": hd, "card_hd95": f"card \"HD95\" as written ({unit})"}
    vals = pd.DataFrame({**base, **{names[k]: scores[k] for k in SCORES},
                         "card HD95 refused": scores["n_card_hd95_refused"]})
    disp = pd.DataFrame({**{k: v.astype(str) for k, v in base.items()},
                         **{names[k]: [fmt_num(v, 2 if "hd95" in k else 4) for v in scores[k]] for k in SCORES},
                         "card HD95 refused": [str(v) if v >= 0 else "–" for v in scores["n_card_hd95_refused"]]})
    cap = (f"Semi-supervised study: test scores per method, labelled fraction and seed. Dice/IoU global-micro "
           f"(pixels pooled) and image-macro (mean over images); {hd}: image-macro mean under the named "
           f"convention; card metrics: the published card's recipe as written (its \"HD95\" is the distance to the "
           f"farthest reference pixel, not a Hausdorff distance), mean over the images it can score, 'refused' = "
           f"images it would crash on")
    return PaperTable("semi_supervised_scores", vals, disp, cap)


def paired_table(paired: pd.DataFrame, hd: str) -> PaperTable:
    """Table ``semi_supervised_paired``: ``Δ [CI]`` per metric of each method against supervised-only."""
    base = _key_columns(paired, {"Seed": "seed", "Images": "n_images"})
    names = {k: ("Δ " + (hd if k == "hd95" else SCORES[k])) for k in PAIRED}
    vals = pd.DataFrame(base)
    disp = pd.DataFrame({k: v.astype(str) for k, v in base.items()})
    for k in PAIRED:
        d, lo, hi = paired[f"{k}_delta"], paired[f"{k}_low"], paired[f"{k}_high"]
        vals[names[k]], vals[f"{names[k]} CI low"], vals[f"{names[k]} CI high"] = d, lo, hi
        dig = 2 if k == "hd95" else 4
        disp[f"{names[k]} [CI]"] = ["–" if not np.isfinite(a) else f"{a:+.{dig}f} [{b:+.{dig}f}, {c:+.{dig}f}]"
                                    for a, b, c in zip(d, lo, hi)]
    n_boot, seed = int(paired["n_boot"].iloc[0]), int(paired["boot_seed"].iloc[0])
    level = float(paired["level"].iloc[0])
    cap = (f"Paired differences method − supervised-only (same labelled fraction and seed, same test images); "
           f"{100 * level:g}% percentile CI from {n_boot} image-level paired bootstrap replicates (seed {seed}, the "
           f"same resamples for every metric). Dice/IoU: > 0 is better; HD95: < 0 is better")
    return PaperTable("semi_supervised_paired", vals, disp, cap)


def summary_table(summary: pd.DataFrame, hd: str) -> PaperTable:
    """Table ``semi_supervised_summary``: mean ± SD over seeds per method and labelled fraction."""
    base = _key_columns(summary, {"Seeds": "n_seeds"})
    unit = hd.rsplit(", ", 1)[-1].rstrip(")")
    names = {**SCORES, "hd95": hd, "card_hd95": f"card \"HD95\" as written ({unit})"}
    shown = ("dice_gm", "dice_im", "iou_gm", "iou_im", "hd95", "card_hd95")
    vals = pd.DataFrame(base)
    disp = pd.DataFrame({k: v.astype(str) for k, v in base.items()})
    for k in shown:
        vals[names[k]], vals[f"{names[k]} SD"] = summary[f"{k}_mean"], summary[f"{k}_sd"]
        dig = 2 if "hd95" in k else 4
        disp[names[k]] = ["–" if not np.isfinite(m) else f"{m:.{dig}f}" + (f" ± {s:.{dig}f}" if np.isfinite(s)
                                                                             else "")
                          for m, s in zip(summary[f"{k}_mean"], summary[f"{k}_sd"])]
    cap = "Semi-supervised study: mean ± sample SD over seeds (test scores as in semi_supervised_scores)"
    return PaperTable("semi_supervised_summary", vals, disp, cap)


def score_vs_fraction_figure(summary: pd.DataFrame, hd: str,
                             panels: Sequence[str] = ("dice_gm", "iou_gm", "hd95")):
    """Score vs labelled fraction: one row of panels per block, one line per method (mean over seeds, error bars
    = sample SD over seeds, none with one seed); the values are readable with :func:`figure_data` (series =
    ``<block> / <method label>``)."""
    blocks = list(summary.groupby(_BLOCK, sort=True))
    fig = _figure(3.3 * len(panels) + 1.6, 2.8 * len(blocks) + 0.4)
    axes = fig.subplots(len(blocks), len(panels), squeeze=False)
    methods = sorted(set(summary["method_label"]), key=lambda m: (m.split(" ")[0] != BASELINE, m))
    for r, (bkey, block) in enumerate(blocks):
        for c, k in enumerate(panels):
            ax = axes[r][c]
            for i, m in enumerate(methods):
                g = block[block["method_label"] == m].sort_values("labelled_fraction")
                if g.empty or not np.isfinite(g[f"{k}_mean"]).any():
                    continue
                x = 100 * g["labelled_fraction"].to_numpy() + (i - (len(methods) - 1) / 2) * 0.4
                sd = g[f"{k}_sd"].to_numpy(dtype=float)
                cont = ax.errorbar(x, g[f"{k}_mean"].to_numpy(dtype=float),
                                   yerr=np.where(np.isfinite(sd), sd, 0.0), fmt="-o", ms=4, capsize=3,
                                   color=color(i), label=_method_name(m) if r == 0 and c == 0 else None)
                for j in range(len(g)):  # one record per point: figure_data reads the plotted values back
                    _record_errorbar(fig, f"{bkey[0]}/{bkey[1]}@{bkey[2]} / {m}", _OneBar(cont, j), axis=1)
            ax.set_xlabel("labelled fraction (%)")
            ax.set_ylabel(hd if k == "hd95" else SCORES[k])
            ax.set_title(f"{bkey[0]} ({bkey[1]}, {bkey[2]} px)", fontsize=8)
    if methods:
        fig.legend(loc="outside right upper", fontsize=7, title="method")
    n = int(summary["n_seeds"].max()) if len(summary) else 0
    fig.suptitle(f"Test score vs labelled fraction: mean over seeds, error bars = sample SD over seeds "
                 f"(up to {n} seed{'s' if n != 1 else ''})", fontsize=8)
    return fig


class _OneBar:
    """The ``j``-th marker and bar of an ``errorbar`` container, shaped as :func:`_record_errorbar` reads it
    (``lines = (line with get_xydata, caps, [bar collection with get_segments])``)."""

    def __init__(self, cont, j: int):
        xy = cont.lines[0].get_xydata()[j:j + 1]
        bars = cont.lines[2]
        seg = [bars[0].get_segments()[j]] if bars else []
        self.lines = (SimpleNamespace(get_xydata=lambda: xy), None,
                      [SimpleNamespace(get_segments=lambda: seg)] if seg else [])


def run(art, options: dict) -> AnalysisOutput:
    """Registry entry (:data:`msb.analysis.protocol.ANALYSES`): options ``n_boot`` (1000), ``seed`` (0),
    ``level`` (0.95), ``allow_mixed_protocols``."""
    n_boot, seed = int(options.get("n_boot", 1000)), int(options.get("seed", 0))
    level = float(options.get("level", 0.95))
    scores = semi_supervised_scores(art.counts, art.metrics, art.runs, options.get("allow_mixed_protocols", False))
    paired, notes = paired_vs_supervised(art.counts, art.metrics, art.runs, n_boot, seed, level)
    summary = seed_summary(scores)
    hd = _hd_label(scores)
    tables = [scores_table(scores), summary_table(summary, hd)]
    if len(paired):
        tables.append(paired_table(paired, hd))
    else:
        notes.append("no method has a supervised-only run of the same labelled fraction and seed: no paired "
                     "differences")
    fig = score_vs_fraction_figure(summary, hd)
    cap = "Score vs labelled fraction, mean ± SD over seeds, one line per method"
    data = {"semi_supervised_scores": scores, "semi_supervised_summary": summary}
    if len(paired):
        data["semi_supervised_paired"] = paired
    return AnalysisOutput(tables=tables, figures=[("semi_supervised", fig, cap)], notes=notes, data=data)
