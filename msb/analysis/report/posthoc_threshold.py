"""The ``threshold`` post-hoc analysis of a study folder (:mod:`msb.analysis.report.posthoc_run`): per run and
checkpoint role, the selection-split curve of Dice / IoU / recall against the decision threshold, the threshold
that maximises the named metric there, and the test split re-scored at that threshold from its stored
probability maps (:mod:`msb.analysis.stats.threshold`), written as the evaluation ``<role>-threshold``.

Where the selection-split maps come from: any evaluation folder of the run (``<run>/evaluation/**``) whose counts
rows are the run's own dataset on its ``checkpoint.selection_split`` with the same checkpoint role, holding
``predictions/*.npz`` with ``prob``: ``msb run`` writes ``<run>/evaluation/selection/<role>/`` when the study file's
``analyses:`` names ``threshold`` (:mod:`msb.study.selection_eval`; ``msb evaluate RUN --checkpoint ROLE
--selection`` for a finished run). A run without one is skipped with that command logged, one line per run and
role, and in ``skipped.json``; the test split is never used to choose.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from msb.utils.progress import Logger, no_log

__all__ = ["threshold_analysis", "threshold_counts_frame"]

_METRICS = ("dice", "iou", "recall")


def _hist(ev: Path, ids: list[str]):
    from msb.analysis.stats.calibration import read_histograms

    return read_histograms(ev / "predictions", ids)


def threshold_counts_frame(test_rows: pd.DataFrame, h_all: np.ndarray, h_fg: np.ndarray, class_ids: np.ndarray,
                           ids: list[str], t: float, role: str) -> pd.DataFrame:
    """The counts rows of the evaluation at threshold ``t``: ``test_rows`` (the declared-threshold evaluation's
    rows) with ``checkpoint_role`` = ``role``, ``threshold`` = ``t`` and the eight counts re-computed from the
    stored maps (``h_all``/``h_fg``: ``(n, C, 256)`` histograms of ``ids``)."""
    from msb.analysis.stats.threshold import counts_at

    c = counts_at(h_all, h_fg, [t])
    pos = {iid: k for k, iid in enumerate(ids)}
    cpos = {int(cid): j for j, cid in enumerate(class_ids)}
    rows = test_rows.copy()
    i = np.array([pos[str(x)] for x in rows["image_id"]])
    j = np.array([cpos[int(x)] for x in rows["class_id"]])
    tp, fp, fn, tn = (c[k][i, j, 0].astype(np.int64) for k in ("tp", "fp", "fn", "tn"))
    rows["tp"], rows["fp"], rows["fn"], rows["tn"] = tp, fp, fn, tn
    rows["intersection"], rows["reference"], rows["predicted"], rows["union"] = tp, tp + fn, tp + fp, tp + fp + fn
    rows["checkpoint_role"] = role
    rows["threshold"] = float(t)
    return rows.reset_index(drop=True)


def _selection_folder(run_dir: Path, dataset: str, split: str, role: str, skip: Path) -> Path | None:
    for f in sorted((run_dir / "evaluation").rglob("counts.parquet")):
        if f.parent == skip or any(p.startswith(".") for p in f.relative_to(run_dir).parts[:-1]):
            continue
        k = pd.read_parquet(f, columns=["dataset", "split", "checkpoint_role"]).drop_duplicates()
        if len(k) == 1 and tuple(k.iloc[0].astype(str)) == (dataset, split, role):
            return f.parent
    return None


def threshold_analysis(study_dir: Path, out: Path, skipped: dict, metric: str = "dice",
                       log: Logger = no_log) -> list[Path]:
    """Run the analysis on every run folder of ``study_dir`` (module docstring); returns the files written.

    Raises:
        MSBError: an unknown ``metric``; damaged prediction files.
    """
    from msb.analysis.counts.counts_io import read_counts
    from msb.analysis.report.posthoc_io import THRESHOLD_SUFFIX, write_table
    from msb.analysis.stats.threshold import DEFAULT_GRID, choose_threshold, counts_at, image_macro
    from msb.config.layering import load_yaml
    from msb.errors import MSBError
    from msb.evaluation.counts import write_counts
    from msb.study.selection_eval import selection_command
    from msb.utils.atomic import atomic_write_text, replace_dir, staging_dir
    from msb.utils.evaluation_folder import seal_folder

    if metric not in _METRICS:
        raise MSBError(f"threshold analysis: metric must be one of {list(_METRICS)}, not {metric!r}")
    curves, summary, written, reasons = [], [], [], []
    for cfg_path in sorted(Path(study_dir).glob("*/config.yaml")):
        run_dir = cfg_path.parent
        cfg = load_yaml(cfg_path)
        ev_cfg, data = cfg.get("evaluation") or {}, cfg.get("data") or {}
        sel_split = str((cfg.get("checkpoint") or {}).get("selection_split", "val"))
        declared = float(ev_cfg.get("threshold", 0.5))
        for ev in sorted((run_dir / "evaluation").glob("*/counts.parquet")) if (run_dir / "evaluation").is_dir() else []:
            role = ev.parent.name
            if role.endswith(THRESHOLD_SUFFIX) or role == "external":
                continue
            if ev_cfg.get("threshold_on", "probability") != "probability":
                reasons.append(f"{run_dir.name}/{role}: threshold_on logit (stored maps are probabilities)")
                continue
            test = read_counts([ev])
            dataset, split = str(test["dataset"].iloc[0]), str(test["split"].iloc[0])
            sel = _selection_folder(run_dir, str(data.get("name", dataset)), sel_split, role, ev.parent)
            if sel is None:
                why = (f"{run_dir.name}/{role}: no stored probability maps on the selection split '{sel_split}'; "
                       f"store them with: {selection_command(run_dir, role)}")
                log(f"threshold analysis: {why}")
                reasons.append(why)
                continue
            sel_rows = read_counts([sel])
            sel_ids = list(dict.fromkeys(sel_rows["image_id"].astype(str)))
            ids = list(dict.fromkeys(test["image_id"].astype(str)))
            sa, sf, _ = _hist(sel, sel_ids)
            grid = sorted(set(DEFAULT_GRID) | {declared})
            c = counts_at(sa, sf, grid)
            vals = {m: image_macro(c["tp"], c["fp"], c["fn"], m) for m in _METRICS}
            k = choose_threshold(vals[metric], grid, declared)
            t = grid[k]
            ta, tf, cids = _hist(ev.parent, ids)
            new_role = role + THRESHOLD_SUFFIX
            rows = threshold_counts_frame(test, ta, tf, cids, ids, t, new_role)
            dst = run_dir / "evaluation" / new_role
            stage = staging_dir(dst)
            try:
                write_counts(rows, stage / "counts.parquet")
                atomic_write_text(stage / "threshold.json", json.dumps(
                    {"chosen_threshold": t, "declared_threshold": declared, "selection_split": sel_split,
                     "selection_metric": f"image-macro {metric}", "selection_folder": str(sel.relative_to(run_dir)),
                     "grid": grid, "rule": "prob_u8 / 255 >= threshold"}, indent=2) + "\n")
                seal_folder(stage, f"msb reaggregate {study_dir} --analyses threshold")
                replace_dir(stage, dst)
            except BaseException:
                import shutil

                shutil.rmtree(stage, ignore_errors=True)
                raise
            written.append(dst / "counts.parquet")
            tc = counts_at(ta, tf, [t])
            decl = {}
            for m in _METRICS:  # the declared evaluation's own counts (thresholded in float, before the uint8 storage)
                piv = [test.pivot_table(index="image_id", columns="class_id", values=x, aggfunc="sum").loc[ids]
                       .to_numpy()[..., None] for x in ("tp", "fp", "fn")]
                decl[m] = float(image_macro(*piv, m)[0])
            for i, th in enumerate(grid):
                curves.append({"run_id": run_dir.name, "checkpoint_role": role, "dataset": dataset,
                               "selection_split": sel_split, "threshold": th, **{m: float(vals[m][i]) for m in _METRICS},
                               "chosen": i == k})
            summary.append({"run_id": run_dir.name, "checkpoint_role": role, "dataset": dataset, "test_split": split,
                            "selection_split": sel_split, "selection_metric": f"image-macro {metric}",
                            "declared_threshold": declared, "chosen_threshold": t,
                            "selection_at_declared": float(vals[metric][grid.index(declared)]),
                            "selection_at_chosen": float(vals[metric][k]),
                            **{f"test_{m}_declared": decl[m] for m in _METRICS},
                            **{f"test_{m}_chosen": float(image_macro(tc["tp"], tc["fp"], tc["fn"], m)[0])
                               for m in _METRICS},
                            "new_role": new_role})
            log(f"[{run_dir.name}] threshold {t:g} chosen on '{sel_split}' (image-macro {metric} "
                f"{vals[metric][k]:.4f}); test re-scored -> {dst / 'counts.parquet'}")
    if summary:
        written += write_table(pd.DataFrame(summary), out, "threshold")
        atomic_write_text(out / "threshold_curves.csv", pd.DataFrame(curves).to_csv(index=False))
        written.append(out / "threshold_curves.csv")
    if reasons:
        skipped["threshold"] = "; ".join(reasons)
    elif not summary:
        skipped["threshold"] = "no run folder with an evaluation holding stored probability maps"
    return written
