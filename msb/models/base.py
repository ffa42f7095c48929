"""The ``Segmentor`` interface that every architecture adapter implements."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import nn

if TYPE_CHECKING:
    from msb.config.schema import ModelConfig

__all__ = ["Segmentor", "construct_adapter"]


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

    Optional hooks (identity by default):

    - :meth:`train_batch_transform`: a batch-level training augmentation owned by the architecture's recipe
      (SANet's colour exchange), called by the trainer before the forward pass;
    - :meth:`adjust_test_logits`: a test-time correction of the combined logits at the evaluation resolution
      (SANet's probability correction strategy); :attr:`test_time_adjustment` names it (``none`` when off)
      so the evaluator can record it.
    """

    arch_name: ClassVar[str] = ""
    test_time_rule: ClassVar[Literal["first", "sum"]] = "first"
    size_divisor: ClassVar[int] = 32
    test_time_adjustment: str = "none"

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

    def train_batch_transform(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator,
                              mean: tuple[float, float, float], std: tuple[float, float, float],
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training-only batch augmentation (identity here).

        Args:
            x: normalised images (N, 3, H, W) float; ``mean``/``std`` (ImageNet by default) undo it.
            y: masks (N, C, H, W) float in [0, 1].
            generator: seeded CPU generator for the draws (reseeded every epoch by the trainer).
        """
        return x, y

    def adjust_test_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Test-time correction of combined logits (N, C, H, W) at evaluation resolution (identity here)."""
        return logits


def construct_adapter(cls: type, num_classes: int, params: dict[str, Any], **fixed: Any) -> "Segmentor":
    """``cls(num_classes, **fixed, **params)``, after checking that every key of ``params`` (``model.params``)
    is a constructor argument. Raises :class:`~msb.errors.MSBError` naming the unknown and the valid keys."""
    from msb.errors import MSBError

    names = [n for n in inspect.signature(cls.__init__).parameters
             if n not in ("self", "num_classes", "args", "kwargs") and n not in fixed]
    unknown = sorted(set(params) - set(names))
    if unknown:
        raise MSBError(f"model.params: unknown key(s) {unknown} for architecture '{cls.arch_name}'; "
                       f"valid keys: {', '.join(names) or 'none'}")
    return cls(num_classes, **fixed, **params)
