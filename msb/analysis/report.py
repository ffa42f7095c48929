"""``msb report STUDY_DIR``: one self-contained HTML report (and Markdown) of a study, from stored artifacts.

Reads only run folders (``config.yaml``, ``split.csv``, ``manifest.json``, ``checkpoints/records.json``,
``train_log.csv``) and evaluation artifacts (``counts.parquet``, ``metrics.parquet``, ``predictions/*.npz``);
the dataset images are used, when found, only as overlay backgrounds. Sections (HTML ids):

``contract``      the benchmark contract (:func:`msb.analysis.contract.contract_table`)
``scores``        every aggregation rule x metric per system, with image-level bootstrap CIs, best in bold
``boundary``      HD95 / ASSD / NSD (image-macro mean) with CIs, from ``metrics.parquet``
``significance``  paired Wilcoxon + BH + rank-biserial, paired-bootstrap CIs of differences, Friedman + post-hoc
``ranking``       ranking sensitivity across rules and metrics (Spearman ρ, rank changes, winner changes)
``populations``   the same scores restricted to sub-populations (per ``source``; user populations)
``folds``         fold-wise summaries (K-fold studies)
``figures``       score distributions, paired differences, ranking changes, Dice vs HD95, overlay grid
``checklist``     the reporting checklist (:func:`msb.analysis.contract.reporting_checklist`)

Output folder (default ``STUDY_DIR/report``): ``report.html`` (figures embedded as base64 PNG),
``report.md`` (figures linked), ``figures/*.png|svg``, ``tables/*.tex|md``, ``data/*.csv``. The folder is
built beside the target and swapped in only when complete: an error leaves the previous report untouched
and no partial folder.
"""

from __future__ import annotations

import base64
import html
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from msb.analysis.aggregate import ALL_METRICS
from msb.analysis.bootstrap import DEFAULT_LEVEL, DEFAULT_N_BOOT, bootstrap_rules
from msb.analysis.contract import (ChecklistItem, RunInfo, contract_table, find_counts_files, find_run_dirs,
                                   read_run, reporting_checklist, resolve_data_root)
from msb.analysis.counts_io import read_counts_with_report
from msb.analysis.figures import (dice_vs_hd95, overlay_grid, overlay_rgb, paired_differences, ranking_changes,
                                  save_figure, score_distributions)
from msb.analysis.populations import Population, compare_populations
from msb.analysis.ranking import rank_table, ranking_correlations, ranking_sensitivity
from msb.analysis.rules import (BASE_RULES, EXTENDED_RULES, RULE_QUESTIONS, ImageTable, aggregate_rules,
                                foldwise_summary, unit_scores)
from msb.analysis.compare import paired_differences_table, paired_tests
from msb.analysis.significance import friedman_test
from msb.analysis.systems import System, align_tables, comparison_blocks, find_systems
from msb.analysis.tables import CITable, frame_to_markdown, scores_ci_table, to_html, to_latex, to_markdown
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text, current_umask, replace_dir

__all__ = ["SECTION_IDS", "FIGURE_IDS", "ReportResult", "build_report", "system_scores"]

#: HTML ids of the report sections, in order.
SECTION_IDS: tuple[str, ...] = ("contract", "scores", "boundary", "significance", "ranking", "populations",
                                "folds", "figures", "checklist")
#: Figure ids (``fig-<id>`` in the HTML, ``figures/<id>[-<block>].png|svg`` on disk).
FIGURE_IDS: tuple[str, ...] = ("score-distributions", "paired-differences", "ranking-changes", "dice-vs-hd95",
                               "overlays")
_BOUNDARY_PREFIXES = ("hd95", "assd", "nsd_tau")
_FIGURE_METRICS = ("dice", "hd95")
_TITLES = {"contract": "Benchmark contract", "scores": "Scores by aggregation rule",
           "boundary": "Boundary metrics", "significance": "Significance and paired differences",
           "ranking": "Ranking sensitivity", "populations": "Evaluation populations", "folds": "Fold-wise summary",
           "figures": "Figures", "checklist": "Reporting checklist"}
