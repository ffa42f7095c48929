"""Optimizer and learning-rate schedule of a run (``train.optimizer``, ``train.scheduler``); one per network."""

from __future__ import annotations

from typing import Iterable

import torch

from msb.config.schema import RunConfig
from msb.errors import MSBError

__all__ = ["build_optimizer", "build_scheduler"]


def build_optimizer(params: Iterable[torch.nn.Parameter] | torch.nn.Module, cfg: RunConfig) -> torch.optim.Optimizer:
    """AdamW / Adam / SGD from ``cfg.train.optimizer``. ``params`` may be the model itself: with
    ``backbone_lr_mult != 1`` its ``backbone.*`` parameters then form a second group at ``lr * backbone_lr_mult``
    (SANet's recipe); an :class:`MSBError` is raised when the model has no ``backbone`` parameters."""
    o = cfg.train.optimizer
    if isinstance(params, torch.nn.Module):
        named = list(params.named_parameters())
        params = [p for _, p in named]
        if o.backbone_lr_mult != 1.0:
            back = [p for n, p in named if n.startswith("backbone.")]
            if not back:
                raise MSBError(f"train.optimizer.backbone_lr_mult: architecture '{cfg.model.arch}' has no "
                               f"'backbone' module; remove the key")
            params = [{"params": [p for n, p in named if not n.startswith("backbone.")], "lr": o.lr},
                      {"params": back, "lr": o.lr * o.backbone_lr_mult}]
    if o.name == "adamw":
        return torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay)
    if o.name == "adam":
        return torch.optim.Adam(params, lr=o.lr, weight_decay=o.weight_decay)
    return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay, nesterov=True)


def build_scheduler(opt: torch.optim.Optimizer, cfg: RunConfig) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-epoch schedule from ``cfg.train.scheduler`` (``none`` = constant)."""
    s = cfg.train.scheduler
    if s.name == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=cfg.train.epochs)
    if s.name == "step":
        return torch.optim.lr_scheduler.StepLR(opt, step_size=s.step_size, gamma=s.gamma)
    if s.name == "multistep":
        return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=list(s.milestones), gamma=s.gamma)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda _e: 1.0)
