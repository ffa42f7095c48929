"""One run folder: train (or resume) it, evaluate its checkpoints, write its manifest.

Each run lives in ``<run_root>/<study>/<run_id>/``. This module knows nothing of studies (search, folds,
ensembles: :mod:`msb.study.pipeline` drives those and calls in here). Every step is resumable: a run whose
resume state says ``finished`` is not trained again, an evaluation whose ``DONE`` marker holds the same
checkpoint SHA-256 is not repeated, and a half-finished training continues from its last finished epoch.
"""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from msb.config.generate import GeneratedRun, write_run_config
from msb.config.schema import RunConfig
from msb.data.cache import build_cache
from msb.data.prepare import ensure_dataset
from msb.data.schema import PreparedDataset
from msb.data.splits import read_split_file, resolve_splits, write_split_file
from msb.data.torch_dataset import SegmentationDataset, UnlabelledImageDataset, build_augmentation
from msb.data.verify import verify_files
from msb.engine import distributed
from msb.engine.budget import BUDGET_FILE, effective_config, plan_budget, write_budget
from msb.engine.determinism import seed_everything
from msb.engine.trainer import Trainer, TrainResult
from msb.errors import MSBError
from msb.models.checkpoint import read_records
from msb.models.registry import build_model
from msb.utils.atomic import atomic_write_text
from msb.data.converters.provenance import prepare_digest
from msb.utils.hashing import sha256_file
from msb.utils.io_errors import write_guard
from msb.utils.progress import Logger, Tracker, no_log, no_track

__all__ = ["RunOutcome", "ensure_split", "train_run", "evaluate_run", "write_manifest", "study_dir", "run_fold",
           "checkpoint_roles", "follow_train", "build_trainer"]


@dataclass
class RunOutcome:
    """What one run of a study produced."""

    run_id: str
    run_dir: Path
    train: TrainResult | None = None
    counts_paths: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def study_dir(cfg: RunConfig) -> Path:
    """``<run_root>/<study>``."""
    return Path(cfg.run_root) / cfg.study


def checkpoint_roles(cfg: RunConfig) -> list[str]:
    """Checkpoint roles to evaluate: ``evaluation.checkpoint`` (``both`` = ``["best", "latest"]``)."""
    c = cfg.evaluation.checkpoint
    return ["best", "latest"] if c == "both" else [c]


def ensure_split(cfg: RunConfig, ds: PreparedDataset, run_dir: Path) -> pd.Series:
    """Return the run's split (``sample_id`` -> split), writing ``split.csv`` on first use and reusing it on
    resume so a continued run never sees a different split."""
    path = run_dir / "split.csv"
    if path.is_file():
        return read_split_file(path)
    s = cfg.data.split
    splits = resolve_splits(ds.index, s.mode, s.val_fraction, s.test_fraction, s.seed, s.group_column)
    with write_guard(path, "split file"):
        write_split_file(path, splits)
    return splits


def _ids(splits: pd.Series, name: str, limit: int | None) -> list[str]:
    ids = sorted(str(k) for k, v in splits.items() if v == name)
    return ids[:limit] if limit else ids