_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.6em 0;font-size:0.85em}td,th{border:1px solid #ccc;padding:2px 6px}
caption{caption-side:top;font-style:italic;text-align:left}figure{margin:1em 0}img{max-width:100%}
.pass{color:#060;font-weight:bold}.fail{color:#a00;font-weight:bold}.note{color:#555;font-size:0.9em}"""


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


# ------------------------------------------------------------------------------------------ document
class _Doc:
    """Collects HTML and Markdown side by side."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.html: list[str] = []
        self.md: list[str] = []
        self.figures: list[Path] = []
        self.tables: list[Path] = []

    def section(self, sid: str) -> None:
        self.html.append(f'</section>\n<section id="{sid}">\n<h2>{html.escape(_TITLES[sid])}</h2>')
        self.md.append(f"\n## {_TITLES[sid]}\n")

    def sub(self, text: str) -> None:
        self.html.append(f"<h3>{html.escape(text)}</h3>")
        self.md.append(f"\n### {text}\n")

    def text(self, text: str, cls: str = "") -> None:
        c = f' class="{cls}"' if cls else ""
        self.html.append(f"<p{c}>{html.escape(text)}</p>")
        self.md.append(("*" + text + "*" if cls == "note" else text) + "\n")

    def frame(self, df: pd.DataFrame, caption: str = "", index: bool = False, digits: int = 4,
              name: str | None = None, p_values: bool = False) -> None:
        shown = _fmt_frame(df, digits, p_values)
        sty = shown.style.format(escape="html").format_index(escape="html", axis=1)
        if not index:
            sty = sty.hide(axis="index")
        if caption:
            sty = sty.set_caption(html.escape(caption))
        self.html.append(sty.to_html())
        self.md.append((f"*{caption}*\n\n" if caption else "") + frame_to_markdown(shown, index=index))
        if name:
            p = self.out / "data" / f"{name}.csv"
            atomic_write_text(p, df.to_csv(index=index))
            self.tables.append(p)

    def ci_table(self, t: CITable, name: str) -> None:
        self.html.append(to_html(t))
        md = to_markdown(t)
        self.md.append(md)
        for suffix, text in ((".tex", to_latex(t, label=f"tab:{name}")), (".md", md)):
            p = self.out / "tables" / f"{name}{suffix}"
            atomic_write_text(p, text)
            self.tables.append(p)

    def figure(self, fid: str, name: str, fig, caption: str) -> None:
        png, svg = save_figure(fig, self.out / "figures" / name)
        self.figures.extend([png, svg])
        data = base64.b64encode(png.read_bytes()).decode("ascii")
        self.html.append(f'<figure id="fig-{name}" class="fig-{fid}"><img alt="{html.escape(caption)}" '
                         f'src="data:image/png;base64,{data}"><figcaption>{html.escape(caption)}</figcaption></figure>')
        self.md.append(f"![{caption}](figures/{png.name})\n\n*{caption}* ([SVG](figures/{svg.name}))\n")

    def missing_figure(self, fid: str, name: str, reason: str) -> None:
        self.html.append(f'<figure id="fig-{name}" class="fig-{fid} missing"><figcaption>not applicable: '
                         f'{html.escape(reason)}</figcaption></figure>')
        self.md.append(f"*Figure {name}: not applicable: {reason}*\n")


def _fmt_frame(df: pd.DataFrame, digits: int, p_values: bool = False) -> pd.DataFrame:
    """Cells as text: floats with ``digits`` decimals; p-value columns (``p_*``, or all with ``p_values``) with
    ``digits`` significant digits so that small p-values stay visible."""
    out = df.copy()
    for c in out.columns:
        if out[c].dtype.kind == "f":
            sig = p_values or str(c).startswith("p_")
            out[c] = [("n/a" if not np.isfinite(v) else (f"{v:.{digits}g}" if sig else f"{v:.{digits}f}"))
                      for v in out[c]]
        else:
            out[c] = out[c].astype(str)
    return out


# ------------------------------------------------------------------------------------------ analysis
def system_scores(systems: Sequence[System], tables: dict[str, ImageTable], rules: Sequence[str],
                  metrics: Sequence[str], n_boot: int, level: float, seed: int) -> pd.DataFrame:
    """Tidy scores of several systems with bootstrap CIs.

    Args:
        systems: the systems (one comparison block); tables: label -> their :class:`ImageTable`.
        rules, metrics: as :func:`msb.analysis.rules.aggregate_rules`.
        n_boot: replicates (0 = no CI); level, seed: CI level, seed.

    Returns:
        ``system, aggregation, metric, value, n_images, n_classes, n_units, n_excluded, ci_low, ci_high,
        ci_level, n_boot``.
    """
    parts = []
    for s in systems:
        t = aggregate_rules(s.rows, [], rules, metrics)
        t.insert(0, "system", s.label)
        if n_boot > 0:
            res = bootstrap_rules(tables[s.label], list(zip(t["aggregation"], t["metric"])), n_boot, level, seed)
            t["ci_low"] = [res[(a, m)].low for a, m in zip(t["aggregation"], t["metric"])]
            t["ci_high"] = [res[(a, m)].high for a, m in zip(t["aggregation"], t["metric"])]
        else:
            t["ci_low"] = np.nan
            t["ci_high"] = np.nan
        t["ci_level"] = level if n_boot > 0 else np.nan
        t["n_boot"] = n_boot
        parts.append(t)
    return pd.concat(parts, ignore_index=True)


def _boundary_scores(systems: Sequence[System], tables: dict[str, ImageTable], n_boot: int, level: float,
                     seed: int) -> pd.DataFrame:
    rows = []
    for s in systems:
        t = tables[s.label]
        cols = [c for c in t.extra if c.startswith(_BOUNDARY_PREFIXES)]
        res = bootstrap_rules(t, [("image-macro", c) for c in cols], max(n_boot, 1), level, seed) if cols else {}
        for c in cols:
            r = res[("image-macro", c)]
            vals = t.extra[c]
            rows.append({"system": s.label, "aggregation": "image-macro", "metric": c, "value": r.estimate,
                         "median": float(np.nanmedian(vals)) if np.isfinite(vals).any() else np.nan,
                         "n_images": t.n_images, "n_excluded": int(np.isnan(vals).sum()),
                         "ci_low": r.low if n_boot > 0 else np.nan, "ci_high": r.high if n_boot > 0 else np.nan,
                         "ci_level": level if n_boot > 0 else np.nan})
    return pd.DataFrame(rows)


def _pick_overlay_images(aligned: dict[str, ImageTable], k: int) -> list[int]:
    labels = list(aligned)
    d = [unit_scores(aligned[lab], "dice", "image") for lab in labels]
    if len(d) >= 2:
        key = -np.nan_to_num(np.abs(d[0] - d[1]), nan=-1.0)
    else:
        key = np.nan_to_num(d[0], nan=2.0)
    ids = aligned[labels[0]].keys["image_id"].astype(str).to_numpy()
    order = np.lexsort((ids, key))
    return [int(i) for i in order[:k]]


def _data_run(run_id: str, dataset: str, runs: dict[str, RunInfo]) -> RunInfo | None:
    """The run whose config locates the dataset images: the run itself, else any run trained on ``dataset``."""
    if run_id in runs:
        return runs[run_id]
    for r in runs.values():
        if str((r.config.get("data") or {}).get("name", "")) == dataset:
            return r
    return None


def _overlays(aligned: dict[str, ImageTable], systems: dict[str, System], runs: dict[str, RunInfo],
              eval_dirs: dict[tuple[str, str], Path], k: int, notes: list[str]):
    positions = _pick_overlay_images(aligned, k)
    labels = list(aligned)
    first = aligned[labels[0]]
    cls_name = first.class_names[0]
    datasets: dict[str, object] = {}
    grey_reason = None
    cells, row_labels, missing = [], [], []
    for i in positions:
        image_id = str(first.keys["image_id"].iloc[i])
        dataset = str(first.keys["dataset"].iloc[i])
        row_labels.append(image_id)
        row = []
        background = None
        for lab in labels:
            t = aligned[lab]
            run_id = str(t.keys["run_id"].iloc[i])
            role = systems[lab].checkpoint_role
            ev = eval_dirs.get((run_id, role))
            npz = (ev / "predictions" / f"{image_id}.npz") if ev is not None else None
            if npz is None or not npz.is_file():
                missing.append(f"{image_id} of run {run_id} ({role})")
                row.append(np.full((32, 32, 3), 128, dtype=np.uint8))
                continue
            with np.load(npz) as z:
                pred, ref = z["pred"][0].astype(bool), z["ref"][0].astype(bool)
            run = _data_run(run_id, dataset, runs)
            if background is None and grey_reason is None:
                root = resolve_data_root(run) if run is not None else None
                if root is None:
                    grey_reason = "dataset images not found (data.root of the run config absent): grey background"
                else:
                    try:
                        from msb.data.schema import load_prepared_dataset

                        if str(root) not in datasets:
                            datasets[str(root)] = load_prepared_dataset(root, check_files=False)
                        background = datasets[str(root)].load_image(image_id)  # type: ignore[attr-defined]
                        if background.shape[:2] != pred.shape:
                            grey_reason = (f"image size {background.shape[:2]} differs from the stored prediction "
                                           f"{pred.shape}: grey background")
                            background = None
                    except MSBError as e:
                        grey_reason = f"dataset image not readable ({e}): grey background"
                        background = None
            row.append(overlay_rgb(pred, ref, background))
        cells.append(row)
    if missing:
        notes.append(f"overlay grid: no stored prediction for {len(missing)} cell(s) (first: {missing[0]}); "
                     f"those cells are left grey")
    if len(missing) == len(positions) * len(labels):
        return None, positions, "no stored predictions (evaluation/<role>/predictions/*.npz)"
    if grey_reason:
        notes.append(f"overlay grid: {grey_reason}")
    title = f"class '{cls_name}'" + (f"; {grey_reason}" if grey_reason else "")
    return overlay_grid(row_labels, labels, cells, title=title), positions, grey_reason


def _block_suffix(key: tuple[str, str], n_blocks: int) -> str:
    return "" if n_blocks == 1 else f"-{key[0]}-{key[1]}"


# ------------------------------------------------------------------------------------------ main
def build_report(study_dir: str | Path, out_dir: str | Path | None = None, *, n_boot: int = DEFAULT_N_BOOT,
                 level: float = DEFAULT_LEVEL, seed: int = 0, populations: Sequence[Population] = (),
                 system_by: str = "run", rules: Sequence[str] = EXTENDED_RULES,
                 metrics: Sequence[str] = ALL_METRICS, max_overlays: int = 4) -> ReportResult:
    """Write the study report (module docstring).

    Args:
        study_dir: ``runs/<study>`` (run folders with ``config.yaml`` below it).
        out_dir: destination (default ``study_dir/report``); replaced as a whole on success.
        n_boot: bootstrap replicates for every CI (0 disables CIs); level: CI level; seed: RNG seed.
        populations: extra populations (:func:`msb.analysis.populations.parse_population`); per-``source``
            populations are added automatically when a block holds several sources.
        system_by: ``"run"`` or ``"model"`` (:func:`msb.analysis.systems.find_systems`).
        rules, metrics: aggregation rules and count metrics of the score tables.
        max_overlays: images in the overlay grid.

    Returns:
        :class:`ReportResult`.

    Raises:
        MSBError: no run folders; no count files; invalid counts; bad arguments. Nothing is written then.
    """
    study_dir = Path(study_dir)
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
        keys = pd.read_parquet(f, columns=["run_id", "checkpoint_role"]).drop_duplicates()
        for rid, role in zip(keys["run_id"].astype(str), keys["checkpoint_role"].astype(str)):
            eval_dirs.setdefault((rid, role), Path(f).parent)
        mp = Path(f).parent / "metrics.parquet"
        if mp.is_file():
            try:
                metric_frames.append(pd.read_parquet(mp))
            except Exception as e:  # pyarrow errors
                notes.append(f"{mp}: unreadable ({type(e).__name__}), boundary metrics skipped for it")
        else:
            notes.append(f"{mp}: missing; boundary metrics (HD95, NSD) absent for that evaluation")
    evaluated = set(counts["run_id"].astype(str))
    for rid in runs:
        if rid not in evaluated:
            notes.append(f"run {rid} has no counts and is not in the scores")
    metrics_df = pd.concat(metric_frames, ignore_index=True) if metric_frames else None

    systems = find_systems(counts, system_by)
    blocks = comparison_blocks(systems)
    labels_by_run = {rid: s.label for s in systems for rid in s.run_ids}

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; the report folder gets normal permissions
    try:
        doc = _Doc(tmp)
        result = _write(doc, study_dir, runs, eval_dirs, counts, metrics_df, blocks, labels_by_run, populations,
                        n_boot, level, seed, rules, metrics, max_overlays, notes)
        html_text, md_text = result
        atomic_write_text(tmp / "report.html", html_text)
        atomic_write_text(tmp / "report.md", md_text)
        checklist = doc.checklist  # type: ignore[attr-defined]
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    rel = lambda ps: tuple(out_dir / p.relative_to(tmp) for p in ps)  # noqa: E731
    return ReportResult(out_dir, out_dir / "report.html", out_dir / "report.md", rel(doc.figures),
                        rel(doc.tables), tuple(checklist), tuple(dict.fromkeys(notes)))


def _write(doc: _Doc, study_dir: Path, runs: dict[str, RunInfo], eval_dirs: dict[tuple[str, str], Path],
           counts: pd.DataFrame,
           metrics_df: pd.DataFrame | None, blocks: dict[tuple[str, str], list[System]],
           labels_by_run: dict[str, str], populations: Sequence[Population], n_boot: int, level: float,
           seed: int, rules: Sequence[str], metrics: Sequence[str], max_overlays: int,
           notes: list[str]) -> tuple[str, str]:
    study = study_dir.resolve().name
    n_blocks = len(blocks)
    all_scores, n_tests, n_systems_max = [], 0, 0
    block_data = {}
    # ---------------- per-block analysis (figures are drawn in the figures section)
    for key, systems in blocks.items():
        tables: dict[str, ImageTable] = {}
        for s in systems:
            t = s.table()
            if metrics_df is not None:
                m = metrics_df[metrics_df["run_id"].astype(str).isin(s.run_ids)
                               & (metrics_df["checkpoint_role"].astype(str) == s.checkpoint_role)]
                if len(m):
                    cols = [c for c in m.columns if c.startswith(_BOUNDARY_PREFIXES) and m[c].dtype.kind == "f"
                            and not c.startswith(("hd95_", "asd_"))]
                    t = t.with_metrics(m, cols)
            tables[s.label] = t
        scores = system_scores(systems, tables, rules, metrics, n_boot, level, seed)
        boundary = _boundary_scores(systems, tables, n_boot, level, seed)
        all_scores.append(scores.assign(dataset=key[0], split=key[1]))
        n_systems_max = max(n_systems_max, len(systems))
        aligned = align_tables(tables, "intersect") if len(tables) > 1 else dict(tables)
        lost = {lab: tables[lab].n_images - aligned[lab].n_images for lab in tables}
        if any(lost.values()):
            notes.append(f"{key[0]}/{key[1]}: paired analyses use the {aligned[next(iter(aligned))].n_images} "
                         f"images common to all systems (dropped per system: {lost})")
        block_data[key] = dict(systems=systems, tables=tables, aligned=aligned, scores=scores, boundary=boundary)

    # ---------------- header
    doc.html.append(f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>msb report: "
                    f"{html.escape(study)}</title><style>{_CSS}</style></head><body>\n"
                    f"<h1>Benchmark report: {html.escape(study)}</h1>\n<section id=\"intro\">")
    doc.md.append(f"# Benchmark report: {study}\n")
    n_img = counts.drop_duplicates(["dataset", "split", "image_id"]).shape[0]
    doc.text(f"Study folder {study_dir}; {len(runs)} run(s); {sum(len(v) for v in blocks.values())} system(s); "
             f"{n_img} distinct evaluated image(s); every number below is recomputed from stored counts, "
             f"metrics tables and predictions (no model was run).")

    # ---------------- contract
    doc.section("contract")
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
            ("tests", "paired two-sided Wilcoxon signed-rank on per-image scores, Benjamini-Hochberg FDR, "
                      "rank-biserial effect size; Friedman + Nemenyi post-hoc for >= 3 systems")],
    }
    contract = contract_table(list(runs.values()), labels_by_run, extra)
    for sec, g in contract.groupby("section", sort=False):
        doc.sub(str(sec))
        doc.frame(g[["field", "value"]].reset_index(drop=True))
    contract_csv = doc.out / "data" / "contract.csv"
    atomic_write_text(contract_csv, contract.to_csv(index=False))
    doc.tables.append(contract_csv)
    problems = [f"{r.run_id}: {p}" for r in runs.values() for p in r.problems]
    if problems:
        doc.text("Missing run files: " + "; ".join(problems), "note")

    # ---------------- scores
    doc.section("scores")
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        doc.text(f"{len(b['systems'])} system(s) on {key[0]}/{key[1]}: "
                 + "; ".join(f"{s.label} = runs {list(s.run_ids)} ({s.checkpoint_role})" for s in b["systems"]))
        for m in metrics:
            doc.ci_table(scores_ci_table(b["scores"], m), f"scores-{m}{sfx}")
        excl = b["scores"][b["scores"]["n_excluded"] > 0]
        if len(excl):
            doc.text("Undefined units excluded: " + "; ".join(
                f"{r.system} {r.aggregation}/{r.metric}: {r.n_excluded} of {r.n_units}" for r in excl.itertuples()),
                "note")
        doc.frame(b["scores"], name=f"scores{sfx}", caption="All scores (tidy)")

    # ---------------- boundary
    doc.section("boundary")
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        bd = b["boundary"]
        if bd.empty:
            doc.text("not available: no metrics.parquet beside the counts (run `msb metrics RUN_DIR`)", "note")
            continue
        conv = (sorted(set(metrics_df["hd_convention"].astype(str))) if metrics_df is not None
                and "hd_convention" in metrics_df.columns else [])
        for m in list(dict.fromkeys(bd["metric"])):
            doc.ci_table(scores_ci_table(bd, m), f"boundary-{m}{sfx}")
        doc.text(f"Image-macro means over images with a defined value (both-empty images excluded; one-sided "
                 f"empty images carry the image-diagonal penalty, docs/metrics.md); HD convention {conv}.", "note")
        doc.frame(bd, name=f"boundary{sfx}")

    # ---------------- significance
    doc.section("significance")
    diff_cache = {}
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        aligned = b["aligned"]
        labels = list(aligned)
        if len(labels) < 2:
            doc.text("not applicable: only one system in this block, nothing to compare", "note")
            continue
        tab = paired_tests(aligned, ("dice", "hd95"))
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
        doc.frame(diff_tab, caption="Differences a − b with paired bootstrap CIs (same resamples for both systems)",
                  name=f"paired-differences{sfx}")
        if len(labels) >= 3:
            sc = {lab: unit_scores(aligned[lab], "dice", "image") for lab in labels}
            try:
                fr = friedman_test(sc)
                doc.text(f"{fr.test}: chi2 = {fr.statistic:.4g}, p = {fr.p_value:.4g} (n = {fr.n} images, "
                         f"k = {fr.k} systems, {fr.n_dropped} image(s) dropped as undefined); mean ranks "
                         + ", ".join(f"{k}: {v:.2f}" for k, v in fr.mean_ranks.items()))
                doc.frame(fr.posthoc.reset_index(names="system"),
                          caption=f"{fr.posthoc_test} p-values (n = {fr.n} images, k = {fr.k} systems)",
                          name=f"posthoc{sfx}", p_values=True)
            except MSBError as e:
                doc.text(f"Friedman test not computed: {e}", "note")
        else:
            doc.text("Friedman test: not applicable (needs at least 3 systems; the paired Wilcoxon test above "
                     "covers two)", "note")

    # ---------------- ranking
    doc.section("ranking")
    rank_cache = {}
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        sc = b["scores"][["system", "aggregation", "metric", "value"]]
        if not b["boundary"].empty:
            sc = pd.concat([sc, b["boundary"][["system", "aggregation", "metric", "value"]]], ignore_index=True)
        ranks = rank_table(sc)
        rank_cache[key] = ranks
        if len(b["systems"]) < 2:
            doc.text("not applicable: only one system, every ranking is trivial", "note")
            continue
        sens = ranking_sensitivity(sc)
        doc.frame(sens, caption="Ranking under each rule and metric vs the reference ranking",
                  name=f"ranking-sensitivity{sfx}")
        changed = sens[sens["winner_changed"]]
        doc.text(("The winner changes under: " + ", ".join(f"{r.aggregation}/{r.metric} ({r.winner})"
                                                          for r in changed.itertuples()))
                 if len(changed) else "The winner is the same under every rule and metric.")
        if len(b["systems"]) >= 3:
            main = sc[sc["metric"].isin(_FIGURE_METRICS)]
            doc.frame(ranking_correlations(main).reset_index(names="ranking"),
                      caption="Spearman rho between the Dice / HD95 rankings of the rules",
                      name=f"ranking-correlations{sfx}", digits=3)

    # ---------------- populations
    doc.section("populations")
    any_pop = False
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        rows = pd.concat([s.rows.assign(system=s.label) for s in b["systems"]], ignore_index=True)
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
    doc.section("folds")
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        rows = pd.concat([s.rows.assign(system=s.label) for s in b["systems"]], ignore_index=True)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        if not (rows["fold"] >= 0).any():
            doc.text("not applicable: no fold runs (fold = -1 everywhere)", "note")
            continue
        fw = foldwise_summary(rows, ["system"], BASE_RULES, ["dice", "iou"])
        doc.frame(fw, caption="Per-fold scores: mean and sample SD over folds, and all folds pooled",
                  name=f"folds{sfx}")

    # ---------------- figures
    doc.section("figures")
    for key, b in block_data.items():
        sfx = _block_suffix(key, n_blocks)
        if n_blocks > 1:
            doc.sub(f"{key[0]} / {key[1]}")
        aligned, scores = b["aligned"], b["scores"]
        per_img = {lab: unit_scores(b["tables"][lab], "dice", "image") for lab in b["tables"]}
        est = {}
        for r in scores[(scores["aggregation"] == "image-macro") & (scores["metric"] == "dice")].itertuples():
            est[r.system] = (r.value, r.ci_low, r.ci_high)
        doc.figure("score-distributions", f"score-distributions{sfx}",
                   score_distributions(per_img, est, "Dice", f"Dice per image ({key[0]}/{key[1]})", seed),
                   "Per-image Dice per system (box, points) with the image-macro Dice and its bootstrap CI")
        if key in diff_cache and diff_cache[key]:
            d = diff_cache[key]
            doc.figure("paired-differences", f"paired-differences{sfx}",
                       paired_differences({k: v[0] for k, v in d.items()}, {k: v[1] for k, v in d.items()},
                                          "Dice", seed=seed),
                       "Per-image Dice differences with the paired-bootstrap CI of the image-macro difference")
        else:
            doc.missing_figure("paired-differences", f"paired-differences{sfx}", "only one system")
        rk = rank_cache[key]
        doc.figure("ranking-changes", f"ranking-changes{sfx}", ranking_changes(rk[rk["metric"].isin(_FIGURE_METRICS)]),
                   "Rank of each system under every aggregation rule for Dice (and HD95, image-macro)")
        pts = {lab: (per_img[lab], unit_scores(t, "hd95", "image")) for lab, t in b["tables"].items()
               if "hd95" in t.extra}
        if pts:
            doc.figure("dice-vs-hd95", f"dice-vs-hd95{sfx}", dice_vs_hd95(pts),
                       "Per-image Dice vs HD95 (HD95 in spacing units; misses carry the diagonal penalty)")
        else:
            doc.missing_figure("dice-vs-hd95", f"dice-vs-hd95{sfx}", "no metrics.parquet with hd95")
        fig, _, grey = _overlays(aligned, {s.label: s for s in b["systems"]}, runs, eval_dirs, max_overlays, notes)
        if fig is None:
            doc.missing_figure("overlays", f"overlays{sfx}", grey or "no stored predictions")
        else:
            doc.figure("overlays", f"overlays{sfx}", fig,
                       "Stored predictions on the images where the systems disagree most (TP green, FP red, "
                       "FN blue)" + (f"; {grey}" if grey else ""))

    # ---------------- checklist
    doc.section("checklist")
    scores_all = pd.concat(all_scores, ignore_index=True)
    items = reporting_checklist(list(runs.values()), counts, scores_all, metrics_df, n_tests, n_systems_max,
                                n_boot)
    doc.checklist = items  # type: ignore[attr-defined]
    doc.html.append('<table id="checklist-table"><tr><th>item</th><th>result</th><th>evidence</th></tr>' + "".join(
        f'<tr><td>{html.escape(i.item)}</td><td class="{"pass" if i.passed else "fail"}">'
        f'{"PASS" if i.passed else "FAIL"}</td><td>{html.escape(i.evidence)}</td></tr>' for i in items) + "</table>")
    doc.md.append(frame_to_markdown(pd.DataFrame(
        [{"item": i.item, "result": "PASS" if i.passed else "FAIL", "evidence": i.evidence} for i in items]),
        index=False))
    atomic_write_text(doc.out / "data" / "checklist.csv", pd.DataFrame(
        [{"item": i.item, "passed": i.passed, "evidence": i.evidence} for i in items]).to_csv(index=False))
    if notes:
        doc.html.append('</section>\n<section id="notes"><h2>Notes</h2><ul>'
                        + "".join(f"<li>{html.escape(n)}</li>" for n in dict.fromkeys(notes)) + "</ul>")
        doc.md.append("\n## Notes\n\n" + "".join(f"- {n}\n" for n in dict.fromkeys(notes)))
    doc.html.append("</section>\n</body></html>\n")
    return "\n".join(doc.html), "\n".join(doc.md)
