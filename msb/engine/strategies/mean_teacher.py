"""Mean teacher (Tarvainen & Valpola, "Mean teachers are better role models", NeurIPS 2017).

The teacher is an exponential moving average (EMA) of the student's weights, updated after every optimizer
step: ``θ'_t = α θ'_{t-1} + (1 − α) θ_t`` (eq. 1 of the paper; α = ``train.strategy.ema_decay``); floating-point
buffers (BatchNorm running statistics) are averaged the same way, integer buffers copied. The teacher is never
trained by gradients and predicts in eval mode. Loss of one iteration::

    L = L_sup(student(x), y) + w(t) · mean((σ(student(strong(u))) − σ(teacher(weak(u))))²)

with the sigmoid ramp-up ``w(t) = consistency_weight · exp(−5 (1 − t)²)``, ``t = min(i / rampup_iterations, 1)``
at iteration ``i`` (Laine & Aila, "Temporal ensembling", ICLR 2017, sec. 3.1; Tarvainen & Valpola use it too).
``weak(u)`` = the unlabelled images with the training augmentation; ``strong(u)`` = the same images with a
photometric perturbation (:func:`strong_view`), so student and teacher see the same pixels' geometry.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from msb.config.strategy_schema import StrategyConfig
from msb.engine.losses import multi_output_loss
from msb.engine.strategies.base import TrainerView
from msb.engine.strategies.semi import SemiSupervised
from msb.models.two_prediction import select_networks

__all__ = ["MeanTeacher", "ema_update", "rampup_weight", "strong_view"]


@torch.no_grad()
def ema_update(teacher: nn.Module, student: nn.Module, decay: float) -> None:
    """In place: every parameter and floating-point buffer ``θ' <- decay · θ' + (1 − decay) · θ`` (the
    teacher's ``θ'``, the student's ``θ``); integer buffers (``num_batches_tracked``) are copied.

    Args:
        teacher, student: modules of the same architecture; decay: α in [0, 1)."""
    for tp, sp in zip(teacher.parameters(), student.parameters()):
        tp.mul_(decay).add_(sp.detach(), alpha=1.0 - decay)
    for tb, sb in zip(teacher.buffers(), student.buffers()):
        if tb.dtype.is_floating_point:
            tb.mul_(decay).add_(sb, alpha=1.0 - decay)
        else:
            tb.copy_(sb)


def rampup_weight(iteration: int, rampup_iterations: int, weight: float) -> float:
    """Consistency weight at 0-based ``iteration``: ``weight · exp(−5 (1 − t)²)``, ``t = min(iteration /
    rampup_iterations, 1)``; ``weight`` when ``rampup_iterations`` is 0 (Laine & Aila 2017)."""
    if rampup_iterations <= 0:
        return float(weight)
    t = min(max(iteration, 0) / rampup_iterations, 1.0)
    return float(weight) * math.exp(-5.0 * (1.0 - t) ** 2)


def strong_view(x: torch.Tensor, gen: torch.Generator, s: StrategyConfig) -> torch.Tensor:
    """The strong view of normalised images ``x`` (N, 3, H, W) float: ``x · c + b + n`` with per-image
    ``c ~ U[1 − strong_contrast, 1 + strong_contrast]``, ``b ~ U[−strong_brightness, strong_brightness]`` and
    per-pixel ``n ~ N(0, strong_noise_std²)``, drawn on the CPU from ``gen``."""
    n = x.shape[0]
    c = 1.0 + s.strong_contrast * (2 * torch.rand(n, 1, 1, 1, generator=gen) - 1)
    b = s.strong_brightness * (2 * torch.rand(n, 1, 1, 1, generator=gen) - 1)
    noise = s.strong_noise_std * torch.randn(x.shape, generator=gen)
    return x * c.to(x) + b.to(x) + noise.to(x)


class MeanTeacher(SemiSupervised):
    """``train.strategy.name: mean_teacher`` (module docstring). Checkpoints hold ``model`` (the student) and
    ``teacher``; the resume state both networks (the student through the trainer), the iteration count."""

    name = "mean_teacher"

    def __init__(self, trainer: TrainerView, unlabelled: Dataset | None) -> None:
        super().__init__(trainer, unlabelled)
        self.teacher = copy.deepcopy(trainer.model).to(trainer.device)
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.teacher.eval()

    def trained(self) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
        return [(self.trainer.model, self.trainer.optimizer)]

    def networks(self) -> dict[str, nn.Module]:
        return {"model": self.trainer.model, "teacher": self.teacher}

    def eval_networks(self) -> list[nn.Module]:
        return select_networks(self.trainer.cfg, {"student": self.trainer.model, "teacher": self.teacher})

    def consistency_weight(self) -> float:
        """The ramp-up weight of the current iteration (:func:`rampup_weight`)."""
        return rampup_weight(self.iteration, self.s.rampup_iterations, self.s.consistency_weight)

    def loss(self, x: torch.Tensor, y: torch.Tensor, xu: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        cfg, student = self.trainer.cfg, self.trainer.model
        sup = multi_output_loss([o.float() for o in student(x)], y, cfg.train.loss.name, cfg.train.loss.bce_weighting)
        size = tuple(xu.shape[-2:])
        p_student = torch.sigmoid(student.combine([o.float() for o in student(strong_view(xu, gen, self.s))], size))
        with torch.no_grad():
            self.teacher.eval()
            p_teacher = torch.sigmoid(self.teacher.predict_logits(xu).float())
        return sup + self.consistency_weight() * torch.mean((p_student - p_teacher) ** 2)

    def after_step(self) -> None:
        ema_update(self.teacher, self.trainer.model, self.s.ema_decay)

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"strategy": self.name, "teacher": self.teacher.state_dict()}

    def strategy_state(self) -> dict[str, Any]:
        return {"teacher": self.teacher.state_dict()}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.teacher.load_state_dict(state["teacher"])
