"""Integrity of an evaluation folder (``<run>/evaluation/<role>/``, external and ensemble evaluations alike).

An evaluation folder holds ``counts.parquet``, ``predictions/<sample_id>.npz``, ``prediction_semantics.json``,
optionally ``metrics.parquet`` (and ``ensemble.json`` for an ensemble), ``digests.json``
(:mod:`msb.utils.digests`) and, written last, ``DONE``. The evaluators write the whole folder into a staging
folder beside it, seal it with :func:`seal_folder` (the digests of every file) and swap it in with
:func:`msb.utils.atomic.replace_dir`; a folder is therefore either the old complete evaluation or the new one.

This module gives the readers' side: the command that regenerates a folder (:func:`regenerate_command`),
the digest check of ``counts.parquet`` (:func:`check_counts_digest`) and the check that the predictions
cover exactly the images of the counts, with their digests (:func:`check_predictions`). Folders written
before digests existed (no ``digests.json``) are read unverified, with a note (:func:`unverified_note`).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Iterable, Sequence

from msb.errors import MSBError
from msb.utils.digests import DIGESTS_FILENAME, Digests, check_digest, compute_digests, read_digests, write_digests
from msb.utils.interrupted import is_temp_file_name

__all__ = ["evaluate_command", "ensemble_hint", "regenerate_command", "seal_folder", "check_counts_digest",
           "check_predictions", "check_done_folder", "unrecorded_checkpoint_error", "unverified_note", "NOT_SEALED",
           "check_listed_digest"]

#: Files of an evaluation folder that ``digests.json`` does not cover (``DONE`` is written after the swap).
NOT_SEALED = frozenset({DIGESTS_FILENAME, "DONE"})

_MAX_LISTED = 5


def _q(path: str | os.PathLike) -> str:
    return shlex.quote(str(path))


def evaluate_command(run_dir: str | os.PathLike, role: str, external: str | None = None) -> str:
    """``msb evaluate RUN [--external NAME] --checkpoint ROLE --force``: rewrites one evaluation folder."""
    ext = f" --external {_q(external)}" if external else ""
    return f"msb evaluate {_q(run_dir)}{ext} --checkpoint {role} --force"


def ensemble_hint(out_dir: str | os.PathLike) -> str:
    """What rebuilds a fold-ensemble evaluation folder (it is made from the folds' stored predictions)."""
    return (f"delete {out_dir} and rerun the command that built the ensemble (msb run STUDY, or msb evaluate "
            f"STUDY --external NAME); it is rebuilt from the folds' stored predictions")


def _derived_command(eval_dir: Path) -> str | None:
    """The regenerate command from the folder's place in a run folder, or None when it is not in one."""
    d = Path(eval_dir)
    parts = d.parts
    if len(parts) >= 3 and parts[-2] == "evaluation":
        run, role, ext = d.parent.parent, parts[-1], None
    elif len(parts) >= 5 and parts[-4] == "evaluation" and parts[-3] == "external":
        run, role, ext = d.parents[3], parts[-1], parts[-2]
    else:
        return None
    if (d / "ensemble.json").is_file():
        return ensemble_hint(d)
    if (d / "score.json").is_file():  # scored external predictions: the msb score command in digests.json
        return None
    if (run / "config.yaml").is_file():
        return evaluate_command(run, role, ext)
    return None


def regenerate_command(eval_dir: str | os.PathLike) -> str:
    """The command that writes ``eval_dir`` again.

    Derived from the folder's place (``<run>/evaluation/<role>`` -> ``msb evaluate <run> --checkpoint <role>
    --force``; an ensemble folder -> :func:`ensemble_hint`), so it stays right when a study is moved; else the
    command recorded in its ``digests.json``; else a generic sentence.
    """
    d = Path(eval_dir)
    derived = _derived_command(d)
    if derived:
        return derived
    try:
        raw = json.loads((d / DIGESTS_FILENAME).read_text(encoding="utf-8"))
        if isinstance(raw, dict) and isinstance(raw.get("regenerate"), str) and raw["regenerate"]:
            return raw["regenerate"]
    except (OSError, ValueError, UnicodeDecodeError):
        pass
    return f"rerun the evaluation that wrote {d} (msb evaluate RUN --checkpoint ROLE --force)"


def seal_folder(folder: str | os.PathLike, regenerate: str) -> Path:
    """Write ``folder/digests.json`` covering every file under ``folder`` (except ``DONE``, ``digests.json``
    and temporary files); call it after the last file is written, before the folder is swapped in."""
    folder = Path(folder)
    rels = []
    for p in folder.rglob("*"):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and not p.is_symlink() and rel not in NOT_SEALED and not is_temp_file_name(p.name):
            rels.append(rel)
    return write_digests(folder, compute_digests(folder, rels), regenerate)


def check_counts_digest(path: str | os.PathLike, data: bytes | None = None) -> bool:
    """Check ``counts.parquet`` against the ``digests.json`` of its folder.

    Args:
        path: the counts file.
        data: its bytes, when already read.

    Returns:
        True when verified; False when its folder has no ``digests.json`` (written before digests existed).

    Raises:
        MSBError: the digest differs, the file is not listed, or ``digests.json`` is damaged; the message
            names the file and the command that regenerates it.
    """
    path = Path(path)
    hint = regenerate_command(path.parent)
    digests = read_digests(path.parent, hint)
    if digests is None:
        return False
    check_digest(digests, path.name, hint, data)
    return True


def check_listed_digest(eval_dir: str | os.PathLike, rel: str) -> bool:
    """Check ``eval_dir/rel`` against the folder's ``digests.json`` when it lists that file.

    Returns:
        True when checked; False when the folder has no digests or does not list ``rel``.

    Raises:
        MSBError: the digest differs (one line naming the file and the regenerate command).
    """
    d = Path(eval_dir)
    hint = regenerate_command(d)
    digests = read_digests(d, hint)
    if digests is None or rel not in digests.files:
        return False
    check_digest(digests, rel, hint)
    return True


def _listed(ids: Sequence[str]) -> str:
    ids = sorted(ids)
    return ", ".join(ids[:_MAX_LISTED]) + (f", ... ({len(ids)} in all)" if len(ids) > _MAX_LISTED else "")


def check_predictions(eval_dir: str | os.PathLike, image_ids: Iterable[str], verify: bool = True) -> bool:
    """Check that ``eval_dir/predictions`` holds one ``<id>.npz`` per image of the counts, and nothing else,
    and (``verify``) that each matches its digest.

    Args:
        eval_dir: the evaluation folder.
        image_ids: the ``image_id`` values of its ``counts.parquet``.
        verify: hash every prediction file against ``digests.json`` (when the folder has one).

    Returns:
        True when the folder has digests (and, with ``verify``, every prediction matched); False for a folder
        written before digests existed.

    Raises:
        MSBError: one line naming the missing (or extra) ids, first few, and the regenerate command; or a
            prediction whose digest differs.
    """
    d = Path(eval_dir)
    hint = regenerate_command(d)
    pred_dir = d / "predictions"
    expected = set(map(str, image_ids))
    found = {p.name[: -len(".npz")] for p in pred_dir.glob("*.npz")} if pred_dir.is_dir() else set()
    missing = expected - found
    if missing:
        raise MSBError(f"{pred_dir}: {len(missing)} of {len(expected)} image(s) of counts.parquet have no prediction "
                       f"file ({_listed(missing)}); regenerate the evaluation: {hint}")
    extra = found - expected
    if extra:
        raise MSBError(f"{pred_dir}: {len(extra)} prediction file(s) for images not in counts.parquet "
                       f"({_listed(extra)}); regenerate the evaluation: {hint}")
    digests: Digests | None = read_digests(d, hint)
    if digests is None:
        return False
    if verify:
        for sid in sorted(expected):
            check_digest(digests, f"predictions/{sid}.npz", hint)
    return True


def unverified_note(folders: Sequence[str | os.PathLike]) -> str:
    """One note line for folders read without digests (written before this version of msb)."""
    shown = ", ".join(str(f) for f in list(folders)[:3]) + (" ..." if len(folders) > 3 else "")
    return (f"note: {len(folders)} evaluation folder(s) have no {DIGESTS_FILENAME} (written before digests "
            f"existed) and were read unverified: {shown}")


def check_done_folder(eval_dir: str | os.PathLike) -> None:
    """Cheap check of a finished (``DONE``) evaluation folder before it is reused instead of re-evaluated:
    every file its ``digests.json`` lists exists (the counts' digest is verified when they are read).

    Raises:
        MSBError: a listed file is missing (one line naming it and the command that regenerates the folder);
            ``digests.json`` is damaged.
    """
    d = Path(eval_dir)
    hint = regenerate_command(d)
    digests = read_digests(d, hint)
    if digests is None:  # written before digests existed
        return
    missing = [rel for rel in digests.files if not (d / rel).is_file()]
    if missing:
        raise MSBError(f"{d / missing[0]}: missing ({len(missing)} file(s) listed in {DIGESTS_FILENAME} are gone); "
                       f"regenerate the evaluation: {hint}")


def unrecorded_checkpoint_error(run_dir: str | os.PathLike, role: str, recorded_roles: Iterable[str]
                                ) -> MSBError | None:
    """The error for a checkpoint file whose record is gone (``checkpoints/records.json`` deleted or without
    ``role``), or None when ``role`` is recorded, was never saved, or a record is being installed
    (``records.json.pending``: :func:`msb.models.checkpoint.load_checkpoint` decides).

    The message says what happened and what to do (restore the records or retrain), never "train the run
    first", which would only repeat "training already finished".
    """
    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoints" / f"{role}.pt"
    if role in set(recorded_roles) or not ckpt.is_file() or (run_dir / "checkpoints" / "records.json.pending").is_file():
        return None
    rec_path = run_dir / "checkpoints" / "records.json"
    what = "missing" if not rec_path.is_file() else f"has no '{role}' record"
    return MSBError(f"{rec_path}: {what} although checkpoints/{ckpt.name} exists: the record holding the checkpoint's "
                    f"SHA-256 was deleted, so the weights cannot be verified and are not evaluated; restore "
                    f"checkpoints/records.json from a backup, or retrain the run: delete {run_dir} and rerun msb run "
                    f"(training starts from scratch)")
