"""Shared fixtures. ``../shared`` (real data, oracle values) is found beside the repository root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    """``../shared``; skips the test with a clear message when it is absent."""
    if not SHARED.is_dir():
        pytest.skip(f"../shared not found at {SHARED}: real-data tests need the shared folder beside the repo")
    return SHARED
