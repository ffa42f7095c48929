"""The selection-split evaluation a study's ``threshold`` analysis needs (docs/analysis.md).

The threshold analysis (:mod:`msb.analysis.report.posthoc_threshold`) chooses a decision threshold on the run's
``checkpoint.selection_split`` (e.g. ``val``), never on the test split, from stored probability maps. ``msb run``
stores maps of the evaluation split only, so when the study file's ``analyses:`` names ``threshold`` the final
evaluation also evaluates each checkpoint role on the selection split, probabilities kept, into

    ``<run>/evaluation/selection/<role>/`` (``counts.parquet``, ``predictions/*.npz`` with ``prob``, ``DONE``)

That folder is kept out of every study-wide counts search (:func:`msb.analysis.counts.counts_files.find_counts_files`
skips ``evaluation/selection/``), so its rows enter no leaderboard, score table or report; only the threshold
analysis reads it. ``msb evaluate RUN --checkpoint ROLE --selection`` writes it for a finished run.
"""

from __future__ import annotations

from pathlib import Path

from msb.analysis.counts.counts_files import SELECTION_EVAL_FOLDER
from msb.data.schema import PreparedDataset
from msb.utils.progress import Logger, Tracker, no_log, no_track

__all__ = ["selection_eval_dir", "selection_command", "evaluate_selection", "wants_selection_maps"]


def selection_eval_dir(run_dir: Path, role: str) -> Path:
    """``<run_dir>/evaluation/selection/<role>``: where the selection-split evaluation of ``role`` goes."""
    return Path(run_dir) / "evaluation" / SELECTION_EVAL_FOLDER / role


def selection_command(run_dir: Path, role: str, force: bool = False) -> str:
    """The command that writes (``force``: rewrites) the selection-split evaluation of one run and role."""
    from msb.utils.evaluation_folder import evaluate_command

    cmd = evaluate_command(run_dir, role).replace(" --force", "") + " --selection"
    return cmd + (" --force" if force else "")


def wants_selection_maps(names: list[str] | None) -> bool:
    """True when a study file's ``analyses.names`` asks for the ``threshold`` post-hoc analysis."""
    return bool(names) and "threshold" in [str(n).strip() for n in names]


def evaluate_selection(run_dir: Path, roles: list[str], ds: PreparedDataset | None = None,
                       track: Tracker = no_track, log: Logger = no_log, force: bool = False,
                       strict: bool = True) -> list[Path]:
    """Evaluate checkpoints ``roles`` of a trained run folder on its ``checkpoint.selection_split`` with
    ``evaluation.save_probabilities`` forced on, into :func:`selection_eval_dir` (module docstring). Same model,
    preprocessing and declared threshold as the test evaluation; a role whose ``DONE`` names the same checkpoint
    SHA-256 is skipped unless ``force``.

    Returns:
        The counts paths written or found (not to be added to a study's test-split counts); ``[]`` with
        ``strict=False`` (``msb run``) when the selection split is the evaluation split or has no samples (logged).

    Raises:
        MSBError: not a run folder; with ``strict``, the selection split is the evaluation split or has no samples
            in ``split.csv``; see
            :func:`msb.evaluation.evaluator.evaluate_checkpoint`.
    """
    from msb.config.layering import load_yaml
    from msb.config.schema import RunConfig
    from msb.data.prepare import ensure_dataset
    from msb.data.splits import read_split_file
    from msb.engine.runner import run_fold
    from msb.errors import MSBError
    from msb.evaluation.evaluator import evaluate_checkpoint
    from msb.models.checkpoint import read_records
    from msb.utils.atomic import atomic_write_text
    from msb.utils.evaluation_folder import check_done_folder, unrecorded_checkpoint_error

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise MSBError(f"{run_dir}: not a run folder (no config.yaml); give runs/<study>/<run_id>")
    cfg = RunConfig.model_validate(load_yaml(run_dir / "config.yaml"))
    split = cfg.checkpoint.selection_split
    why = None
    if split == cfg.evaluation.split:
        why = (f"{run_dir / 'config.yaml'}: checkpoint.selection_split '{split}' is the evaluation split; a "
               f"threshold chosen there would be chosen on the split it is scored on")
    elif split not in set(read_split_file(run_dir / "split.csv").astype(str)):
        why = f"{run_dir / 'split.csv'}: the selection split '{split}' has no samples"
    if why is not None:
        if strict:
            raise MSBError(why)
        log(f"[{run_dir.name}] no selection-split evaluation for the threshold analysis: {why}")
        return []
    cfg = cfg.model_copy(update={"evaluation": cfg.evaluation.model_copy(update={"save_probabilities": True})})
    config_hash = (run_dir / "config.sha256").read_text().strip()
    ds = ds or ensure_dataset(cfg, log)
    records = read_records(run_dir)
    out = []
    for role in roles:
        eval_dir = selection_eval_dir(run_dir, role)
        done = eval_dir / "DONE"
        err = unrecorded_checkpoint_error(run_dir, role, records)
        if err is not None:
            raise err
        if not force and done.is_file() and role in records and done.read_text().strip() == records[role].sha256:
            check_done_folder(eval_dir)
            out.append(eval_dir / "counts.parquet")
            continue
        res = evaluate_checkpoint(run_dir, cfg, ds, role, run_dir.name, config_hash, split, track,
                                  run_fold(run_dir), out_dir=eval_dir,
                                  command=selection_command(run_dir, role, force=True))
        atomic_write_text(done, res.checkpoint_sha256)
        log(f"[{run_dir.name}] evaluated '{role}' on {res.n_images} '{split}' (selection split) images, "
            f"probabilities kept -> {res.counts_path} (for the threshold analysis; in no leaderboard)")
        out.append(res.counts_path)
    return out
