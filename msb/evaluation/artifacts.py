"""The files of an evaluation folder, written the same way by every evaluator (``msb evaluate``, ``msb score``).

An evaluation folder (docs/design.md) holds ``predictions/<sample_id>.npz``, ``counts.parquet``,
``prediction_semantics.json``, ``metrics.parquet`` (optional) and ``digests.json``. The model evaluator
(:mod:`msb.evaluation.evaluator`) and the external-prediction scorer (:mod:`msb.evaluation.score`) both write
them through this module, so a scored folder cannot drift from an evaluated one.

- :func:`write_prediction_file`: one ``<sample_id>.npz`` (``pred`` bool (C, H, W), ``ref`` bool (C, H, W),
  ``spacing`` float64 (2,) (row, col) mm/px, ``class_ids`` int64 (C,), and ``prob`` uint8 (C, H, W) when kept);
  temp file then rename.
- :func:`finish_evaluation_folder`: ``counts.parquet`` from the per-image count frames, the semantics file, the
  metrics table from the stored predictions, then ``digests.json`` (written after every other file).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from msb.config.metrics_schema import MetricsConfig
from msb.evaluation.counts import write_counts
from msb.utils.atomic import atomic_path
from msb.utils.evaluation_folder import seal_folder

__all__ = ["write_prediction_file", "finish_evaluation_folder"]


def write_prediction_file(pred_dir: Path, sample_id: str, pred: np.ndarray, ref: np.ndarray,
                          spacing: Sequence[float], class_ids: np.ndarray, prob_u8: np.ndarray | None = None,
                          atomic: bool = True) -> Path:
    """Write ``pred_dir/<sample_id>.npz`` (deflate-compressed, zlib level 1), atomically by default (temp file
    then rename).

    Args:
        pred_dir: the folder ``<evaluation>/predictions`` (must exist).
        sample_id: file stem.
        pred: bool (C, H, W) hard prediction at the native image size.
        ref: bool (C, H, W) reference.
        spacing: (row, col) pixel spacing in mm (1 = pixels).
        class_ids: int64 (C,) foreground class id of each channel.
        prob_u8: uint8 (C, H, W) probability map ``round(255 p)`` to keep (the legacy metrics read it), or None.
        atomic: False writes the file in place, for a ``pred_dir`` inside a staging folder that is swapped in
            only once complete (:func:`msb.utils.atomic.staging_dir`): the temp file and rename would only add
            ~0.25 ms per file.

    Returns:
        The written path.
    """
    arrays = {"pred": np.asarray(pred, dtype=bool), "ref": np.asarray(ref, dtype=bool),
              "spacing": np.asarray(spacing, dtype=np.float64), "class_ids": np.asarray(class_ids, dtype=np.int64)}
    if prob_u8 is not None:
        arrays["prob"] = np.asarray(prob_u8, dtype=np.uint8)
    path = pred_dir / f"{sample_id}.npz"
    if not atomic:
        _savez_fast(path, arrays)
        return path
    with atomic_path(path) as tmp:
        _savez_fast(tmp, arrays)
    return path


#: zlib level of the prediction files: 1, the fastest deflate; boolean masks compress nearly as well as at
#: NumPy's default level (docs/performance.md).
_NPZ_LEVEL = 1


def _savez_fast(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez_compressed(path, **arrays)`` at zlib level ``_NPZ_LEVEL``: the same ``.npz`` layout (one
    ``<name>.npy`` member per array, deflated), read back by ``np.load`` unchanged."""
    with zipfile.ZipFile(path, mode="w", compression=zipfile.ZIP_DEFLATED, compresslevel=_NPZ_LEVEL,
                         allowZip64=True) as zf:
        for name, arr in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(arr), allow_pickle=False)


def finish_evaluation_folder(out_dir: Path, frames: list[pd.DataFrame], write_semantics: Callable[[Path], Path],
                             metrics: MetricsConfig | None, regenerate: str,
                             metric_rows: dict[str, list[dict[str, object]]] | None = None) -> None:
    """Write ``counts.parquet``, the semantics file, ``metrics.parquet`` (unless ``metrics`` is None) and, last,
    ``digests.json`` into the (staging) evaluation folder ``out_dir`` whose ``predictions/`` are written.

    Args:
        out_dir: the folder (normally a staging folder swapped in by the caller).
        frames: per-image count rows (:func:`msb.evaluation.counts.counts_rows`), concatenated in order.
        write_semantics: writes ``out_dir/prediction_semantics.json`` (what produced the predictions).
        metrics: metric settings of ``metrics.parquet``; None to skip the table.
        regenerate: the command that rewrites the folder, recorded in ``digests.json``.
        metric_rows: sample id -> its metrics rows (:func:`msb.evaluation.image_metrics.image_metric_rows`)
            computed from the arrays written to ``predictions/``; None = read the stored predictions back.

    Raises:
        MSBError: a stored prediction cannot be read back by the metric engine.
        ValueError: the count rows violate the counts schema.
    """
    write_counts(pd.concat(frames, ignore_index=True), out_dir / "counts.parquet")
    write_semantics(out_dir)
    if metrics is not None:
        from msb.evaluation.image_metrics import write_metrics_table

        write_metrics_table(out_dir, metrics, metric_rows)
    seal_folder(out_dir, regenerate)
