"""SegFormer-B3 (Xie et al., NeurIPS 2021) as the MSB paper's case study uses it: MiT-B3 encoder from
segmentation-models-pytorch and the all-MLP decoder with 768 channels.

The adapter is :class:`msb.models.zoo.segformer.SegFormer` with the encoder fixed to ``mit_b3`` and the decoder
width to 768 (the paper's value for B2–B5). Parameters: 47,224,771 at 3 output maps (Table 3: 47.22 M); GMACs
(conv+linear, :mod:`msb.profiling.flops`): 17.80 at 256², 71.21 at 512² (plus 0.37 / 5.9 GMACs of attention
products, not in the convention). ``encoder_weights``: none, ``imagenet`` (smp's MiT-B3 ImageNet weights) or a
local MiT-B3 state dict (smp/official keys; loaded strictly, a ``head.*`` classifier ignored).
"""

from __future__ import annotations

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.base import construct_adapter
from msb.models.registry import register
from msb.models.zoo.segformer import SegFormer

__all__ = ["SegFormerB3"]


@register("segformer_b3")
class SegFormerB3(SegFormer):
    """SegFormer with the MiT-B3 encoder and a 768-channel decoder. ``forward(x)`` -> ``[logits (N, C, H, W)]``."""

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None,
                 decoder_segmentation_channels: int = 768) -> None:
        super().__init__(num_classes, encoder="mit_b3", encoder_weights=encoder_weights,
                         decoder_segmentation_channels=decoder_segmentation_channels)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "SegFormerB3":
        """Build from ``model.encoder_weights`` and ``model.params``. Raises :class:`MSBError` for another
        encoder."""
        if cfg.encoder not in (None, "mit_b3"):
            raise MSBError(f"model.encoder: segformer_b3 uses the MiT-B3 encoder ('mit_b3'), got '{cfg.encoder}'; "
                           f"remove the key or use arch segformer for another MiT size")
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)
