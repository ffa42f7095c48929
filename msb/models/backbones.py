"""timm encoders used by the polyp-segmentation adapters.

``model.encoder_weights: imagenet`` creates them with ``pretrained=True`` (timm's own Hugging Face download and
cache, :mod:`msb.models.pretrained`; ImageNet weights of timm's ``res2net50d.in1k`` / ``pvt_v2_b2.in1k``).
Otherwise weights come only from a local file (a ``.pth``/``.pt``/``.safetensors`` state dict),
loaded strictly by :func:`msb.models.weights.load_local_weights` (an :class:`~msb.errors.MSBError` lists
missing/unexpected keys). A classifier head in the file (``fc.*``, ``head.*``) is ignored; the prefixes
``module.``, ``backbone.`` and ``model.`` are stripped, so a timm state dict, an official one, or
``adapter.backbone.state_dict()`` all load.

- ``res2net50_v1b``: Res2Net-50 v1b 26w×4s (Gao et al., TPAMI 2021), the backbone of PraNet and SANet, built as
  timm ``res2net50d`` (deep 3×3 stem of width 32 + average-pool downsampling = the "v1b" variant; timm's
  ``res2net50_26w_4s`` has the plain 7×7 stem and is **not** it). Features: 256/512/1024/2048 channels at
  strides 4/8/16/32. Keys follow timm (``conv1.0``, ``layer1.0.convs.0`` …), which are the official v1b names.
  Random init as the official code (Kaiming-normal convs, every BN weight 1): timm's ``zero_init_last`` (last
  BN of each block at 0) is switched off.
- ``pvt_v2_b2``: PVTv2-B2 (Wang et al., CVMJ 2022), the encoder of Polyp-PVT, PVT-CASCADE and G-CASCADE,
  built as timm ``pvt_v2_b2`` with stochastic depth 0.1 (the ``pvt_v2_b2`` class those repositories copy).
  Features: 64/128/320/512 channels at strides 4/8/16/32, each after its stage LayerNorm. Official checkpoints
  (``patch_embed1``, ``block1.0`` … keys) are renamed to timm names with timm's own
  ``pvt_v2.checkpoint_filter_fn`` before the strict load.
"""

from __future__ import annotations

from pathlib import Path

import timm
import torch
from torch import nn

from msb.errors import MSBError
from msb.models.pretrained import IMAGENET, pretrained_guard
from msb.models.weights import load_local_weights

__all__ = ["Backbone", "build_backbone", "BACKBONES", "is_none"]

# name -> (timm model name, feature channels, extra timm kwargs)
BACKBONES: dict[str, tuple[str, tuple[int, ...], dict]] = {
    "res2net50_v1b": ("res2net50d", (256, 512, 1024, 2048), {"zero_init_last": False}),
    "pvt_v2_b2": ("pvt_v2_b2", (64, 128, 320, 512), {"drop_path_rate": 0.1}),
    "pvt_v2_b3": ("pvt_v2_b3", (64, 128, 320, 512), {"drop_path_rate": 0.1}),  # CENet (msb/models/paper/cenet.py)
}


def is_none(weights: str | Path | None) -> bool:
    """True for "no weights": ``None``, ``""`` or the string ``none`` (any case)."""
    return weights is None or str(weights).strip().lower() in ("", "none", "null")


class Backbone(nn.Module):
    """A timm classification network without its classifier, returning 4 feature maps.

    ``forward(x)`` with x (N, 3, H, W) returns ``[f1, f2, f3, f4]`` at strides 4, 8, 16, 32 with
    :attr:`channels` channels. The wrapped timm model is ``self.model`` so its state-dict keys are
    ``model.<timm key>`` inside an adapter.
    """

    def __init__(self, name: str, weights: str | Path | None = None, **kwargs) -> None:
        super().__init__()
        if name not in BACKBONES:
            raise MSBError(f"unknown backbone '{name}'; available: {', '.join(sorted(BACKBONES))}")
        timm_name, channels, extra = BACKBONES[name]
        self.name = name
        self.channels = channels
        if str(weights).strip().lower() == IMAGENET:  # timm's own download and cache (msb.models.pretrained)
            with pretrained_guard(name):
                self.model = timm.create_model(timm_name, pretrained=True, num_classes=0, **{**extra, **kwargs})
            return
        self.model = timm.create_model(timm_name, pretrained=False, num_classes=0, **{**extra, **kwargs})
        if not is_none(weights):
            transform = None
            if timm_name.startswith("pvt_v2"):
                from timm.models.pvt_v2 import checkpoint_filter_fn

                def transform(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
                    return checkpoint_filter_fn(sd, self.model)
            load_local_weights(self.model, weights, strip_prefixes=("module.", "backbone.", "model."),
                               transform=transform)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        indices = [1, 2, 3, 4] if self.name.startswith("res2net") else [0, 1, 2, 3]
        return list(self.model.forward_intermediates(x, indices=indices, intermediates_only=True))


def build_backbone(name: str, weights: str | Path | None = None, **kwargs) -> Backbone:
    """:class:`Backbone` ``name`` (a key of :data:`BACKBONES`), random init unless ``weights`` is a local file.

    Raises:
        MSBError: unknown name; weights file missing, unreadable or not matching (keys listed).
    """
    return Backbone(name, weights, **kwargs)
