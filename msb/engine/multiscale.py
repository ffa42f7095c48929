"""Multi-scale training inputs (PraNet ``MyTrain.py`` / Polyp-PVT / CASCADE; SANet's random-size batches).

For a training batch at the cached input size, :func:`scaled_batches` returns the list of (images, masks) pairs
the trainer runs, one per selected rate. Config: :class:`msb.config.schema.MultiScaleConfig`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from msb.config.schema import MultiScaleConfig

__all__ = ["scaled_size", "select_rates", "scaled_batches"]


def scaled_size(size: tuple[int, int], rate: float, multiple: int = 32) -> tuple[int, int]:
    """``round(s · rate / multiple) · multiple`` for each side s (pixels), at least ``multiple``.

    PraNet: ``int(round(352 · 0.75 / 32) · 32) = 256``, ``352 · 1.25 -> 448``. Python's ``round`` (half to
    even), as the reference scripts."""
    return tuple(max(multiple, int(round(s * rate / multiple) * multiple)) for s in size)  # type: ignore


def select_rates(cfg: MultiScaleConfig, generator: torch.Generator) -> list[float]:
    """The rates used for one batch: all of ``cfg.rates`` (``sampling: all``) or one drawn with
    ``cfg.probabilities`` from ``generator`` (``sampling: random``)."""
    if cfg.sampling == "all":
        return list(cfg.rates)
    probs = torch.tensor(cfg.probabilities, dtype=torch.float64)
    i = int(torch.multinomial(probs, 1, generator=generator))
    return [cfg.rates[i]]


def scaled_batches(x: torch.Tensor, y: torch.Tensor, cfg: MultiScaleConfig | None,
                   generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rescaled copies of a training batch.

    Args:
        x: images (N, 3, H, W) float; y: masks (N, C, H, W) float in [0, 1].
        cfg: multi-scale settings, or None (returns ``[(x, y)]``).
        generator: CPU generator for ``sampling: random``.

    Returns:
        One (x_r, y_r) per selected rate. A rate whose size equals (H, W) returns the batch unchanged (the
        reference resizes only when rate != 1). Images: bilinear, align_corners=True; masks: bilinear
        (soft targets, ``soft_masks``) or nearest.
    """
    if cfg is None:
        return [(x, y)]
    size = tuple(x.shape[-2:])
    out = []
    for rate in select_rates(cfg, generator):
        new = scaled_size(size, rate, cfg.size_multiple)  # type: ignore[arg-type]
        if new == size:
            out.append((x, y))
            continue
        xr = F.interpolate(x, size=new, mode="bilinear", align_corners=True)
        if cfg.soft_masks:
            yr = F.interpolate(y, size=new, mode="bilinear", align_corners=True)
        else:
            yr = F.interpolate(y, size=new, mode="nearest")
        out.append((xr, yr))
    return out
