"""Analyses behind the study report (:mod:`msb.analysis.report.report`): per-block scores with CIs, boundary metrics
and the overlay grid of stored predictions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from msb.analysis.stats.bootstrap import bootstrap_rules
from msb.analysis.report.contract import RunInfo, resolve_data_root
from msb.analysis.report.figures import overlay_grid, overlay_rgb
from msb.analysis.counts.rules import ImageTable, aggregate_rules, unit_scores
from msb.analysis.counts.systems import System, align_tables
from msb.errors import MSBError
from msb.evaluation.image_metrics import CONVENTION_COLUMNS, SETTING_COLUMNS

__all__ = ["BOUNDARY_PREFIXES", "BlockData", "analyse_blocks", "boundary_scores", "overlay_figure",
           "overlay_subject", "system_scores"]

#: Column prefixes of ``metrics.parquet`` shown as boundary metrics.
BOUNDARY_PREFIXES: tuple[str, ...] = ("hd95", "assd", "nsd_tau")


def system_scores(systems: Sequence[System], tables: dict[str, ImageTable], rules: Sequence[str],
                  metrics: Sequence[str], n_boot: int, level: float, seed: int) -> pd.DataFrame:
    """Tidy scores of several systems with bootstrap CIs.

    Args:
        systems: the systems (one comparison block); tables: label -> their :class:`ImageTable`.
        rules, metrics: as :func:`msb.analysis.counts.rules.aggregate_rules`.
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


def boundary_scores(systems: Sequence[System], tables: dict[str, ImageTable], n_boot: int, level: float,
                    seed: int) -> pd.DataFrame:
    """Image-macro means of the boundary metrics (columns ``hd95*``, ``assd*``, ``nsd_tau*`` of each table's
    ``extra``) with image-level percentile bootstrap CIs.

    Args:
        systems: one comparison block; tables: label -> :class:`ImageTable` (with metrics joined).
        n_boot: replicates (0 = no CI; the estimate is still computed); level, seed: CI level, seed.

    Returns:
        ``system, aggregation ("image-macro"), metric, value, median, n_images, n_excluded (NaN images),
        ci_low, ci_high, ci_level``; empty when no table has a boundary column.
    """
    rows = []
    for s in systems:
        t = tables[s.label]
        cols = [c for c in t.extra if c.startswith(BOUNDARY_PREFIXES)]
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


@dataclass(frozen=True)
class BlockData:
    """Everything the report shows for one comparison block (dataset x split).

    Attributes:
        systems: the systems; tables: label -> :class:`ImageTable` (boundary metrics joined);
        aligned: the tables restricted to the images common to all systems (paired analyses);
        scores: :func:`system_scores`; boundary: :func:`boundary_scores`.
    """

    systems: list[System]
    tables: dict[str, ImageTable]
    aligned: dict[str, ImageTable]
    scores: pd.DataFrame
    boundary: pd.DataFrame


def _metric_settings(m: pd.DataFrame) -> list[str]:
    """Distinct distance/NSD settings (conventions, boundary connectivity, tau unit) among metrics rows, as
    ``key=value, ...`` strings (sorted; one entry when the rows agree)."""
    cols = [c for c in (*CONVENTION_COLUMNS, *SETTING_COLUMNS) if c in m.columns]
    if not cols or m.empty:
        return []
    combos = m[cols].astype(str).drop_duplicates()
    return sorted(", ".join(f"{c}={v}" for c, v in zip(cols, row)) for row in combos.itertuples(index=False))


def analyse_blocks(blocks: dict[tuple[str, str], list[System]], metrics_df: pd.DataFrame | None,
                   rules: Sequence[str], metrics: Sequence[str], n_boot: int, level: float, seed: int,
                   notes: list[str]) -> dict[tuple[str, str], BlockData]:
    """Per comparison block: image tables (with the boundary columns of ``metrics_df`` joined), scores with
    CIs, boundary scores and the aligned tables for paired analyses.

    Args:
        blocks: (dataset, split) -> systems (:func:`msb.analysis.counts.systems.comparison_blocks`).
        metrics_df: the evaluations' ``metrics.parquet`` rows, or None.
        rules, metrics, n_boot, level, seed: as :func:`system_scores`.
        notes: receives a note per block whose systems were scored on different images.

    Returns:
        (dataset, split) -> :class:`BlockData`, in the order of ``blocks``.
    """
    block_data = {}
    for key, systems in blocks.items():
        tables: dict[str, ImageTable] = {}
        rows = {}
        if metrics_df is not None:
            rows = {s.label: metrics_df[metrics_df["run_id"].astype(str).isin(s.run_ids)
                                        & (metrics_df["checkpoint_role"].astype(str) == s.checkpoint_role)]
                    for s in systems}
            settings = _metric_settings(pd.concat(list(rows.values()), ignore_index=True))
            if len(settings) > 1:  # distances of different conventions are neither averaged nor compared
                notes.append(f"{key[0]}/{key[1]}: boundary metrics left out: the evaluations use different "
                             f"conventions ({'; '.join(settings)}); recompute them with one (msb metrics)")
                rows = {}
        for s in systems:
            t = s.table()
            m = rows.get(s.label)
            if m is not None and len(m):
                cols = [c for c in m.columns if c.startswith(BOUNDARY_PREFIXES) and m[c].dtype.kind == "f"
                        and not c.startswith(("hd95_", "asd_"))]
                t = t.with_metrics(m, cols)
            tables[s.label] = t
        scores = system_scores(systems, tables, rules, metrics, n_boot, level, seed)
        boundary = boundary_scores(systems, tables, n_boot, level, seed)
        aligned = _common_images(tables)
        if not aligned:
            notes.append(f"{key[0]}/{key[1]}: the systems share no image (e.g. different random splits, one per "
                         f"seed): no paired analyses in this block")
        lost = {lab: tables[lab].n_images - aligned[lab].n_images for lab in aligned}
        if any(lost.values()):
            notes.append(f"{key[0]}/{key[1]}: paired analyses use the {aligned[next(iter(aligned))].n_images} "
                         f"images common to all systems (dropped per system: {lost})")
        block_data[key] = BlockData(systems, tables, aligned, scores, boundary)
    return block_data


