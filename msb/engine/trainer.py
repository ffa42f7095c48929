"""The resumable trainer.

One epoch = shuffle (seeded by :func:`~msb.engine.determinism.epoch_seed`), the model's
``train_batch_transform`` (e.g. SANet colour exchange), multi-scale copies of the batch (``train.multiscale``,
:mod:`msb.engine.multiscale`; one optimizer step per rate or one accumulated step), forward, loss summed over all
outputs (deep supervision), backward, gradient clipping, optimizer step; then validation on the selection
split at the training resolution (image-macro Dice/IoU of ``sigmoid(logits) >= threshold``), scheduler step,
checkpointing and early stopping. At the end of every epoch the full resume state (model, optimizer,
scheduler, AMP scaler, early-stopping state, best value, RNG states, history) is written atomically, so an
interrupted run continues from the last finished epoch; with ``full_determinism`` on CPU the resumed run ends
with bitwise the same weights as an uninterrupted one. Precision (``train.precision``), the DDP wrapper, the
training DataLoader and the out-of-memory line come from :mod:`msb.engine.acceleration` (docs/training.md).

Epochs are 1-based wherever they are stored or shown (epoch k = after k finished epochs; :mod:`msb.utils.epochs`):
``train_log.csv``, the console, ``checkpoints/records.json`` and the checkpoint files, the resume state
(``epoch`` = epochs finished, ``best.epoch``, history rows) and :class:`TrainResult`. Only the loop index that
seeds each epoch (:func:`~msb.engine.determinism.epoch_seed`) is 0-based, and it never leaves the loop.
"""

from __future__ import annotations

import csv
import io
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from msb.config.schema import RunConfig
from msb.data.torch_dataset import SegmentationDataset
from msb.models.checkpoint import load_state, reconcile_records, save_checkpoint, save_state
from msb.engine.acceleration import (apply_cudnn_settings, oom_error, prepare_network, runtime_record, train_loader,
                                     write_runtime)
from msb.engine.distributed import DistContext
from msb.engine.determinism import epoch_seed, get_rng_state, seed_everything, set_full_determinism, set_rng_state
from msb.engine.losses import multi_output_loss
from msb.engine.multiscale import scaled_batches
from msb.engine.optim import build_optimizer, build_scheduler
from msb.engine.strategies import build_strategy
from msb.models.two_prediction import combine_probabilities
from msb.evaluation.counts import compute_confusion_counts
from msb.errors import MSBError
from msb.evaluation.postprocess import apply_normalisation
from msb.models.base import Segmentor
from msb.utils.atomic import atomic_write_text
from msb.utils.device import select_device
from msb.utils.fault_points import fault_point
from msb.utils.precision import resolve_precision
from msb.utils.epochs import EPOCH_BASE, EPOCH_BASE_KEY
from msb.utils.io_errors import write_guard
from msb.utils.progress import Tracker, no_track

__all__ = ["Trainer", "TrainResult", "build_optimizer", "build_scheduler"]


