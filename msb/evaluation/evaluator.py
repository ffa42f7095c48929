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
- ``metrics.parquet``: boundary and lesion metrics of the predictions, computed from the arrays in memory as the
  files are written (the same table ``msb metrics`` computes from the stored files; ``docs/metrics.md``);
- ``prediction_semantics.json``: test-time rule, the model's test-time adjustment (SANet PCS), the
  ``evaluation.test_time_normalisation`` (``none``/``minmax``), threshold (:func:`write_prediction_semantics`);
- ``digests.json``: SHA-256 of every file above and the command that regenerates the folder
  (:mod:`msb.utils.digests`), written after them.

The whole folder is written into a staging folder beside it (``.<role>.staging-*``) and swapped in as a whole
(:func:`msb.utils.atomic.replace_dir`) only when complete; the old evaluation stays in place, untouched, until
then, so a ``kill -9`` at any moment leaves either the old complete evaluation or the new one. The caller
writes ``DONE`` after the swap (:func:`msb.engine.runner.evaluate_run`).

Before the threshold the model's :meth:`~msb.models.base.Segmentor.adjust_test_logits` is applied to the
native-size logits and, with ``test_time_normalisation: minmax``, each probability map is min-max rescaled
(:mod:`msb.evaluation.postprocess`).
"""

from __future__ import annotations

import errno
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from msb.config.metrics_schema import MetricsConfig
from msb.config.schema import RunConfig
from msb.data.cache import build_cache
from msb.data.schema import OPTIONAL_INDEX_COLUMNS, PreparedDataset, mask_to_onehot, read_mask
from msb.data.splits import read_split_file
from msb.data.torch_dataset import SegmentationDataset
from msb.models.checkpoint import load_checkpoint
from msb.errors import MSBError
from msb.evaluation.artifacts import finish_evaluation_folder, write_prediction_file
from msb.evaluation.background import BackgroundJobs
from msb.evaluation.counts import compute_confusion_counts, counts_rows
from msb.evaluation.postprocess import apply_normalisation
from msb.evaluation.protocol_context import protocol_context
from msb.models.registry import build_model
from msb.models.two_prediction import checkpoint_networks, combine_probabilities, test_time_rule_name
from msb.utils.atomic import replace_dir, staging_dir
from msb.utils.device import select_device
from msb.utils.evaluation_folder import evaluate_command
from msb.utils.precision import resolve_precision
from msb.utils.fault_points import fault_point
from msb.utils.progress import Tracker, no_track

__all__ = ["EvaluationResult", "evaluate_checkpoint", "write_prediction_semantics", "ExternalTarget",
           "map_reference_classes"]


@dataclass
class EvaluationResult:
    """Paths written by :func:`evaluate_checkpoint`, the number of images evaluated and the SHA-256 of the
    checkpoint file evaluated (what ``DONE`` records)."""

    role: str
    counts_path: Path
    predictions_dir: Path
    metrics_path: Path | None
    n_images: int
    checkpoint_sha256: str = ""


@dataclass
class ExternalTarget:
    """Evaluate on another prepared dataset (an external test set) instead of the run's own split.

    Attributes:
        dataset: the external prepared dataset (images and reference masks are read from it).
        name: label written to the counts ``dataset`` column.
        split: label written to the counts ``split`` column (e.g. ``all``).
        sample_ids: the external samples to evaluate, in order.
        class_map: model foreground class id -> external class ids whose union is that class's reference
            (external classes not listed are background); see :func:`map_reference_classes`.
        out_dir: folder for ``counts.parquet``, ``predictions/`` and ``metrics.parquet``.
        merge: optional merge of the model's predicted classes before scoring: merged class id -> model class
            ids whose predictions are united (pixel-wise OR of the binary predictions, max of the probabilities);
            ``class_map`` and the counts then use the merged classes ``merged_classes``.
        merged_classes: the merged foreground classes (``ClassSpec``), in channel order.
    """

    dataset: PreparedDataset
    name: str
    split: str
    sample_ids: list[str]
    class_map: dict[int, tuple[int, ...]]
    out_dir: Path
    merge: dict[int, tuple[int, ...]] | None = None
    merged_classes: list | None = None


def map_reference_classes(ref: np.ndarray, source_class_ids: list[int], class_map: dict[int, tuple[int, ...]],
                          target_class_ids: list[int]) -> np.ndarray:
    """Map a one-hot reference of one dataset's classes onto another label set (pixel-wise union).

    Args:
        ref: bool ``(C_src, H, W)``, channel ``j`` = class ``source_class_ids[j]``.
        source_class_ids: foreground class ids of ``ref``'s channels.
        class_map: target class id -> source class ids merged into it.
        target_class_ids: output channel order.

    Returns:
        bool ``(C_tgt, H, W)``: channel ``k`` is the union of the source channels listed for
        ``target_class_ids[k]`` (all False when none is listed).
    """
    pos = {c: j for j, c in enumerate(source_class_ids)}
    out = np.zeros((len(target_class_ids),) + ref.shape[1:], dtype=bool)
    for k, t in enumerate(target_class_ids):
        for s in class_map.get(t, ()):
            out[k] |= ref[pos[s]]
    return out


def write_prediction_semantics(out_dir: Path, cfg: RunConfig, model: torch.nn.Module) -> Path:
    """Write ``out_dir/prediction_semantics.json``: how the stored predictions were made from the model.

    Keys: ``model``, ``test_time_rule`` (``first``/``sum`` of the outputs), ``test_time_adjustment`` (e.g.
    ``pcs`` = SANet's probability correction, ``none``), ``test_time_normalisation`` (``none``/``minmax``),
    ``upsampling`` (logits to the native size), ``threshold``, ``threshold_on``, ``prob_encoding``; semi-supervised
    runs add ``two_prediction`` (strategy, rule; :mod:`msb.models.two_prediction`).
    """
    import json

    from msb.utils.atomic import atomic_write_text

    ev = cfg.evaluation
    sem = {"model": cfg.model.arch, "test_time_rule": test_time_rule_name(model.test_time_rule, cfg),
           "test_time_adjustment": getattr(model, "test_time_adjustment", "none"),
           "test_time_normalisation": ev.test_time_normalisation,
           "upsampling": "bilinear, align_corners=False, logits to the native image size",
           "threshold": float(ev.threshold), "threshold_on": ev.threshold_on,
           "prob_encoding": "uint8 round(255 * p), p after test_time_adjustment and test_time_normalisation"}
    if cfg.train.strategy.name != "supervised":  # semi-supervised runs only: other files are unchanged
        sem["two_prediction"] = {"strategy": cfg.train.strategy.name, "rule": ev.two_prediction or "average",
                                 "combine": "mean of the networks' probabilities, each after its adjustment"}
    path = out_dir / "prediction_semantics.json"
    atomic_write_text(path, json.dumps(sem, indent=2))
    return path


def evaluate_checkpoint(run_dir: Path, cfg: RunConfig, ds: PreparedDataset, role: str, run_id: str,
                        config_hash: str, split: str | None = None, track: Tracker = no_track,
                        fold: int = -1, *, external: ExternalTarget | None = None, out_dir: Path | None = None,
                        command: str | None = None) -> EvaluationResult:
    """Evaluate checkpoint ``role`` of ``run_dir`` on ``split`` (default ``cfg.evaluation.split``).

    With ``external``, the samples ``external.sample_ids`` of ``external.dataset`` are evaluated instead (same
    preprocessing, threshold and test-time rule as the run; no retraining, no threshold tuning), the reference
    masks are mapped onto the model's classes (``ds``, the training dataset) with ``external.class_map``, and
    the outputs go to ``external.out_dir``. Without it, ``out_dir`` (default ``run_dir/evaluation/<role>``) is the
    folder written and ``command`` (default ``msb evaluate RUN --checkpoint ROLE --force``) the regenerate command
    sealed into it (e.g. the selection-split evaluation of :mod:`msb.study.selection_eval`).

    The folder is written into a staging folder and swapped in only when complete (module docstring); on
    any error the staging folder is deleted and the previous evaluation is left as it was.

    Raises:
        MSBError: the checkpoint is missing or its SHA-256 differs; the split is empty; a mask value is not
            covered by ``classes.csv``; the disk is full (the message names the path and the free space).
    """
    split = split or cfg.evaluation.split
    payload, rec = load_checkpoint(run_dir, role)
    if external is None:
        splits = read_split_file(run_dir / "split.csv")
        ids = [s for s, sp in splits.items() if sp == split]
        if cfg.data.max_samples_per_split:
            ids = sorted(ids)[: cfg.data.max_samples_per_split]
    else:
        ids, split = list(external.sample_ids), external.split
    if not ids:
        raise MSBError(f"{run_dir / 'split.csv'}: split '{split}' has no samples; nothing to evaluate")
    classes = ds.foreground_classes
    if external is not None:  # from here on, images and references come from the external dataset
        ds = external.dataset
    nets = checkpoint_networks(cfg, payload, lambda: build_model(cfg.model, len(classes)),
                               str(run_dir / "checkpoints" / f"{role}.pt"))  # two with evaluation.two_prediction
    device = select_device(cfg.train.device)
    for net in nets:
        net.to(device).eval()
    amp_dtype = resolve_precision(cfg.train.precision, device).autocast_dtype  # None = fp32
    cache = build_cache(ds, cfg.data.input_size, cfg.data.cache_dir, track)
    data = SegmentationDataset(cache, ids, cfg.data.normalize_mean, cfg.data.normalize_std)
    loader = torch.utils.data.DataLoader(data, batch_size=cfg.train.batch_size, shuffle=False,
                                         num_workers=cfg.data.num_workers)
    out_dir = external.out_dir if external is not None else Path(out_dir or run_dir / "evaluation" / role)
    stage: Path | None = None
    try:
        stage = staging_dir(out_dir)  # the old evaluation in out_dir stays untouched until the swap
        n = _evaluate_into(stage, run_dir, cfg, ds, role, run_id, config_hash, split, track, fold, external, ids,
                           classes, nets, device, amp_dtype, loader, rec.sha256, command)
        fault_point("evaluate.staged")
        replace_dir(stage, out_dir)
    except OSError as exc:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            here = next(p for p in (out_dir, *out_dir.parents) if p.exists())
            free = shutil.disk_usage(here).free / 2**20
            raise MSBError(f"{exc.filename or out_dir}: {exc.strerror} ({free:.0f} MiB free there) while writing the "
                           f"evaluation; the previous evaluation in {out_dir} is unchanged; free disk space and "
                           f"rerun") from None
        raise
    except BaseException:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
        raise
    fault_point("evaluate.swapped")
    metrics_path = out_dir / "metrics.parquet" if cfg.evaluation.compute_metrics else None
    return EvaluationResult(role, out_dir / "counts.parquet", out_dir / "predictions", metrics_path, n, rec.sha256)


#: Images whose prediction file and metrics wait for the writer threads, at most (and at most
#: ``_PENDING_BYTES`` of their arrays); over that the main thread runs the oldest jobs itself.
_PENDING = 256
_PENDING_BYTES = 256 * 2**20
#: Writer threads, and their ``nice`` increment: at the lowest priority they take only the time the forward
#: pass's threads leave, so the forward runs as fast as alone (measured: docs/performance.md); the main thread
#: runs the jobs left after the last batch beside them (:class:`msb.evaluation.background.BackgroundJobs`).
_WRITERS = 2
_WRITER_NICE = 19


def _evaluate_into(out_dir: Path, run_dir: Path, cfg: RunConfig, ds: PreparedDataset, role: str, run_id: str,
                   config_hash: str, split: str, track: Tracker, fold: int, external: ExternalTarget | None,
                   ids: list[str], classes: list, nets: list[torch.nn.Module], device: torch.device,
                   amp_dtype: torch.dtype | None,
                   loader: torch.utils.data.DataLoader, checkpoint_sha256: str, command: str | None = None) -> int:
    """Write the complete evaluation (predictions, counts, semantics, metrics, digests) into the empty staging
    folder ``out_dir``; return the number of images. ``nets``: the network, or the two of the run's
    ``evaluation.two_prediction`` rule (their probabilities averaged)."""
    model = nets[0]
    merge = external.merge if external is not None else None
    if merge:  # the model's classes are merged before scoring: counts and references use the merged classes
        net_class_ids, classes = [c.class_id for c in classes], list(external.merged_classes)
        net_pos = {c: j for j, c in enumerate(net_class_ids)}
        merge_idx = [[net_pos[m] for m in merge[c.class_id]] for c in classes]
    if external is not None:
        model_class_ids = [c.class_id for c in classes]
        src_class_ids = [c.class_id for c in external.dataset.foreground_classes]
    pred_dir = out_dir / "predictions"
    pred_dir.mkdir()
    thr, on = cfg.evaluation.threshold, cfg.evaluation.threshold_on
    # the counts' semantics column records min-max normalisation, so reaggregation refuses to pool it
    on_recorded = "minmax_probability" if cfg.evaluation.test_time_normalisation == "minmax" else on
    index = ds.index.set_index("sample_id")
    source_of = index["source"].to_dict() if "source" in index.columns else {}  # per-image lookups, not .loc
    context = {"dataset": external.name if external is not None else cfg.data.name, "split": split, "fold": fold, "run_id": run_id,
               "model": cfg.model.arch, "checkpoint_role": role, "checkpoint_sha256": checkpoint_sha256,
               "config_hash": config_hash, "threshold": float(thr), "threshold_on": on_recorded,
               **protocol_context(cfg, run_dir, test_time_rule_name(getattr(model, "test_time_rule", "first"), cfg),
                                  external is not None)}
    mask_paths, spacings = _sample_lookups(ds, ids)  # once, column-wise, not a pandas row per image
    per_image: list[dict[str, np.ndarray]] = []
    done_ids: list[str] = []
    heights: list[int] = []
    widths: list[int] = []
    class_ids = np.array([c.class_id for c in classes], dtype=np.int64)
    # prediction files are deflate-compressed by low-priority background threads (zlib releases the GIL),
    # overlapping the next images' forward pass; at most _PENDING files wait, and every write has finished (its
    # error raised here) before counts.parquet is written
    # the metrics table is computed from the same arrays by those threads (no read-back of the files), unless
    # legacy metrics need probability maps that are not kept (then the read-back raises its usual error)
    metrics_cfg = cfg.evaluation.metrics if cfg.evaluation.compute_metrics else None
    if metrics_cfg is not None and metrics_cfg.legacy and not cfg.evaluation.save_probabilities:
        metrics_cfg = None
    metric_rows: dict[str, list[dict[str, object]]] | None = {} if metrics_cfg is not None else None
    with BackgroundJobs(max(1, min(_WRITERS, os.cpu_count() or 1)), _WRITER_NICE, _PENDING, _PENDING_BYTES,
                        name="msb-npz") as writer:
        with torch.inference_mode():  # no autograd records at all (no_grad still keeps version counters)
            for x, _, idx in track(loader, f"evaluating {role}", len(loader)):
                with torch.autocast(device_type=device.type, dtype=amp_dtype or torch.float32,
                                    enabled=amp_dtype is not None):
                    x = x.to(device)
                    if cfg.train.channels_last:
                        x = x.contiguous(memory_format=torch.channels_last)
                    logits_small = [net.predict_logits(x) for net in nets]
                logits_small = [ls.float() for ls in logits_small]
                for k, i in enumerate(idx.tolist()):
                    sid = ids[i]
                    mpath = mask_paths[sid]
                    ref = mask_to_onehot(read_mask(mpath), ds.classes, mpath)
                    if external is not None:
                        ref = map_reference_classes(ref, src_class_ids, external.class_map, model_class_ids)
                    h, w = ref.shape[-2:]
                    per_net = [net.adjust_test_logits(  # e.g. SANet's PCS; identity by default
                        F.interpolate(ls[k: k + 1], size=(h, w), mode="bilinear", align_corners=False)[0][None])[0]
                        for net, ls in zip(nets, logits_small)]
                    prob, logits = combine_probabilities(per_net)  # one network: sigmoid(logits), logits
                    if merge:  # union of the merged classes' predictions = the max of their probabilities/logits
                        prob = torch.stack([prob[ix].amax(0) for ix in merge_idx])
                        logits = torch.stack([logits[ix].amax(0) for ix in merge_idx])
                    prob = apply_normalisation(prob, cfg.evaluation.test_time_normalisation)
                    pred = (prob >= thr) if on == "probability" else (logits >= thr)
                    pred_np = pred.cpu().numpy()
                    per_image.append(compute_confusion_counts(pred_np[None], ref[None]))
                    done_ids.append(sid)
                    heights.append(h)
                    widths.append(w)
                    prob_u8 = (np.round(prob.cpu().numpy() * 255).astype(np.uint8)
                               if cfg.evaluation.save_probabilities else None)
                    size = pred_np.nbytes + ref.nbytes + (prob_u8.nbytes if prob_u8 is not None else 0)
                    writer.submit(_write_and_score, pred_dir, sid, pred_np, ref, spacings[sid], class_ids, prob_u8,
                                  metrics_cfg, metric_rows, size=size)
                    fault_point("evaluate.prediction")
        writer.finish()
    counts = {c: np.concatenate([m[c] for m in per_image]) for c in per_image[0]}
    frame = counts_rows(context, counts, image_ids=done_ids, class_ids=class_ids,
                        class_names=[c.name for c in classes], heights=heights, widths=widths,
                        sources=[str(source_of.get(s, "") or "") for s in done_ids])
    finish_evaluation_folder(out_dir, [frame], lambda d: write_prediction_semantics(d, cfg, model),
                             cfg.evaluation.metrics if cfg.evaluation.compute_metrics else None,
                             command or evaluate_command(run_dir, role,
                                                         external.name if external is not None else None),
                             metric_rows)
    return len(ids)


def _sample_lookups(ds: PreparedDataset, ids: list[str]) -> tuple[dict[str, Path], dict[str, tuple[float, float]]]:
    """Mask path and (row, col) spacing (mm/px) of every id: the values of ``ds.mask_path`` / ``ds.spacing``,
    read from the index columns once instead of one pandas row per image. An id missing from the index is
    looked up the per-image way, which raises its usual MSBError."""
    pos = {str(s): k for k, s in enumerate(ds.index["sample_id"])}
    if any(str(s) not in pos for s in ids) or len(pos) != len(ds.index):
        return {s: ds.mask_path(s) for s in ids}, {s: ds.spacing(s) for s in ids}
    rows = [pos[str(s)] for s in ids]
    mask_col = ds.index["mask_path"].tolist()
    masks = {s: ds.root / str(mask_col[r]) for s, r in zip(ids, rows)}
    cols = [ds.index[c].tolist() if c in ds.index.columns else None for c in OPTIONAL_INDEX_COLUMNS]

    def one(v: object) -> float:  # as PreparedDataset.spacing: 1.0 where the cell is empty
        return 1.0 if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)  # type: ignore[arg-type]

    spacing = {s: tuple(1.0 if c is None else one(c[r]) for c in cols) for s, r in zip(ids, rows)}
    return masks, spacing  # type: ignore[return-value]


def _write_and_score(pred_dir: Path, sid: str, pred: np.ndarray, ref: np.ndarray, spacing: tuple[float, float],
                     class_ids: np.ndarray, prob_u8: np.ndarray | None, metrics_cfg: MetricsConfig | None,
                     rows: dict | None) -> None:
    """Background job of one image: write its prediction file, then (``rows`` not None) put its metrics rows,
    computed from the same arrays as the file holds, into ``rows[sid]``."""
    path = write_prediction_file(pred_dir, sid, pred, ref, spacing, class_ids, prob_u8, atomic=False)  # staged
    if rows is not None:
        from msb.evaluation.image_metrics import image_metric_rows

        rows[sid] = image_metric_rows(path, pred, ref, spacing, class_ids, metrics_cfg, prob_u8)

