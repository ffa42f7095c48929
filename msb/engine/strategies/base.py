"""The training-strategy interface of the trainer, and ``supervised`` (the default).

A strategy tells the :class:`~msb.engine.trainer.Trainer` which networks it trains and checkpoints, which
networks make the prediction that is validated (the declared two-prediction rule), how one epoch is trained,
and what it adds to the resume state. ``supervised`` trains with the trainer's own loop (labelled images only),
bit-identical to runs made before strategies existed; the semi-supervised strategies
(:mod:`msb.engine.strategies.semi`) run their own loop of declared iterations over mixed batches. Strategies
never import the trainer, not even for type hints: they receive it and see it through :class:`TrainerView`, the
part of the trainer they use, so the import graph stays one-way (``trainer -> strategies``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

import torch
from torch import nn

__all__ = ["Strategy", "SupervisedStrategy", "TrainerView"]


class TrainerView(Protocol):
    """What a strategy reads and calls on the trainer that owns it (:class:`msb.engine.trainer.Trainer` satisfies
    it structurally; the strategies never import that module).

    Attributes:
        cfg: the run config (:class:`msb.config.schema.RunConfig`).
        model: the main network (``nn.Module``), checkpointed as ``model``.
        device: the ``torch.device`` it trains on.
        optimizer: the main network's optimizer.
        scaler: the AMP ``GradScaler`` (disabled on CPU / bf16).
        precision: the resolved precision (its ``context(device)`` is the autocast context).
        dist: the DDP context, or None on one process.
        run_dir: the run folder (``Path``), named in error messages.
        train_ds: the labelled training dataset (its ``len`` sets the epoch length).
        steps_done: batches of the current epoch done (named by a divergence error).
        track: the progress wrapper ``track(iterable, description, total)``.
    """

    cfg: Any
    model: nn.Module
    device: torch.device
    optimizer: torch.optim.Optimizer
    scaler: Any
    precision: Any
    dist: Any
    run_dir: Path
    train_ds: Any
    steps_done: int
    track: Callable[[Iterable[Any], str, int], Iterator[Any]]

    def model_num_classes(self) -> int:
        """Output maps of the network (one per class, background excluded for binary)."""

    def _fmt(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` in the trainer's memory format (channels-last when enabled)."""


class Strategy:
    """Base class: one network, the trainer's own epoch loop (see module docstring).

    Args:
        trainer: the trainer this strategy belongs to (its ``cfg``, ``model``, ``device``, ``optimizer``, ...).
    """

    name = "supervised"
    #: True: the trainer calls :meth:`train_epoch`; False: the trainer's own (supervised) loop runs
    own_loop = False

    def __init__(self, trainer: TrainerView) -> None:
        self.trainer = trainer

    def networks(self) -> dict[str, nn.Module]:
        """Checkpointed networks by checkpoint key (``model`` = the main network, read by the evaluator)."""
        return {"model": self.trainer.model}

    def eval_networks(self) -> list[nn.Module]:
        """The networks whose probabilities are averaged into the validated prediction (one for supervised)."""
        return [self.trainer.model]

    def train_epoch(self, epoch: int, seed: int) -> tuple[float, int]:
        """Train one epoch (1-based ``epoch``, epoch seed ``seed``); returns (mean loss, images seen)."""
        raise NotImplementedError

    def scheduler_step(self) -> None:
        """Step the schedules of networks beyond the trainer's own (none here)."""

    def checkpoint_extra(self) -> dict[str, Any]:
        """Keys added to each checkpoint file beside ``model`` (none here: files are as before)."""
        return {}

    def resume_state(self) -> dict[str, Any]:
        """Keys added to the resume state (none here: the state file is as before)."""
        return {}

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`resume_state` saved (``state`` = the whole resume state)."""


class SupervisedStrategy(Strategy):
    """``train.strategy.name: supervised``: the labelled images only, the trainer's own loop."""
