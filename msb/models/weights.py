"""Loading local weight files (never from a hub).

Accepts PyTorch pickles (``.pth``/``.pt``/``.bin``, optionally wrapped as ``{"state_dict": ...}`` or
``{"model": ...}``) and ``.safetensors``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch
from torch import nn

from msb.errors import MSBError

__all__ = ["read_state_dict", "load_local_weights"]


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Read a state dict from a local file. Raises :class:`MSBError` if it is missing or unreadable."""
    path = Path(path)
    if not path.is_file():
        raise MSBError(f"{path}: weights file not found; give a local .pth/.pt/.safetensors file "
                       f"(nothing is downloaded) or set encoder_weights: null")
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            sd = load_file(str(path))
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any reader failure is a user-file problem
        raise MSBError(f"{path}: cannot read weights ({type(exc).__name__}: {exc})") from exc
    for key in ("state_dict", "model", "model_state"):
        if isinstance(sd, dict) and key in sd and isinstance(sd[key], dict):
            sd = sd[key]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        raise MSBError(f"{path}: not a state dict of tensors")
    return sd


def load_local_weights(module: nn.Module, path: str | Path, strip_prefixes: tuple[str, ...] = ("module.",),
                       ignore_prefixes: tuple[str, ...] = ("fc.", "head.", "classifier."),
                       transform: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
                       ) -> None:
    """Load a local state dict into ``module`` strictly.

    Keys starting with ``strip_prefixes`` lose that prefix; keys starting with ``ignore_prefixes`` (a
    classifier head the segmentation encoder lacks) are dropped. ``transform`` (optional) maps the read
    state dict before that, e.g. to rename the keys of an official checkpoint to the library's names.

    Raises:
        MSBError: missing keys, unexpected keys or shape mismatches, listing up to 10 of each.
    """
    sd = read_state_dict(path)
    if transform is not None:
        sd = transform(sd)
    clean: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        for p in strip_prefixes:
            if k.startswith(p):
                k = k[len(p):]
        if any(k.startswith(p) for p in ignore_prefixes):
            continue
        clean[k] = v
    own = module.state_dict()
    missing = sorted(set(own) - set(clean))
    unexpected = sorted(set(clean) - set(own))
    shape = sorted(k for k in set(own) & set(clean) if own[k].shape != clean[k].shape)
    if missing or unexpected or shape:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {', '.join(missing[:10])}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {', '.join(unexpected[:10])}")
        if shape:
            parts.append("shape mismatch: " + ", ".join(
                f"{k} {tuple(clean[k].shape)} vs {tuple(own[k].shape)}" for k in shape[:10]))
        raise MSBError(f"{path}: weights do not match {type(module).__name__}: " + "; ".join(parts))
    # nn.Module's loader: some encoders (smp's MiT) override load_state_dict without ``strict``; the keys were
    # checked above, so the plain strict load is what is meant
    nn.Module.load_state_dict(module, clean, strict=True)
