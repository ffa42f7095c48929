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


_SCRATCH = ("__pycache__", ".pytest_cache", ".egg-info", ".pyc")


def _tree_state() -> set[str] | None:
    """What the suite must not change in the source tree: ``git status --porcelain --ignored`` lines
    (tracked changes, untracked and ignored paths; ignored folders collapsed) plus the entries of the
    git-ignored output folders ``runs/``, ``datasets/*/``, ``.msb_cache/``, ``profiles/``; Python/pytest caches
    left out. None when this is not a git work tree (e.g. an installed copy)."""
    import subprocess

    try:
        r = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--ignored=traditional"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    state = {ln for ln in r.stdout.splitlines() if not any(s in ln for s in _SCRATCH)}
    for folder in ("runs", "datasets", ".msb_cache", "profiles"):
        if (REPO / folder).is_dir():
            state |= {f"{folder}/{p.name}" for p in (REPO / folder).iterdir() if p.is_dir()}
    return state


@pytest.fixture(scope="session", autouse=True)
def source_tree_unchanged():
    """Tests never write into the source tree: the tree state (:func:`_tree_state`) after the session equals the
    state before it; otherwise the session ends with an error naming the new or changed paths. (Editing the
    tree while the suite runs trips it too.)"""
    before = _tree_state()
    yield
    after = _tree_state()
    if before is not None and after is not None and after != before:
        pytest.fail("tests wrote into the source tree (use tmp_path): " + "; ".join(sorted(after ^ before)[:20]),
                    pytrace=False)
