"""Final evaluation of a run folder's checkpoint (``msb evaluate``).

Reloads ``checkpoints/<role>.pt`` (SHA-256 verified against its record), predicts the evaluation split from
the preprocessing cache (the same resized inputs as training), upsamples the test-time logits bilinearly
(``align_corners=False``) to each image's native size, thresholds them (``sigmoid(logits) >= t`` or
``logits >= t``), and compares with the native-resolution reference mask. Writes into
``evaluation/<role>/``:

- ``counts.parquet``: one row per image x foreground class (``docs/counts_schema.md``);
- ``predictions/<sample_id>.npz``: ``pred``/``ref`` bool (C, H, W), ``prob`` uint8 (C, H, W) =
  round(255·sigmoid) (the 8-bit maps the polyp protocol saves as PNG), ``spacing`` (row, col) mm/px,
  ``class_ids``;
- ``metrics.parquet``: boundary and lesion metrics from the stored predictions (``docs/metrics.md``).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, TypeVar

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from msb.config.schema import RunConfig
from msb.data.cache import build_cache
from msb.data.schema import PreparedDataset, mask_to_onehot, read_mask
from msb.data.splits import read_split_file
from msb.data.torch_dataset import SegmentationDataset
from msb.models.checkpoint import load_checkpoint
from msb.errors import MSBError
from msb.evaluation.counts import compute_confusion_counts, counts_rows, write_counts
from msb.models.registry import build_model
from msb.utils.atomic import atomic_path
from msb.utils.device import select_device

__all__ = ["EvaluationResult", "evaluate_checkpoint"]

T = TypeVar("T")
Tracker = Callable[[Iterable[T], str, int], Iterator[T]]


def _no_track(it: Iterable[T], desc: str, total: int) -> Iterator[T]:
    return iter(it)


@dataclass
class EvaluationResult:
    """Paths written by :func:`evaluate_checkpoint` and the number of images evaluated."""

    role: str
    counts_path: Path
    predictions_dir: Path
    metrics_path: Path | None
    n_images: int


def evaluate_checkpoint(run_dir: Path, cfg: RunConfig, ds: PreparedDataset, role: str, run_id: str,
                        config_hash: str, split: str | None = None, track: Tracker = _no_track,
                        fold: int = -1) -> EvaluationResult:
    """Evaluate checkpoint ``role`` of ``run_dir`` on ``split`` (default ``cfg.evaluation.split``).

    Raises:
        MSBError: the checkpoint is missing or its SHA-256 differs; the split is empty; a mask value is not
            covered by ``classes.csv``.
    """
    split = split or cfg.evaluation.split
    payload, rec = load_checkpoint(run_dir, role)
    splits = read_split_file(run_dir / "split.csv")
    ids = [s for s, sp in splits.items() if sp == split]
    if cfg.data.max_samples_per_split:
        ids = sorted(ids)[: cfg.data.max_samples_per_split]
    if not ids:
        raise MSBError(f"{run_dir / 'split.csv'}: split '{split}' has no samples; nothing to evaluate")
    classes = ds.foreground_classes
    model = build_model(cfg.model, len(classes))
    model.load_state_dict(payload["model"])
    device = select_device(cfg.train.device)
    model.to(device).eval()
    use_amp = device.type == "cuda" and cfg.train.amp != "off"
    cache = build_cache(ds, cfg.data.input_size, cfg.data.cache_dir, track)
    data = SegmentationDataset(cache, ids, cfg.data.normalize_mean, cfg.data.normalize_std)
    loader = torch.utils.data.DataLoader(data, batch_size=cfg.train.batch_size, shuffle=False,
                                         num_workers=cfg.data.num_workers)
    out_dir = run_dir / "evaluation" / role
    pred_dir = out_dir / "predictions"
    if pred_dir.exists():
        shutil.rmtree(pred_dir)
    pred_dir.mkdir(parents=True)
    thr, on = cfg.evaluation.threshold, cfg.evaluation.threshold_on
    index = ds.index.set_index("sample_id")
    context = {"dataset": cfg.data.name, "split": split, "fold": fold, "run_id": run_id,
               "model": cfg.model.arch, "checkpoint_role": role, "checkpoint_sha256": rec.sha256,
               "config_hash": config_hash, "threshold": float(thr), "threshold_on": on}
    frames = []
    class_ids = np.array([c.class_id for c in classes], dtype=np.int64)
    with torch.no_grad():
        for x, _, idx in track(loader, f"evaluating {role}", len(loader)):
            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=use_amp):
                logits_small = model.predict_logits(x.to(device))
            logits_small = logits_small.float()
            for k, i in enumerate(idx.tolist()):
                sid = ids[i]
                row = index.loc[sid]
                mpath = ds.mask_path(sid)
                ref = mask_to_onehot(read_mask(mpath), ds.classes, mpath)
                h, w = ref.shape[-2:]
                logits = F.interpolate(logits_small[k: k + 1], size=(h, w), mode="bilinear",
                                       align_corners=False)[0]
                prob = torch.sigmoid(logits)
                pred = (prob >= thr) if on == "probability" else (logits >= thr)
                pred_np = pred.cpu().numpy()
                counts = compute_confusion_counts(pred_np[None], ref[None])
                frames.append(counts_rows(context, counts, image_ids=[sid], class_ids=class_ids,
                                          class_names=[c.name for c in classes], heights=h, widths=w,
                                          sources=str(row.get("source", "") or "")))
                arrays = {"pred": pred_np, "ref": ref, "spacing": np.asarray(ds.spacing(sid), dtype=np.float64),
                          "class_ids": class_ids}
                if cfg.evaluation.save_probabilities:
                    arrays["prob"] = np.round(prob.cpu().numpy() * 255).astype(np.uint8)
                with atomic_path(pred_dir / f"{sid}.npz") as tmp:
                    np.savez_compressed(tmp, **arrays)
    counts_path = write_counts(pd.concat(frames, ignore_index=True), out_dir / "counts.parquet")
    metrics_path = None
    if cfg.evaluation.compute_metrics:
        from msb.evaluation.image_metrics import write_metrics_table

        metrics_path = write_metrics_table(out_dir, cfg.evaluation.metrics)
    return EvaluationResult(role, counts_path, pred_dir, metrics_path, len(ids))
