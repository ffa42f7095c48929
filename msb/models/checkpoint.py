"""Checkpoint files and records.

A checkpoint file (``checkpoints/<role>.pt``) holds ``{"model": state_dict, "epoch", "arch", "num_classes",
"config_hash"}``. ``checkpoints/records.json`` holds one record per role: epoch, selection split, metric,
value and the SHA-256 of the file's bytes, which :func:`load_checkpoint` verifies before loading.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from msb.errors import MSBError
from msb.utils.atomic import atomic_write_bytes, atomic_write_text
from msb.utils.hashing import sha256_file

__all__ = ["CheckpointRecord", "save_checkpoint", "read_records", "load_checkpoint", "save_state", "load_state"]


@dataclass
class CheckpointRecord:
    """Record of one saved checkpoint (role ``best`` or ``latest``)."""

    role: str
    epoch: int
    selection_split: str
    metric: str
    value: float
    sha256: str
    path: str


def save_checkpoint(run_dir: Path, role: str, payload: dict[str, Any], epoch: int, selection_split: str,
                    metric: str, value: float) -> CheckpointRecord:
    """Write ``checkpoints/<role>.pt`` atomically, then update ``records.json`` (atomically)."""
    path = run_dir / "checkpoints" / f"{role}.pt"
    # serialise in memory, hash those bytes and write them atomically. Note: torch.save embeds a random
    # serialization id, so the SHA-256 identifies this file (integrity), not the weights: two trainings
    # with bitwise-equal weights still give different hashes.
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    atomic_write_bytes(path, data)
    rec = CheckpointRecord(role, epoch, selection_split, metric, float(value), digest, f"checkpoints/{role}.pt")
    records = read_records(run_dir)
    records[role] = rec
    atomic_write_text(run_dir / "checkpoints" / "records.json",
                      json.dumps({k: asdict(v) for k, v in records.items()}, indent=2))
    return rec


def read_records(run_dir: Path) -> dict[str, CheckpointRecord]:
    """Read ``checkpoints/records.json`` (empty dict when absent)."""
    path = run_dir / "checkpoints" / "records.json"
    if not path.is_file():
        return {}
    return {k: CheckpointRecord(**v) for k, v in json.loads(path.read_text()).items()}


def load_checkpoint(run_dir: Path, role: str) -> tuple[dict[str, Any], CheckpointRecord]:
    """Load ``checkpoints/<role>.pt`` after verifying its SHA-256 against the record.

    Raises:
        MSBError: no record for ``role``, the file is missing, or its SHA-256 differs from the record.
    """
    records = read_records(run_dir)
    if role not in records:
        raise MSBError(f"{run_dir}: no '{role}' checkpoint recorded in checkpoints/records.json; "
                       f"train the run first (msb run) or pick one of: {', '.join(records) or 'none'}")
    rec = records[role]
    path = run_dir / rec.path
    if not path.is_file():
        raise MSBError(f"{path}: checkpoint file is missing; retrain the run")
    digest = sha256_file(path)
    if digest != rec.sha256:
        raise MSBError(f"{path}: SHA-256 {digest[:12]}... differs from the record {rec.sha256[:12]}...; "
                       f"the file was changed after training, refusing to evaluate it")
    return torch.load(path, map_location="cpu", weights_only=False), rec


def save_state(run_dir: Path, state: dict[str, Any]) -> None:
    """Write the resume state ``state/train_state.pt`` atomically, then its SHA-256 to
    ``state/train_state.sha256`` (checked by :func:`load_state`). A crash between the two writes leaves a
    mismatch, which :func:`load_state` reports instead of resuming from a state it cannot trust."""
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    atomic_write_bytes(run_dir / "state" / "train_state.pt", data)
    atomic_write_text(run_dir / "state" / "train_state.sha256", hashlib.sha256(data).hexdigest() + "\n")


def load_state(run_dir: Path) -> dict[str, Any] | None:
    """Read the resume state, or ``None`` when the run has not finished an epoch yet.

    Raises:
        MSBError: the state file is unreadable, or its SHA-256 differs from ``train_state.sha256``
            (says to delete the ``state/`` folder to restart that run from scratch).
    """
    path = run_dir / "state" / "train_state.pt"
    if not path.is_file():
        return None
    fix = (f"delete {path.parent} to restart this run from scratch (its checkpoints are kept until "
           f"overwritten)")
    sha_path = run_dir / "state" / "train_state.sha256"
    digest = sha256_file(path)
    if sha_path.is_file() and digest != sha_path.read_text().strip():
        # the state file is replaced atomically before its hash: a hash file older than the state file means
        # the process stopped between the two writes (the state itself is complete), not corruption
        if sha_path.stat().st_mtime_ns >= path.stat().st_mtime_ns:
            raise MSBError(f"{path}: resume state is corrupt (SHA-256 differs from {sha_path.name}); {fix}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a damaged file
        raise MSBError(f"{path}: resume state is unreadable ({type(exc).__name__}); {fix}") from exc
    atomic_write_text(sha_path, digest + "\n")
    return state
