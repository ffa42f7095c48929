"""Pixel-wise strict-majority ensemble of the K fold models, computed from their stored predictions.

For one evaluation set (the shared test split, or an external dataset) and one checkpoint role, every fold's
evaluation folder holds ``predictions/<sample_id>.npz`` with the binary prediction ``pred`` (C, H, W) at
native resolution (each fold's own threshold rule already applied). The ensemble prediction is

    ``ens[c, y, x] = 2 * sum_k pred_k[c, y, x] > K``

i.e. foreground where *more than half* of the folds predict foreground (strict majority vote; with an even K
a tie is background; K = 2 gives the intersection). No model is re-run and nothing is tuned: the ensemble
reads artifacts only.

Outputs in ``<ensemble run folder>/evaluation/.../<role>/``: ``counts.parquet`` (the usual schema, see below),
``predictions/<sample_id>.npz`` (``pred``, ``ref``, ``spacing``, ``class_ids``, ``votes`` uint8 (C, H, W) = number
of folds voting foreground, ``prob`` uint8 = round(255 * votes / K)), ``metrics.parquet`` (optional),
``ensemble.json`` (members and rule), ``prediction_semantics.json`` (the members' semantics + the vote),
``digests.json`` (SHA-256 of every file, :mod:`msb.utils.digests`) and ``DONE``. The folder is written into a
staging folder beside it and swapped in whole (:func:`msb.utils.atomic.replace_dir`), ``DONE`` after the swap:
a rebuild never deletes the old ensemble until the new one is complete. The members' counts and predictions
are checked against their ``digests.json`` (and the predictions against the counts' images) before they are
used.

Counts rows of the ensemble (docs/studies.md): ``fold = -1``; ``run_id = <selected run id>-ensemble``;
``model = <arch>-ensemble<K>`` (e.g. ``unet-ensemble5``); ``checkpoint_role`` = the members' role;
``checkpoint_sha256`` = SHA-256 of the canonical JSON list of the member checkpoint SHA-256s in fold order;
``config_hash``, ``threshold``, ``threshold_on``, ``dataset``, ``split`` = the members' (identical) values.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from msb.errors import MSBError
from msb.evaluation.counts import PROTOCOL_DEFAULTS, compute_confusion_counts, counts_rows, write_counts
from msb.utils.atomic import atomic_path, atomic_write_text, replace_dir, staging_dir
from msb.utils.digests import Digests, check_digest, read_digests
from msb.utils.evaluation_folder import (check_counts_digest, check_done_folder, check_predictions, ensemble_hint,
                                         regenerate_command, seal_folder)
from msb.utils.fault_points import fault_point
from msb.utils.hashing import sha256_json
from msb.utils.interrupted import clean_interrupted_writes

__all__ = ["strict_majority", "ensemble_evaluation", "ensemble_model_name", "ensemble_run_id"]


def ensemble_run_id(run_id: str) -> str:
    """``<run_id>-ensemble``: the ``run_id`` of ensemble counts rows and the ensemble folder name."""
    return f"{run_id}-ensemble"


def ensemble_model_name(arch: str, k: int) -> str:
    """``<arch>-ensemble<K>``: the ``model`` of ensemble counts rows."""
    return f"{arch}-ensemble{k}"


def strict_majority(preds: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Strict-majority vote of K boolean masks of one shape.

    Args:
        preds: K >= 1 bool arrays of identical shape (e.g. (C, H, W)).

    Returns:
        ``(ensemble, votes)``: bool array, True where ``2 * votes > K``; ``votes`` uint8 (K <= 255) count of
        members voting True.

    Raises:
        ValueError: no members, shapes differ, non-boolean input or K > 255.
    """
    if not preds:
        raise ValueError("strict_majority needs at least one member")
    if len(preds) > 255:
        raise ValueError("at most 255 members (votes are stored as uint8)")
    shape = preds[0].shape
    votes = np.zeros(shape, dtype=np.uint8)
    for p in preds:
        if p.shape != shape:
            raise ValueError(f"member shapes differ: {p.shape} vs {shape}")
        if p.dtype != np.bool_:
            raise ValueError(f"members must be boolean, got {p.dtype}")
        votes += p
    return 2 * votes.astype(np.int64) > len(preds), votes