def no_pairs_reason(block: "BlockData") -> str:
    """Why a block has no paired analyses: one system only, or systems that share no image."""
    if len(block.tables) < 2:
        return "only one system in this block, nothing to compare"
    return "the systems share no image (e.g. one random split per seed), nothing to pair"


def _common_images(tables: dict[str, ImageTable]) -> dict[str, ImageTable]:
    """:func:`align_tables` with ``intersect``; ``{}`` when several systems share no image at all."""
    if len(tables) < 2:
        return dict(tables)
    try:
        return align_tables(tables, "intersect")
    except MSBError as e:
        if "share no image" not in str(e):
            raise
        return {}


def _pick_overlay_images(aligned: dict[str, ImageTable], k: int) -> list[int]:
    """Positions of the ``k`` images where the first two systems' Dice differ most (one system, or no image
    differs: the lowest Dice of the first), ties broken by image id."""
    labels = list(aligned)
    d = [unit_scores(aligned[lab], "dice", "image") for lab in labels]
    if len(d) >= 2 and np.nanmax(np.abs(d[0] - d[1]), initial=0.0) > 0:
        key = -np.nan_to_num(np.abs(d[0] - d[1]), nan=-1.0)
    else:  # one system, or no image differs: the lowest Dice of the first
        key = np.nan_to_num(d[0], nan=2.0)
    ids = aligned[labels[0]].keys["image_id"].astype(str).to_numpy()
    order = np.lexsort((ids, key))
    return [int(i) for i in order[:k]]


def overlay_subject(aligned: dict[str, ImageTable], k: int) -> str:
    """What the overlay grid shows, for its caption: the images where the first two systems' Dice differ most
    (:func:`_pick_overlay_images`) when some image differs, else the ``k`` lowest-Dice images of the first."""
    labels = list(aligned)
    if len(labels) >= 2:
        d = np.abs(unit_scores(aligned[labels[0]], "dice", "image") - unit_scores(aligned[labels[1]], "dice", "image"))
        if np.isfinite(d).any() and np.nanmax(d) > 0:
            return f"the images where the Dice of {labels[0]} and {labels[1]} differ most"
        return f"the {k} images with the lowest Dice of {labels[0]} (the systems' per-image Dice do not differ)"
    return f"the {k} images with the lowest Dice of {labels[0]}"


def _data_run(run_id: str, dataset: str, runs: dict[str, RunInfo]) -> RunInfo | None:
    """The run whose config locates the dataset images: the run itself, else any run trained on ``dataset``."""
    if run_id in runs:
        return runs[run_id]
    for r in runs.values():
        if str((r.config.get("data") or {}).get("name", "")) == dataset:
            return r
    return None


def overlay_figure(aligned: dict[str, ImageTable], systems: dict[str, System], runs: dict[str, RunInfo],
                   eval_dirs: dict[tuple[str, str], Path], k: int, notes: list[str]):
    """Grid of stored predictions (TP/FP/FN colours) on the ``k`` images where the systems disagree most.

    Args:
        aligned: label -> aligned :class:`ImageTable` (same images, same order); systems: label -> system.
        runs: run id -> :class:`RunInfo` (to locate the dataset images used as backgrounds).
        eval_dirs: (run id, checkpoint role) -> evaluation folder holding ``predictions/<image_id>.npz``.
        k: images (rows); notes: receives notes (missing predictions, grey backgrounds).

    Returns:
        ``(figure or None, image positions, reason)``: the figure is None when no cell has a stored
        prediction or ``aligned`` is empty (the systems share no image; ``reason`` says so); otherwise ``reason``
        is None or why the background is grey.
    """
    if not aligned:
        return None, [], "the systems share no image"
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
