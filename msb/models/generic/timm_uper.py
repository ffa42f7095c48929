"""``arch: timm_uper``: any timm backbone that supports ``features_only`` with a UPerNet head.

Configuration (``model.*``)::

    model:
      arch: timm_uper
      encoder: convnext_tiny          # any timm model name (timm.list_models()) with features_only support
      encoder_weights: none           # none | imagenet (timm's hub cache, `msb weights fetch`) | PATH
      params: {out_indices: [-4, -3, -2, -1], head_channels: 512, pool_scales: [1, 2, 3, 6], dropout: 0.1,
               backbone_kwargs: {drop_path_rate: 0.1}}   # backbone_kwargs: extra timm.create_model arguments

The backbone is ``timm.create_model(encoder, features_only=True, out_indices=...)``; the head's input widths
are the backbone's ``feature_info.channels()`` and the logits are upsampled bilinearly from the finest selected
feature map to the input size. ``size_divisor`` of an instance is the coarsest selected feature's reduction
(``feature_info.reduction()``). A local weight file is a state dict of the full timm classification model
(timm key names, classifier included or not), loaded by timm's own loader (``pretrained_cfg_overlay`` with
``file``), which maps the keys to the ``features_only`` module names.

Output: ``[logits]`` with logits (N, C, H, W) at the input resolution; test-time rule ``first``.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence

import timm
import torch
import torch.nn.functional as F

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import is_none
from msb.models.base import Segmentor, construct_adapter
from msb.models.generic.uper import UPerHead
from msb.models.pretrained import IMAGENET, pretrained_guard
from msb.models.registry import register

__all__ = ["TimmUPer", "timm_features"]


def timm_features(encoder: str, out_indices: Sequence[int], weights: str | None,
                  backbone_kwargs: dict | None = None) -> torch.nn.Module:
    """``timm.create_model(encoder, features_only=True, out_indices=...)`` with msb's weight options.

    Args:
        encoder: a timm model name.
        out_indices: feature levels to return (timm's numbering, 0 = finest; negative counts from the coarsest,
            so the default (-4, -3, -2, -1) is the last four levels: strides 4-32 for ResNets and ConvNeXts).
        weights: None/"none" (random init), "imagenet" (timm's pretrained tag via the hub cache) or a local file
            of the classification model's state dict.
        backbone_kwargs: extra keyword arguments of ``timm.create_model`` (e.g. ``drop_path_rate``).

    Raises:
        MSBError: unknown model name (with the closest names), a model without ``features_only`` support, an
            out index it does not have, a missing local file, or a weight file that does not load.
    """
    if not timm.is_model(encoder):
        close = timm.list_models(f"*{encoder.split('.')[0][:6]}*")[:5]
        raise MSBError(f"model.encoder: '{encoder}' is not a timm model"
                       + (f"; similar: {', '.join(close)}" if close else "") + " (timm.list_models())")
    kwargs = {**(backbone_kwargs or {}), "features_only": True, "out_indices": tuple(int(i) for i in out_indices)}
    imagenet = str(weights).strip().lower() == IMAGENET
    local = not imagenet and not is_none(weights)
    if local:
        _check_local_file(encoder, str(weights))
        kwargs["pretrained_cfg_overlay"] = {"file": str(weights)}
    try:
        with pretrained_guard("timm_uper", encoder) if imagenet else contextlib.nullcontext():
            return timm.create_model(encoder, pretrained=imagenet or local, **kwargs)
    except MSBError:
        raise
    except TypeError as exc:
        raise MSBError(f"model.params.backbone_kwargs: timm model '{encoder}' does not accept "
                       f"{sorted(backbone_kwargs or {})} ({str(exc)[:200]})") from exc
    except (RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0][:300]
        what = f"weights '{weights}'" if local else "the backbone"
        raise MSBError(f"model.encoder: timm could not build {encoder} (features_only, out_indices="
                       f"{kwargs['out_indices']}) with {what}: {first}") from exc
    except (IndexError, AssertionError, ValueError) as exc:
        raise MSBError(f"model.params.out_indices: {list(kwargs['out_indices'])} is not valid for timm model "
                       f"'{encoder}' ({type(exc).__name__}: {str(exc)[:200]})") from exc


def _check_local_file(encoder: str, path: str) -> None:
    """Strict key/shape check of a local file against timm's classification model ``encoder`` (classifier keys
    of the file dropped, ``module.`` stripped), before timm's own (lenient) loader maps it to the features_only
    names. Raises MSBError: missing file; missing/unexpected/mis-shaped keys (one line, first 10 of each)."""
    from msb.models.weights import check_and_load, read_state_dict, remove_prefixes

    if not Path(path).is_file():
        raise MSBError(f"model.encoder_weights: file '{path}' does not exist")
    classifier = timm.models.get_pretrained_cfg_value(encoder, "classifier") or ()
    classifier = (classifier,) if isinstance(classifier, str) else tuple(classifier)
    sd = remove_prefixes(read_state_dict(path), ("module.",))
    sd = {k: v for k, v in sd.items() if not any(k.startswith(c + ".") for c in classifier)}
    check_and_load(timm.create_model(encoder, num_classes=0), sd, path)


@register("timm_uper")
class TimmUPer(Segmentor):
    """timm ``features_only`` backbone (``self.backbone``) + :class:`~msb.models.generic.uper.UPerHead`:
    ``forward(x)`` -> ``[logits]``, logits (N, C, H, W)."""

    test_time_rule = "first"

    def __init__(self, num_classes: int = 1, encoder: str = "convnext_tiny", encoder_weights: str | None = None,
                 out_indices: Sequence[int] = (-4, -3, -2, -1), head_channels: int = 512,
                 pool_scales: Sequence[int] = (1, 2, 3, 6), dropout: float = 0.1,
                 backbone_kwargs: dict | None = None) -> None:
        super().__init__()
        if not isinstance(out_indices, (list, tuple)) or len(out_indices) < 2 or len(set(out_indices)) != len(
                out_indices) or not all(isinstance(i, int) for i in out_indices):
            raise MSBError(f"model.params.out_indices: give >= 2 distinct integer feature levels, finest first, "
                           f"e.g. [-4, -3, -2, -1] (the last four); got {out_indices!r}")
        if not isinstance(head_channels, int) or head_channels < 1:
            raise MSBError(f"model.params.head_channels: a positive integer (512 in UPerNet), got {head_channels!r}")
        if not pool_scales or not all(isinstance(s, int) and s >= 1 for s in pool_scales):
            raise MSBError(f"model.params.pool_scales: positive integers, e.g. [1, 2, 3, 6]; got {pool_scales!r}")
        if not 0.0 <= float(dropout) < 1.0:
            raise MSBError(f"model.params.dropout: a probability in [0, 1), got {dropout!r}")
        if backbone_kwargs is not None and not isinstance(backbone_kwargs, dict):
            raise MSBError(f"model.params.backbone_kwargs: a mapping of timm.create_model arguments, got "
                           f"{backbone_kwargs!r}")
        self.backbone = timm_features(encoder, out_indices, encoder_weights, backbone_kwargs)
        info = self.backbone.feature_info
        self.channels = tuple(info.channels())
        self.reductions = tuple(info.reduction())
        if list(self.reductions) != sorted(self.reductions):
            raise MSBError(f"model.params.out_indices: the levels must go from fine to coarse; {encoder} gives "
                           f"reductions {list(self.reductions)} for {list(out_indices)}")
        self.size_divisor = int(max(self.reductions))
        self.head = UPerHead(self.channels, num_classes, channels=head_channels, pool_scales=pool_scales,
                             dropout=float(dropout))

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "TimmUPer":
        return construct_adapter(cls, num_classes, cfg.params, encoder=cfg.encoder or "convnext_tiny",
                                 encoder_weights=cfg.encoder_weights)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        feats = self.backbone(x)
        if feats[0].ndim == 4 and feats[0].shape[1] != self.channels[0] and feats[0].shape[-1] == self.channels[0]:
            feats = [f.permute(0, 3, 1, 2) for f in feats]  # NHWC backbones (e.g. Swin) -> NCHW
        logits = self.head(feats)
        return [F.interpolate(logits, size=x.shape[-2:], mode="bilinear", align_corners=False)]
