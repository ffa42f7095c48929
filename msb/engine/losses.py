"""Training losses.

Structure loss (Wei, Wang, Huang: F3Net, AAAI 2020; used by PraNet, Polyp-PVT, CASCADE):
``w = 1 + 5·|avgpool31(y) − y|`` (31×31 mean filter, stride 1, padding 15), ``p = sigmoid(logits)``;

- weighted BCE: ``Σ w·BCE(logits, y) / Σ w`` per image and channel (``bce_weighting: weighted``, as published);
  ``bce_weighting: reference`` reproduces the reference scripts, whose ``reduce='none'`` argument PyTorch's
  legacy reduction handling turns into a plain mean, so the weight then acts on the IoU term only;
- weighted IoU: ``1 − (Σ w·p·y + 1) / (Σ w·(p + y) − Σ w·p·y + 1)`` per image and channel.

The loss of one output is the mean over images and channels of wBCE + wIoU; with deep supervision the trainer
sums it over all outputs (each upsampled bilinearly to the mask size).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

__all__ = ["structure_loss", "dice_bce_loss", "multi_output_loss"]


def structure_loss(logits: torch.Tensor, target: torch.Tensor,
                   bce_weighting: Literal["weighted", "reference"] = "weighted") -> torch.Tensor:
    """Boundary-weighted structure loss (see module docstring).

    Args:
        logits: (N, C, H, W) float, raw scores.
        target: (N, C, H, W) float in [0, 1] (hard or soft masks), same shape.
        bce_weighting: ``weighted`` (published formula) or ``reference`` (plain mean BCE, as the reference code).

    Returns:
        Scalar tensor.
    """
    weit = 1 + 5 * torch.abs(F.avg_pool2d(target, kernel_size=31, stride=1, padding=15) - target)
    bce = F.binary_cross_entropy_with_logits(logits, target, reduction="none")
    if bce_weighting == "weighted":
        wbce = (weit * bce).sum(dim=(2, 3)) / weit.sum(dim=(2, 3))
    else:
        wbce = bce.mean().expand(logits.shape[:2])
    p = torch.sigmoid(logits)
    inter = (p * target * weit).sum(dim=(2, 3))
    union = ((p + target) * weit).sum(dim=(2, 3))
    wiou = 1 - (inter + 1) / (union - inter + 1)
    return (wbce + wiou).mean()


def dice_bce_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean BCE + (1 − soft Dice with +1 smoothing), per image and channel, averaged. Shapes as above."""
    bce = F.binary_cross_entropy_with_logits(logits, target)
    p = torch.sigmoid(logits)
    inter = (p * target).sum(dim=(2, 3))
    dice = (2 * inter + 1) / (p.sum(dim=(2, 3)) + target.sum(dim=(2, 3)) + 1)
    return bce + (1 - dice).mean()


def multi_output_loss(outputs: list[torch.Tensor], target: torch.Tensor, name: str = "structure",
                      bce_weighting: Literal["weighted", "reference"] = "weighted") -> torch.Tensor:
    """Sum of the loss over all outputs (deep supervision); each output (N, C, h, w) is upsampled
    bilinearly (align_corners=False) to the target's (H, W) first."""
    total = None
    for out in outputs:
        if out.shape[-2:] != target.shape[-2:]:
            out = F.interpolate(out, size=target.shape[-2:], mode="bilinear", align_corners=False)
        if name == "structure":
            loss = structure_loss(out, target, bce_weighting)
        elif name == "bce":
            loss = F.binary_cross_entropy_with_logits(out, target)
        else:
            loss = dice_bce_loss(out, target)
        total = loss if total is None else total + loss
    assert total is not None
    return total