def _member_counts(d: Path) -> pd.DataFrame:
    """A member's counts, after checking them against its ``digests.json`` and its predictions against them."""
    p = d / "counts.parquet"
    if not p.is_file() or not (d / "predictions").is_dir():
        raise MSBError(f"{d}: no counts.parquet/predictions for this ensemble member; evaluate the fold first "
                       f"(msb run, or msb evaluate --external)")
    data = p.read_bytes()
    check_counts_digest(p, data)
    frame = pd.read_parquet(io.BytesIO(data))
    for col, default in PROTOCOL_DEFAULTS.items():  # a counts file of schema version 1
        if col not in frame.columns:
            frame[col] = default
    check_predictions(d, frame["image_id"].astype(str).unique(), verify=False)  # hashed when read (_vote_all)
    return frame


def ensemble_evaluation(member_dirs: Sequence[Path], out_dir: Path, run_id: str, model: str,
                        compute_metrics: bool = False, metrics_config: Any = None, force: bool = False) -> Path:
    """Build the strict-majority ensemble of ``member_dirs`` (fold evaluation folders of one role and one
    evaluation set, in fold order) into ``out_dir``; skip when ``DONE`` matches the members. Returns the counts
    path.

    Raises:
        MSBError: a member without counts/predictions; a member's counts or prediction that differs from its
            ``digests.json``, or whose predictions do not cover its counts' images (each names the file and the
            command that regenerates it); members that evaluated different images, classes, thresholds or
            references (not the same evaluation set); a finished ensemble with files missing.
    """
    member_dirs = [Path(d) for d in member_dirs]
    frames = [_member_counts(d) for d in member_dirs]
    first = frames[0]
    shas = [str(f["checkpoint_sha256"].iloc[0]) for f in frames]
    member_done = [(d / "DONE").read_text().strip() if (d / "DONE").is_file() else "" for d in member_dirs]
    marker = sha256_json({"members": [str(d) for d in member_dirs], "checkpoints": shas, "done": member_done,
                          "run_id": run_id, "model": model})
    done = out_dir / "DONE"
    if not force and done.is_file() and done.read_text().strip() == marker:
        check_done_folder(out_dir)
        return out_dir / "counts.parquet"
    image_ids = list(dict.fromkeys(first["image_id"].astype(str)))
    for d, f in zip(member_dirs[1:], frames[1:]):
        for col in ("dataset", "split", "threshold", "threshold_on", "config_hash", "split_policy", "input_size",
                    "variant", "test_time_rule"):
            if set(f[col].unique()) != set(first[col].unique()):
                raise MSBError(f"{d}: ensemble member differs in '{col}' ({sorted(map(str, f[col].unique()))} vs "
                               f"{sorted(map(str, first[col].unique()))}); members must share one evaluation set")
        if sorted(set(f["image_id"].astype(str))) != sorted(image_ids):
            raise MSBError(f"{d}: ensemble member evaluated other images than {member_dirs[0]}; members must "
                           f"share one evaluation set")
    cls = first.drop_duplicates("class_id")[["class_id", "class_name"]]
    class_ids = cls["class_id"].astype(np.int64).tolist()
    class_names = cls["class_name"].astype(str).tolist()
    per_image = first.drop_duplicates("image_id").set_index("image_id")
    context = {"dataset": str(first["dataset"].iloc[0]), "split": str(first["split"].iloc[0]), "fold": -1,
               "run_id": run_id, "model": model, "checkpoint_role": str(first["checkpoint_role"].iloc[0]),
               "checkpoint_sha256": sha256_json(shas), "config_hash": str(first["config_hash"].iloc[0]),
               "threshold": float(first["threshold"].iloc[0]), "threshold_on": str(first["threshold_on"].iloc[0]),
               # the members' protocol (one split policy, input size, variant; the ensemble has no single seed)
               **{c: first[c].iloc[0].item() if hasattr(first[c].iloc[0], "item") else first[c].iloc[0]
                  for c in PROTOCOL_DEFAULTS}}
    k = len(member_dirs)
    clean_interrupted_writes(out_dir.parent)
    member_digests = [read_digests(d, regenerate_command(d)) for d in member_dirs]
    stage = staging_dir(out_dir)  # the old ensemble in out_dir stays untouched until the swap
    try:
        (stage / "predictions").mkdir()
        rows = _vote_all(member_dirs, image_ids, stage / "predictions", context, class_ids, class_names, per_image,
                         member_digests)
        write_counts(pd.concat(rows, ignore_index=True), stage / "counts.parquet")
        if compute_metrics and metrics_config is not None:
            from msb.evaluation.image_metrics import write_metrics_table

            write_metrics_table(stage, metrics_config)
        sem_path = member_dirs[0] / "prediction_semantics.json"
        sem = json.loads(sem_path.read_text()) if sem_path.is_file() else {}
        sem.update({"model": model, "ensemble": f"strict majority of {k} members: foreground where 2 * votes > {k}",
                    "prob_encoding": f"uint8 round(255 * votes / {k}) (vote fraction, not a probability)"})
        atomic_write_text(stage / "prediction_semantics.json", json.dumps(sem, indent=2))
        atomic_write_text(stage / "ensemble.json", json.dumps(
            {"rule": "strict majority: foreground where 2 * votes > K", "k": k,
             "members": [{"dir": str(d), "checkpoint_sha256": s} for d, s in zip(member_dirs, shas)],
             "run_id": run_id, "model": model}, indent=2))
        seal_folder(stage, ensemble_hint(out_dir))
        fault_point("ensemble.staged")
        replace_dir(stage, out_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    atomic_write_text(done, marker)  # DONE last, after the new folder is in place
    return out_dir / "counts.parquet"


def _vote_all(member_dirs: list[Path], image_ids: list[str], pred_dir: Path, context: dict[str, Any],
              class_ids: list[int], class_names: list[str], per_image: pd.DataFrame,
              member_digests: Sequence[Digests | None] | None = None) -> list[pd.DataFrame]:
    """Vote every image (strict majority), write its ``.npz`` into ``pred_dir``; return the counts rows.

    ``member_digests``: each member's ``digests.json`` (None for a member written before digests); every
    prediction read is checked against it.

    Raises:
        MSBError: a member's prediction differs from its digest; a member's reference differs from the first
            member's (not the same evaluation set).
    """
    rows = []
    k = len(member_dirs)
    member_digests = list(member_digests) if member_digests is not None else [None] * k
    for sid in image_ids:
        members = []
        for d, dg in zip(member_dirs, member_digests):
            data = (d / "predictions" / f"{sid}.npz").read_bytes()
            if dg is not None:
                check_digest(dg, f"predictions/{sid}.npz", data=data)
            with np.load(io.BytesIO(data), allow_pickle=False) as z:
                members.append({key: z[key] for key in ("pred", "ref", "spacing", "class_ids")})
        ref = members[0]["ref"]
        for d, m in zip(member_dirs[1:], members[1:]):
            if m["ref"].shape != ref.shape or not np.array_equal(m["ref"], ref):
                raise MSBError(f"{d / 'predictions' / (sid + '.npz')}: reference differs from the first member's; "
                               f"members must share one evaluation set")
        ens, votes = strict_majority([m["pred"].astype(bool) for m in members])
        h, w = ref.shape[-2:]
        counts = compute_confusion_counts(ens[None], ref[None])
        rows.append(counts_rows(context, counts, image_ids=[sid], class_ids=class_ids, class_names=class_names,
                                heights=h, widths=w, sources=str(per_image.loc[sid, "source"])))
        with atomic_path(pred_dir / f"{sid}.npz") as tmp:
            np.savez_compressed(tmp, pred=ens, ref=ref, spacing=members[0]["spacing"],
                                class_ids=members[0]["class_ids"], votes=votes,
                                prob=np.round(255.0 * votes / k).astype(np.uint8))
        fault_point("ensemble.prediction")
    return rows
