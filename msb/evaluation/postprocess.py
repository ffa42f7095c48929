"""Test-time post-processing of probability maps, shared by the evaluator and the trainer's validation.

``minmax`` (``evaluation.test_time_normalisation``) reproduces the per-image min-max rescaling of old polyp test
scripts (PraNet ``MyTest.py``, Polyp-PVT ``Test.py``, CASCADE ``test_polyp.py``):
``p' = (p − min p) / (max p − min p + 1e-8)``. Followed by a fixed threshold (0.5), it labels the most
confident pixels of **every** image as foreground, even of an image without any target; the benchmark default
is ``none``.
"""

from __future__ import annotations

from typing import Literal

import torch

__all__ = ["minmax_normalise", "apply_normalisation"]


def minmax_normalise(prob: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Per image and channel ``(p − min) / (max − min + eps)`` over the last two axes. (..., H, W) -> same."""
    lo = prob.amin(dim=(-2, -1), keepdim=True)
    hi = prob.amax(dim=(-2, -1), keepdim=True)
    return (prob - lo) / (hi - lo + eps)


def apply_normalisation(prob: torch.Tensor, mode: Literal["none", "minmax"]) -> torch.Tensor:
    """``prob`` unchanged (``none``) or :func:`minmax_normalise` (``minmax``)."""
    return minmax_normalise(prob) if mode == "minmax" else prob
