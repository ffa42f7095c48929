"""``msb score PRED_DIR``: score a folder of external predictions into run-folder artifacts.

Predictions that ``msb`` did not make (an author's released maps, another framework's outputs) are scored
against a prepared dataset exactly as ``msb evaluate`` scores a model: the same count rows
(:func:`msb.evaluation.counts.counts_rows`), the same prediction files and folder sealing
(:mod:`msb.evaluation.artifacts`), the same metrics table. Each (model, dataset) becomes one run folder

``<out>/<model>-<dataset>/``: ``config.yaml`` + ``config.sha256`` (a run config recording the dataset, the model
label and the declared semantics), ``split.csv`` (when every scored sample has a train/val/test split),
``manifest.json`` (source folder, SHA-256 of every input file), and ``evaluation/scored/`` with
``counts.parquet``, ``predictions/<sample_id>.npz``, ``metrics.parquet``, ``prediction_semantics.json``,
``score.json`` (missing samples, inputs), ``digests.json`` and ``DONE``,

so ``msb reaggregate``, ``msb metrics``, ``msb report``, populations and significance read them unchanged.

Layouts: ``flat`` = ``PRED_DIR/<name>.<ext>`` for one model and one dataset; ``pranet`` = the result folders
the PraNet template publishes, ``PRED_DIR/<model>/<dataset>/<name>.png``, one run folder per pair, with the
dataset folder names given by ``--dataset NAME=PREPARED``.

The stored ``prob`` is the input map as read, quantised to uint8 (an 8-bit PNG is kept bit for bit, otherwise
``round(255 p)``), before any min-max step: the legacy metrics apply the PraNet template's own min-max to it.
The folder is written into a staging folder and swapped in whole; ``DONE`` (the inputs' SHA-256) comes last.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from msb.config.metrics_schema import MetricsConfig
from msb.data.readers import mask_to_onehot, read_mask
from msb.data.schema import PreparedDataset, load_prepared_dataset
from msb.errors import MSBError
from msb.evaluation.artifacts import finish_evaluation_folder, write_prediction_file
from msb.evaluation.counts import compute_confusion_counts, counts_rows
from msb.evaluation.score_io import (Semantics, list_prediction_files, match_files, read_prediction, resize_map,
                                     to_probability)
from msb.utils.atomic import atomic_write_text, replace_dir, staging_dir
from msb.utils.hashing import sha256_file, sha256_json
from msb.utils.progress import Tracker, no_track

__all__ = ["SCORED_ROLE", "ScoreTarget", "ScoreResult", "find_targets", "score_target"]

#: The ``checkpoint_role`` (and evaluation folder name) of scored external predictions.
SCORED_ROLE = "scored"
_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class ScoreTarget:
    """One prediction folder to score: the model label, the dataset label and prepared dataset, the folder."""

    model: str
    dataset_name: str
    dataset: PreparedDataset
    pred_dir: Path


@dataclass
class ScoreResult:
    """What :func:`score_target` wrote: run folder, evaluation folder, images scored, samples without a file."""

    run_dir: Path
    eval_dir: Path
    n_images: int
    missing: list[str] = field(default_factory=list)


def _parse_dataset(spec: str) -> tuple[str | None, Path]:
    name, sep, path = spec.partition("=")
    return (name, Path(path)) if sep and name and "/" not in name else (None, Path(spec))


def find_targets(pred_dir: Path, datasets: list[str], layout: str, model: str | None = None) -> list[ScoreTarget]:
    """The (model, dataset) folders to score.

    Args:
        pred_dir: ``PRED_DIR``.
        datasets: ``--dataset`` values, ``PREPARED`` or ``NAME=PREPARED`` (prepared-dataset folders).
        layout: ``flat`` (one folder, one dataset; model label ``model`` or the folder name) or ``pranet``
            (``PRED_DIR/<model>/<NAME>/``; every model folder holding a given NAME is scored, ``model``
            restricts it to one).

    Raises:
        MSBError: no dataset; a flat layout with several datasets; a pranet layout without names, or a model
            or dataset folder that is missing (named); a prepared dataset that does not load.
    """
    pred_dir = Path(pred_dir)
    if not pred_dir.is_dir():
        raise MSBError(f"{pred_dir}: prediction folder not found")
    if not datasets:
        raise MSBError("msb score needs --dataset PREPARED (or NAME=PREPARED, repeatable with --layout pranet)")
    specs = [_parse_dataset(d) for d in datasets]
    loaded = [(name or path.name, load_prepared_dataset(path, check_files=False)) for name, path in specs]
    if layout == "flat":
        if len(loaded) != 1:
            raise MSBError("--layout flat scores one dataset; give one --dataset, or use --layout pranet for "
                           "PRED_DIR/<model>/<dataset>/ folders")
        name, ds = loaded[0]
        return [ScoreTarget(model or pred_dir.name, name, ds, pred_dir)]
    if layout != "pranet":
        raise MSBError(f"--layout must be flat or pranet, not {layout!r}")
    if any(name is None for name, _ in specs):
        raise MSBError("--layout pranet needs --dataset NAME=PREPARED, NAME being the dataset folder name under "
                       "each model folder (e.g. --dataset Kvasir=datasets/kvasir_seg)")
    models = sorted(p.name for p in pred_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    if model is not None:
        if model not in models:
            raise MSBError(f"{pred_dir / model}: model folder not found (found: {', '.join(models) or 'none'})")
        models = [model]
    targets = [ScoreTarget(m, name, ds, pred_dir / m / name) for m in models for name, ds in loaded
               if (pred_dir / m / name).is_dir()]
    for name, _ in loaded:
        if not any(t.dataset_name == name for t in targets):
            raise MSBError(f"{pred_dir}: no model folder has a '{name}' dataset folder (PRED_DIR/<model>/{name}/)")
    return targets


def _samples(ds: PreparedDataset, split: str | None, split_file: Path | None) -> tuple[list[str], dict[str, str]]:
    """(sample ids to score in index order, ``{sample_id: split}`` for ``split.csv``)."""
    if split_file is not None:
        from msb.data.splits import read_split_file

        splits = {str(k): str(v) for k, v in read_split_file(split_file, ds.sample_ids).items()}
    else:
        splits = {str(s): str(v) for s, v in zip(ds.index["sample_id"], ds.index["split"])}
    ids = [s for s in ds.sample_ids if split is None or splits.get(s) == split]
    if not ids:
        where = split_file if split_file is not None else ds.root / "index.csv"
        raise MSBError(f"{where}: split '{split}' has no samples of {ds.root}; nothing to score")
    return ids, {s: splits.get(s, "") for s in ids}


def _run_config(t: ScoreTarget, sem: Semantics, metrics: MetricsConfig, split: str | None, out_root: Path):
    from msb.config.schema import DataConfig, EvaluationConfig, ModelConfig, RunConfig

    ev = EvaluationConfig(split=split or "all", threshold=sem.threshold, threshold_on="probability",
                          test_time_normalisation="minmax" if sem.minmax else "none", metrics=metrics)
    return RunConfig(study=out_root.name, run_root=str(out_root.parent),
                     data=DataConfig(name=t.dataset_name, root=str(t.dataset.root)),
                     model=ModelConfig(arch=t.model), evaluation=ev)


def score_target(t: ScoreTarget, sem: Semantics, out_root: Path, *, split: str | None = None,
                 split_file: Path | None = None, id_rule: str = "stem", allow_missing: bool = False,
                 metrics: MetricsConfig | None = None, force: bool = False, command: str = "msb score",
                 track: Tracker = no_track) -> ScoreResult:
    """Score one prediction folder into ``out_root/<model>-<dataset>/`` (module docstring).

    Args:
        t: the target (:func:`find_targets`); sem: the declared semantics.
        out_root: the study folder receiving the run folder.
        split: score only the samples of this split (``index.csv``, or ``split_file``); None: every sample.
        split_file: a ``sample_id,split`` file (e.g. a run's ``split.csv``) instead of ``index.csv``'s split.
        id_rule: file name -> sample rule (:data:`msb.evaluation.score_io.ID_RULES`).
        allow_missing: score a sample without a file as an empty prediction (listed in ``score.json`` and the
            result) instead of refusing.
        metrics: settings of ``metrics.parquet`` (default :class:`MetricsConfig`); ``legacy=True`` adds the
            PraNet-template columns.
        force: replace an existing scored run folder (else refused).
        command: the command line recorded in ``digests.json`` as what regenerates the folder.

    Returns:
        :class:`ScoreResult`.

    Raises:
        MSBError: missing (without ``allow_missing``) or extra prediction files, a wrongly sized, non-binary or
            out-of-range prediction, unreadable files, an existing run folder without ``force``. Each message
            names the file; nothing is left half-written.
    """
    metrics = metrics or MetricsConfig()
    ds = t.dataset
    ids, splits = _samples(ds, split, split_file)
    files = list_prediction_files(t.pred_dir)
    matched, missing, extra = match_files(files, ds, ids, id_rule)
    if extra:
        names = ", ".join(p.name for p in extra[:5]) + (f", ... ({len(extra)} in all)" if len(extra) > 5 else "")
        raise MSBError(f"{extra[0]}: {len(extra)} prediction file(s) match no sample of split "
                       f"'{split or 'all'}' of {ds.root} under --id-rule {id_rule} ({names}); remove them or fix "
                       f"--split / --id-rule")
    if missing and not allow_missing:
        shown = ", ".join(missing[:5]) + (f", ... ({len(missing)} in all)" if len(missing) > 5 else "")
        raise MSBError(f"{t.pred_dir}: no prediction file for {len(missing)} of {len(ids)} sample(s) ({shown}); "
                       f"add them, or pass --allow-missing to score them as empty predictions")
    run_id = _SAFE.sub("_", f"{t.model}-{t.dataset_name}")
    run_dir = Path(out_root) / run_id
    if run_dir.exists() and not force:
        raise MSBError(f"{run_dir}: already exists; pass --force to replace it, or choose another --out")
    cfg = _run_config(t, sem, metrics, split, Path(out_root))
    from msb.config.generate import config_hash, run_config_to_yaml

    chash = config_hash(cfg)
    inputs = {p.name: sha256_file(p) for p in sorted(matched.values())}
    inputs_sha = sha256_json(inputs)
    classes = ds.foreground_classes
    class_ids = np.array([c.class_id for c in classes], dtype=np.int64)
    context = {"dataset": t.dataset_name, "split": split or "all", "fold": -1, "run_id": run_id,
               "model": t.model, "checkpoint_role": SCORED_ROLE, "checkpoint_sha256": inputs_sha,
               "config_hash": chash, "threshold": float(sem.threshold),
               "threshold_on": "minmax_probability" if sem.minmax else "probability"}
    Path(out_root).mkdir(parents=True, exist_ok=True)
    stage = staging_dir(run_dir)
    try:
        eval_dir = stage / "evaluation" / SCORED_ROLE
        (eval_dir / "predictions").mkdir(parents=True)
        frames = []
        for sid in track(ids, f"scoring {run_id}", len(ids)):
            frames.append(_score_one(sid, ds, matched.get(sid), sem, context, classes, class_ids, eval_dir))
        semantics = {"source": "external predictions (msb score)", "prediction_dir": str(Path(t.pred_dir).resolve()),
                     **sem.as_dict(), "id_rule": id_rule, "threshold_on": context["threshold_on"],
                     "upsampling": {"none": "none: maps must be at the native image size",
                                    "nearest": "nearest to the native image size",
                                    "bilinear": "bilinear, align_corners=False, to the native image size"}[sem.resize],
                     "prob_encoding": "uint8: an 8-bit map as read (bit for bit), else round(255 p), p = value / scale; "
                                      "before min-max", "missing_as_empty": list(missing)}

        def _write_semantics(d: Path) -> Path:
            atomic_write_text(d / "prediction_semantics.json", json.dumps(semantics, indent=2))
            atomic_write_text(d / "score.json", json.dumps({"inputs": inputs, "inputs_sha256": inputs_sha,
                                                            "missing": list(missing), "command": command}, indent=2))
            return d / "prediction_semantics.json"

        finish_evaluation_folder(eval_dir, frames, _write_semantics, metrics, command)
        atomic_write_text(stage / "config.yaml", run_config_to_yaml(cfg))
        atomic_write_text(stage / "config.sha256", chash + "\n")
        if all(v in ("train", "val", "test") for v in splits.values()):
            atomic_write_text(stage / "split.csv", "sample_id,split\n" + "".join(f"{s},{v}\n" for s, v in splits.items()))
        atomic_write_text(stage / "manifest.json", json.dumps(
            {"kind": "scored external predictions", "config_hash": chash, "prediction_dir": semantics["prediction_dir"],
             "inputs_sha256": inputs_sha, "n_inputs": len(inputs), "dataset_root": str(ds.root)}, indent=2))
        atomic_write_text(eval_dir / "DONE", inputs_sha)
        replace_dir(stage, run_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return ScoreResult(run_dir, run_dir / "evaluation" / SCORED_ROLE, len(ids), list(missing))


def _score_one(sid: str, ds: PreparedDataset, path: Path | None, sem: Semantics, context: dict, classes: list,
               class_ids: np.ndarray, eval_dir: Path):
    """Count rows of one sample; writes its prediction file."""
    mpath = ds.mask_path(sid)
    ref = mask_to_onehot(read_mask(mpath), ds.classes, mpath)
    h, w = ref.shape[-2:]
    if path is None:  # --allow-missing: an empty prediction
        p = np.zeros(ref.shape, dtype=np.float64)
        prob_u8 = np.zeros(ref.shape, dtype=np.uint8)
    else:
        raw = read_prediction(path, len(classes))
        p = resize_map(to_probability(raw, path, sem), (h, w), path, sem)
        keep_raw = raw.dtype == np.uint8 and raw.shape[-2:] == (h, w) and sem.kind == "probability" \
            and sem.scale in ("auto", "255", "255.0")
        prob_u8 = raw if keep_raw else np.rint(p * 255.0).astype(np.uint8)
    if sem.minmax:
        lo, hi = p.min(axis=(-2, -1), keepdims=True), p.max(axis=(-2, -1), keepdims=True)
        p = (p - lo) / (hi - lo + 1e-8)
    pred = p >= sem.threshold
    counts = compute_confusion_counts(pred[None], ref[None])
    row = ds.row(sid)
    write_prediction_file(eval_dir / "predictions", sid, pred, ref, ds.spacing(sid), class_ids, prob_u8)
    return counts_rows(context, counts, image_ids=[sid], class_ids=class_ids, class_names=[c.name for c in classes],
                       heights=h, widths=w, sources=str(row.get("source", "") or ""))