@dataclass
class TrainResult:
    """Outcome of :meth:`Trainer.fit`.

    Attributes:
        epochs_done: epochs finished (= the 1-based epoch of the last finished one).
        best_epoch: 1-based epoch of the best checkpoint (the ``epoch`` of its ``train_log.csv`` row; 0 when no
            epoch has a finite selection value yet).
        best_value: its selection value (``±inf`` when none yet).
        stopped_early, finished: early stopping fired; training is complete (not interrupted).
        history: one dict per finished epoch, the rows of ``train_log.csv`` (``epoch`` 1-based).
    """

    epochs_done: int
    best_epoch: int
    best_value: float
    stopped_early: bool
    finished: bool
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Train one run folder's model (see module docstring).

    Args:
        cfg: the run config.
        run_dir: the run folder (checkpoints/, state/, train_log.csv are written there).
        model: a :class:`Segmentor`.
        train_ds, val_ds: datasets of the training and selection splits.
        config_hash: stored in each checkpoint.
        track: progress wrapper ``track(iterable, description, total)``.
        log: receives one summary line per epoch.
        dist: this process of a DDP job (:mod:`msb.engine.distributed`); None = a single process. Under DDP
            ``train.batch_size`` is the global batch, only rank 0 writes files, and every rank resumes from the
            same resume state.
        unlabelled_ds: images-only dataset of the unlabelled pool (``train.strategy`` ``mean_teacher``/``cps``,
            :mod:`msb.engine.strategies`); ``supervised`` (the default) never reads it.
    """

    def __init__(self, cfg: RunConfig, run_dir: Path, model: Segmentor, train_ds: SegmentationDataset,
                 val_ds: SegmentationDataset, config_hash: str = "", track: Tracker = no_track,
                 log: Callable[[str], None] = lambda _m: None, dist: DistContext | None = None,
                 unlabelled_ds: Dataset | None = None) -> None:
        self.cfg, self.run_dir, self.model, self.log = cfg, Path(run_dir), model, log
        self.train_ds, self.val_ds, self.config_hash, self.track = train_ds, val_ds, config_hash, track
        self.dist, self.is_main = dist, dist is None or dist.is_main
        self.device = select_device(cfg.train.device)
        if dist is not None:
            self.device = dist.device(self.device)
        self.precision = resolve_precision(cfg.train.precision, self.device)
        self.use_amp = self.precision.use_scaler  # the fp16 GradScaler is active
        self.model.to(self.device)
        self.net = prepare_network(self.model, cfg, self.device, dist)  # what the training step calls
        self.loader = None  # the training DataLoader, kept across epochs with train.persistent_workers
        self.data_wait_s = 0.0  # seconds of the last epoch spent waiting for the DataLoader
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.use_amp)
        self.maximize = cfg.checkpoint.metric != "loss"
        # consecutive optimizer steps with a non-finite loss or skipped by the fp16 scaler (AMP only)
        self.nonfinite_streak = 0
        self.steps_done = 0  # batches of the current epoch done (named by a divergence error)
        self.last_epoch_batches: int | None = None  # train.budget steps: batches of the last epoch (budget.py)
        self.strategy = build_strategy(self, unlabelled_ds)  # supervised: this class's own loop, unchanged

    def _fmt(self, x: torch.Tensor) -> torch.Tensor:
        """The model input in the configured memory format (``train.channels_last``)."""
        return x.contiguous(memory_format=torch.channels_last) if self.cfg.train.channels_last else x

    # --- one epoch -------------------------------------------------------------------------------------
    def _train_epoch(self, epoch: int, seed: int) -> tuple[float, int]:
        """Train one epoch (``epoch`` 1-based, shown in the progress bar); returns (mean loss, images seen)."""
        if self.strategy.own_loop:  # mean teacher, CPS: mixed batches over declared iterations
            return self.strategy.train_epoch(epoch, seed)
        cfg = self.cfg
        self.train_ds.set_epoch_seed(seed)
        self.steps_done = 0
        loader = train_loader(self.train_ds, cfg, self.device, seed, self.dist, self.loader)
        if cfg.train.persistent_workers and cfg.data.num_workers > 0:
            self.loader = loader
        world = self.dist.world_size if self.dist is not None else 1
        self.model.train()
        clip = cfg.train.grad_clip
        total, seen, counted = 0.0, 0, 0
        # batch-level draws (multi-scale rate, the model's train_batch_transform) from their own generator
        aug_gen = torch.Generator().manual_seed(seed + 1)
        ms = cfg.train.multiscale
        step_each = ms is None or ms.step_per_rate
        self.data_wait_s, t_wait = 0.0, time.perf_counter()
        for step, (x, y, _) in enumerate(self.track(loader, f"epoch {epoch}/{cfg.train.epochs}", len(loader)),
                                         start=1):
            if self.last_epoch_batches is not None and epoch == cfg.train.epochs and step > self.last_epoch_batches:
                break
            self.data_wait_s += time.perf_counter() - t_wait
            # DDP: scale this rank's mean loss so that the gradient average equals the global batch's mean loss
            n_step = loader.batch_sampler.global_sizes[step - 1] if world > 1 else x.shape[0]  # images in the step
            share = x.shape[0] * world / n_step
            x = x.to(self.device, non_blocking=True)
            y = y.to(self.device, non_blocking=True)
            x, y = self.model.train_batch_transform(x, y, aug_gen, cfg.data.normalize_mean, cfg.data.normalize_std)
            scaled = scaled_batches(x, y, ms, aug_gen)
            batch_loss = 0.0
            bad_loss: float | None = None  # the first non-finite loss of the current optimizer step
            for i, (xs, ys) in enumerate(scaled):
                if step_each or i == 0:
                    self.optimizer.zero_grad(set_to_none=True)
                    bad_loss = None
                with self.precision.context(self.device):
                    outputs = self.net(self._fmt(xs))
                loss = multi_output_loss([o.float() for o in outputs], ys, cfg.train.loss.name,
                                         cfg.train.loss.bce_weighting)
                if world > 1:
                    loss = loss * share
                    total_loss = loss.detach().clone()
                    torch.distributed.all_reduce(total_loss)  # the global batch's loss, the same on every rank
                    loss_value = float(total_loss) / world
                else:
                    loss_value = float(loss.detach())
                if not math.isfinite(loss_value) and bad_loss is None:
                    bad_loss = loss_value
                self.scaler.scale(loss).backward()
                if not (step_each or i == len(scaled) - 1):
                    batch_loss += loss_value / len(scaled)
                    continue
                grad_norm = None
                if clip.mode != "none" and clip.max > 0:
                    self.scaler.unscale_(self.optimizer)
                    if clip.mode == "norm":
                        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip.max)
                    else:
                        if not self.use_amp:
                            grad_norm = self._grad_norm()
                        torch.nn.utils.clip_grad_value_(self.model.parameters(), clip.max)
                elif not self.use_amp:
                    grad_norm = self._grad_norm()
                self._optimizer_step(epoch, step, len(loader), bad_loss, grad_norm)
                batch_loss += loss_value / len(scaled)
            if math.isfinite(batch_loss):  # a step the fp16 scaler skipped within the patience is not averaged
                total += batch_loss * n_step
                counted += n_step
            seen += n_step
            self.steps_done = step
            t_wait = time.perf_counter()
        return total / max(counted, 1), seen

    def _grad_norm(self) -> torch.Tensor:
        """Total L2 norm of the current gradients (read only; used to detect non-finite gradients)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())

    def _optimizer_step(self, epoch: int, step: int, steps: int, bad_loss: float | None,
                        grad_norm: torch.Tensor | None) -> None:
        """Take the optimizer step (through the AMP scaler) unless the loss or the gradients are non-finite.

        Without AMP the first non-finite loss or gradient stops training; with the fp16 GradScaler a step it
        skips (gradient overflow) or a non-finite loss counts towards ``train.nonfinite_patience`` consecutive
        steps, one more stops training. Finite steps are taken exactly as before (same operations, same order).

        Raises:
            MSBError: one line naming the run folder, the epoch and the step (1-based batch of the epoch).
        """
        if not self.use_amp:
            if bad_loss is None and (grad_norm is None or bool(torch.isfinite(grad_norm))):
                self.scaler.step(self.optimizer)
                self.scaler.update()
                return
            what = (f"the training loss is {bad_loss}" if bad_loss is not None else
                    f"the gradient norm is {float(grad_norm)}")
            raise self._diverged(epoch, step, steps, what)
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        skipped = self.scaler.get_scale() < before
        if not skipped and bad_loss is None:
            self.nonfinite_streak = 0
            return
        self.nonfinite_streak += 1
        patience = self.cfg.train.nonfinite_patience
        if self.nonfinite_streak > patience:
            what = (f"the training loss is {bad_loss}" if bad_loss is not None else
                    "the fp16 gradients overflowed (GradScaler skipped the step)")
            raise self._diverged(epoch, step, steps, f"{what}, {self.nonfinite_streak} non-finite step(s) in a row "
                                                     f"(train.nonfinite_patience {patience})")

    def _diverged(self, epoch: int, step: int, steps: int, what: str) -> MSBError:
        """The one-line error of a diverged run (nothing of the current epoch has been saved)."""
        return MSBError(f"{self.run_dir}: training diverged at epoch {epoch} step {step} of {steps}: {what}; nothing "
                        f"of epoch {epoch} was saved; lower train.optimizer.lr (now {self.cfg.train.optimizer.lr}) "
                        f"or clip gradients (train.grad_clip) and rerun")

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Loss and image-macro Dice/IoU on the selection split at training resolution.

        Images whose reference and prediction are both empty have undefined Dice/IoU and are excluded
        (the same rule as ``msb reaggregate``); if every image is excluded the value is NaN. Semi-supervised
        strategies validate the prediction of ``evaluation.two_prediction`` (the loss: the mean over its networks)."""
        nets = self.strategy.eval_networks()
        for net in nets:
            net.eval()
        loader = DataLoader(self.val_ds, batch_size=self.cfg.train.batch_size, shuffle=False,
                            num_workers=self.cfg.data.num_workers)
        thr, on = self.cfg.evaluation.threshold, self.cfg.evaluation.threshold_on
        losses, tps, fps, fns = [], [], [], []
        for x, y, _ in loader:
            x, y = x.to(self.device), y.to(self.device)
            per_net, net_losses = [], []
            for net in nets:
                with self.precision.context(self.device):
                    outputs = net(self._fmt(x))
                outputs = [o.float() for o in outputs]
                net_losses.append(float(multi_output_loss(outputs, y, self.cfg.train.loss.name,
                                                          self.cfg.train.loss.bce_weighting)))
                per_net.append(net.adjust_test_logits(net.combine(outputs, tuple(y.shape[-2:]))))
            losses.append(sum(net_losses) / len(net_losses) * x.shape[0])
            prob, logits = combine_probabilities(per_net)
            prob = apply_normalisation(prob, self.cfg.evaluation.test_time_normalisation)
            pred = (prob >= thr) if on == "probability" else (logits >= thr)
            c = compute_confusion_counts(pred.cpu().numpy(), y.cpu().numpy() > 0.5)
            tps.append(c["tp"]), fps.append(c["fp"]), fns.append(c["fn"])
        tp, fp, fn = (np.concatenate(a).astype(np.float64) for a in (tps, fps, fns))
        with np.errstate(invalid="ignore", divide="ignore"):
            dice = np.where(tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), np.nan)
            iou = np.where(tp + fp + fn > 0, tp / (tp + fp + fn), np.nan)

        def macro(v: np.ndarray) -> float:
            per_class = [np.nanmean(col) if np.isfinite(col).any() else np.nan for col in v.T]
            return float(np.nanmean(per_class)) if np.isfinite(per_class).any() else float("nan")

        return {"val_loss": sum(losses) / max(len(self.val_ds), 1), "val_dice": macro(dice), "val_iou": macro(iou)}

    # --- state -----------------------------------------------------------------------------------------
    def _state(self, epoch: int, best: dict[str, Any], early: dict[str, Any], history: list[dict[str, Any]],
               finished: bool) -> dict[str, Any]:
        """The resume state after 1-based ``epoch`` (= epochs finished). Once training has ``finished`` it is only
        the record of the finished training (epoch, best, early stopping, history: a few kB) unless
        ``checkpoint.keep_resume_state`` is set: nothing resumes a finished run, its weights are in the checkpoints,
        and the full state (weights, optimizer moments) would be the largest file of the run folder. It replaces
        the full state through :func:`save_state` (digest first, atomic), so a kill at any point leaves either
        state and a rerun resumes or skips correctly."""
        if finished and not self.cfg.checkpoint.keep_resume_state:
            return {"epoch": epoch, EPOCH_BASE_KEY: EPOCH_BASE, "best": best, "early_stopping": early,
                    "history": history, "finished": True, "config_hash": self.config_hash,
                    "nonfinite_streak": self.nonfinite_streak, "released": True}
        return {
            "epoch": epoch, EPOCH_BASE_KEY: EPOCH_BASE, "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(), "best": best,
            "early_stopping": early, "rng": get_rng_state(), "history": history, "finished": finished,
            "config_hash": self.config_hash, "nonfinite_streak": self.nonfinite_streak,
            **self.strategy.resume_state(),  # mean teacher / CPS: the other network, its optimizer, the iteration
        }

    def _save_checkpoint(self, role: str, epoch: int, value: float) -> None:
        """Write checkpoint ``role`` after 1-based ``epoch`` (rank 0 only under DDP)."""
        if self.is_main:
            save_checkpoint(self.run_dir, role, self._ckpt_payload(epoch), epoch, self.cfg.checkpoint.selection_split,
                            self.cfg.checkpoint.metric, value)

    def _write_log(self, history: list[dict[str, Any]]) -> None:
        """Write ``train_log.csv`` atomically (a disk-full error is one line; the previous log is kept)."""
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(history[0]))
        w.writeheader()
        w.writerows(history)
        with write_guard(self.run_dir / "train_log.csv", "training log"):
            atomic_write_text(self.run_dir / "train_log.csv", buf.getvalue())

    def _ckpt_payload(self, epoch: int) -> dict[str, Any]:
        """Checkpoint file contents after 1-based ``epoch``."""
        return {"model": self.model.state_dict(), "epoch": epoch, EPOCH_BASE_KEY: EPOCH_BASE,
                "arch": self.cfg.model.arch, "num_classes": self.model_num_classes(), "config_hash": self.config_hash,
                **self.strategy.checkpoint_extra()}  # mean teacher: "teacher"; CPS: "model_b"

    def model_num_classes(self) -> int:
        """Number of output channels, read from the training masks."""
        return int(self.train_ds.masks.shape[1])

    # --- main loop -------------------------------------------------------------------------------------
    def fit(self, stop_after_epoch: int | None = None,
            on_epoch_end: Callable[[dict[str, Any]], bool | None] | None = None) -> TrainResult:
        """Train until ``train.epochs`` (or early stopping), resuming from ``state/train_state.pt``.

        Args:
            stop_after_epoch: stop (as if interrupted) once this many epochs are done; for tests.
            on_epoch_end: called with the epoch's ``train_log.csv`` row (a copy) after the resume state of
                each newly trained epoch is saved; returning True stops training there as if interrupted
                (``finished=False``; used for Hyperband pruning by :mod:`msb.study`).
        """
        cfg = self.cfg
        set_full_determinism(cfg.full_determinism)
        cudnn_benchmark = apply_cudnn_settings(cfg)
        # best["epoch"]: 1-based epoch of the best checkpoint, 0 = none yet
        best: dict[str, Any] = {"value": -math.inf if self.maximize else math.inf, "epoch": 0}
        early: dict[str, Any] = {"bad_epochs": 0, "stopped": False}
        history: list[dict[str, Any]] = []
        start = 0
        state = None
        if self.is_main:  # rank 0 repairs interrupted writes first; then every rank reads the same state
            reconcile_records(self.run_dir)  # finish or drop a checkpoint record interrupted by a kill
            state = load_state(self.run_dir)
            write_runtime(self.run_dir, runtime_record(cfg, self.device, self.precision, self.dist, cudnn_benchmark))
        if self.dist is not None:
            self.dist.barrier()
            if not self.is_main:
                state = load_state(self.run_dir)
        if state is not None and state.get("finished"):  # nothing to resume (the state may hold no weights)
            self.log("training already finished, skipped")
            best, early = state["best"], state["early_stopping"]
            return TrainResult(int(state["epoch"]), best["epoch"], best["value"], early["stopped"], True,
                               list(state["history"]))
        if state is not None:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
            set_rng_state(state["rng"])
            best, early, history = state["best"], state["early_stopping"], state["history"]
            self.nonfinite_streak = int(state.get("nonfinite_streak", 0))
            self.strategy.load_resume_state(state)
            start = int(state["epoch"])  # epochs finished (load_state converts old 0-based states)
            self.log(f"resuming from epoch {start + 1} (state/train_state.pt)")
        metric_key = {"dice": "val_dice", "iou": "val_iou", "loss": "val_loss"}[cfg.checkpoint.metric]
        save_roles = set(cfg.checkpoint.save)
        epoch = start  # 1-based number of the last finished epoch
        for index in range(start, cfg.train.epochs):
            epoch = index + 1
            seed = epoch_seed(cfg.random_seed, index)  # 0-based index: the seeds of older runs are unchanged
            seed_everything(seed)
            t0 = time.perf_counter()
            try:
                train_loss, seen = self._train_epoch(epoch, seed)
                train_s = time.perf_counter() - t0
                val = self.validate() if self.is_main else None
            except torch.OutOfMemoryError:
                raise oom_error(cfg, self.run_dir, self.precision.name, self.dist.world_size if self.dist else 1,
                                f"epoch {epoch}") from None
            if self.dist is not None:
                val = self.dist.broadcast(val)  # validated on rank 0; every rank takes the same decisions
            if not math.isfinite(val["val_loss"]):
                raise self._diverged(epoch, self.steps_done, self.steps_done,
                                     f"the validation loss on '{cfg.checkpoint.selection_split}' after that step is "
                                     f"{val['val_loss']} (non-finite predictions)")
            lr = self.optimizer.param_groups[0]["lr"]
            self.scheduler.step()
            self.strategy.scheduler_step()
            value = val[metric_key]
            improved = np.isfinite(value) and (
                value > best["value"] + (cfg.train.early_stopping.min_delta if cfg.train.early_stopping else 0)
                if self.maximize else
                value < best["value"] - (cfg.train.early_stopping.min_delta if cfg.train.early_stopping else 0))
            if improved:
                best = {"value": float(value), "epoch": epoch}
                early["bad_epochs"] = 0
                if "best" in save_roles:
                    self._save_checkpoint("best", epoch, value)
            else:
                early["bad_epochs"] += 1
            if "latest" in save_roles:
                self._save_checkpoint("latest", epoch, value)
            history.append({"epoch": epoch, "train_loss": round(train_loss, 6),
                            "val_loss": round(val["val_loss"], 6), "val_dice": round(val["val_dice"], 6),
                            "val_iou": round(val["val_iou"], 6), "lr": lr, "train_seconds": round(train_s, 3),
                            "train_images_per_s": round(seen / train_s, 2) if train_s > 0 else 0.0})
            if cfg.train.early_stopping and early["bad_epochs"] >= cfg.train.early_stopping.patience:
                early["stopped"] = True
            finished = early["stopped"] or epoch >= cfg.train.epochs
            if finished and best["epoch"] < EPOCH_BASE and "best" in save_roles:
                # no finite selection value in any epoch (e.g. an all-empty validation split): fall back to last
                best = {"value": float(value), "epoch": epoch}
                self._save_checkpoint("best", epoch, value)
            h = history[-1]
            self.log(f"epoch {h['epoch']}/{cfg.train.epochs}: train_loss {h['train_loss']:.4f}  "
                     f"val_loss {h['val_loss']:.4f}  val_dice {h['val_dice']:.4f}  "
                     f"({h['train_images_per_s']:.1f} img/s){'  *best*' if best['epoch'] == epoch else ''}")
            if self.is_main:
                self._write_log(history)
                save_state(self.run_dir, self._state(epoch, best, early, history, finished))
            stop = bool(on_epoch_end(dict(h))) if on_epoch_end is not None else False
            if self.dist is not None:
                stop = bool(self.dist.broadcast(stop))  # also the barrier after rank 0 saved the epoch
                fault_point(f"ddp.rank{self.dist.rank}.epoch_saved")
            if finished:
                break
            if stop or (stop_after_epoch is not None and epoch >= stop_after_epoch):
                return TrainResult(epoch, best["epoch"], best["value"], False, False, history)
        return TrainResult(epoch, best["epoch"], best["value"], early["stopped"], True, history)
