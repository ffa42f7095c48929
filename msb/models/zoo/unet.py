"""U-Net (Ronneberger et al., MICCAI 2015) through segmentation-models-pytorch.

Encoder configurable (``model.encoder``, default ``resnet34``); ``encoder_weights`` is None (random init),
``imagenet`` (smp's own download and cache, :mod:`msb.models.pretrained`) or a local state-dict file of the
encoder. Input H and W must be multiples of 32 (5-stage encoder).
One output (no deep supervision); test-time rule ``first``.
"""

from __future__ import annotations

import segmentation_models_pytorch as smp
import torch

from msb.config.schema import ModelConfig
from msb.models.base import Segmentor
from msb.models.pretrained import IMAGENET, pretrained_guard
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["UNet"]


@register("unet")
class UNet(Segmentor):
    """smp ``Unet`` wrapped as a :class:`Segmentor`: forward returns ``[logits]`` with logits (N, C, H, W)."""

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int, encoder: str = "resnet34", encoder_weights: str | None = None,
                 **params) -> None:
        super().__init__()
        if str(encoder_weights).strip().lower() == IMAGENET:  # smp's own download and cache
            with pretrained_guard("unet", encoder):
                self.net = smp.Unet(encoder_name=encoder, encoder_weights=IMAGENET, classes=num_classes, **params)
            return
        self.net = smp.Unet(encoder_name=encoder, encoder_weights=None, classes=num_classes, **params)
        if encoder_weights is not None:
            load_local_weights(self.net.encoder, encoder_weights)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "UNet":
        """Build from ``model.encoder`` (default ``resnet34``), ``model.encoder_weights`` and ``model.params``
        (passed to ``smp.Unet``). Raises :class:`MSBError` for a weights file that does not match."""
        return cls(num_classes, encoder=cfg.encoder or "resnet34", encoder_weights=cfg.encoder_weights,
                   **cfg.params)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x`` float (N, 3, H, W), H and W multiples of 32 -> ``[logits]``, logits (N, C, H, W)."""
        return [self.net(x)]
