"""``msb checkpoints upgrade``: rewrite a run folder's checkpoints and resume state as weights-only files.

Files written by an older msb (NumPy RNG states and scalars inside) are refused by the restricted unpickler
(:func:`msb.models.safe_io.safe_load`). This module is the one place that reads them with the full unpickler,
and only when the caller passes ``trust_pickle=True`` (the user's ``--trust-pickle``: they trust whoever wrote
the folder, since unpickling runs whatever code the file names). Each file is first verified against its
recorded SHA-256 (the record in ``checkpoints/records.json`` / ``state/train_state.sha256``), converted by
:func:`msb.models.safe_io.to_safe` (NumPy RNG state as :func:`msb.engine.determinism.numpy_state_plain`), and
written back through :func:`msb.models.checkpoint.save_checkpoint` / :func:`~msb.models.checkpoint.save_state`,
which install the file and its new digest consistently at every kill point. Weights and every value are
unchanged, so evaluation gives identical counts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from msb.engine.determinism import numpy_state_plain
from msb.errors import MSBError
from msb.models.checkpoint import STATE_DIGEST, STATE_FILE, read_records, save_checkpoint, save_state
from msb.models.safe_io import safe_load, trusted_load

__all__ = ["UpgradeResult", "upgrade_run", "run_folders"]


@dataclass
class UpgradeResult:
    """What :func:`upgrade_run` did to one run folder: ``upgraded`` / ``already_safe`` list file paths."""

    run_dir: Path
    upgraded: list[str] = field(default_factory=list)
    already_safe: list[str] = field(default_factory=list)


def run_folders(path: Path) -> list[Path]:
    """``path`` itself when it is a run folder (holds ``config.yaml``), else its run folders (a study folder).

    Raises:
        MSBError: ``path`` does not exist, or holds no run folder.
    """
    path = Path(path)
    if not path.exists():
        raise MSBError(f"{path}: no such folder; give a run folder runs/<study>/<run_id> or a study folder")
    if (path / "config.yaml").is_file():
        return [path]
    runs = sorted(p for p in path.iterdir() if p.is_dir() and (p / "config.yaml").is_file())
    if not runs:
        raise MSBError(f"{path}: neither a run folder (no config.yaml) nor a study folder holding run folders")
    return runs


def _verified(path: Path, sha256: str | None) -> bytes:
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if sha256 is None or digest != sha256:
        raise MSBError(f"{path}: SHA-256 {digest[:12]}... does not match its record ({(sha256 or 'none')[:12]}...); "
                       f"the file changed after it was written, not upgrading it")
    return data


def _plain_state(state: Any) -> Any:
    if isinstance(state, dict) and isinstance(state.get("rng"), dict) and "numpy" in state["rng"]:
        state = {**state, "rng": {**state["rng"], "numpy": numpy_state_plain(state["rng"]["numpy"])}}
    return state


def upgrade_run(run_dir: Path, trust_pickle: bool, log: Callable[[str], None] = print) -> UpgradeResult:
    """Rewrite the checkpoints and resume state of ``run_dir`` that the restricted unpickler refuses.

    Args:
        run_dir: a run folder. trust_pickle: must be True to read a refused file with the full unpickler.
        log: one line per file.

    Returns:
        :class:`UpgradeResult` (files rewritten, files already weights-only).

    Raises:
        MSBError: a file's SHA-256 differs from its record, or a file needs the full unpickler and
            ``trust_pickle`` is False (one line naming the file and ``--trust-pickle``).
    """
    run_dir = Path(run_dir)
    res = UpgradeResult(run_dir)
    records = read_records(run_dir)
    for role, rec in records.items():
        path = run_dir / rec.path
        data = _verified(path, rec.sha256)
        try:
            safe_load(data, path, run_dir, "checkpoint", "retrain the run")
            res.already_safe.append(str(path))
            continue
        except MSBError:
            if not trust_pickle:
                raise MSBError(f"{path}: needs the full unpickler, which runs any code the file names; add "
                               f"--trust-pickle only if you trust whoever wrote {run_dir}") from None
        payload = trusted_load(data, path)
        save_checkpoint(run_dir, role, payload, rec.epoch, rec.selection_split, rec.metric, rec.value)
        res.upgraded.append(str(path))
        log(f"upgraded {path}")
    spath = run_dir / "state" / STATE_FILE
    if spath.is_file():
        sha = (run_dir / "state" / STATE_DIGEST)
        data = _verified(spath, sha.read_text().strip() if sha.is_file() else None)
        try:
            safe_load(data, spath, run_dir, "resume state", "delete the state/ folder")
            res.already_safe.append(str(spath))
        except MSBError:
            if not trust_pickle:
                raise MSBError(f"{spath}: needs the full unpickler, which runs any code the file names; add "
                               f"--trust-pickle only if you trust whoever wrote {run_dir}") from None
            save_state(run_dir, _plain_state(trusted_load(data, spath)))
            res.upgraded.append(str(spath))
            log(f"upgraded {spath}")
    return res
