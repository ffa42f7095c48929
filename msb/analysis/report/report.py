"""``msb report STUDY_DIR``: one self-contained HTML report (and Markdown) of a study, from stored artifacts.

Reads only run folders (config, split, manifest, checkpoint records, training log) and evaluation artifacts
(counts, metrics, predictions); dataset images, when found, only as overlay backgrounds. Sections (HTML ids):

``summary``       first screen: question, protocol, leaderboard per test set with 95 % CIs, paired-test result,
                  critical-difference diagram for >= 3 systems (:mod:`msb.analysis.report.report_summary`)
``checklist``     the reporting checklist with evidence (:func:`msb.analysis.report.contract.reporting_checklist`)
``contract``      the benchmark contract (:func:`msb.analysis.report.contract.contract_table`)
``scores``        every aggregation rule x metric per system, with image-level bootstrap CIs, best in bold
``boundary``      HD95 / ASSD / NSD (image-macro mean) with CIs, from ``metrics.parquet``
``significance``  paired Wilcoxon + BH + rank-biserial, paired-bootstrap CIs of differences, Friedman + post-hoc
``ranking``       ranking sensitivity across rules and metrics (Spearman ρ, rank changes, winner changes)
``populations``   the same scores restricted to sub-populations (per ``source``; user populations)
``folds``         fold-wise summaries (K-fold studies)
``figures``       score distributions, paired differences, ranking changes, Dice vs HD95, overlay grid, training curves
``protocol``      the published protocols' tables and figures (:mod:`msb.analysis.report.report_protocol`)
Sections after the first two are collapsed; tidy tables are CSV links; identical systems are shown once.

HTML from ``templates/report.html.j2`` (:class:`msb.analysis.report.report_doc.ReportDoc`); per-block analyses:
:mod:`msb.analysis.report.report_data`. Output folder (default ``STUDY_DIR/report``): ``report.html`` (figures as
base64 PNG), ``report.md``, ``figures/*.png|svg``, ``tables/*.tex|md``, ``data/*.csv``; built beside the target
and swapped in only when complete (an error leaves the previous report untouched, no partial folder).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from msb.analysis.counts.aggregate import ALL_METRICS
from msb.analysis.stats.bootstrap import DEFAULT_LEVEL, DEFAULT_N_BOOT
from msb.analysis.stats.compare import family_tests, paired_differences_table
from msb.analysis.report.contract import (ChecklistItem, RunInfo, contract_table, find_counts_files, find_run_dirs,
                                   read_run, reporting_checklist)
from msb.analysis.counts.counts_io import read_counts_with_report
from msb.utils.evaluation_folder import check_listed_digest, check_predictions
from msb.analysis.report.legacy_table import add_legacy_block
from msb.analysis.report.figures import dice_vs_hd95, paired_differences, ranking_changes, score_distributions
from msb.analysis.counts.identical import drop_identical, frame as identical_frame
from msb.analysis.report.report_summary import write_checklist, write_summary, write_training_curves
from msb.analysis.report.report_protocol import write_protocol_section
from msb.analysis.report.summary import BlockTests, distance_unit
from msb.analysis.stats.populations import Population, compare_populations
from msb.analysis.stats.ranking import rank_table, ranking_correlations, ranking_sensitivity
from msb.analysis.report.report_data import analyse_blocks, no_pairs_reason, overlay_figure, overlay_subject, system_scores
from msb.analysis.report.report_doc import ReportDoc
from msb.analysis.counts.rules import BASE_RULES, EXTENDED_RULES, RULE_QUESTIONS, foldwise_summary, unit_scores
from msb.analysis.stats.significance import POSTHOC_NAMES, friedman_test
from msb.analysis.counts.systems import System, comparison_blocks, find_systems
from msb.analysis.report.tables import scores_ci_table
from msb.config.analysis_schema import AnalysisConfig
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text, current_umask, replace_dir

__all__ = ["SECTION_IDS", "FIGURE_IDS", "ReportResult", "build_report", "system_scores"]

#: HTML ids of the report sections, in order.
SECTION_IDS: tuple[str, ...] = ("summary", "checklist", "contract", "scores", "boundary", "significance",
                                "ranking", "populations", "folds", "figures")
#: Figure ids (``fig-<id>`` in the HTML, ``figures/<id>[-<block>].png|svg`` on disk).
FIGURE_IDS: tuple[str, ...] = ("score-distributions", "paired-differences", "ranking-changes", "dice-vs-hd95",
                               "overlays", "training-curves")
_FIGURE_METRICS = ("dice", "hd95")
_TITLES = {"summary": "Summary: which model is better, and how sure are we?", "contract": "Benchmark contract", "scores": "Scores by aggregation rule",
           "boundary": "Boundary metrics", "significance": "Significance and paired differences",
           "ranking": "Ranking sensitivity", "populations": "Evaluation populations", "folds": "Fold-wise summary",
           "figures": "Figures", "checklist": "Reporting checklist"}
_UNITS_NOTE = "Distances (HD95, ASSD) are in {unit}; Dice, IoU, precision, recall and NSD are fractions in [0, 1]."


@dataclass(frozen=True)
class ReportResult:
    """What :func:`build_report` wrote: folder, ``report.html``, ``report.md``, figure and table files, the
    checklist and notes (e.g. grey overlay backgrounds because the dataset was not found)."""

    out_dir: Path
    html: Path
    markdown: Path
    figures: tuple[Path, ...]
    tables: tuple[Path, ...]
    checklist: tuple[ChecklistItem, ...]
    notes: tuple[str, ...] = field(default=())


def _block_suffix(key: tuple[str, str], n_blocks: int) -> str:
    return "" if n_blocks == 1 else f"-{key[0]}-{key[1]}"


def _section(doc: ReportDoc, sid: str) -> None:
    doc.section(sid, _TITLES[sid])


# ------------------------------------------------------------------------------------------ main
def build_report(study_dir: str | Path, out_dir: str | Path | None = None, *, n_boot: int = DEFAULT_N_BOOT,
                 level: float = DEFAULT_LEVEL, seed: int = 0, populations: Sequence[Population] = (),
                 system_by: str = "run", rules: Sequence[str] = EXTENDED_RULES,
                 metrics: Sequence[str] = ALL_METRICS, max_overlays: int = 4, posthoc: str = "nemenyi",
                 protocol: dict | None = None, setting: AnalysisConfig | None = None) -> ReportResult:
    """Write the study report (module docstring).

    Args:
        study_dir: ``runs/<study>`` (run folders with ``config.yaml`` below it).
        out_dir: destination (default ``study_dir/report``); replaced as a whole on success.
        n_boot: bootstrap replicates for every CI (0 disables CIs); level: CI level; seed: RNG seed; setting: the
            study's statistics setting (:mod:`msb.analysis.stats.setting`), which replaces all three and sets
            the test family (Dice unless set; HD95 tested as a family of its own) and correction.
        populations: extra populations (:func:`msb.analysis.stats.populations.parse_population`); per-``source``
            populations are added automatically when a block holds several sources.
        system_by: ``"run"`` or ``"model"`` (:func:`msb.analysis.counts.systems.find_systems`).
        rules, metrics: aggregation rules and count metrics of the score tables.
        max_overlays: images in the overlay grid.
        posthoc: post-hoc test after Friedman for >= 3 systems, ``"nemenyi"`` or ``"conover"``
            (:func:`msb.analysis.stats.significance.friedman_test`); protocol: options of the section ``protocol``
            (:func:`msb.analysis.report.report_protocol.write_protocol_section`; ``{"analyses": ()}`` omits it).

    Returns:
        :class:`ReportResult`.

    Raises:
        MSBError: no run folders; no count files; invalid counts; bad arguments. Nothing is written then.
    """
    study_dir, st = Path(study_dir), setting or AnalysisConfig(bootstrap=n_boot, level=level, seed=seed)
    n_boot, level, seed = st.bootstrap, st.level, st.seed
    if isinstance(n_boot, bool) or int(n_boot) != n_boot or n_boot < 0:
        raise MSBError(f"--bootstrap must be a non-negative integer, got {n_boot!r}")
    if not 0 < level < 1:
        raise MSBError(f"confidence level must be in (0, 1), got {level!r}")
    out_dir = Path(out_dir) if out_dir is not None else study_dir / "report"
    run_dirs = find_run_dirs(study_dir, exclude=[out_dir])
    runs = {rd.name: read_run(rd) for rd in run_dirs}
    files = find_counts_files(study_dir, exclude=[out_dir])
    if not files:
        raise MSBError(f"{study_dir}: no counts.parquet below it: no run has been evaluated; run `msb run` or "
                       f"`msb evaluate RUN_DIR` first")
    counts, read_report = read_counts_with_report(files)
    notes: list[str] = list(read_report.notes)
    eval_dirs: dict[tuple[str, str], Path] = {}
    metric_frames = []
    for f in read_report.files:
        keys = pd.read_parquet(f, columns=["run_id", "checkpoint_role", "image_id"])
        for rid, role in keys[["run_id", "checkpoint_role"]].drop_duplicates().astype(str).itertuples(index=False):
            eval_dirs.setdefault((rid, role), Path(f).parent)
        if (Path(f).parent / "predictions").is_dir():  # the overlays and boundary metrics read them
            check_predictions(Path(f).parent, keys["image_id"].astype(str).unique())
        mp = Path(f).parent / "metrics.parquet"
        if mp.is_file():
            check_listed_digest(Path(f).parent, "metrics.parquet")
            try:
                metric_frames.append(pd.read_parquet(mp))
            except Exception as e:  # pyarrow errors
                notes.append(f"{mp}: unreadable ({type(e).__name__}), boundary metrics skipped for it")
        else:
            notes.append(f"{mp}: missing; boundary metrics (HD95, NSD) absent for that evaluation")
    not_run = sorted(set(runs) - set(counts["run_id"].astype(str)))
    if not_run:  # msb generate's config-only folders, unevaluated trials: listed once, in no checklist item
        notes.append(f"generated, not run (no evaluation; not in the scores or checks): {', '.join(not_run)}")
        runs = {k: v for k, v in runs.items() if k not in not_run}
    metrics_df = pd.concat(metric_frames, ignore_index=True) if metric_frames else None

    systems = find_systems(counts, system_by)
    blocks, identical = drop_identical(comparison_blocks(systems), eval_dirs)
    labels_by_run = {rid: s.label for s in systems for rid in s.run_ids}

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; the report folder gets normal permissions
    try:
        doc = ReportDoc(tmp)
        result = _write(doc, study_dir, runs, eval_dirs, counts, metrics_df, blocks, labels_by_run, populations,
                        n_boot, level, seed, rules, metrics, max_overlays, notes, posthoc, identical, protocol, st)
        html_text, md_text = result
        atomic_write_text(tmp / "report.html", html_text)
        atomic_write_text(tmp / "report.md", md_text)
        checklist = doc.checklist
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    rel = lambda ps: tuple(out_dir / p.relative_to(tmp) for p in ps)  # noqa: E731
    return ReportResult(out_dir, out_dir / "report.html", out_dir / "report.md", rel(doc.figures),
                        rel(doc.tables), tuple(checklist), tuple(dict.fromkeys(notes)))


def _write(doc: ReportDoc, study_dir: Path, runs: dict[str, RunInfo], eval_dirs: dict[tuple[str, str], Path],
           counts: pd.DataFrame, metrics_df: pd.DataFrame | None, blocks: dict[tuple[str, str], list[System]],
           labels_by_run: dict[str, str], populations: Sequence[Population], n_boot: int, level: float,
           seed: int, rules: Sequence[str], metrics: Sequence[str], max_overlays: int,
           notes: list[str], posthoc: str = "nemenyi", identical: dict | None = None,
           protocol: dict | None = None, st: AnalysisConfig = AnalysisConfig()) -> tuple[str, str]:
    study = study_dir.resolve().name
    n_blocks = len(blocks)
    # ---------------- per-block analysis (figures are drawn in the figures section)
    block_data = analyse_blocks(blocks, metrics_df, rules, metrics, n_boot, level, seed, notes)
    all_scores = [b.scores.assign(dataset=key[0], split=key[1]) for key, b in block_data.items()]
    n_systems_max = max((len(b.systems) for b in block_data.values()), default=0)
    n_tests, identical, unit = 0, identical or {}, distance_unit(metrics_df)
    tests: dict[tuple[str, str], BlockTests] = {}
    zero_pairs = [(f"{', '.join(g.others)} = {g.kept}", g.n_defined) for gs in identical.values() for g in gs]
    # ---------------- header
    doc.md.append(f"# Benchmark report: {study}\n")
    n_img = counts.drop_duplicates(["dataset", "split", "image_id"]).shape[0]
    doc.text(f"Study folder {study_dir}; {len(runs)} run(s); {sum(len(v) for v in blocks.values())} system(s); "
             f"{n_img} distinct evaluated image(s); every number below is recomputed from stored counts, "
             f"metrics tables and predictions (no model was run).")
    if any(identical.values()):
        doc.link_csv(identical_frame(identical), "identical-systems", "Identical systems (named once)")

    # ---------------- contract
    _section(doc, "contract")
    agg_rows = [(r, RULE_QUESTIONS.get(r, "")) for r in rules]
    extra = {
        "Evaluated data (from counts)": [
            (f"{d}/{s}", f"{int(g.drop_duplicates('image_id').shape[0])} images, classes "
                         f"{sorted(set(g['class_name'].astype(str)))}, sources {sorted(set(g['source'].astype(str)))}, "
                         f"native resolution {int(g['height'].min())}-{int(g['height'].max())} x "
                         f"{int(g['width'].min())}-{int(g['width'].max())} px")
            for (d, s), g in counts.groupby(["dataset", "split"], sort=True)],
        "Decision rule (from counts)": [
            ("threshold", ", ".join(f"{v:g}" for v in sorted(set(counts["threshold"].astype(float))))),
            ("threshold_on", ", ".join(sorted(set(counts["threshold_on"].astype(str)))))],
        "Aggregation": agg_rows + [
            ("undefined scores", "NaN (0/0) units are excluded from means and counted, never set to 0 or 1"),
            ("uncertainty", f"image-level percentile bootstrap, {n_boot} replicates, level {level:g}, seed {seed}, "
                            "fold-stratified when a system pools folds" if n_boot else "no bootstrap"),
            ("tests", "paired two-sided Wilcoxon signed-rank on per-image scores, rank-biserial effect size; "
                      "Friedman + " + POSTHOC_NAMES[posthoc] + " for >= 3 systems"),
            ("statistics setting", st.describe())],
    }
    contract = contract_table(list(runs.values()), labels_by_run, extra)
    for sec, g in contract.groupby("section", sort=False):
        doc.sub(str(sec))
        doc.frame(g[["field", "value"]].reset_index(drop=True))
    atomic_write_text(contract_csv := doc.out / "data" / "contract.csv", contract.to_csv(index=False))
    doc.tables.append(contract_csv)
    if problems := [f"{r.run_id}: {p}" for r in runs.values() for p in r.problems]:
        doc.text("Missing run files: " + "; ".join(problems), "note")

    # ---------------- scores
    _section(doc, "scores")
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        doc.text(f"{len(b.systems)} system(s) on {key[0]}/{key[1]}: "
                 + "; ".join(f"{s.label} = runs {list(s.run_ids)} ({s.checkpoint_role})" for s in b.systems))
        for m in metrics:
            doc.ci_table(scores_ci_table(b.scores, m), f"scores-{m}{sfx}")
        excl = b.scores[b.scores["n_excluded"] > 0]
        if len(excl):
            doc.text(f"{len(excl)} of {len(b.scores)} scores exclude undefined (0/0) units, never counted as 0 or 1: "
                     f"columns n_excluded / n_units of the tidy table.", "note")
        doc.link_csv(b.scores, f"scores{sfx}", "All scores (tidy)")

    # ---------------- boundary
    _section(doc, "boundary")
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        bd = b.boundary
        if bd.empty:
            doc.text("not available: no metrics.parquet beside the counts (run `msb metrics RUN_DIR`)", "note")
            continue
        conv = (sorted(set(metrics_df["hd_convention"].astype(str))) if metrics_df is not None
                and "hd_convention" in metrics_df.columns else [])
        for m in list(dict.fromkeys(bd["metric"])):
            doc.ci_table(scores_ci_table(bd, m), f"boundary-{m}{sfx}")
        doc.text(f"Image-macro means over images with a defined value (both-empty images excluded; one-sided "
                 f"empty images carry the image-diagonal penalty, docs/metrics.md); HD convention {conv}. "
                 + _UNITS_NOTE.format(unit=unit), "note")
        doc.link_csv(bd, f"boundary{sfx}", "Boundary metrics (tidy)")
    add_legacy_block(doc, metrics_df)  # only when metrics.parquet holds legacy columns

    # ---------------- significance
    _section(doc, "significance")
    diff_cache = {}
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        aligned = b.aligned
        labels = list(aligned)
        if len(labels) < 2:
            doc.text(f"not applicable: {no_pairs_reason(b)}", "note")
            continue
        tab = family_tests(aligned, st.test_family, ("hd95",), st.correction)
        n_tests += int(tab["p_value"].notna().sum())
        doc.frame(tab, caption="Paired tests on per-image scores (rank_biserial > 0: system_a higher)",
                  name=f"wilcoxon{sfx}")
        diff_tab = paired_differences_table(aligned, ("image-macro", "global-micro"), "dice", n_boot, level, seed)
        diffs = {}
        for r in diff_tab[diff_tab["aggregation"] == "image-macro"].itertuples():
            diffs[f"{r.system_a} − {r.system_b}"] = (
                unit_scores(aligned[r.system_a], "dice", "image") - unit_scores(aligned[r.system_b], "dice", "image"),
                (r.difference, r.ci_low, r.ci_high))
        diff_cache[key] = diffs
        tests[key] = BlockTests(tab, diff_tab)
        doc.frame(diff_tab, caption="Differences a − b with paired bootstrap CIs (same resamples for both systems)",
                  name=f"paired-differences{sfx}")
        if len(labels) >= 3:
            sc = {lab: unit_scores(aligned[lab], "dice", "image") for lab in labels}
            try:
                fr = friedman_test(sc, posthoc)
                doc.text(f"{fr.test}: chi2 = {fr.statistic:.4g}, p = {fr.p_value:.4g} (n = {fr.n} images, "
                         f"k = {fr.k} systems, {fr.n_dropped} image(s) dropped as undefined); mean ranks "
                         + ", ".join(f"{k}: {v:.2f}" for k, v in fr.mean_ranks.items()))
                doc.frame(fr.posthoc.reset_index(names="system"),
                          caption=f"{fr.posthoc_test} p-values (n = {fr.n} images, k = {fr.k} systems)",
                          name=f"posthoc{sfx}", p_values=True)
                tests[key].friedman = fr
            except MSBError as e:
                doc.text(f"Friedman test not computed: {e}", "note")
                tests[key].friedman_note = f"Friedman test not computed: {e}"
        else:
            doc.text("Friedman test: not applicable (needs at least 3 systems; the paired Wilcoxon test above "
                     "covers two)", "note")

    # ---------------- ranking
    _section(doc, "ranking")
    rank_cache = {}
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        sc = b.scores[["system", "aggregation", "metric", "value"]]
        if not b.boundary.empty:
            sc = pd.concat([sc, b.boundary[["system", "aggregation", "metric", "value"]]], ignore_index=True)
        ranks = rank_table(sc)
        rank_cache[key] = ranks
        if len(b.systems) < 2:
            doc.text("not applicable: only one system, every ranking is trivial", "note")
            continue
        sens = ranking_sensitivity(sc)
        doc.frame(sens, caption="Ranking under each rule and metric vs the reference ranking",
                  name=f"ranking-sensitivity{sfx}")
        changed = sens[sens["winner_changed"]]
        doc.text(("The winner changes under: " + ", ".join(f"{r.aggregation}/{r.metric} ({r.winner})"
                                                          for r in changed.itertuples()))
                 if len(changed) else "The winner is the same under every rule and metric.")
        if len(b.systems) >= 3:
            main = sc[sc["metric"].isin(_FIGURE_METRICS)]
            doc.frame(ranking_correlations(main).reset_index(names="ranking"),
                      caption="Spearman rho between the Dice / HD95 rankings of the rules",
                      name=f"ranking-correlations{sfx}", digits=3)

    # ---------------- populations
    _section(doc, "populations")
    any_pop = False
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        rows = pd.concat([s.rows.assign(system=s.label) for s in b.systems], ignore_index=True)
        pops = list(populations)
        sources = sorted(set(rows["source"].astype(str)))
        if len(sources) > 1:
            pops += [Population(f"source={src}", "source", frozenset([src]), "automatic (per source)")
                     for src in sources]
        usable = [p for p in pops if p.mask(rows).any()]
        for p in pops:
            if p not in usable:
                notes.append(f"population {p.name!r} matches no image of {key[0]}/{key[1]}")
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        if not usable:
            doc.text(f"not applicable: a single source ({sources}) and no population given "
                     f"(--population source:A | ids:FILE | flag:FILE[:COLUMN])", "note")
            continue
        any_pop = True
        comp = compare_populations(rows, usable, ["system"], BASE_RULES, ["dice"])
        doc.frame(comp, caption="Same predictions, different evaluation populations (delta = subset − all)",
                  name=f"populations{sfx}")
    if not any_pop and populations:
        doc.text("no population matched any image", "note")

    # ---------------- folds
    _section(doc, "folds")
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        rows = pd.concat([s.rows.assign(system=s.label) for s in b.systems], ignore_index=True)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        if not (rows["fold"] >= 0).any():
            doc.text("not applicable: no fold runs (fold = -1 everywhere)", "note")
            continue
        fw = foldwise_summary(rows, ["system"], BASE_RULES, ["dice", "iou"])
        doc.frame(fw, caption="Per-fold scores: mean and sample SD over folds, and all folds pooled",
                  name=f"folds{sfx}")

    # ---------------- figures
    _section(doc, "figures")
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        aligned, scores = b.aligned, b.scores
        per_img = {lab: unit_scores(b.tables[lab], "dice", "image") for lab in b.tables}
        est = {}
        for r in scores[(scores["aggregation"] == "image-macro") & (scores["metric"] == "dice")].itertuples():
            est[r.system] = (r.value, r.ci_low, r.ci_high)
        doc.figure("score-distributions", f"score-distributions{sfx}",
                   score_distributions(per_img, est, "Dice per image (0-1)", f"Dice per image ({key[0]}/{key[1]})",
                                       seed),
                   "Per-image Dice per system (box, points) with the image-macro Dice and its bootstrap CI")
        if key in diff_cache and diff_cache[key]:
            d = diff_cache[key]
            doc.figure("paired-differences", f"paired-differences{sfx}",
                       paired_differences({k: v[0] for k, v in d.items()}, {k: v[1] for k, v in d.items()},
                                          "Dice (0-1)", seed=seed),
                       "Per-image Dice differences with the paired-bootstrap CI of the image-macro difference")
        else:
            doc.missing_figure("paired-differences", f"paired-differences{sfx}", "only one system")
        rk = rank_cache[key]
        doc.figure("ranking-changes", f"ranking-changes{sfx}", ranking_changes(rk[rk["metric"].isin(_FIGURE_METRICS)]),
                   "Rank of each system under every aggregation rule for Dice (and HD95, image-macro)")
        pts = {lab: (per_img[lab], unit_scores(t, "hd95", "image")) for lab, t in b.tables.items()
               if "hd95" in t.extra}
        if pts:
            doc.figure("dice-vs-hd95", f"dice-vs-hd95{sfx}", dice_vs_hd95(pts, unit=unit),
                       f"Per-image Dice vs HD95 (HD95 in {unit}; misses carry the diagonal penalty)")
        else:
            doc.missing_figure("dice-vs-hd95", f"dice-vs-hd95{sfx}", "no metrics.parquet with hd95")
        fig, _, grey = overlay_figure(aligned, {s.label: s for s in b.systems}, runs, eval_dirs, max_overlays, notes)
        if fig is None:
            doc.missing_figure("overlays", f"overlays{sfx}", grey or "no stored predictions")
        else:
            doc.figure("overlays", f"overlays{sfx}", fig, f"Stored predictions on {overlay_subject(aligned, max_overlays)}"
                       " (TP green, FP red, FN blue)" + (f"; {grey}" if grey else ""))

    write_training_curves(doc, runs, labels_by_run)
    write_protocol_section(doc, study_dir, notes, **(protocol or {}))

    # ---------------- first screen: summary and checklist (built last, shown first)
    scores_all = pd.concat(all_scores, ignore_index=True)
    items = reporting_checklist(list(runs.values()), counts, scores_all, metrics_df, n_tests, n_systems_max,
                                n_boot, zero_pairs)
    write_summary(doc, list(runs.values()), counts, eval_dirs, block_data, tests, identical, metrics_df, n_boot,
                  level, seed)
    write_checklist(doc, items)
    doc.move_first("summary", "checklist")
    atomic_write_text(doc.out / "data" / "checklist.csv", pd.DataFrame(
        [{"item": i.item, "passed": i.passed, "status": i.status, "evidence": i.evidence} for i in items]
    ).to_csv(index=False))
    tail = ("\n## Notes\n\n" + "".join(f"- {n}\n" for n in dict.fromkeys(notes))) if notes else ""
    return doc.render_html(study, list(dict.fromkeys(notes))), doc.markdown(tail)
