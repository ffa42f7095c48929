"""Training strategies behind one interface (:class:`~msb.engine.strategies.base.Strategy`):
``supervised`` (default), ``mean_teacher``, ``cps``; :func:`build_strategy` picks one from ``train.strategy``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch.utils.data import Dataset

from msb.engine.strategies.base import Strategy, SupervisedStrategy
from msb.engine.strategies.cps import CrossPseudoSupervision
from msb.engine.strategies.mean_teacher import MeanTeacher

if TYPE_CHECKING:
    from msb.engine.trainer import Trainer

__all__ = ["Strategy", "build_strategy"]


def build_strategy(trainer: "Trainer", unlabelled: Dataset | None = None) -> Strategy:
    """The strategy of ``trainer.cfg.train.strategy.name``; ``unlabelled``: the images-only dataset of the
    unlabelled pool (needed by ``mean_teacher`` and ``cps``, see :class:`~msb.engine.strategies.semi.SemiSupervised`
    for the errors raised)."""
    name = trainer.cfg.train.strategy.name
    if name == "mean_teacher":
        return MeanTeacher(trainer, unlabelled)
    if name == "cps":
        return CrossPseudoSupervision(trainer, unlabelled)
    return SupervisedStrategy(trainer)
