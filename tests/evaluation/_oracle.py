"""Helpers for tests that read ``../shared`` (the metric oracle and the real data).

``../shared`` is the folder beside the repository root. Tests that need it call :func:`shared_dir`, which
skips the test with a clear message when the folder is absent.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
ORACLE = SHARED / "oracle"


def shared_dir(sub: str = "") -> Path:
    """Return ``../shared/<sub>``; skip the calling test when it is absent."""
    path = SHARED / sub if sub else SHARED
    if not path.exists():
        pytest.skip(f"../shared not found: {path} is absent (the oracle and real data live beside the repo root)")
    return path


@lru_cache(maxsize=1)
def _reference_values(path: str) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def reference_values() -> dict:
    """``../shared/oracle/reference_values.json`` (skips when absent)."""
    return _reference_values(str(shared_dir("oracle") / "reference_values.json"))


def case_names(nonempty: bool | None = None) -> list[str]:
    """Oracle case names for parametrisation.

    Args:
        nonempty: True -> only cases where both masks are non-empty; False -> only cases with an empty mask;
            None -> all.

    When ``../shared`` is absent, returns one placeholder so that the test runs and skips with a clear
    message (via :func:`load_case`) instead of silently collecting nothing.
    """
    index = ORACLE / "cases" / "index.json"
    if not index.exists():
        return ["shared-absent"]
    cases = json.loads(index.read_text(encoding="utf-8"))
    if nonempty is not None:
        cases = [c for c in cases if (c["n_pred"] > 0 and c["n_gt"] > 0) == nonempty]
    return [c["name"] for c in cases]


def load_case(name: str) -> tuple[np.ndarray, np.ndarray, tuple[float, float], dict]:
    """(pred bool, gt bool, spacing, reference block) of one oracle case."""
    z = np.load(shared_dir("oracle") / "cases" / f"{name}.npz")
    return z["pred"].astype(bool), z["gt"].astype(bool), tuple(float(s) for s in z["spacing"]), \
        reference_values()["cases"][name]


def decode(value):
    """JSON value -> float (``"nan"``/``"inf"`` strings decoded); dicts (library errors) pass through."""
    if isinstance(value, str):
        return float(value)
    return value


def close(actual: float, expected, atol: float = 1e-6, rtol: float = 0.0) -> bool:
    """True when both are NaN, equal infinities, or ``|a - e| <= atol + rtol |e|``."""
    e = decode(expected)
    a = float(actual)
    if math.isnan(e) or math.isnan(a):
        return math.isnan(e) and math.isnan(a)
    if math.isinf(e) or math.isinf(a):
        return a == e
    return abs(a - e) <= atol + rtol * abs(e)
