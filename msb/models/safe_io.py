"""Run artifacts that load without running code: checkpoints and resume states as ``torch.load(weights_only=True)``
files.

A run folder may come from someone else (a shared study, a download). PyTorch's full unpickler runs whatever
callable a file names, and a SHA-256 beside the file protects against damage, not against its author. So every
checkpoint and resume state is written as plain data that PyTorch's restricted unpickler accepts (tensors,
numbers, strings, ``None``, lists, tuples, dicts and ``OrderedDict``; :func:`to_safe` converts NumPy values on
the way out), and read with :func:`safe_load` only. A file that the restricted unpickler refuses (an older
msb's file holding NumPy objects, or a crafted one) is refused in one line naming the file and
``msb checkpoints upgrade RUN --trust-pickle``; :func:`trusted_load` (the full unpickler) is called from that
upgrade path only, after the user said they trust the file. docs/studies.md ("Checkpoint format") says why this
format and not safetensors + JSON.
"""

from __future__ import annotations

import io
import pickle
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from msb.errors import MSBError

__all__ = ["to_safe", "safe_load", "trusted_load", "UPGRADE_HINT"]

#: the way out named by every refusal (``RUN``: the run folder)
UPGRADE_HINT = "msb checkpoints upgrade {run} --trust-pickle"


def to_safe(obj: Any) -> Any:
    """``obj`` with every NumPy value replaced by its plain equivalent, so that ``torch.save`` writes a file that
    ``torch.load(weights_only=True)`` reads back equal.

    NumPy scalars become Python ``int``/``float``/``bool`` (exact: ``float(np.float64(x)) == x``), NumPy arrays
    become tensors of the same dtype and shape (a copy), containers are rebuilt with the same type (``dict``,
    ``OrderedDict`` with its ``_metadata``, ``list``, ``tuple``); tensors, numbers, strings and ``None`` are returned as they are.

    Raises:
        TypeError: a value of another type (an object the restricted unpickler would refuse), naming its key path.
    """
    return _to_safe(obj, "state")


def _to_safe(obj: Any, where: str) -> Any:
    if isinstance(obj, np.generic):  # first: np.float64 is also a Python float, and pickles as a NumPy scalar
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str, bytes, torch.Tensor, torch.dtype, torch.device,
                                       torch.Size)):
        return obj
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, OrderedDict):  # a state dict: its ``_metadata`` (module versions) is kept, as torch.save does
        out = OrderedDict((k, _to_safe(v, f"{where}[{k!r}]")) for k, v in obj.items())
        if hasattr(obj, "_metadata"):
            out._metadata = obj._metadata  # type: ignore[attr-defined]
        return out
    if isinstance(obj, dict):
        return {k: _to_safe(v, f"{where}[{k!r}]") for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_safe(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(_to_safe(v, f"{where}[{i}]") for i, v in enumerate(obj))
    raise TypeError(f"{where}: {type(obj).__name__} cannot be stored in a weights-only checkpoint")


def safe_load(data: bytes, path: Path, run_dir: Path, what: str, damaged: str) -> Any:
    """Unpickle ``data`` (the bytes of ``path``, already verified against their digest) with PyTorch's restricted
    unpickler (``weights_only=True``), on the CPU: no code named by the file runs.

    Args:
        data: the file's bytes. path: the file (for the message). run_dir: its run folder (for the way out).
        what: ``"checkpoint"`` or ``"resume state"``. damaged: what to do about a damaged file (appended to its
            message).

    Raises:
        MSBError: the restricted unpickler refuses the file (one line: the file, that loading it would need the
            full unpickler, and ``msb checkpoints upgrade RUN --trust-pickle`` for files whose author is trusted),
            or the file is damaged (names ``damaged``).
    """
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:  # the restricted unpickler refused a global (a class or a function)
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)|Unsupported operand \d+|Unsupported class [\w.]+",
                          str(exc))
        reason = (f"it names {found.group(1)}" if found and found.group(1) else found.group(0) if found
                  else "PyTorch's weights-only unpickler refused it")
        raise MSBError(f"{path}: {what} refused: it cannot be loaded without running code from the file "
                       f"(an older msb's file, or a crafted one: {reason}); if you trust "
                       f"whoever wrote this run folder: {UPGRADE_HINT.format(run=run_dir)}") from None
    except Exception as exc:  # noqa: BLE001 - a damaged archive (zip / pickle stream)
        raise MSBError(f"{path}: {what} is unreadable ({type(exc).__name__}); {damaged}") from exc


def trusted_load(data: bytes, path: Path) -> Any:
    """Unpickle ``data`` (the bytes of ``path``) with PyTorch's full unpickler (``weights_only=False``): runs any
    code the file names. Called only by ``msb checkpoints upgrade --trust-pickle``
    (:mod:`msb.models.checkpoint_upgrade`).

    Raises:
        MSBError: the file is damaged (one line naming it).
    """
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001 - a damaged file
        raise MSBError(f"{path}: unreadable even with the full unpickler ({type(exc).__name__}); retrain the run") from exc
