"""SegFormer (Xie, Wang, Yu, Anandkumar, Alvarez, Luo; NeurIPS 2021) through segmentation-models-pytorch.

Mix Transformer encoder ``model.encoder`` = ``mit_b0`` … ``mit_b5`` (default ``mit_b2``) and the all-MLP decoder:
per-stage linear projection to D channels, upsampling to stride 4, concatenation, 1×1 fusion conv + BN + ReLU,
1×1 prediction conv, ×4 bilinear upsampling. D = 256 for B0/B1 and 768 for B2–B5 as in the paper
(``model.params.decoder_segmentation_channels`` overrides it).

One output at the input resolution (no deep supervision); test-time rule ``first``. ``encoder_weights`` is a local
state dict of the MiT encoder (smp/official key names; a ``head.*`` classifier is ignored). Input: H, W multiples
of 32 (minimum 32×32). Parameters (B2): 27.35 M with one class; 27.46 M with the 150 ADE20K classes the paper
counted (published 27.5 M).
"""

from __future__ import annotations

import contextlib

import segmentation_models_pytorch as smp
import torch

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.pretrained import IMAGENET, pretrained_guard
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["SegFormer"]

_ENCODERS = ("mit_b0", "mit_b1", "mit_b2", "mit_b3", "mit_b4", "mit_b5")


@register("segformer")
class SegFormer(Segmentor):
    """smp ``Segformer`` as a :class:`Segmentor`: ``forward(x)`` -> ``[logits]``, logits (N, C, H, W)."""

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder: str = "mit_b2", encoder_weights: str | None = None,
                 decoder_segmentation_channels: int | None = None) -> None:
        super().__init__()
        if encoder not in _ENCODERS:
            raise MSBError(f"model.encoder: segformer needs a Mix Transformer encoder ({', '.join(_ENCODERS)}), "
                           f"got '{encoder}'")
        if decoder_segmentation_channels is None:
            decoder_segmentation_channels = 256 if encoder in ("mit_b0", "mit_b1") else 768
        imagenet = str(encoder_weights).strip().lower() == IMAGENET  # smp's own download and cache
        with pretrained_guard("segformer", encoder) if imagenet else contextlib.nullcontext():
            self.net = smp.Segformer(encoder_name=encoder, encoder_weights=IMAGENET if imagenet else None,
                                     classes=num_classes, decoder_segmentation_channels=decoder_segmentation_channels)
        if not imagenet and not is_none(encoder_weights):
            load_local_weights(self.net.encoder, encoder_weights)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "SegFormer":
        return construct_adapter(cls, num_classes, cfg.params, encoder=cfg.encoder or "mit_b2",
                                 encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.net(x)]
