"""Checkpoint files and records.

A checkpoint file (``checkpoints/<role>.pt``) holds ``{"model": state_dict, "epoch", "epoch_base", "arch",
"num_classes", "config_hash"}``. ``checkpoints/records.json`` holds one record per role: epoch, selection
split, metric, value, the SHA-256 of the file's bytes (which :func:`load_checkpoint` verifies before loading)
and ``epoch_base``. Every epoch is 1-based (epoch k = after k finished epochs, as in ``train_log.csv``;
:mod:`msb.utils.epochs`); records and resume states written before that convention (no ``epoch_base``) are
converted when read.
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
from msb.utils.epochs import EPOCH_BASE, normalise_records, upgrade_state
from msb.utils.hashing import sha256_file

__all__ = ["CheckpointRecord", "save_checkpoint", "read_records", "load_checkpoint", "save_state", "load_state"]


@dataclass
class CheckpointRecord:
    """Record of one saved checkpoint (role ``best`` or ``latest``).

    Attributes:
        role: ``best`` or ``latest``; epoch: 1-based epoch after which the weights were saved (epoch k = after
        k finished epochs, the ``epoch`` of that row of ``train_log.csv``); selection_split, metric, value: the
        selection value of that epoch; sha256: of the file's bytes; path: relative to the run folder;
        epoch_base: always 1 (the marker that tells new records from old 0-based ones).
    """

    role: str
    epoch: int
    selection_split: str
    metric: str
    value: float
    sha256: str
    path: str
    epoch_base: int = EPOCH_BASE


def save_checkpoint(run_dir: Path, role: str, payload: dict[str, Any], epoch: int, selection_split: str,
                    metric: str, value: float) -> CheckpointRecord:
    """Write ``checkpoints/<role>.pt`` atomically, then update ``records.json`` (atomically).

    Args:
        run_dir: the run folder.
        role: ``best`` or ``latest``.
        payload: what ``torch.save`` writes (model state dict and metadata).
        epoch: the 1-based epoch after which the weights were taken (>= 1).
        selection_split, metric, value: the selection value of that epoch.

    Returns:
        The new record (other roles' records are kept; old 0-based ones are rewritten 1-based).

    Raises:
        ValueError: ``epoch`` < 1 (a 0-based epoch passed by mistake).
        MSBError: the existing ``records.json`` is damaged (see :func:`read_records`).
    """
    if isinstance(epoch, bool) or int(epoch) != epoch or epoch < EPOCH_BASE:
        raise ValueError(f"epoch must be a 1-based epoch (>= {EPOCH_BASE}), got {epoch!r}")
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
    """Read ``checkpoints/records.json`` (empty dict when absent) with 1-based epochs.

    Records written before the 1-based convention (no ``epoch_base``) have their 0-based epoch raised by 1
    (:func:`msb.utils.epochs.normalise_records`).

    Raises:
        MSBError: the file is not valid JSON, not a mapping of role -> record, or has an unknown
            ``epoch_base`` or record field (the message names the file).
    """
    path = run_dir / "checkpoints" / "records.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MSBError(f"{path}: unreadable checkpoint records ({type(exc).__name__}); retrain the run") from exc
    try:
        return {k: CheckpointRecord(**v) for k, v in normalise_records(raw, path).items()}
    except TypeError as exc:
        raise MSBError(f"{path}: unexpected checkpoint record fields ({exc}); retrain the run") from exc


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

    The returned state has 1-based epochs (``epoch`` = epochs finished, ``best["epoch"]`` 1-based, 0 when none)
    and ``"epoch_base": 1``; a state written before that convention is converted
    (:func:`msb.utils.epochs.upgrade_state`).

    Raises:
        MSBError: the state file is unreadable, its SHA-256 differs from ``train_state.sha256``, or it is an old
            state that cannot be converted (each says to delete the ``state/`` folder to restart that run from
            scratch).
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
    if not isinstance(state, dict):
        raise MSBError(f"{path}: resume state is not a dict ({type(state).__name__}); {fix}")
    atomic_write_text(sha_path, digest + "\n")
    return upgrade_state(state, path)
