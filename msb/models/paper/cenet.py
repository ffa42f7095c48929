"""CENet (Bozorgpour, Azad, et al., "CENet: Context Enhancement Network for Medical Image Segmentation",
MICCAI 2025, arXiv 2505.18423) with a PVTv2-B3 encoder, as in the MSB paper's case study.

Written from the paper and the structure of the official code (``xmindflow/cenet src/networks/cenet``: ``net.py``,
``decoders.py``, ``out.py``) with its training script defaults (``main_skin.py``: skip mode ``cat``, EUCB up-sampling
in the decoder and the output head, edge scales (0.8, 0.4), 2 differential-attention heads per skip); the blocks
are in :mod:`msb.models.paper.cenet_blocks`.

- encoder: PVTv2-B3 (timm ``pvt_v2_b3``, stochastic depth 0.1): x1..x4 with 64/128/320/512 channels at strides
  4..32;
- decoder: d4 = CFAM(x4); for stage s = 3, 2, 1: up = EUCB(d, ×2, to the skip width); d = CFAM(up + DSEB(x_s, up))
  with CFAM dilation rates (1, 2, 2), (1, 2, 3), (1, 2, 4), (2, 3, 5) from the deepest stage on and DSEB
  attention depths 4, 3, 2;
- output head: EUCB(d1: 64 -> 32, stride 4 -> 2) concatenated with w ⊙ maxpool2(ResBlock_5×5(image: 3 -> 32))
  (w learned per channel, initial N(0.75, 1)), a 3×3 ResBlock (64), a 1×1 conv to C maps, bilinear ×2.

One output at the input resolution; test-time rule ``first``. Input: H, W multiples of 32. The differential and
non-local attentions are over all pixels of a stage (4,096 tokens at stride 4 of a 256² input; the paper's
512² run ran out of GPU memory). Parameters: 53,247,111 at 3 output maps (Table 3: 53.25 M). GMACs at 256²:
14.22 under the conv+linear convention (:mod:`msb.profiling.flops`) plus 7.75 of attention products: 4.92 of the
skip connections' differential attention, 2.46 of the decoder's non-local blocks, 0.37 of PVTv2's attention.
Table 3's 19.13 equals conv+linear + the differential-attention products exactly (14.22 + 4.92): the paper's
counter included those products and not the other two (tests/models/test_paper_archs_a.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import build_backbone
from msb.models.base import Segmentor, construct_adapter
from msb.models.paper.cenet_blocks import CFAModule, DSEBlock, EUCB, ResBlock
from msb.models.registry import register

__all__ = ["CENet"]

_RATES = ((1, 2, 2), (1, 2, 3), (1, 2, 4), (2, 3, 5))  # CFAM dilations, stride 32 -> 4


class OutHead(nn.Module):
    """``forward(d1, image)``: d1 (N, 64, H/4, W/4), image (N, 3, H, W) -> logits (N, C, H, W)."""

    def __init__(self, dec_channels: int, in_channels: int, num_classes: int) -> None:
        super().__init__()
        half = dec_channels // 2
        self.w = nn.Parameter(torch.randn(1, half, 1, 1) + 0.75)
        self.image = ResBlock(in_channels, half, 5)
        self.up = EUCB(dec_channels, half)
        self.mix = ResBlock(2 * half, 2 * half, 3)
        self.cls = nn.Conv2d(2 * half, num_classes, 1)
        nn.init.trunc_normal_(self.cls.weight, std=0.02)
        nn.init.zeros_(self.cls.bias)

    def forward(self, d1: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        low = self.w * F.max_pool2d(self.image(image), 2)
        y = self.cls(self.mix(torch.cat([self.up(d1), low], dim=1)))
        return F.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)


@register("cenet_pvt_b3")
class CENet(Segmentor):
    """CENet with PVTv2-B3 (see module docstring). ``forward(x)`` -> ``[logits (N, C, H, W)]``."""

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None,
                 scale_factors: tuple[float, ...] = (0.8, 0.4), heads: tuple[int, int, int] = (2, 2, 2),
                 drop_path_rate: float = 0.1) -> None:
        super().__init__()
        self.backbone = build_backbone("pvt_v2_b3", encoder_weights, drop_path_rate=drop_path_rate)
        c1, c2, c3, c4 = self.backbone.channels
        self.dec4 = CFAModule(c4, _RATES[0])
        self.up3, self.skip3 = EUCB(c4, c3), DSEBlock(c3, tuple(scale_factors), heads[0], depth=4)
        self.dec3 = CFAModule(c3, _RATES[1])
        self.up2, self.skip2 = EUCB(c3, c2), DSEBlock(c2, tuple(scale_factors), heads[1], depth=3)
        self.dec2 = CFAModule(c2, _RATES[2])
        self.up1, self.skip1 = EUCB(c2, c1), DSEBlock(c1, tuple(scale_factors), heads[2], depth=2)
        self.dec1 = CFAModule(c1, _RATES[3])
        self.head = OutHead(c1, 3, num_classes)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "CENet":
        """Build from ``model.encoder_weights`` (none, ``imagenet``, a local PVTv2-B3 file: timm or official
        keys) and ``model.params``. Raises :class:`MSBError` for another encoder or an unknown key."""
        if cfg.encoder not in (None, "pvt_v2_b3"):
            raise MSBError(f"model.encoder: cenet_pvt_b3 uses the PVTv2-B3 encoder ('pvt_v2_b3'), got "
                           f"'{cfg.encoder}'; remove the key")
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x`` (N, 3, H, W), H and W multiples of 32 -> ``[logits (N, C, H, W)]``."""
        x1, x2, x3, x4 = self.backbone(x)
        d = self.dec4(x4)
        for up, skip, dec, feat in ((self.up3, self.skip3, self.dec3, x3), (self.up2, self.skip2, self.dec2, x2),
                                    (self.up1, self.skip1, self.dec1, x1)):
            d = up(d)
            d = dec(d + skip(feat, d))
        return [self.head(d, x)]