def _versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for pkg in ("msb", "torch", "torchvision", "segmentation-models-pytorch", "timm", "numpy", "albumentations"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def write_manifest(run_dir: Path, run: GeneratedRun, device: str, extra: dict[str, Any] | None = None) -> None:
    """``manifest.json``: binds results to config hash, split-file hash (and ``labelled_sha256`` of
    ``labelled.csv`` in semi-supervised runs), ``prepare_sha256`` (the dataset's ``prepare.json``, None
    without), checkpoint SHA-256s, package versions and device; ``training`` =
    ``train_runtime.json`` (resolved precision, processes, global and per-process batch:
    :func:`msb.engine.acceleration.runtime_record`) when the run was trained by this version; ``extra`` keys
    (e.g. ``fold``, ``folds_sha256`` of a study fold run) are added."""
    records = read_records(run_dir)
    runtime = run_dir / "train_runtime.json"
    split_path = run_dir / "split.csv"
    manifest: dict[str, Any] = {
        "run_id": run.run_id, "study": run.config.study, "config_hash": run.config_hash,
        "split_sha256": sha256_file(split_path) if split_path.is_file() else None,
        "checkpoints": {k: {"sha256": v.sha256, "epoch": v.epoch, "epoch_base": v.epoch_base, "metric": v.metric,
                            "value": v.value, "selection_split": v.selection_split} for k, v in records.items()},
        "versions": _versions(), "device": device, "platform": platform.platform(),
    }
    manifest["prepare_sha256"] = prepare_digest(run.config.data.root)  # how the dataset was made (prepare.json)
    if (run_dir / "labelled.csv").is_file():  # semi-supervised runs only: other manifests are unchanged
        manifest["labelled_sha256"] = sha256_file(run_dir / "labelled.csv")
    if runtime.is_file():
        manifest["training"] = json.loads(runtime.read_text())
    if (run_dir / "pool.csv").is_file():  # pool-contrast runs only
        manifest["pool"] = {"name": run.config.data.pool.name if run.config.data.pool else None,
                            "sha256": sha256_file(run_dir / "pool.csv"),
                            "n_rows": (run_dir / "pool.csv").read_text(encoding="utf-8").count("\n") - 1}
    if (run_dir / BUDGET_FILE).is_file():  # train.budget runs only: epochs run and optimizer steps taken
        manifest["budget"] = json.loads((run_dir / BUDGET_FILE).read_text())
    manifest.update(extra or {})
    atomic_write_text(run_dir / "manifest.json", json.dumps(manifest, indent=2))


def train_run(run: GeneratedRun, run_dir: Path, ds: PreparedDataset, track: Tracker = no_track,
              log: Logger = no_log, stop_after_epoch: int | None = None,
              on_epoch_end: Callable[[dict[str, Any]], bool | None] | None = None) -> TrainResult:
    """Train (or resume) one run in ``run_dir``. ``on_epoch_end``: see :meth:`Trainer.fit` (Hyperband
    reporting/pruning).

    Before the first epoch every image and mask file of the dataset (all splits: the cache holds them all) is
    decoded from the source and its mask values checked against ``classes.csv`` at native resolution
    (:func:`msb.data.verify.verify_files`; files that passed before and did not change are skipped).

    Raises:
        MSBError: an empty train/selection split; with ``data.require_audit``, a required audit check that fails
            across the run's split (:class:`msb.errors.AuditFailed`, before any epoch); a bad data file (naming the file, the bad value and its pixel
            count); a diverged training (naming the epoch and step); a full or failing disk (naming the file and
            the free space; the last saved epoch is kept).

    Leftovers of writes interrupted by a kill (``.latest.pt.*``, ``.train_state.pt.*``, staging folders) are
    removed first (:func:`msb.utils.interrupted.clean_interrupted_writes`).
    """
    from msb.utils.interrupted import clean_interrupted_writes

    cfg = run.config
    if run_dir.is_dir():
        clean_interrupted_writes(run_dir, log)
    with write_guard(run_dir / "config.yaml", "run config"):
        write_run_config(run, run_dir)
    splits = ensure_split(cfg, ds, run_dir)
    lim = cfg.data.max_samples_per_split
    train_ids = _ids(splits, "train", lim)
    val_ids = _ids(splits, cfg.checkpoint.selection_split, lim)
    for name, ids in (("train", train_ids), (cfg.checkpoint.selection_split, val_ids)):
        if not ids:
            raise MSBError(f"{run_dir / 'split.csv'}: split '{name}' is empty; change data.split fractions")
    if cfg.data.require_audit:  # a clean audit across this run's split before any training (msb.audit.gate)
        from msb.audit.gate import require_clean_audit

        require_clean_audit(ds.root, run_dir / "split.csv", cfg.data.require_audit, study_dir(cfg) / "audits",
                            log=lambda m: log(f"[{run.run_id}] {m}"))
    checked = verify_files(ds, None, cfg.data.cache_dir, track)
    if checked:
        log(f"[{run.run_id}] checked {checked} image/mask file(s) of '{ds.name}' at native resolution: OK")
    cache = build_cache(ds, cfg.data.input_size, cfg.data.cache_dir, track)
    if cfg.data.pool is not None:  # pool-contrast study: train on the pool's rows of the training split
        from msb.data.pools import ensure_pool

        train_ids = ensure_pool(cfg.data.pool, ds, run_dir, train_ids)
        log(f"[{run.run_id}] training pool '{cfg.data.pool.name}' ({cfg.data.pool.kind}, pool.csv): "
            f"{len(train_ids)} training images")
    unlabelled_ids: list[str] = []
    if cfg.data.labelled_policy:  # semi-supervised protocol: only the labelled subset trains with masks
        from msb.data.labelled import labelled_train_ids

        all_train, train_ids = train_ids, labelled_train_ids(cfg, run_dir, ds, cache, train_ids)
        if cfg.train.strategy.name != "supervised":  # the unlabelled pool: training split minus labelled.csv
            labelled = set(train_ids)
            unlabelled_ids = [s for s in all_train if s not in labelled]
        log(f"[{run.run_id}] labelled subset (labelled.csv): {len(train_ids)} training images with masks"
            + (f", {len(unlabelled_ids)} unlabelled images ({cfg.train.strategy.name})" if unlabelled_ids else ""))
    ctx = distributed.current()
    if ctx is not None:  # DDP: the other ranks train this run with us (msb.engine.distributed)
        distributed.send_work(ctx, {"op": "train", "run": run, "run_dir": str(run_dir), "ds": ds,
                                    "stop_after_epoch": stop_after_epoch})
    trainer = build_trainer(run, run_dir, ds, cache, train_ids, val_ids, track, log, ctx, unlabelled_ids)
    log(f"[{run.run_id}] training {cfg.model.arch} on {len(train_ids)} images "
        f"(selection on {len(val_ids)} '{cfg.checkpoint.selection_split}' images), device {trainer.device}"
        + (f", {ctx.world_size} DDP process{'es' if ctx.world_size > 1 else ''} ({ctx.backend}), global batch "
           f"{cfg.train.batch_size}" if ctx else ""))
    result = trainer.fit(stop_after_epoch=stop_after_epoch, on_epoch_end=on_epoch_end)
    if cfg.train.budget is not None:  # budget.json: the plan, the epochs run and the optimizer steps taken
        write_budget(run_dir, plan_budget(cfg, len(train_ids)), result.epochs_done)  # type: ignore[arg-type]
    return result


def follow_train(order: dict[str, Any]) -> TrainResult:
    """A rank > 0 of a DDP job: train the run of rank 0's work ``order`` (:func:`train_run` sent it after
    writing the split file and the cache; this rank only reads them and writes nothing)."""
    run, run_dir, ds = order["run"], Path(order["run_dir"]), order["ds"]
    cfg = run.config
    splits = read_split_file(run_dir / "split.csv")
    lim = cfg.data.max_samples_per_split
    cache = build_cache(ds, cfg.data.input_size, cfg.data.cache_dir, no_track)
    train_ids = _ids(splits, "train", lim)
    if cfg.data.pool is not None:  # rank 0 wrote pool.csv before sending the work
        from msb.data.pools import POOL_FILE, read_pool_file

        train_ids = read_pool_file(run_dir / POOL_FILE, train_ids)
    if cfg.data.labelled_policy:  # rank 0 wrote labelled.csv before sending the work: read, never drawn again
        from msb.data.labelled import labelled_train_ids

        train_ids = labelled_train_ids(cfg, run_dir, ds, cache, train_ids)
    trainer = build_trainer(run, run_dir, ds, cache, train_ids,
                            _ids(splits, cfg.checkpoint.selection_split, lim), no_track, no_log,
                            distributed.current())
    return trainer.fit(stop_after_epoch=order["stop_after_epoch"])


def build_trainer(run: GeneratedRun, run_dir: Path, ds: PreparedDataset, cache: Any, train_ids: list[str],
             val_ids: list[str], track: Tracker, log: Logger, ctx: distributed.DistContext | None,
             unlabelled_ids: list[str] | None = None) -> Trainer:
    """The datasets, the seeded initial model and the :class:`Trainer` of one run (the same on every rank); with
    ``train.budget`` the trainer runs the plan's epochs (:mod:`msb.engine.budget`); ``unlabelled_ids``: the
    unlabelled pool of a ``mean_teacher``/``cps`` run (images only, with their own copy of the training
    augmentation)."""
    plan = plan_budget(run.config, len(train_ids))
    cfg = effective_config(run.config, plan)
    a = cfg.train.augment
    aug = build_augmentation(a.hflip, a.vflip, a.rotate90 if cfg.data.input_size[0] == cfg.data.input_size[1] else 0,
                             a.brightness_contrast, seed=cfg.random_seed)
    train_ds = SegmentationDataset(cache, train_ids, cfg.data.normalize_mean, cfg.data.normalize_std, aug)
    val_ds = SegmentationDataset(cache, val_ids, cfg.data.normalize_mean, cfg.data.normalize_std)
    unl_ds = None
    if unlabelled_ids:
        unl_aug = build_augmentation(a.hflip, a.vflip, a.rotate90 if cfg.data.input_size[0] == cfg.data.input_size[1]
                                     else 0, a.brightness_contrast, seed=cfg.random_seed)
        unl_ds = UnlabelledImageDataset(cache, unlabelled_ids, cfg.data.normalize_mean, cfg.data.normalize_std, unl_aug)
    seed_everything(cfg.random_seed)  # the initial weights depend on the run seed only
    model = build_model(cfg.model, len(ds.foreground_classes))
    trainer = Trainer(cfg, run_dir, model, train_ds, val_ds, run.config_hash, track, log, dist=ctx,
                      unlabelled_ds=unl_ds)
    if plan is not None and plan.unit == "steps":
        trainer.last_epoch_batches = plan.last_epoch_batches
        if ctx is None or ctx.is_main:
            write_budget(run_dir, plan)
    return trainer


def run_fold(run_dir: Path) -> int:
    """Cross-validation fold of a run folder: ``fold`` of its ``fold.json`` (written by :mod:`msb.study`),
    -1 when the run is not a fold run."""
    path = Path(run_dir) / "fold.json"
    return int(json.loads(path.read_text())["fold"]) if path.is_file() else -1


def evaluate_run(run_dir: Path, roles: list[str], ds: PreparedDataset | None = None, track: Tracker = no_track,
                 log: Logger = no_log, force: bool = False) -> list[Path]:
    """Evaluate checkpoints ``roles`` of a trained run folder (reads ``config.yaml``; skips a role whose
    counts already exist for the same checkpoint SHA-256 unless ``force``). Returns the counts paths.

    Leftovers of interrupted writes in the run folder are removed first
    (:func:`msb.utils.interrupted.clean_interrupted_writes`). Each evaluation is written into a staging folder and
    swapped in whole (:func:`msb.evaluation.evaluator.evaluate_checkpoint`); ``DONE`` is written after the swap,
    so ``--force`` keeps the old complete evaluation until the new one is complete.

    Raises:
        MSBError: not a run folder; a checkpoint file whose record is gone (``records.json`` deleted); a
            finished evaluation with files missing (:func:`msb.utils.evaluation_folder.check_done_folder`); see
            :func:`~msb.evaluation.evaluator.evaluate_checkpoint`.
    """
    from msb.evaluation.evaluator import evaluate_checkpoint
    from msb.config.layering import load_yaml
    from msb.utils.evaluation_folder import check_done_folder, unrecorded_checkpoint_error
    from msb.utils.interrupted import clean_interrupted_writes

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not run_dir.is_dir():
        raise MSBError(f"{run_dir}: no such folder; give a run folder runs/<study>/<run_id>")
    if not cfg_path.is_file():
        raise MSBError(f"{run_dir}: not a run folder (no config.yaml); give runs/<study>/<run_id>")
    clean_interrupted_writes(run_dir, log)
    cfg = RunConfig.model_validate(load_yaml(cfg_path))
    config_hash = (run_dir / "config.sha256").read_text().strip()
    ds = ds or ensure_dataset(cfg, log)
    records = read_records(run_dir)
    out = []
    for role in roles:
        eval_dir = run_dir / "evaluation" / role
        counts = eval_dir / "counts.parquet"
        done = eval_dir / "DONE"
        err = unrecorded_checkpoint_error(run_dir, role, records)
        if err is not None:
            raise err
        if not force and done.is_file() and role in records and done.read_text().strip() == records[role].sha256:
            check_done_folder(eval_dir)
            log(f"[{run_dir.name}] evaluation of '{role}' already done, skipped")
            out.append(counts)
            continue
        res = evaluate_checkpoint(run_dir, cfg, ds, role, run_dir.name, config_hash, track=track,
                                  fold=run_fold(run_dir))
        atomic_write_text(done, res.checkpoint_sha256)  # DONE last, after the new folder is in place
        log(f"[{run_dir.name}] evaluated '{role}' on {res.n_images} '{cfg.evaluation.split}' images -> {res.counts_path}")
        out.append(res.counts_path)
    return out
