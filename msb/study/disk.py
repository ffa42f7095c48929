"""What a study folder holds on disk, for the line ``msb run`` prints at its end (docs/studies.md, "Disk")."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["disk_use", "disk_use_line"]

_KINDS = ("checkpoints", "resume states", "predictions", "other")


def _kind(rel: Path) -> str:
    parts = rel.parts
    if "checkpoints" in parts:
        return "checkpoints"
    if "state" in parts and rel.name.startswith("train_state"):
        return "resume states"
    if "predictions" in parts:
        return "predictions"
    return "other"


def disk_use(study_dir: Path) -> dict[str, int]:
    """Bytes of every regular file below ``study_dir`` (symbolic links not followed), by kind: ``checkpoints``
    (``checkpoints/``), ``resume states`` (``state/train_state*``), ``predictions`` (``predictions/`` of every
    evaluation), ``other``; plus ``total``. A missing folder gives zeros."""
    out = dict.fromkeys(_KINDS, 0)
    study_dir = Path(study_dir)
    for root, _dirs, files in os.walk(study_dir):
        for f in files:
            p = Path(root) / f
            try:
                if p.is_symlink():
                    continue
                size = p.stat().st_size
            except OSError:  # removed while walking (another worker)
                continue
            out[_kind(p.relative_to(study_dir))] += size
    out["total"] = sum(out[k] for k in _KINDS)
    return out


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def disk_use_line(study_dir: Path) -> str:
    """``disk: <study_dir> holds 123.4 MB (checkpoints ..., resume states ..., predictions ..., other ...)``
    (MB = 10^6 bytes)."""
    u = disk_use(study_dir)
    return (f"disk: {study_dir} holds {_mb(u['total'])} (" + ", ".join(f"{k} {_mb(u[k])}" for k in _KINDS) + ")")
