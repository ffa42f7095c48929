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

__all__ = ["read_state_dict", "load_local_weights", "remove_prefixes", "check_and_load"]


def read_state_dict(path: str | Path, what: str = "weights") -> dict[str, torch.Tensor]:
    """Read a state dict of tensors from a local file (``.pth``/``.pt``/``.bin`` pickle read with
    ``weights_only=True``, or ``.safetensors``), unwrapping ``{"state_dict"|"model"|"model_state": ...}``.

    Raises:
        MSBError: the file is missing, unreadable or not a mapping of names to tensors (names the file).
    """
    path = Path(path)
    if not path.is_file():
        hint = ("or set encoder_weights: none" if what == "weights" else "or remove model.checkpoint")
        raise MSBError(f"{path}: {what} file not found; give a local .pth/.pt/.safetensors file {hint}")
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


def remove_prefixes(sd: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """``sd`` with each key's leading ``prefixes`` removed (repeatedly, in order: ``module.backbone.x`` -> ``x``).
    Tensors are shared, not copied."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        changed = True
        while changed:
            changed = False
            for p in prefixes:
                if k.startswith(p):
                    k, changed = k[len(p):], True
        out[k] = v
    return out


def check_and_load(module: nn.Module, sd: dict[str, torch.Tensor], path: str | Path) -> None:
    """Load ``sd`` into ``module`` strictly after checking its keys and shapes.

    A missing ``<bn>.num_batches_tracked`` whose ``<bn>.running_mean`` is present is accepted (a file written
    before PyTorch 0.4.1 has none): as in :meth:`torch.nn.modules.batchnorm._NormBase._load_from_state_dict` for
    a state dict without version metadata, the module keeps its own counter (0 for a new model).

    Raises:
        MSBError: one line naming ``path``, with the missing, unexpected and mis-shaped keys (first 10 of each).
    """
    own = module.state_dict()
    missing = sorted(k for k in set(own) - set(sd)
                     if not (k.endswith(".num_batches_tracked")
                             and k[:-len("num_batches_tracked")] + "running_mean" in sd))
    unexpected = sorted(set(sd) - set(own))
    shape = sorted(k for k in set(own) & set(sd) if own[k].shape != sd[k].shape)
    if missing or unexpected or shape:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing key(s): {', '.join(missing[:10])}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected key(s): {', '.join(unexpected[:10])}")
        if shape:
            parts.append("shape mismatch: " + ", ".join(
                f"{k} {tuple(sd[k].shape)} vs {tuple(own[k].shape)}" for k in shape[:10]))
        raise MSBError(f"{path}: weights do not match {type(module).__name__}: " + "; ".join(parts))
    full = dict(sd)
    for k in set(own) - set(sd):  # only num_batches_tracked counters are left here
        full[k] = own[k]
    # nn.Module's loader: some encoders (smp's MiT) override load_state_dict without ``strict``; the keys were
    # checked above, so the plain strict load is what is meant
    nn.Module.load_state_dict(module, full, strict=True)


def load_local_weights(module: nn.Module, path: str | Path, strip_prefixes: tuple[str, ...] = ("module.",),
                       ignore_prefixes: tuple[str, ...] = ("fc.", "head.", "classifier."),
                       transform: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None,
                       ) -> None:
    """Load a local state dict into ``module`` strictly.

    Keys starting with ``strip_prefixes`` lose that prefix first; ``transform`` (optional) then maps the state
    dict, e.g. to rename the keys of an official checkpoint to the library's names (so a ``module.``-prefixed
    official file is renamed too); keys starting with ``ignore_prefixes`` (a classifier head the segmentation
    encoder lacks) are dropped last. Missing ``num_batches_tracked`` counters are accepted
    (:func:`check_and_load`).

    Raises:
        MSBError: missing keys, unexpected keys or shape mismatches, listing up to 10 of each.
    """
    sd = remove_prefixes(read_state_dict(path), strip_prefixes)
    if transform is not None:
        sd = transform(sd)
    clean = {k: v for k, v in sd.items() if not any(k.startswith(p) for p in ignore_prefixes)}
    check_and_load(module, clean, path)
