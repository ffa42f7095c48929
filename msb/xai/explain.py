"""``msb explain``: Grad-CAM of chosen images for every run (fold) of a model and the fold average.

For each group of runs (:func:`~msb.xai.runs.group_runs`: the k folds of one cross-validation, or a single run)
and each requested image:

1. each run's checkpoint (``checkpoints/<role>.pt``, SHA-256 verified by
   :func:`msb.models.checkpoint.load_checkpoint`) is rebuilt with the run's config;
2. the image is read from the prepared dataset at ``data.root``, resized to the run's ``data.input_size`` with
   the same rule as the preprocessing cache (:func:`msb.data.cache.resize_image`) and normalised with the
   run's mean/std;
3. Grad-CAM (:func:`~msb.xai.gradcam.grad_cam`) is computed at the input size on the run's target layer(s)
   (:mod:`msb.xai.layers`) for each foreground class, targeting the predicted foreground, then resized
   bilinearly (``cv2.INTER_LINEAR``) to the image's native size and clipped to [0, 1];
4. the prediction is made as the evaluator does: test-time logits upsampled bilinearly
   (``align_corners=False``) to the native size, the model's test-time adjustment, the run's threshold;
5. the **fold average** is the pixel-wise mean of the runs' CAMs (each already in [0, 1]; not re-normalised,
   so disagreement between folds lowers the peak) and the prediction of the mean probability (mean logit for
   ``threshold_on: logit``) at the threshold.

Outputs under ``out_dir/<group>/<image_id>/`` (``<group>`` = the run folder name, without ``-fold<j>`` for folds): ``<run folder>.png`` per run and ``fold_average.png``
(when the group has more than one run), ``cams.npz`` (``cam`` float32 (K, C, H, W) per run, ``cam_fold_average``
float32 (C, H, W), ``runs`` (K,) str, ``class_ids`` int64 (C,)); and ``out_dir/explain.csv`` with one row per
image x run (or fold average) x class. Every file is written atomically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import cv2
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from msb.data.cache import resize_image
from msb.data.schema import PreparedDataset, load_prepared_dataset
from msb.data.splits import read_split_file
from msb.errors import MSBError
from msb.models.checkpoint import load_checkpoint, read_records
from msb.models.registry import build_model
from msb.utils.atomic import atomic_path
from msb.utils.device import select_device
from msb.xai.gradcam import grad_cam
from msb.xai.layers import target_layer_names
from msb.xai.overlay import render_overlay
from msb.xai.runs import ExplainRun, find_runs, group_runs

__all__ = ["ExplainOutputs", "explain", "preprocess_image", "EXPLAIN_COLUMNS"]

EXPLAIN_COLUMNS = ("model_group", "image_id", "run", "fold", "checkpoint_role", "checkpoint_sha256", "class_id",
                   "class_name", "target_layers", "target_region", "image_split", "height", "width",
                   "pred_area_px", "cam_mean", "cam_max", "png", "npz")


@dataclass
class ExplainOutputs:
    """What :func:`explain` wrote: the summary table (columns :data:`EXPLAIN_COLUMNS`), the output folder and
    every file written."""

    table: pd.DataFrame
    out_dir: Path
    paths: list[Path] = field(default_factory=list)


def preprocess_image(image: np.ndarray, size: tuple[int, int], mean: Sequence[float],
                     std: Sequence[float]) -> torch.Tensor:
    """uint8 (H, W, 3) RGB -> float32 (1, 3, h, w) at ``size`` = (h, w): :func:`~msb.data.cache.resize_image`
    then ``(x / 255 - mean) / std`` per channel (as :class:`~msb.data.torch_dataset.SegmentationDataset`)."""
    small = resize_image(image, size).astype(np.float32)
    x = (small - np.asarray(mean, np.float32) * 255.0) / (np.asarray(std, np.float32) * 255.0)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))[None]


def _default_out(runs: list[ExplainRun]) -> Path:
    if len(runs) == 1:
        return runs[0].run_dir / "explain"
    parents = {r.run_dir.resolve().parent for r in runs}
    return (parents.pop() / "explain") if len(parents) == 1 else Path("explain")


def _split_images(ids: Sequence[str]) -> list[str]:
    out: list[str] = []
    for s in ids:
        for part in str(s).replace(",", " ").split():
            if part not in out:
                out.append(part)
    return out


def _check_inputs(groups: dict[str, list[ExplainRun]], image_ids: list[str], role: str,
                  datasets: dict[str, PreparedDataset]) -> None:
    for runs in groups.values():
        for r in runs:
            recs = read_records(r.run_dir)
            if role not in recs or not (r.run_dir / recs[role].path).is_file():
                raise MSBError(f"{r.run_dir}: no '{role}' checkpoint (checkpoints/records.json); train the run "
                               f"first (msb run)" + (f" or choose --checkpoint {' or '.join(recs)}" if recs else ""))
            ds = datasets[r.config.data.root]
            missing = [i for i in image_ids if i not in set(ds.sample_ids)]
            if missing:
                raise MSBError(f"{ds.root / 'index.csv'}: no sample_id {missing[0]!r}"
                               f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; "
                               f"--images takes sample ids of the run's dataset, e.g. {', '.join(ds.sample_ids[:3])}")


def explain(paths: Sequence[str | Path], image_ids: Sequence[str], out_dir: str | Path | None = None,
            role: str = "best", target_layers: Sequence[str] = (), device: str = "auto",
            log: Callable[[str], None] = lambda m: None) -> ExplainOutputs:
    """Grad-CAM overlays for ``image_ids`` from every run named by ``paths`` and each model's fold average.

    Args:
        paths: run folders and/or study folders (:func:`~msb.xai.runs.find_runs`).
        image_ids: ``sample_id`` values of the runs' dataset (a value may hold several, comma or space separated).
        out_dir: output folder; default ``<run>/explain`` for one run, ``<study>/explain`` for runs of one study,
            else ``./explain``.
        role: checkpoint role (``best`` or ``latest``).
        target_layers: layer paths overriding the per-architecture default (:mod:`msb.xai.layers`).
        device: ``auto``, ``cpu`` or ``cuda``.

    Returns:
        :class:`ExplainOutputs`.

    Raises:
        MSBError: no image id; a missing folder or run; a missing checkpoint or one whose SHA-256 differs from
            its record; an image id not in the dataset; a target layer that does not resolve. Inputs are checked
            before anything is written.
    """
    ids = _split_images(image_ids)
    if not ids:
        raise MSBError("--images: give at least one sample_id of the run's dataset")
    if role not in ("best", "latest"):
        raise MSBError(f"--checkpoint must be best or latest, not '{role}'")
    selection = find_runs(paths)
    runs = selection.runs
    if selection.skipped_trials:
        log(f"{selection.skipped_trials} search-trial run(s) skipped: a study folder with fold runs is explained "
            f"through its folds (name a trial's folder to explain it)")
    groups = group_runs(runs)
    datasets: dict[str, PreparedDataset] = {}
    for r in runs:
        root = r.config.data.root
        if root not in datasets:
            if not (Path(root) / "index.csv").is_file():
                raise MSBError(f"{r.run_dir / 'config.yaml'}: data.root '{root}' holds no index.csv; run msb from "
                               f"the folder the study was run from, or prepare the dataset there")
            datasets[root] = load_prepared_dataset(root, check_files=False)
    _check_inputs(groups, ids, role, datasets)
    dev = select_device(device)
    out = Path(out_dir) if out_dir is not None else _default_out(runs)
    rows: list[dict] = []
    written: list[Path] = []
    for gkey, gruns in groups.items():
        ds = datasets[gruns[0].config.data.root]
        classes = ds.foreground_classes
        names = [c.name for c in classes]
        class_ids = np.array([c.class_id for c in classes], dtype=np.int64)
        images = {i: ds.load_image(i) for i in ids}
        refs = {i: ds.load_onehot(i) for i in ids}
        per_image: dict[str, list[dict]] = {i: [] for i in ids}
        for r in gruns:
            cfg = r.config
            payload, rec = load_checkpoint(r.run_dir, role)
            model = build_model(cfg.model, len(classes))
            model.load_state_dict(payload["model"])
            model.to(dev).eval()
            split_path = r.run_dir / "split.csv"
            splits = read_split_file(split_path) if split_path.is_file() else pd.Series(dtype=str)
            layers: tuple[str, ...] | None = None
            thr, on = cfg.evaluation.threshold, cfg.evaluation.threshold_on
            fold_txt = f"fold {r.fold}" if r.fold is not None else "not a fold run"
            for i in ids:
                img = images[i]
                h, w = img.shape[:2]
                x = preprocess_image(img, tuple(cfg.data.input_size), cfg.data.normalize_mean,
                                     cfg.data.normalize_std).to(dev)
                if layers is None:
                    layers = target_layer_names(cfg.model.arch, model, x, len(classes), tuple(target_layers))
                    log(f"[{r.run_dir.name}] {fold_txt}, '{role}' checkpoint, Grad-CAM on {', '.join(layers)}")
                res = grad_cam(model, x, layers, threshold=thr, threshold_on=on)
                cam = np.stack([np.clip(cv2.resize(c, (w, h), interpolation=cv2.INTER_LINEAR), 0.0, 1.0)
                                for c in res.cam]).astype(np.float32)
                with torch.no_grad():
                    logits = F.interpolate(torch.from_numpy(res.logits)[None], size=(h, w), mode="bilinear",
                                           align_corners=False)
                    if hasattr(model, "adjust_test_logits"):
                        logits = model.adjust_test_logits(logits.to(dev)).cpu()
                    logits = logits[0].float()
                    prob = torch.sigmoid(logits)
                    norm = getattr(cfg.evaluation, "test_time_normalisation", "none")
                    if norm != "none":
                        from msb.evaluation.postprocess import apply_normalisation

                        prob = apply_normalisation(prob, norm)
                score = (prob if on == "probability" else logits).numpy()
                per_image[i].append({"run": r.run_dir.name, "fold": r.fold, "sha": rec.sha256, "cam": cam,
                                     "score": score, "pred": score >= thr, "region": res.region,
                                     "split": str(splits.get(i, "unused")), "layers": layers})
            del model
        for i in ids:
            entries = per_image[i]
            folder = out / gkey / i
            h, w = images[i].shape[:2]
            cams = np.stack([e["cam"] for e in entries])
            avg = cams.mean(axis=0).astype(np.float32)
            npz = folder / "cams.npz"
            targets = list(entries)
            if len(entries) > 1:
                thr = gruns[0].config.evaluation.threshold
                score = np.mean([e["score"] for e in entries], axis=0)
                targets.append({"run": "fold_average", "fold": None, "sha": "", "cam": avg, "pred": score >= thr,
                                "region": ["mean of the runs"] * len(names), "split": "",
                                "layers": entries[0]["layers"]})
            for e in targets:
                fold_txt = "" if e["fold"] is None else f", fold {e['fold']}"
                group_txt = "" if gkey in e["run"] else f"{gkey} | "  # the run id already names its group
                title = (f"{group_txt}{i} | {e['run']}{fold_txt} | {role} checkpoint | Grad-CAM on "
                         f"{', '.join(e['layers'])}")
                png = render_overlay(images[i], e["pred"], e["cam"], folder / f"{e['run']}.png", title, names,
                                     refs[i])
                written.append(png)
                for c, name in enumerate(names):
                    rows.append({"model_group": gkey, "image_id": i, "run": e["run"],
                                 "fold": -1 if e["fold"] is None else int(e["fold"]), "checkpoint_role": role,
                                 "checkpoint_sha256": e["sha"], "class_id": int(class_ids[c]), "class_name": name,
                                 "target_layers": ", ".join(e["layers"]), "target_region": e["region"][c],
                                 "image_split": e["split"], "height": h, "width": w,
                                 "pred_area_px": int(e["pred"][c].sum()), "cam_mean": float(e["cam"][c].mean()),
                                 "cam_max": float(e["cam"][c].max()), "png": str(png), "npz": str(npz)})
            with atomic_path(npz) as tmp:
                np.savez_compressed(tmp, cam=cams, cam_fold_average=avg,
                                    runs=np.array([e["run"] for e in entries]), class_ids=class_ids)
            written.append(npz)
    table = pd.DataFrame.from_records(rows, columns=list(EXPLAIN_COLUMNS))
    csv = out / "explain.csv"
    with atomic_path(csv) as tmp:
        table.to_csv(tmp, index=False)
    written.append(csv)
    return ExplainOutputs(table, out, written)
