"""Numeric precision of training and inference: ``train.precision`` resolved for one device.

Shared by the trainer, the evaluator and the profiler (it knows no training code). The rules are those of
:class:`msb.config.schema.TrainConfig`: ``auto`` = bf16 on a CUDA GPU that supports it, else fp16 with a GradScaler,
fp32 on CPU; ``fp16`` needs CUDA (on CPU it runs fp32, as the old ``amp: on`` did); ``bf16`` runs PyTorch's
autocast also on CPU; ``fp32`` never autocasts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["Precision", "resolve_precision"]


@dataclass(frozen=True)
class Precision:
    """A resolved precision.

    Attributes:
        name: ``fp32``, ``fp16`` or ``bf16`` (what ran; recorded in ``manifest.json``).
        autocast_dtype: ``torch.float16`` / ``torch.bfloat16`` for ``torch.autocast``, None for fp32.
        use_scaler: a GradScaler is needed (fp16 only: bf16 has fp32's exponent range).
        requested: the configured ``train.precision``.
    """

    name: str
    autocast_dtype: torch.dtype | None
    use_scaler: bool
    requested: str

    @property
    def autocast(self) -> bool:
        """True when the forward pass runs under ``torch.autocast``."""
        return self.autocast_dtype is not None

    def context(self, device: torch.device) -> torch.autocast:
        """``torch.autocast`` for ``device`` (disabled for fp32)."""
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype or torch.float32,
                              enabled=self.autocast)


def resolve_precision(requested: str, device: torch.device) -> Precision:
    """Resolve ``train.precision`` (``auto|fp32|fp16|bf16``) on ``device``.

    Raises:
        ValueError: an unknown ``requested`` value (the config schema admits only the four).
    """
    cuda = device.type == "cuda"
    if requested == "auto":
        name = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32"
    elif requested == "fp16":
        name = "fp16" if cuda else "fp32"
    elif requested in ("bf16", "fp32"):
        name = requested
    else:
        raise ValueError(f"train.precision {requested!r} is not one of auto, fp32, fp16, bf16")
    dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[name]
    return Precision(name, dtype, name == "fp16", requested)
