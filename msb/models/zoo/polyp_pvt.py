"""Polyp-PVT (Dong, Wang, Fan, Li, Fu, Shao; CAAI AIR 2023, arXiv 2108.06932).

Re-implemented from the paper and the structure of ``DengPingFan/Polyp-PVT lib/pvt.py``:

- encoder PVTv2-B2 (timm ``pvt_v2_b2``, stochastic depth 0.1): x1..x4 with 64/128/320/512 channels, strides 4..32;
- CIM (camouflage identification) on x1: CBAM channel attention (ratio 16), then 7×7 spatial attention;
- CFM (cascaded fusion): x2, x3, x4 reduced by 1×1 :class:`~msb.models.zoo.blocks.ConvBN` to 32 channels, then the
  partial decoder (PraNet's aggregation) ending in a 96 -> 32 3×3 conv: a 32-channel map at stride 8;
- SAM (similarity aggregation, a non-local graph step): the CIM feature, reduced 64 -> 32 and downsampled ×0.5
  (bilinear, align_corners=True) to stride 8, gives the "edge" ``softmax_c(·)[:, 1]``; 16 anchors are the inner
  4×4 cells of a 6×6 average pooling of the edge-masked projection; one GCN step over the anchors (node 1×1 conv,
  ``h − x``, state 1×1 conv, ReLU) is projected back and added: ``out = x + conv_extend(·)``;
- heads: 1×1 conv 32 -> C on the CFM feature (P1) and on the SAM feature (P2), both at stride 8.

Outputs: ``[P2, P1]`` (the SAM head first, as it is computed last). Loss: the structure loss on both.
**Test-time rule ``sum``: sigmoid(P1 + P2)** (the reference ``Test.py`` sums the two maps before the sigmoid).

Input: H, W multiples of 32 (minimum 32×32). Parameters: 25.11 M (the published figure: the PVTv2 classifier
head is not part of the count).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import build_backbone
from msb.models.base import Segmentor, construct_adapter
from msb.models.zoo.blocks import ChannelAttention, ConvBN, PartialDecoder, SpatialAttention
from msb.models.registry import register

__all__ = ["PolypPVT", "SAM"]


class GCN(nn.Module):
    """Graph reasoning step over ``num_node`` nodes with ``num_state`` features (GloRe-style, Chen et al.,
    CVPR 2019): ``relu(conv_state(conv_node(x) − x))``. x (N, S, K) -> (N, S, K)."""

    def __init__(self, num_state: int, num_node: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(num_node, num_node, kernel_size=1)
        self.conv2 = nn.Conv1d(num_state, num_state, kernel_size=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(x.permute(0, 2, 1)).permute(0, 2, 1)
        return F.relu(self.conv2(h - x))


class SAM(nn.Module):
    """Similarity aggregation module (see module docstring).

    ``forward(x, edge)``: x (N, 32, H, W), edge (N, 32, h, w) resized to (H, W) with nearest (the reference's
    ``F.upsample`` default). Returns (N, 32, H, W).
    """

    def __init__(self, num_in: int = 32, plane_mid: int = 16, mids: int = 4) -> None:
        super().__init__()
        self.num_s, self.num_n, self.mids = plane_mid, mids * mids, mids
        self.conv_state = nn.Conv2d(num_in, plane_mid, 1)
        self.conv_proj = nn.Conv2d(num_in, plane_mid, 1)
        self.gcn = GCN(plane_mid, self.num_n)
        self.conv_extend = nn.Conv2d(plane_mid, num_in, 1, bias=False)

    def forward(self, x: torch.Tensor, edge: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        edge = F.interpolate(edge, size=(h, w), mode="nearest")
        edge = torch.softmax(edge, dim=1)[:, 1:2]
        state = self.conv_state(x).reshape(n, self.num_s, -1)  # (N, S, HW)
        proj = self.conv_proj(x)
        anchors = F.adaptive_avg_pool2d(proj * edge, self.mids + 2)[:, :, 1:-1, 1:-1].reshape(n, self.num_s, -1)
        assign = torch.softmax(torch.matmul(anchors.permute(0, 2, 1), proj.reshape(n, self.num_s, -1)), dim=1)
        nodes = torch.matmul(state, assign.permute(0, 2, 1))  # (N, S, K)
        nodes = self.gcn(nodes)
        back = torch.matmul(nodes, assign).reshape(n, self.num_s, h, w)
        return x + self.conv_extend(back)


@register("polyp_pvt")
class PolypPVT(Segmentor):
    """Polyp-PVT (see module docstring). ``forward(x)`` -> ``[P2, P1]``, each (N, C, H/8, W/8)."""

    test_time_rule = "sum"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None, channel: int = 32,
                 drop_path_rate: float = 0.1) -> None:
        super().__init__()
        self.backbone = build_backbone("pvt_v2_b2", encoder_weights, drop_path_rate=drop_path_rate)
        self.translayer2_0 = ConvBN(64, channel, 1)
        self.translayer2_1 = ConvBN(128, channel, 1)
        self.translayer3_1 = ConvBN(320, channel, 1)
        self.translayer4_1 = ConvBN(512, channel, 1)
        self.cfm = PartialDecoder(channel, out_channels=channel)
        self.ca = ChannelAttention(64)
        self.sa = SpatialAttention(7)
        self.sam = SAM(channel)
        self.out_sam = nn.Conv2d(channel, num_classes, 1)
        self.out_cfm = nn.Conv2d(channel, num_classes, 1)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "PolypPVT":
        if cfg.encoder not in (None, "pvt_v2_b2"):
            raise MSBError(f"model.encoder: polyp_pvt uses the PVTv2-B2 encoder ('pvt_v2_b2'), got "
                           f"'{cfg.encoder}'; remove the key or set it to pvt_v2_b2")
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x1, x2, x3, x4 = self.backbone(x)
        x1 = self.ca(x1) * x1
        cim = self.sa(x1) * x1
        cfm = self.cfm(self.translayer4_1(x4), self.translayer3_1(x3), self.translayer2_1(x2))
        edge = F.interpolate(self.translayer2_0(cim), scale_factor=0.5, mode="bilinear", align_corners=True)
        sam = self.sam(cfm, edge)
        return [self.out_sam(sam), self.out_cfm(cfm)]
