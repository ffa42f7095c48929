"""The epoch convention of run folders: 1-based wherever a person or a file sees an epoch.

Epoch ``k`` means "after ``k`` finished epochs": the first epoch is 1, the last of ``train.epochs = E`` is E.
This is the number in ``train_log.csv``, ``checkpoints/records.json`` (and the ``epoch`` of each
``checkpoints/<role>.pt``), ``manifest.json``, the resume state ``state/train_state.pt`` (its ``epoch``
counter, ``best.epoch`` and its history rows), the console and the report. Inside the trainer the loop index
(0-based, used for the per-epoch seed) never leaves the loop.

Files written before this convention stored 0-based epochs in ``records.json`` and in the resume state (the
history rows / ``train_log.csv`` were always 1-based). New files carry the marker ``"epoch_base": 1``
(:data:`EPOCH_BASE_KEY`): in every record of ``records.json``, in the resume state and in each checkpoint
file. A record or state without it is old and is converted on read (:func:`normalise_records`,
:func:`upgrade_state`). This module has no torch dependency, so the analysis side can use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from msb.errors import MSBError

__all__ = ["EPOCH_BASE", "EPOCH_BASE_KEY", "normalise_records", "upgrade_state"]

#: the base of every stored epoch number (1: epoch k = after k finished epochs)
EPOCH_BASE = 1
#: the marker key in records, resume states and checkpoint files
EPOCH_BASE_KEY = "epoch_base"


def _base_of(item: dict[str, Any], path: Path | str, what: str) -> int:
    """The epoch base recorded in ``item``: 0 for an unmarked (old) item, else the marker, which must be 0 or 1."""
    base = item.get(EPOCH_BASE_KEY, 0)
    if isinstance(base, bool) or base not in (0, 1):
        raise MSBError(f"{path}: {what} has {EPOCH_BASE_KEY} = {base!r}; this msb reads 0 (old files) or 1; "
                       f"the file was written by another msb version or edited, retrain the run in a new run_root")
    return int(base)


def normalise_records(raw: Any, path: Path | str) -> dict[str, dict[str, Any]]:
    """Checkpoint records (the parsed ``checkpoints/records.json``) with 1-based epochs.

    Args:
        raw: the parsed JSON: ``{role: {"epoch": int, ...}}``; a record without ``"epoch_base"`` is old
            (0-based epoch) and its epoch is raised by 1.
        path: the file, named in errors.

    Returns:
        ``{role: record}``, new dicts (``raw`` is not modified), each with an int ``epoch >= 1`` and
        ``"epoch_base": 1``.

    Raises:
        MSBError: ``raw`` is not a mapping of role -> mapping, an ``epoch`` is not a non-negative integer
            (>= 1 for marked records), or ``epoch_base`` is neither 0 nor 1. The message names ``path``.
    """
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise MSBError(f"{path}: not a mapping of checkpoint role -> record; the file is damaged, retrain the run "
                       f"(or delete the checkpoints/ folder)")
    out: dict[str, dict[str, Any]] = {}
    for role, rec in raw.items():
        base = _base_of(rec, path, f"record '{role}'")
        epoch = rec.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0 or (base == 1 and epoch < 1):
            raise MSBError(f"{path}: record '{role}' has epoch {epoch!r}, not a valid "
                           f"{'1' if base else '0'}-based epoch; the file is damaged, retrain the run")
        out[role] = {**rec, "epoch": epoch + (EPOCH_BASE - base), EPOCH_BASE_KEY: EPOCH_BASE}
    return out


def upgrade_state(state: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """A resume state with 1-based epochs (``state["epoch"]`` = epochs finished, ``best["epoch"]`` = the
    1-based best epoch, 0 when none yet).

    A state without ``"epoch_base"`` is old: its ``epoch`` was the 0-based index of the last finished epoch
    and ``best.epoch`` 0-based (-1 = none), while its history rows were already 1-based. It is converted only
    when its history confirms that reading (rows numbered ``1 .. epoch + 1``); otherwise it is refused.

    Args:
        state: the loaded ``state/train_state.pt`` dict (modified in place and returned).
        path: the file, named in errors.

    Returns:
        ``state`` with ``"epoch_base": 1``.

    Raises:
        MSBError: ``epoch_base`` is neither 0 nor 1, or an old state whose history does not match its epoch
            counter; the message says to delete the ``state/`` folder or rerun in a new run_root.
    """
    if _base_of(state, path, "the resume state") == EPOCH_BASE:
        return state
    fix = (f"delete {Path(path).parent} (the run restarts from scratch) or rerun in a new run_root")
    try:
        last = int(state["epoch"])
        rows = [int(r["epoch"]) for r in state.get("history", [])]
        best = dict(state["best"])
        best_epoch = int(best["epoch"])
    except (KeyError, TypeError, ValueError):
        raise MSBError(f"{path}: resume state written before epochs were 1-based lacks epoch/best/history; "
                       f"{fix}") from None
    if rows != list(range(1, last + 2)) or not -1 <= best_epoch <= last:
        raise MSBError(f"{path}: resume state written before epochs were 1-based (epoch {last}, history epochs "
                       f"{rows[:3]}{'...' if len(rows) > 3 else ''}) cannot be converted; {fix}")
    best["epoch"] = best_epoch + 1  # -1 (none yet) -> 0
    state.update({"epoch": last + 1, "best": best, EPOCH_BASE_KEY: EPOCH_BASE})
    return state
