"""Training strategies behind one interface (:class:`~msb.engine.strategies.base.Strategy`):
``supervised`` (default), ``mean_teacher``, ``cps``; :func:`build_strategy` picks one from ``train.strategy``."""

from __future__ import annotations


from torch.utils.data import Dataset

from msb.engine.strategies.base import Strategy, SupervisedStrategy, TrainerView
from msb.engine.strategies.cps import CrossPseudoSupervision
from msb.engine.strategies.mean_teacher import MeanTeacher
from msb.engine.strategies.semi import SupervisedIterations

__all__ = ["Strategy", "build_strategy"]


def build_strategy(trainer: TrainerView, unlabelled: Dataset | None = None) -> Strategy:
    """The strategy of ``trainer.cfg.train.strategy.name``; ``unlabelled``: the images-only dataset of the
    unlabelled pool (needed by ``mean_teacher`` and ``cps``, see :class:`~msb.engine.strategies.semi.SemiSupervised`
    for the errors raised)."""
    name = trainer.cfg.train.strategy.name
    if name == "mean_teacher":
        return MeanTeacher(trainer, unlabelled)
    if name == "cps":
        return CrossPseudoSupervision(trainer, unlabelled)
    if trainer.cfg.train.strategy.iterations_per_epoch is not None:  # the epochs of the mixed-batch methods
        return SupervisedIterations(trainer, None)
    return SupervisedStrategy(trainer)
