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

__all__ = ["seed_everything", "set_full_determinism", "get_rng_state", "set_rng_state", "epoch_seed"]


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
    """Capture the Python, NumPy, torch CPU and CUDA RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore states captured by :func:`get_rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
