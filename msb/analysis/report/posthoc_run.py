"""The post-hoc analyses of a study folder: ``msb reaggregate STUDY --analyses rank_stability,calibration,threshold``
and the same names in a study file's ``analyses:`` (run at the end of ``msb run``). They read only stored artifacts
(counts, prediction files with probability maps); nothing is retrained or re-inferred.

Written into ``<study>/posthoc/`` (tables as CSV, LaTeX and Markdown; figures as PNG and SVG in ``figures/``):

* ``rank_stability``: ``rank_stability_bootstrap.*`` (per block and system: rank-1 share, median rank, rank
  interval, Kendall τ; :mod:`msb.analysis.stats.rank_boot`, the leaderboard's replicates) with a blob plot per block,
  and, when the study repeats systems over seeds / splits / folds, ``rank_stability_seeds.*`` (win share, mean ± SD),
  ``rank_stability_seed_rankings.csv`` and ``rank_stability_seed_pairs.csv`` (:mod:`msb.analysis.stats.rank_stability`);
* ``calibration``: ``calibration.*`` (per system x dataset x class: ECE, MCE, Brier with image bootstrap CIs),
  ``calibration_images.csv`` (per image), ``calibration_reliability.csv`` and a reliability diagram per block
  (:mod:`msb.analysis.stats.calibration`);
* ``threshold``: per run and checkpoint role with stored probabilities on the test split *and* on the run's
  selection split, the threshold maximising the selection split's image-macro Dice, written as a new evaluation
  ``<run>/evaluation/<role>-threshold/`` (its own ``counts.parquet``, ``checkpoint_role`` ``<role>-threshold``, the
  ``threshold`` column holding the chosen value, so ``msb reaggregate`` and ``msb report`` use it unchanged), and
  ``threshold.*`` / ``threshold_curves.csv`` (:mod:`msb.analysis.stats.threshold`).

An analysis that has nothing to work on is skipped with its reason in ``posthoc/skipped.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from msb.analysis.report.posthoc_io import THRESHOLD_SUFFIX, write_table
from msb.config.analysis_schema import AnalysisConfig
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text
from msb.utils.progress import Logger, no_log

__all__ = ["POSTHOC_ANALYSES", "split_analysis_names", "write_posthoc_analyses"]

#: The post-hoc analysis names (the protocol analyses' names are those of :mod:`msb.analysis.protocol`).
POSTHOC_ANALYSES: tuple[str, ...] = ("rank_stability", "calibration", "threshold")


def split_analysis_names(text: str | Sequence[str] | None) -> tuple[list[str], str | list[str] | None]:
    """``(post-hoc names, the rest)`` of an ``--analyses`` value or an ``analyses.names`` list. The post-hoc
    analyses run only when named (``all`` / None keep their meaning: every *protocol* analysis, as before); the
    rest is None when empty."""
    if text is None:
        return [], None
    items = [str(t).strip() for t in (text.split(",") if isinstance(text, str) else text) if str(t).strip()]
    mine = [t for t in items if t in POSTHOC_ANALYSES]
    rest = [t for t in items if t not in POSTHOC_ANALYSES]
    back: str | list[str] | None = (",".join(rest) if isinstance(text, str) else rest) if rest else None
    return list(dict.fromkeys(mine)), back


def _figure(fig, folder: Path, name: str) -> list[Path]:
    from msb.analysis.report.figures import save_figure

    return list(save_figure(fig, folder / "figures" / name))


def _sfx(key: tuple[str, str], n: int) -> str:
    return "" if n == 1 else f"-{key[0]}-{key[1]}"


def _rank_stability(counts: pd.DataFrame, st: AnalysisConfig, out: Path, skipped: dict) -> list[Path]:
    from msb.analysis.counts.identical import drop_identical
    from msb.analysis.counts.systems import comparison_blocks, find_systems
    from msb.analysis.report.figures_posthoc import blob_plot
    from msb.analysis.report.report_data import _common_images
    from msb.analysis.report.verdict import block_ranks
    from msb.analysis.stats.rank_stability import seed_stability

    written: list[Path] = []
    blocks, _ = drop_identical(comparison_blocks(find_systems(counts, "run")), {})
    tabs = []
    for key, systems in blocks.items():
        dist = block_ranks(_common_images({s.label: s.table() for s in systems}), st.bootstrap, st.level, st.seed)
        if dist is None:
            continue
        tabs.append(dist.table().assign(dataset=key[0], split=key[1]))
        written += _figure(blob_plot(dist, f"{key[0]}/{key[1]}: bootstrap ranks\n({dist.n_boot:,} replicates, "
                                           f"image-macro Dice)"), out, f"rank_stability_blob{_sfx(key, len(blocks))}")
    if tabs:
        written += write_table(pd.concat(tabs, ignore_index=True), out, "rank_stability_bootstrap")
    else:
        skipped["rank_stability_bootstrap"] = ("no block with two systems sharing images (or bootstrap 0 in the "
                                               "statistics setting)")
    rankings, systems_t, pairs = seed_stability(counts)
    if len(systems_t):
        written += write_table(systems_t, out, "rank_stability_seeds")
        for name, frame in (("rank_stability_seed_rankings", rankings), ("rank_stability_seed_pairs", pairs)):
            atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
            written.append(out / f"{name}.csv")
    else:
        skipped["rank_stability_seeds"] = ("no system repeated over two or more seeds, random splits or folds "
                                           "(random_seed axis, split seeds, cross-validation)")
    return written


def _eval_folders(study_dir: Path) -> dict[tuple[str, str, str, str], Path]:
    """(dataset, split, run_id, checkpoint_role) -> evaluation folder, from every counts file of the study."""
    from msb.analysis.counts.counts_files import find_counts_files

    out = {}
    for f in find_counts_files([study_dir]):
        keys = pd.read_parquet(f, columns=["dataset", "split", "run_id", "checkpoint_role"]).drop_duplicates()
        for k in keys.itertuples(index=False):
            out[tuple(str(x) for x in k)] = f.parent
    return out


def _calibration(study_dir: Path, counts: pd.DataFrame, st: AnalysisConfig, out: Path, skipped: dict,
                 bins: int) -> list[Path]:
    from msb.analysis.counts.systems import comparison_blocks, find_systems
    from msb.analysis.report.figures_posthoc import reliability_diagram
    from msb.analysis.stats.calibration import calibration_summary, calibration_values, read_histograms, \
        reliability_table

    folders = _eval_folders(study_dir)
    rows, img_rows, rel_rows, written = [], [], [], []
    blocks = comparison_blocks(find_systems(counts[~counts["checkpoint_role"].astype(str).str.endswith(
        THRESHOLD_SUFFIX)], "run"))
    for key, systems in blocks.items():
        curves = {}
        for s in systems:
            parts = []
            for rid, g in s.rows.groupby("run_id", sort=True):
                ev = folders.get((s.dataset, s.split, str(rid), s.checkpoint_role))
                ids = list(dict.fromkeys(g["image_id"].astype(str)))
                if ev is None or not ids or not (ev / "predictions" / f"{ids[0]}.npz").is_file():
                    break
                with np.load(ev / "predictions" / f"{ids[0]}.npz") as z:
                    if "prob" not in z.files:
                        break
                ha, hf, cids = read_histograms(ev / "predictions", ids)
                parts.append((ha, hf, cids, ids, np.full(len(ids), int(g["fold"].iloc[0]))))
            else:
                if not parts:
                    continue
                ha = np.concatenate([p[0] for p in parts])
                hf = np.concatenate([p[1] for p in parts])
                ids = [i for p in parts for i in p[3]]
                folds = np.concatenate([p[4] for p in parts])
                strata = folds if len(np.unique(folds)) > 1 else None
                names = dict(zip(s.rows["class_id"].astype(int), s.rows["class_name"].astype(str)))
                per = calibration_values(ha, hf, bins)
                for c, cid in enumerate(parts[0][2]):
                    base = {"dataset": s.dataset, "split": s.split, "system": s.label, "class_id": int(cid),
                            "class_name": names.get(int(cid), str(cid))}
                    rows.append({**base, **calibration_summary(ha[:, c], hf[:, c], bins, st.bootstrap, st.level,
                                                               st.seed, strata)})
                    img_rows.append(pd.DataFrame({**base, "image_id": ids, "ece": per["ece"][:, c],
                                                  "mce": per["mce"][:, c], "brier": per["brier"][:, c],
                                                  "n_pixels": per["n_pixels"][:, c].astype(np.int64)}))
                    rel = reliability_table(ha[:, c].sum(0), hf[:, c].sum(0), bins)
                    rel_rows.append(rel.assign(**base))
                    curves[f"{s.label} ({base['class_name']})"] = rel
        if curves:
            written += _figure(reliability_diagram(curves, f"{key[0]}/{key[1]}: reliability ({bins} bins, every "
                                                           f"pixel)"), out,
                               f"calibration_reliability{_sfx(key, len(blocks))}")
    if not rows:
        skipped["calibration"] = ("no evaluation folder with stored probability maps (predictions/*.npz with "
                                  "'prob'; evaluation.save_probabilities: true)")
        return written
    written += write_table(pd.DataFrame(rows), out, "calibration")
    for name, frame in (("calibration_images", pd.concat(img_rows, ignore_index=True)),
                        ("calibration_reliability", pd.concat(rel_rows, ignore_index=True))):
        atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
        written.append(out / f"{name}.csv")
    return written


def write_posthoc_analyses(study_dir: Path, names: Sequence[str], setting: AnalysisConfig | None = None,
                           out: Path | None = None, log: Logger = no_log, bins: int = 15,
                           metric: str = "dice") -> list[Path]:
    """Run the named post-hoc analyses of one study folder (module docstring).

    Args:
        study_dir: ``<run_root>/<study>``; names: among :data:`POSTHOC_ANALYSES`.
        setting: the statistics setting (replicates, level, seed; default: the study's recorded one).
        out: output folder (default ``<study>/posthoc``); log: line logger.
        bins: reliability bins; metric: the threshold analysis's selection metric (dice, iou or recall).

    Returns:
        The files written, ``skipped.json`` last.

    Raises:
        MSBError: an unknown name; no counts in the folder; damaged prediction files.
    """
    from msb.analysis.counts.counts_io import read_counts
    from msb.analysis.stats.setting import find_setting

    bad = [n for n in names if n not in POSTHOC_ANALYSES]
    if bad:
        raise MSBError(f"unknown post-hoc analysis {bad}; choose from {list(POSTHOC_ANALYSES)}")
    study_dir = Path(study_dir)
    st = setting or find_setting([study_dir])[0]
    out = Path(out) if out is not None else study_dir / "posthoc"
    out.mkdir(parents=True, exist_ok=True)
    skipped: dict[str, str] = {}
    written: list[Path] = []
    if "threshold" in names:  # first: its evaluations join the counts the other analyses read
        from msb.analysis.report.posthoc_threshold import threshold_analysis

        written += threshold_analysis(study_dir, out, skipped, metric, log)
    counts = read_counts([study_dir])
    if "rank_stability" in names:
        written += _rank_stability(counts, st, out, skipped)
    if "calibration" in names:
        written += _calibration(study_dir, counts, st, out, skipped, bins)
    atomic_write_text(out / "skipped.json", json.dumps(skipped, indent=2) + "\n")
    for k, why in skipped.items():
        log(f"post-hoc {k}: skipped: {why}")
    log(f"post-hoc analyses ({', '.join(names)}) written to {out} ({len(written)} files)")
    return written + [out / "skipped.json"]
