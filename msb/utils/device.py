"""Device selection shared by training, evaluation and profiling."""

from __future__ import annotations

import torch

from msb.errors import MSBError

__all__ = ["select_device"]


def select_device(name: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cpu``/``cuda`` as given.

    Raises:
        MSBError: ``cuda`` requested but ``torch.cuda.is_available()`` is False.
    """
    if name == "cuda" and not torch.cuda.is_available():
        raise MSBError("device 'cuda' requested but torch.cuda.is_available() is False on this machine; "
                       "use 'cpu' or 'auto'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)
