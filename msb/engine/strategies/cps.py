"""Cross pseudo supervision (Chen, Yuan, Zeng & Wang, "Semi-supervised semantic segmentation with cross pseudo
supervision", CVPR 2021).

Two networks ``a`` (the trainer's model) and ``b`` of the same architecture, initialised differently (``b`` is
built under the torch seed ``random_seed + 1``), each with its own optimizer and schedule. Loss of one
iteration (eq. 3 of the paper, λ = ``train.strategy.cps_weight``)::

    L = L_sup(a(x), y) + L_sup(b(x), y) + λ · (BCE(a(u), ŷ_b) + BCE(b(u), ŷ_a))

with the hard pseudo-labels ``ŷ = [σ(logits) > 0.5]`` of the other network on the unlabelled images ``u``
(:func:`pseudo_labels`; per foreground channel, the two-class argmax of the sigmoid outputs), detached: no
gradient flows through a pseudo-label. Only unlabelled images get the CPS term here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from msb.engine.losses import multi_output_loss
from msb.engine.optim import build_optimizer, build_scheduler
from msb.engine.strategies.base import TrainerView
from msb.engine.strategies.semi import SemiSupervised
from msb.models.registry import build_model
from msb.models.two_prediction import select_networks

__all__ = ["CrossPseudoSupervision", "pseudo_labels"]


def pseudo_labels(logits: torch.Tensor) -> torch.Tensor:
    """Hard pseudo-labels of logits (N, C, H, W): float32 ``1`` where ``σ(logits) > 0.5`` (the argmax of
    {background, class} per channel), else ``0``; detached."""
    return (torch.sigmoid(logits.detach().float()) > 0.5).float()


class CrossPseudoSupervision(SemiSupervised):
    """``train.strategy.name: cps`` (module docstring). Checkpoints hold ``model`` (network a) and ``model_b``;
    the resume state also ``b``'s optimizer and schedule."""

    name = "cps"

    def __init__(self, trainer: TrainerView, unlabelled: Dataset | None) -> None:
        super().__init__(trainer, unlabelled)
        cfg = trainer.cfg
        with torch.random.fork_rng(devices=[]):  # the global RNG stream is left as it was
            torch.manual_seed(cfg.random_seed + 1)
            self.model_b = build_model(cfg.model, trainer.model_num_classes()).to(trainer.device)
        self.optimizer_b = build_optimizer(self.model_b, cfg)
        self.scheduler_b = build_scheduler(self.optimizer_b, cfg)

    def trained(self) -> list[tuple[nn.Module, torch.optim.Optimizer]]:
        return [(self.trainer.model, self.trainer.optimizer), (self.model_b, self.optimizer_b)]

    def networks(self) -> dict[str, nn.Module]:
        return {"model": self.trainer.model, "model_b": self.model_b}

    def eval_networks(self) -> list[nn.Module]:
        return select_networks(self.trainer.cfg, {"a": self.trainer.model, "b": self.model_b})

    def loss(self, x: torch.Tensor, y: torch.Tensor, xu: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        cfg, a, b = self.trainer.cfg, self.trainer.model, self.model_b
        lo = cfg.train.loss
        sup = (multi_output_loss([o.float() for o in a(x)], y, lo.name, lo.bce_weighting)
               + multi_output_loss([o.float() for o in b(x)], y, lo.name, lo.bce_weighting))
        size = tuple(xu.shape[-2:])
        la = a.combine([o.float() for o in a(xu)], size)
        lb = b.combine([o.float() for o in b(xu)], size)
        cps = (F.binary_cross_entropy_with_logits(la, pseudo_labels(lb))
               + F.binary_cross_entropy_with_logits(lb, pseudo_labels(la)))
        return sup + self.s.cps_weight * cps

    def scheduler_step(self) -> None:
        self.scheduler_b.step()

    def checkpoint_extra(self) -> dict[str, Any]:
        return {"strategy": self.name, "model_b": self.model_b.state_dict()}

    def strategy_state(self) -> dict[str, Any]:
        return {"model_b": self.model_b.state_dict(), "optimizer_b": self.optimizer_b.state_dict(),
                "scheduler_b": self.scheduler_b.state_dict()}

    def load_strategy_state(self, state: dict[str, Any]) -> None:
        self.model_b.load_state_dict(state["model_b"])
        self.optimizer_b.load_state_dict(state["optimizer_b"])
        self.scheduler_b.load_state_dict(state["scheduler_b"])
