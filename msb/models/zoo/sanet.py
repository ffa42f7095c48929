"""SANet: Shallow Attention Network (Wei, Hu, Zhang, Li, Zhou, Cui; MICCAI 2021, arXiv 2108.00882).

Re-implemented from the paper and the structure of the official ``weijun88/SANet`` code:

- backbone Res2Net-50 v1b 26w×4s (timm ``res2net50d``); features x2, x3, x4 (512/1024/2048 ch, strides 8/16/32);
- ``linear5/4/3`` = 1×1 conv (with bias) to 64 channels + BN + ReLU on x4, x3, x2;
- o5 and o4 are upsampled to the stride-8 size (bilinear, align_corners=True);
- **shallow attention**: ``predict = conv1×1(cat[o5, o4·o5, o3·o4·o5])`` (192 -> C, with bias).

One output at stride 8 (no deep supervision); test-time rule ``first``. The paper's loss is BCE + Dice
(``train.loss.name: dice_bce``; see ``configs/architectures/sanet.yaml`` for the small smoothing difference).

Options (``model.params``):

- ``colour_exchange`` (training augmentation, default off; on in the paper's recipe): each training image is
  converted to CIELAB (OpenCV 8-bit) and normalised to a donor image's per-channel mean and standard deviation,
  ``lab' = (lab − μ)/σ · σ_d + μ_d``, then converted back. The reference draws the donor from the whole training
  set (from a numeric-filename pool with p = 0.7, which relies on the Kvasir/CVC-ClinicDB file names) at native
  resolution and casts with ``np.uint8`` (values outside 0..255 wrap around). Here the donor is another image
  of the same shuffled batch (a uniform random training image; none when the batch has one image), at training
  resolution, and out-of-range values are clipped. See :func:`colour_exchange`.
- ``pcs`` (probability correction strategy, test time, default off; on in the paper's recipe): on the logits at
  evaluation resolution, positive logits are divided by the fraction of positive pixels and negative logits by
  the fraction of negative pixels, per image and class (:func:`probability_correction`). The sign is kept, so
  the mask at threshold 0.5 is unchanged; the probability map (and threshold sweeps) change. No min-max.

Input: H, W multiples of 32 (minimum 32×32). Parameters: 23.90 M (the published figure; no classifier head).
"""

from __future__ import annotations

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import build_backbone
from msb.models.base import Segmentor, construct_adapter
from msb.models.registry import register

__all__ = ["SANet", "colour_exchange", "probability_correction"]


def colour_exchange(x: torch.Tensor, mean: tuple[float, float, float], std: tuple[float, float, float],
                    generator: torch.Generator) -> torch.Tensor:
    """SANet's colour exchange within a batch (see module docstring).

    Args:
        x: normalised RGB images (N, 3, H, W) float, ``x = (rgb/255 − mean)/std``.
        mean, std: the normalisation constants (fractions of 255).
        generator: CPU generator; image i receives donor ``(i + r_i) mod N`` with r_i uniform in 1..N−1.

    Returns:
        The exchanged images, normalised the same way, same shape/dtype/device. N = 1 returns ``x`` unchanged.
        A channel with zero standard deviation keeps its values shifted to the donor mean.
    """
    n = x.shape[0]
    if n < 2:
        return x
    m = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
    s = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1) * 255.0
    rgb = (x.detach().float().cpu() * s + m).clamp(0, 255).round().to(torch.uint8)
    rgb_np = rgb.permute(0, 2, 3, 1).contiguous().numpy()
    lab = [cv2.cvtColor(im, cv2.COLOR_RGB2LAB).astype(np.float32) for im in rgb_np]
    mu = [im.mean(axis=(0, 1)) for im in lab]
    sd = [im.std(axis=(0, 1)) for im in lab]
    donors = (torch.arange(n) + torch.randint(1, n, (n,), generator=generator)) % n
    out = np.empty_like(rgb_np)
    for i, d in enumerate(donors.tolist()):
        scale = np.where(sd[i] > 0, sd[d] / np.where(sd[i] > 0, sd[i], 1.0), 0.0)
        new = (lab[i] - mu[i]) * scale + mu[d]
        out[i] = cv2.cvtColor(np.clip(np.round(new), 0, 255).astype(np.uint8), cv2.COLOR_LAB2RGB)
    res = (torch.from_numpy(out).permute(0, 3, 1, 2).float() - m) / s
    return res.to(device=x.device, dtype=x.dtype)


def probability_correction(logits: torch.Tensor) -> torch.Tensor:
    """SANet's probability correction strategy (PCS).

    For each image and class with logits z (H, W): ``z / mean(z > 0)`` where z > 0 and ``z / mean(z < 0)``
    where z < 0 (zeros unchanged). (N, C, H, W) float -> same shape.
    """
    pos, neg = logits > 0, logits < 0
    fp = pos.float().mean(dim=(2, 3), keepdim=True).clamp_min(1e-12)
    fn = neg.float().mean(dim=(2, 3), keepdim=True).clamp_min(1e-12)
    return torch.where(pos, logits / fp, torch.where(neg, logits / fn, logits))


@register("sanet")
class SANet(Segmentor):
    """SANet (see module docstring). ``forward(x)`` -> ``[P]`` with P (N, C, H/8, W/8)."""

    test_time_rule = "first"
    size_divisor = 32

    def __init__(self, num_classes: int = 1, encoder_weights: str | None = None, colour_exchange: bool = False,
                 pcs: bool = False) -> None:
        super().__init__()
        self.colour_exchange = bool(colour_exchange)
        self.pcs = bool(pcs)
        self.test_time_adjustment = "pcs" if self.pcs else "none"
        self.backbone = build_backbone("res2net50_v1b", encoder_weights)

        def linear(cin: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, 64, 1), nn.BatchNorm2d(64), nn.ReLU(inplace=True))

        self.linear5, self.linear4, self.linear3 = linear(2048), linear(1024), linear(512)
        self.predict = nn.Conv2d(64 * 3, num_classes, 1)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "SANet":
        if cfg.encoder not in (None, "res2net50_v1b"):
            raise MSBError(f"model.encoder: sanet uses the Res2Net-50 v1b backbone ('res2net50_v1b'), "
                           f"got '{cfg.encoder}'; remove the key or set it to res2net50_v1b")
        return construct_adapter(cls, num_classes, cfg.params, encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        _, x2, x3, x4 = self.backbone(x)
        o3 = self.linear3(x2)
        size = o3.shape[-2:]
        o5 = F.interpolate(self.linear5(x4), size=size, mode="bilinear", align_corners=True)
        o4 = F.interpolate(self.linear4(x3), size=size, mode="bilinear", align_corners=True)
        return [self.predict(torch.cat([o5, o4 * o5, o3 * o4 * o5], dim=1))]

    def train_batch_transform(self, x: torch.Tensor, y: torch.Tensor, generator: torch.Generator,
                              mean: tuple[float, float, float], std: tuple[float, float, float],
                              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Colour exchange when ``colour_exchange`` is on (masks unchanged); identity otherwise."""
        if not self.colour_exchange:
            return x, y
        return colour_exchange(x, mean, std, generator), y

    def adjust_test_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """:func:`probability_correction` when ``pcs`` is on; identity otherwise."""
        return probability_correction(logits) if self.pcs else logits
