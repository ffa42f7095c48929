"""Grad-CAM target layers: a documented default per architecture, a dotted-path override, a generic fallback.

Defaults (:data:`DEFAULT_TARGET_LAYERS`; paths inside the registered :class:`~msb.models.base.Segmentor`):

================  ===========================================================  ==================================
architecture      target layer(s)                                              why
================  ===========================================================  ==================================
``unet``          ``net.decoder.blocks[-1]``                                   last decoder block (full
                                                                               resolution, just before the head)
``segformer``     ``net.decoder``                                              the fused all-MLP decoder output
                                                                               (stride 4) the head reads
``pranet``        ``ra2.convs[-1]``                                            last conv of the stride-8 reverse
                                                                               attention branch giving S_2 (the
                                                                               test-time output)
``sanet``         ``linear5``, ``linear4``, ``linear3``                        the three maps multiplied and fed
                                                                               to the prediction conv
``polyp_pvt``     ``cfm``, ``sam``                                             the two features whose heads are
                                                                               summed at test time
``pvt_cascade``   ``decoder.conv_block4`` ... ``decoder.conv_block1``          the four stages whose heads are
                                                                               summed at test time
``g_cascade``     ``decoder.gcb4`` ... ``decoder.gcb1``                        idem (graph blocks, before the
                                                                               shared spatial attention)
================  ===========================================================  ==================================

With several layers, the ``grad-cam`` package computes one CAM per layer, rescales each to [0, 1] at the input
size and averages them (its ``aggregate_multi_layers``). An architecture without a default uses the last
``nn.Conv2d`` executed in a forward pass whose output channels differ from the class count (the last feature
layer before the prediction head); ``--target-layer`` overrides every rule.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from msb.errors import MSBError

__all__ = ["DEFAULT_TARGET_LAYERS", "resolve_layer", "target_layer_names", "fallback_layer_name"]

DEFAULT_TARGET_LAYERS: dict[str, tuple[str, ...]] = {
    "unet": ("net.decoder.blocks[-1]",),
    "segformer": ("net.decoder",),
    "pranet": ("ra2.convs[-1]",),
    "sanet": ("linear5", "linear4", "linear3"),
    "polyp_pvt": ("cfm", "sam"),
    "pvt_cascade": ("decoder.conv_block4", "decoder.conv_block3", "decoder.conv_block2", "decoder.conv_block1"),
    "g_cascade": ("decoder.gcb4", "decoder.gcb3", "decoder.gcb2", "decoder.gcb1"),
}

_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|\d+)(\[-?\d+\])*$")


def resolve_layer(model: nn.Module, path: str) -> nn.Module:
    """The sub-module at a dotted ``path``; a part may carry indices, e.g. ``net.decoder.blocks[-1]``.

    Raises:
        MSBError: the path does not name a sub-module (lists the model's top-level children).
    """
    module: nn.Module = model
    for part in path.split("."):
        if not _PART.match(part):
            raise MSBError(f"--target-layer '{path}': cannot parse '{part}'; use a dotted module path as printed "
                           f"by model.named_modules(), optionally with [index]")
        name, *indices = re.split(r"\[|\]", part.replace("][", "["))
        indices = [i for i in indices if i != ""]
        try:
            module = getattr(module, name) if not name.isdigit() else module[int(name)]  # type: ignore[index]
            for i in indices:
                module = module[int(i)]  # type: ignore[index]
        except (AttributeError, IndexError, TypeError, KeyError):
            children = ", ".join(n for n, _ in model.named_children())
            raise MSBError(f"--target-layer '{path}': no sub-module '{part}' in {type(model).__name__} "
                           f"(top-level children: {children})") from None
    if not isinstance(module, nn.Module):
        raise MSBError(f"--target-layer '{path}' is not a module")
    return module


def fallback_layer_name(model: nn.Module, x: torch.Tensor, num_classes: int) -> str:
    """Name of the last ``nn.Conv2d`` executed in ``model(x)`` whose ``out_channels != num_classes``."""
    order: list[str] = []
    names = {m: n for n, m in model.named_modules()}
    hooks = [m.register_forward_hook(lambda mod, i, o: order.append(names[mod]))
             for m in model.modules() if isinstance(m, nn.Conv2d) and m.out_channels != num_classes]
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    if not order:
        raise MSBError(f"{type(model).__name__}: no Conv2d feature layer found for Grad-CAM; give --target-layer")
    return order[-1]


def target_layer_names(arch: str, model: nn.Module, x: torch.Tensor, num_classes: int,
                       override: tuple[str, ...] = ()) -> tuple[str, ...]:
    """Target layer paths: ``override`` if given, else :data:`DEFAULT_TARGET_LAYERS`, else the fallback."""
    if override:
        return tuple(override)
    if arch in DEFAULT_TARGET_LAYERS:
        return DEFAULT_TARGET_LAYERS[arch]
    return (fallback_layer_name(model, x, num_classes),)
