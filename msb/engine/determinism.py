"""Seeding and RNG-state capture for reproducible, resumable training.

``seed_everything`` seeds Python, NumPy and PyTorch (CPU and CUDA). ``set_full_determinism`` additionally
asks PyTorch for deterministic algorithms (``torch.use_deterministic_algorithms``), disables cuDNN benchmark
and sets ``CUBLAS_WORKSPACE_CONFIG`` (required by cuBLAS for deterministic GEMMs).
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

__all__ = ["seed_everything", "set_full_determinism", "get_rng_state", "set_rng_state", "numpy_state_plain",
           "numpy_state_tuple", "epoch_seed"]


def seed_everything(seed: int) -> None:
    """Seed ``random``, ``numpy.random`` and torch (all devices) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int) -> int:
    """Seed for one epoch: a fixed function of the run seed and the epoch, so a resumed run draws the same
    shuffles and augmentations as an uninterrupted one."""
    return (seed * 1_000_003 + epoch * 7919) % (2**31 - 1)


def set_full_determinism(enabled: bool) -> None:
    """Switch PyTorch's deterministic mode on or off (see module docstring)."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = not enabled


def get_rng_state() -> dict[str, Any]:
    """Capture the Python, NumPy, torch CPU and CUDA RNG states as plain data (a weights-only resume state,
    :mod:`msb.models.safe_io`): Python's as its ``getstate()`` tuple of ints, NumPy's legacy MT19937 state as
    :func:`numpy_state_plain` (its 624 uint32 words bit-cast to an int32 tensor: exact, same bytes), torch's as
    uint8 tensors."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": numpy_state_plain(np.random.get_state()),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def numpy_state_plain(st: Any) -> dict[str, Any]:
    """NumPy's legacy global RNG state (``np.random.get_state()``: ``(name, uint32[624] key, pos, has_gauss,
    cached_gaussian)``, or a dict already in this form) as a dict of plain values: ``key`` an int32 tensor holding
    the same 32-bit words. Exact: :func:`numpy_state_tuple` gives back the identical tuple.

    Raises:
        ValueError: a state of another shape.
    """
    if isinstance(st, dict):
        return st
    if not (isinstance(st, tuple) and len(st) == 5):
        raise ValueError(f"unexpected NumPy RNG state: {type(st).__name__}")
    name, key, pos, has_gauss, cached = st
    key = np.ascontiguousarray(np.asarray(key, dtype=np.uint32))
    return {"name": str(name), "key": torch.from_numpy(key.view(np.int32).copy()), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def numpy_state_tuple(st: Any) -> tuple:
    """The ``np.random.set_state`` tuple of a state from :func:`numpy_state_plain` (or such a tuple itself)."""
    if isinstance(st, tuple):
        return st
    key = st["key"].numpy() if isinstance(st["key"], torch.Tensor) else np.asarray(st["key"])
    return (st["name"], key.astype(np.int32, copy=False).view(np.uint32), st["pos"], st["has_gauss"],
            st["cached_gaussian"])


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states captured by :func:`get_rng_state` (also an older resume state's NumPy tuple)."""
    random.setstate(tuple(state["python"]) if isinstance(state["python"], list) else state["python"])
    np.random.set_state(numpy_state_tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
