"""Checkpoint files and records.

A checkpoint file (``checkpoints/<role>.pt``) holds ``{"model": state_dict, "epoch", "epoch_base", "arch",
"num_classes", "config_hash"}``. ``checkpoints/records.json`` holds one record per role: epoch, selection
split, metric, value, the SHA-256 of the file's bytes (which :func:`load_checkpoint` verifies before loading)
and ``epoch_base``. Every epoch is 1-based (epoch k = after k finished epochs, as in ``train_log.csv``;
:mod:`msb.utils.epochs`); records and resume states written before that convention (no ``epoch_base``) are
converted when read.

A digest is always computed from the bytes in memory, written before the file it guards is installed, and
never recomputed from a file on disk: ``state/train_state.sha256`` (resume state) and ``records.json``
(checkpoints) are installed by renaming a ``*.pending`` file written before the guarded file, so the pair is
consistent at every kill point (:func:`save_state`, :func:`save_checkpoint`), and every load verifies the bytes
it unpickles. Both are weights-only files (:mod:`msb.models.safe_io`): written through :func:`~msb.models.safe_io.to_safe`
and read with PyTorch's restricted unpickler, so loading a run folder never runs code from it. A disk-full or I/O error while writing is one line naming the file and the free space
(:mod:`msb.utils.io_errors`); the previous file and digest are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from msb.errors import MSBError
from msb.models.safe_io import safe_load, to_safe
from msb.utils.atomic import atomic_write_bytes, atomic_write_text
from msb.utils.epochs import EPOCH_BASE, normalise_records, upgrade_state
from msb.utils.fault_points import fault_point
from msb.utils.hashing import sha256_file
from msb.utils.io_errors import write_guard

__all__ = ["CheckpointRecord", "save_checkpoint", "read_records", "reconcile_records", "load_checkpoint",
           "save_state", "load_state", "STATE_FILE", "STATE_DIGEST", "STATE_PENDING"]

#: the resume state, its SHA-256 and the digest of a state being installed (``state/`` of a run folder)
STATE_FILE, STATE_DIGEST, STATE_PENDING = "train_state.pt", "train_state.sha256", "train_state.sha256.pending"


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


def _pending_records_path(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "records.json.pending"


def _records_json(records: dict[str, CheckpointRecord]) -> str:
    return json.dumps({k: asdict(v) for k, v in records.items()}, indent=2)


def save_checkpoint(run_dir: Path, role: str, payload: dict[str, Any], epoch: int, selection_split: str,
                    metric: str, value: float) -> CheckpointRecord:
    """Write ``checkpoints/<role>.pt`` and its record in ``records.json``, consistent at every kill point.

    Order: the new ``records.json`` (holding the file's SHA-256, computed from the bytes in memory) is written
    as ``records.json.pending``; the checkpoint file is replaced atomically; the pending records are renamed
    onto ``records.json``. A kill before the checkpoint is installed leaves the old file and record; a kill
    between the two renames leaves a file that matches the pending record, which :func:`load_checkpoint`
    accepts and :func:`reconcile_records` (called by the trainer on start) commits. A digest is never computed
    from a file on disk.

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
        MSBError: the existing ``records.json`` is damaged (see :func:`read_records`), or the disk is full or
            failing (one line naming the file and the free space; the previous checkpoint and record are kept).
    """
    if isinstance(epoch, bool) or int(epoch) != epoch or epoch < EPOCH_BASE:
        raise ValueError(f"epoch must be a 1-based epoch (>= {EPOCH_BASE}), got {epoch!r}")
    path = run_dir / "checkpoints" / f"{role}.pt"
    # serialise in memory, hash those bytes and write them atomically. Note: torch.save embeds a random
    # serialization id, so the SHA-256 identifies this file (integrity), not the weights: two trainings
    # with bitwise-equal weights still give different hashes.
    buf = io.BytesIO()
    torch.save(to_safe(payload), buf)  # weights-only: loadable without the full unpickler
    data = buf.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    rec = CheckpointRecord(role, epoch, selection_split, metric, float(value), digest, f"checkpoints/{role}.pt")
    records = read_records(run_dir)
    records[role] = rec
    rec_path = run_dir / "checkpoints" / "records.json"
    _install_guarded(path, data, "checkpoint", _pending_records_path(run_dir), rec_path, _records_json(records),
                     "checkpoint records", ("save_checkpoint:records_pending", "save_checkpoint:file_installed",
                                            "save_checkpoint:records_installed"))
    return rec


def _install_guarded(path: Path, data: bytes, what: str, pending: Path, guard_path: Path, guard_text: str,
                     guard_what: str, points: tuple[str, str, str]) -> None:
    """Install ``data`` at ``path`` together with the file that vouches for it (a digest or the records), so
    that every kill point leaves a consistent pair: the guard is written to ``pending`` first, then ``path`` is
    replaced, then ``pending`` is renamed onto ``guard_path`` (a reader accepts a file matching either). A failed
    write of ``path`` removes ``pending``. ``points``: the named kill points after each of the three steps.

    Raises:
        MSBError: a full or failing disk (:func:`msb.utils.io_errors.write_guard`: path and free space).
    """
    with write_guard(pending, guard_what):
        atomic_write_text(pending, guard_text)
    fault_point(points[0])
    try:
        with write_guard(path, what):
            atomic_write_bytes(path, data)
    except BaseException:
        with contextlib.suppress(OSError):
            pending.unlink()
        raise
    fault_point(points[1])
    with write_guard(guard_path, guard_what):
        os.replace(pending, guard_path)
    fault_point(points[2])


def _parse_records(path: Path) -> dict[str, CheckpointRecord]:
    """Records of one records file (``records.json`` or its pending successor), 1-based; MSBError if damaged."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise MSBError(f"{path}: unreadable checkpoint records ({type(exc).__name__}); retrain the run") from exc
    try:
        return {k: CheckpointRecord(**v) for k, v in normalise_records(raw, path).items()}
    except TypeError as exc:
        raise MSBError(f"{path}: unexpected checkpoint record fields ({exc}); retrain the run") from exc


def read_records(run_dir: Path) -> dict[str, CheckpointRecord]:
    """Read ``checkpoints/records.json`` (empty dict when absent) with 1-based epochs.

    Records written before the 1-based convention (no ``epoch_base``) have their 0-based epoch raised by 1
    (:func:`msb.utils.epochs.normalise_records`). A ``records.json.pending`` left by an interrupted
    :func:`save_checkpoint` is not read here (see :func:`load_checkpoint`, :func:`reconcile_records`).

    Raises:
        MSBError: the file is not valid JSON, not a mapping of role -> record, or has an unknown
            ``epoch_base`` or record field (the message names the file).
    """
    path = run_dir / "checkpoints" / "records.json"
    if not path.is_file():
        return {}
    return _parse_records(path)


def _pending_records(run_dir: Path) -> dict[str, CheckpointRecord]:
    """The records of ``records.json.pending`` ({} when absent or unreadable: it is only ever a candidate)."""
    path = _pending_records_path(run_dir)
    if not path.is_file():
        return {}
    try:
        return _parse_records(path)
    except MSBError:
        return {}


def reconcile_records(run_dir: Path) -> None:
    """Finish or drop a ``records.json.pending`` left by a kill inside :func:`save_checkpoint` (writer side:
    the trainer calls this before resuming). The pending records are committed when every checkpoint file whose
    record they change has exactly the SHA-256 they hold (the kill came after the file was installed), and
    deleted otherwise (the kill came before: the old file and record still agree)."""
    pending = _pending_records_path(run_dir)
    if not pending.is_file():
        return
    new = _pending_records(run_dir)
    old = read_records(run_dir)
    changed = [r for r in new.values() if old.get(r.role) != r]
    ok = bool(new) and all((run_dir / r.path).is_file() and sha256_file(run_dir / r.path) == r.sha256
                           for r in changed)
    if ok:
        with write_guard(run_dir / "checkpoints" / "records.json", "checkpoint records"):
            os.replace(pending, run_dir / "checkpoints" / "records.json")
    else:
        with contextlib.suppress(OSError):
            pending.unlink()


def load_checkpoint(run_dir: Path, role: str) -> tuple[dict[str, Any], CheckpointRecord]:
    """Load ``checkpoints/<role>.pt`` after verifying its SHA-256 against the record.

    The file is read once; its bytes are hashed and the same bytes are unpickled with the restricted
    (weights-only) unpickler, so what is loaded is what was verified and no code in the file runs. A file that matches the record of a ``records.json.pending`` (a kill between installing the file
    and its record) is accepted with that record.

    Raises:
        MSBError: no record for ``role``, the file is missing, its SHA-256 differs from the record, or it cannot
            be loaded without the full unpickler (names ``msb checkpoints upgrade RUN --trust-pickle``).
    """
    records = read_records(run_dir)
    if role not in records and role not in _pending_records(run_dir):
        raise MSBError(f"{run_dir}: no '{role}' checkpoint recorded in checkpoints/records.json; "
                       f"train the run first (msb run) or pick one of: {', '.join(records) or 'none'}")
    rec = records.get(role) or _pending_records(run_dir)[role]
    path = run_dir / rec.path
    if not path.is_file():
        raise MSBError(f"{path}: checkpoint file is missing; retrain the run")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != rec.sha256:
        pend = _pending_records(run_dir).get(role)
        if pend is None or pend.sha256 != digest:
            raise MSBError(f"{path}: SHA-256 {digest[:12]}... differs from the record {rec.sha256[:12]}...; "
                           f"the file was changed after training, refusing to evaluate it")
        rec = pend
    payload = safe_load(data, path, run_dir, "checkpoint", "retrain the run")  # the digest matched: a refusal is not damage
    if not isinstance(payload, dict) or "model" not in payload:
        raise MSBError(f"{path}: not an msb checkpoint (no 'model' state dict); retrain the run")
    return payload, rec


def _read_digest(path: Path) -> str | None:
    """The hex digest held by a digest file, or None when the file is absent."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def save_state(run_dir: Path, state: dict[str, Any]) -> None:
    """Write the resume state ``state/train_state.pt`` and its SHA-256 ``state/train_state.sha256`` so that the
    pair is consistent at every kill point.

    Order: the digest of the serialised bytes (computed in memory) is written as ``train_state.sha256.pending``;
    the state file is replaced atomically; the pending digest is renamed onto ``train_state.sha256``. A kill
    before the state is installed leaves the old state with its old digest (the pending one names a state that
    never arrived); a kill between the two renames leaves a state that matches the pending digest, which
    :func:`load_state` accepts and installs. A digest is never computed from the file it guards.

    Raises:
        MSBError: the disk is full or failing (one line naming the file and the free space; the previous state
            and digest are kept).
    """
    buf = io.BytesIO()
    torch.save(to_safe(state), buf)  # weights-only: loadable without the full unpickler
    data = buf.getvalue()
    sdir = run_dir / "state"
    path, sha_path, pending = sdir / STATE_FILE, sdir / STATE_DIGEST, sdir / STATE_PENDING
    _install_guarded(path, data, "resume state", pending, sha_path, hashlib.sha256(data).hexdigest() + "\n",
                     "resume-state digest", ("save_state:digest_pending", "save_state:state_installed",
                                             "save_state:digest_installed"))


def load_state(run_dir: Path) -> dict[str, Any] | None:
    """Read the resume state, or ``None`` when the run has not finished an epoch yet.

    The state is accepted only when the SHA-256 of its bytes equals ``train_state.sha256``, or equals
    ``train_state.sha256.pending`` (a kill between installing the state and its digest: the pending digest is
    then installed, see :func:`save_state`). The bytes that were hashed are the bytes unpickled.

    The returned state has 1-based epochs (``epoch`` = epochs finished, ``best["epoch"]`` 1-based, 0 when none)
    and ``"epoch_base": 1``; a state written before that convention is converted
    (:func:`msb.utils.epochs.upgrade_state`).

    Raises:
        MSBError: the state file has no digest, its SHA-256 matches no digest (changed after it was written),
            the restricted unpickler refuses it (names ``msb checkpoints upgrade RUN --trust-pickle``), or it is an
            old state that cannot be converted (each names the file and says to
            delete the ``state/`` folder to restart that run from scratch).
    """
    sdir = run_dir / "state"
    path, sha_path, pending = sdir / STATE_FILE, sdir / STATE_DIGEST, sdir / STATE_PENDING
    if not path.is_file():
        return None
    fix = (f"delete {path.parent} to restart this run from scratch (its checkpoints are kept until "
           f"overwritten)")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    committed, candidate = _read_digest(sha_path), _read_digest(pending)
    if committed is not None and digest == committed:
        if candidate is not None:  # a kill before its state was installed: that state never arrived
            with contextlib.suppress(OSError):
                pending.unlink()
    elif candidate is not None and digest == candidate:
        # a kill between installing the state and installing its digest (written before the state)
        with write_guard(sha_path, "resume-state digest"):
            os.replace(pending, sha_path)
    elif committed is None and candidate is None:
        raise MSBError(f"{path}: resume state has no digest ({sha_path.name} is missing), so it cannot be "
                       f"verified; {fix}")
    elif not zipfile.is_zipfile(io.BytesIO(data)):
        raise MSBError(f"{path}: resume state is unreadable (not a PyTorch file; SHA-256 {digest[:12]}... differs "
                       f"from {sha_path.name}); {fix}")
    else:
        raise MSBError(f"{path}: resume state is corrupt (SHA-256 {digest[:12]}... differs from {sha_path.name} "
                       f"{(committed or candidate or '')[:12]}...: the file changed after it was written); {fix}")
    state = safe_load(data, path, run_dir, "resume state", fix)
    if not isinstance(state, dict):
        raise MSBError(f"{path}: resume state is not a dict ({type(state).__name__}); {fix}")
    return upgrade_state(state, path)
