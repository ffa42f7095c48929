"""PVT-GCASCADE: Graph-convolutional cascaded decoder (Rahman, Marculescu; WACV 2024, arXiv 2310.16175).

Re-implemented from the paper and the structure of ``SLDGroup/G-CASCADE lib/networks.py`` (``PVT_GCASCADE``)
and ``lib/decoders.py`` (``GCASCADE``, additive skip aggregation, the default):

- encoder PVTv2-B2 (timm ``pvt_v2_b2``, stochastic depth 0.1): x1..x4 with 64/128/320/512 ch, strides 4..32;
- GCAM at each stage = GCB (a ViG :class:`~msb.models.zoo.graph.Grapher`: k = 11 neighbours, max-relative graph
  conv with GELU and BN, relative position; candidate pooling r = 1, 1, 4, 2 at strides 32, 16, 8, 4;
  dilation ``min(i // 4 + 1, 18 // k)`` for i = 0, 3, 8, 11, i.e. 1 everywhere for k = 11) followed by the
  7×7 spatial attention SPA (one module shared by all stages);
- UCB between stages = nearest ×2 upsampling, depthwise 3×3 conv (bias) + BN + ReLU, 1×1 conv (bias) to the
  next stage's channels; the skip feature is **added**;
- heads: 1×1 conv (bias) on the 512/320/128/64-channel stage outputs, strides 32/16/8/4.

Outputs ``[p1, p2, p3, p4]`` (strides 32, 16, 8, 4); structure loss on each. **Test-time rule ``sum``** of the four
logit maps (each upsampled bilinearly to the input size), as the reference test script.

**Input size is baked in**: the relative-position term of every Grapher is built for one feature grid, so
``model.params.img_size`` (an int for square inputs or [H, W]; default 352, the paper's polyp setting) must equal
``data.input_size``; another input size raises :class:`~msb.errors.MSBError` (the reference interpolates the
term silently). Multi-scale training (the reference scripts' 0.75/1/1.25 rates) needs the explicit opt-in
``model.params.train_size_mismatch: interpolate``, which resizes the term bicubically for training batches of
another size, as the reference does; evaluation is always at ``img_size``. H, W must be multiples of 32 and
the stride-32 grid must hold at least k nodes: the minimum square input for k = 11 is 128×128. Parameters: 26.63 M, the published (trainable) count; the fixed relative
position terms are non-trainable buffers here (the reference stores them as frozen parameters, which a plain
``sum(p.numel())`` would count: 15.48 M extra at 352×352).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import build_backbone
from msb.models.base import Segmentor, construct_adapter
from msb.models.zoo.blocks import SpatialAttention
from msb.models.zoo.graph import Grapher
from msb.models.zoo.pvt_cascade import CHANNELS, cascade_heads, check_pvt_encoder
from msb.models.registry import register

__all__ = ["GCascade", "GCascadeDecoder", "UCB"]

REDUCE_RATIOS = (1, 1, 4, 2)
_DILATION_INDEX = (0, 3, 8, 11)


class UCB(nn.Sequential):
    """Up-convolution block: nearest ×2, depthwise 3×3 conv (bias) + BN + ReLU, 1×1 conv (bias) cin -> cout."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__(nn.Upsample(scale_factor=2, mode="nearest"),
                         nn.Conv2d(cin, cin, 3, padding=1, groups=cin, bias=True), nn.BatchNorm2d(cin),
                         nn.ReLU(inplace=True), nn.Conv2d(cin, cout, 1, bias=True))


class GCascadeDecoder(nn.Module):
    """The G-CASCADE decoder for an input image of size ``img_size`` = (H, W).

    ``forward(x4, [x3, x2, x1])`` -> ``(d4, d3, d2, d1)`` with 512/320/128/64 channels at strides 32/16/8/4.
    """

    def __init__(self, img_size: tuple[int, int], channels: tuple[int, int, int, int] = CHANNELS, k: int = 11,
                 act: str = "gelu", train_interpolate: bool = False) -> None:
        super().__init__()
        h, w = img_size
        max_dilation = 18 // k
        gcbs = []
        for i, (c, stride, r) in enumerate(zip(channels, (32, 16, 8, 4), REDUCE_RATIOS)):
            dil = min(_DILATION_INDEX[i] // 4 + 1, max_dilation)
            gcbs.append(Grapher(c, (h // stride, w // stride), k=k, dilation=dil, reduce_ratio=r, act=act,
                                name=f"g_cascade GCB at stride {stride}", train_interpolate=train_interpolate))
        self.gcb4, self.gcb3, self.gcb2, self.gcb1 = gcbs
        self.ucb3 = UCB(channels[0], channels[1])
        self.ucb2 = UCB(channels[1], channels[2])
        self.ucb1 = UCB(channels[2], channels[3])
        self.spa = SpatialAttention(7)

    def _gcam(self, gcb: Grapher, x: torch.Tensor) -> torch.Tensor:
        x = gcb(x)
        return self.spa(x) * x

    def forward(self, x: torch.Tensor, skips: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        d4 = self._gcam(self.gcb4, x)
        d3 = self._gcam(self.gcb3, self.ucb3(d4) + skips[0])
        d2 = self._gcam(self.gcb2, self.ucb2(d3) + skips[1])
        d1 = self._gcam(self.gcb1, self.ucb1(d2) + skips[2])
        return d4, d3, d2, d1


def _size(img_size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(img_size, int):
        size = (img_size, img_size)
    else:
        size = tuple(int(v) for v in img_size)
    if len(size) != 2 or min(size) <= 0 or size[0] % 32 or size[1] % 32:
        raise MSBError(f"model.params.img_size: g_cascade needs a positive size (int or [H, W]) with H and W "
                       f"multiples of 32, got {img_size!r}")
    return size  # type: ignore[return-value]


@register("g_cascade")
class GCascade(Segmentor):
    """PVT-GCASCADE (see module docstring). ``forward(x)`` -> ``[p1, p2, p3, p4]``, (N, C, H/s, W/s)."""

    test_time_rule = "sum"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None,
                 img_size: int | Sequence[int] = 352, k: int = 11, drop_path_rate: float = 0.1,
                 train_size_mismatch: str = "error") -> None:
        super().__init__()
        if train_size_mismatch not in ("error", "interpolate"):
            raise MSBError(f"model.params.train_size_mismatch: 'error' or 'interpolate', got {train_size_mismatch!r}")
        self.img_size = _size(img_size)
        self.train_interpolate = train_size_mismatch == "interpolate"
        self.backbone = build_backbone("pvt_v2_b2", encoder_weights, drop_path_rate=drop_path_rate)
        self.decoder = GCascadeDecoder(self.img_size, CHANNELS, k=k, train_interpolate=self.train_interpolate)
        self.heads = cascade_heads(num_classes)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "GCascade":
        check_pvt_encoder("g_cascade", cfg)
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if tuple(x.shape[-2:]) != self.img_size and not (self.training and self.train_interpolate):
            hint = (" (multi-scale training also needs model.params.train_size_mismatch: interpolate)"
                    if self.training else "")
            raise MSBError(f"g_cascade was built for {self.img_size[0]}x{self.img_size[1]} inputs "
                           f"(model.params.img_size) but got {x.shape[-2]}x{x.shape[-1]}"
                           f"{' in training' if self.training else ''}: its graph size is fixed by the input "
                           f"size; set model.params.img_size equal to data.input_size{hint}")
        x1, x2, x3, x4 = self.backbone(x)
        feats = self.decoder(x4, [x3, x2, x1])
        return [head(f) for head, f in zip(self.heads, feats)]
