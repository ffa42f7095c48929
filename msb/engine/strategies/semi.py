"""The epoch loop shared by the semi-supervised strategies (mean teacher, CPS).

One epoch = ``train.strategy.iterations_per_epoch`` iterations (default ``ceil(n_labelled / batch_size)``). Each
iteration takes ``train.batch_size`` labelled images (image + mask, ``train.augment``) and
``unlabelled_ratio · batch_size`` unlabelled images (images only, :class:`~msb.data.torch_dataset.UnlabelledImageDataset`:
no mask key exists), asks the strategy for the loss (:meth:`SemiSupervised.loss`), backpropagates once, clips
and steps every network's optimizer, then calls :meth:`SemiSupervised.after_step` (the EMA update) and counts
the iteration (the ramp-up position, saved in the resume state).

Order of the images: a seeded epoch order (``torch.randperm`` from the epoch seed; the labelled order from
``seed``, the unlabelled from ``seed + 2``), repeated as often as needed to fill the epoch's iterations; every
draw has its own augmentation seed (:func:`~msb.engine.sampling.sample_seed` of the draw position), so the
epoch depends on (run seed, epoch) only and a resumed run repeats it exactly. Photometric draws of the strong
view come from a generator seeded with ``seed + 1``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from msb.engine.losses import multi_output_loss
from msb.engine.sampling import sample_seed
from msb.engine.strategies.base import Strategy, TrainerView
from msb.errors import MSBError

__all__ = ["SemiSupervised", "SupervisedIterations", "epoch_draws"]


def epoch_draws(n: int, per_iteration: int, iterations: int, seed: int) -> list[list[tuple[int, int]]]:
    """The batches of one epoch: ``iterations`` lists of ``per_iteration`` ``(index, augmentation seed)`` pairs.

    Indices 0..n-1 in seeded random orders (``torch.randperm(n)`` from ``Generator().manual_seed(seed)``,
    concatenated until long enough); the k-th draw of the epoch gets the seed ``sample_seed(seed, k)``.

    Raises:
        MSBError: ``n`` is 0.
    """
    if n <= 0:
        raise MSBError("train.strategy: the unlabelled or labelled pool is empty; check data.labelled_fraction "
                       "(a fraction of 1 leaves no unlabelled image)")
    g = torch.Generator().manual_seed(seed)
    need = per_iteration * iterations
    order: list[int] = []
    while len(order) < need:
        order += torch.randperm(n, generator=g).tolist()
    return [[(order[k], sample_seed(seed, k)) for k in range(j * per_iteration, (j + 1) * per_iteration)]
            for j in range(iterations)]


class SemiSupervised(Strategy):
    """Base of the strategies that train on labelled and unlabelled images (module docstring).

    Args:
        trainer: the trainer; unlabelled: the images-only dataset of the unlabelled pool.

    Raises:
        MSBError: no unlabelled images; DDP; ``train.multiscale`` (not supported with these strategies).
    """

    own_loop = True
    #: False: labelled batches only (``supervised`` with ``iterations_per_epoch``, :class:`SupervisedIterations`)
    needs_unlabelled = True

    def __init__(self, trainer: TrainerView, unlabelled: Dataset | None) -> None:
        super().__init__(trainer)
        cfg = trainer.cfg
        self.s = cfg.train.strategy
        where = f"{trainer.run_dir}: train.strategy.name {self.s.name!r}"
        if trainer.dist is not None:
            raise MSBError(f"{where} runs in one process only; run without torchrun / --nproc-per-node")
        if cfg.train.multiscale is not None:
            raise MSBError(f"{where} does not support train.multiscale; remove train.multiscale")
        if self.needs_unlabelled and (unlabelled is None or len(unlabelled) == 0):
            raise MSBError(f"{where} needs unlabelled training images (the training split minus labelled.csv); "
                           f"lower data.labelled_fraction below 1")
        self.unlabelled = unlabelled
        self.iteration = 0  # optimizer steps done over the whole run: the ramp-up position

    # --- what a strategy defines ---------------------------------------------------------------------------
    def trained(self) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
        """(network, optimizer) pairs stepped every iteration."""
        raise NotImplementedError

    def loss(self, x: torch.Tensor, y: torch.Tensor, xu: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """The scalar loss of one iteration: ``x`` (N, 3, H, W), ``y`` (N, C, H, W) labelled; ``xu`` (M, 3, H, W)
        unlabelled images only; ``gen`` seeded CPU generator for the strong view."""
        raise NotImplementedError

    def after_step(self) -> None:
        """Called after every optimizer step (mean teacher: the EMA update)."""

    # --- the loop ------------------------------------------------------------------------------------------
    def iterations(self) -> int:
        """Iterations of one epoch (``iterations_per_epoch`` or ``ceil(n_labelled / batch_size)``)."""
        return self.s.iterations_per_epoch or math.ceil(len(self.trainer.train_ds) / self.trainer.cfg.train.batch_size)

    def train_epoch(self, epoch: int, seed: int) -> tuple[float, int]:
        """One epoch of mixed batches (module docstring); returns (mean loss per iteration, images seen)."""
        t, cfg = self.trainer, self.trainer.cfg
        bs, iters, workers = cfg.train.batch_size, self.iterations(), cfg.data.num_workers
        lab = DataLoader(t.train_ds, batch_sampler=epoch_draws(len(t.train_ds), bs, iters, seed),
                         num_workers=workers)
        unl = (DataLoader(self.unlabelled, batch_sampler=epoch_draws(len(self.unlabelled), bs * self.s.unlabelled_ratio,
                                                                    iters, seed + 2), num_workers=workers)
               if self.needs_unlabelled else [None] * iters)
        for net, _ in self.trained():
            net.train()
        gen = torch.Generator().manual_seed(seed + 1)
        total, seen = 0.0, 0
        t.steps_done = 0
        for step, ((x, y, _), u) in enumerate(t.track(zip(lab, unl), f"epoch {epoch}/{cfg.train.epochs}", iters),
                                               start=1):
            x, y = x.to(t.device), y.to(t.device)
            x, y = t.model.train_batch_transform(x, y, gen, cfg.data.normalize_mean, cfg.data.normalize_std)
            xu = u["image"].to(t.device) if u is not None else None
            for _, opt in self.trained():
                opt.zero_grad(set_to_none=True)
            with t.precision.context(t.device):
                loss = self.loss(t._fmt(x), y, t._fmt(xu) if xu is not None else None, gen)
            loss_value = float(loss.detach())
            t.scaler.scale(loss).backward()
            self._step(epoch, step, iters, loss_value)
            self.after_step()
            self.iteration += 1
            total += loss_value
            seen += x.shape[0] + (xu.shape[0] if xu is not None else 0)
            t.steps_done = step
        return total / max(iters, 1), seen

    def _step(self, epoch: int, step: int, steps: int, loss_value: float) -> None:
        """Clip (per network, ``train.grad_clip``) and step every optimizer; a non-finite loss or gradient stops
        training without AMP (one line naming the epoch and step), with the fp16 scaler the scaler skips it."""
        t = self.trainer
        clip = t.cfg.train.grad_clip
        norms = []
        for net, opt in self.trained():
            if t.use_amp:
                t.scaler.unscale_(opt)
            if clip.mode == "norm" and clip.max > 0:
                norms.append(torch.nn.utils.clip_grad_norm_(net.parameters(), clip.max))
            else:
                grads = [p.grad for p in net.parameters() if p.grad is not None]
                norms.append(torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(()))
                if clip.mode == "value" and clip.max > 0:
                    torch.nn.utils.clip_grad_value_(net.parameters(), clip.max)
        bad = [float(n) for n in norms if not bool(torch.isfinite(n))]
        if not t.use_amp and (not math.isfinite(loss_value) or bad):
            what = (f"the training loss is {loss_value}" if not math.isfinite(loss_value) else
                    f"the gradient norm is {bad[0]}")
            raise t._diverged(epoch, step, steps, what)
        for _, opt in self.trained():
            t.scaler.step(opt)
        t.scaler.update()

    # --- resume --------------------------------------------------------------------------------------------
    def strategy_state(self) -> dict[str, Any]:
        """What a subclass adds to the resume state beside the iteration count."""
        return {}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`strategy_state`."""

    def resume_state(self) -> dict[str, Any]:
        """``{"strategy": {"name", "iteration", ...networks and optimizers}}`` for the resume state."""
        return {"strategy": {"name": self.name, "iteration": self.iteration, **self.strategy_state()}}

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Restore the iteration count (ramp-up position) and the strategy's networks and optimizers.

        Raises:
            MSBError: the resume state was written by another strategy (or none)."""
        saved = state.get("strategy")
        if not saved or saved.get("name") != self.name:
            raise MSBError(f"{self.trainer.run_dir / 'state' / 'train_state.pt'}: written by strategy "
                           f"{(saved or {}).get('name', 'supervised')!r}, not {self.name!r}; use a new run folder")
        self.iteration = int(saved["iteration"])
        self.load_strategy_state(saved)


class SupervisedIterations(SemiSupervised):
    """``supervised`` with a declared ``iterations_per_epoch``: the same epochs of mixed-batch methods (same
    labelled draws, same optimizer steps per epoch), labelled images only, no unlabelled image read. Without
    ``iterations_per_epoch`` ``supervised`` is the trainer's own loop (:class:`~msb.engine.strategies.base.SupervisedStrategy`)."""

    name = "supervised"
    needs_unlabelled = False

    def trained(self) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
        return [(self.trainer.model, self.trainer.optimizer)]

    def loss(self, x: torch.Tensor, y: torch.Tensor, xu: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor:
        cfg, net = self.trainer.cfg, self.trainer.model
        return multi_output_loss([o.float() for o in net(x)], y, cfg.train.loss.name, cfg.train.loss.bce_weighting)
