"""The ``Segmentor`` interface that every architecture adapter implements."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

import torch
from torch import nn

if TYPE_CHECKING:
    from msb.config.schema import ModelConfig

__all__ = ["Segmentor"]


class Segmentor(nn.Module):
    """Base class of all segmentation models.

    ``forward(x)`` takes a float tensor (N, 3, H, W) and returns a **list** of logit maps, each
    (N, C, h_i, w_i) with C = number of foreground classes: the final output first, then the deep-supervision
    side outputs (possibly at lower resolution). The trainer applies the loss to every output, upsampled
    to the mask size.

    ``test_time_rule`` declares how the outputs combine at test time:
    ``first`` = the final output only (U-Net, PraNet); ``sum`` = the sum of all logit maps after upsampling to
    the input size (Polyp-PVT, CASCADE). :meth:`predict_logits` applies it.

    ``size_divisor``: H and W must be multiples of it (e.g. 32 for a 5-stage encoder).
    """

    arch_name: ClassVar[str] = ""
    test_time_rule: ClassVar[Literal["first", "sum"]] = "first"
    size_divisor: ClassVar[int] = 32

    @classmethod
    def from_config(cls, cfg: "ModelConfig", num_classes: int) -> "Segmentor":
        """Build the adapter from a :class:`~msb.config.schema.ModelConfig`."""
        raise NotImplementedError

    def combine(self, outputs: list[torch.Tensor], size: tuple[int, int]) -> torch.Tensor:
        """Combine the outputs by :attr:`test_time_rule` into one logit map (N, C, *size)."""
        def up(t: torch.Tensor) -> torch.Tensor:
            if tuple(t.shape[-2:]) == tuple(size):
                return t
            return nn.functional.interpolate(t, size=size, mode="bilinear", align_corners=False)

        if self.test_time_rule == "first":
            return up(outputs[0])
        return torch.stack([up(o) for o in outputs]).sum(0)

    def predict_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Test-time logits (N, C, H, W) at the input resolution."""
        return self.combine(self.forward(x), tuple(x.shape[-2:]))
