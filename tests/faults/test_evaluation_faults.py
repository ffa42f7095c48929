"""Fault injection on evaluation artifacts (issue 17 items 2, 4, 7, 10, 11): a subprocess killed at a named point
(``MSB_FAULT_KILL_AT=<point>[@<n>]``, :mod:`msb.utils.fault_points`; points used here: ``evaluate.prediction``,
``evaluate.staged``, ``evaluate.swapped``, ``ensemble.prediction``, ``atomic.<file name>`` and
``replace_dir.moved_aside``) or a hostile edit of a run folder, then the next command.

Each case asserts the one-line error (exit status 2, no traceback) or the recovery, and that no result changed:
the SHA-256 of every file of the run folder before and after (leftovers of the interrupted write aside).

The project is tests/study/conftest.py ``write_project``: 24 synthetic 32x32 frames (6 test images), a 0.3 M
parameter U-Net, one epoch, one thread, trained once per module; each test works on a copy.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KILLED = -signal.SIGKILL


def _write_project():
    """``write_project`` of tests/study/conftest.py (loaded by path: test folders are not packages)."""
    spec = importlib.util.spec_from_file_location("_study_conftest_faults", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.write_project


def _run_in_process():
    """``run_msb_in_process`` of tests/study/conftest.py."""
    spec = importlib.util.spec_from_file_location("_study_conftest_faults_ip", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.run_msb_in_process


def msb(*args: str, cwd: Path = REPO, kill_at: str | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m msb ARGS`` (offline, one thread); ``kill_at`` sets ``MSB_FAULT_KILL_AT``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("MSB_FAULT_KILL_AT", None)
    if kill_at:
        env["MSB_FAULT_KILL_AT"] = kill_at
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _is_leftover(rel: Path) -> bool:
    """A path inside a leftover of an interrupted write (hidden staging/set-aside folder or temp file)."""
    return any(part.startswith(".") for part in rel.parts)


def tree_hashes(folder: Path, leftovers: bool = False) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` (relative POSIX path -> hex); leftovers only when asked."""
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and (leftovers or not _is_leftover(rel)):
            out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def leftovers(folder: Path) -> list[str]:
    """Paths (relative) of hidden files and folders anywhere under ``folder``."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob(".*"))


def one_error_line(r: subprocess.CompletedProcess) -> str:
    """The single ``error: ...`` line of a refused command (exit 2, no traceback)."""
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0]


def counts_table(eval_dir: Path) -> pd.DataFrame:
    """The counts of an evaluation, sorted, without the checkpoint file hash (torch.save bytes differ per save)."""
    df = pd.read_parquet(eval_dir / "counts.parquet").drop(columns=["checkpoint_sha256"])
    return df.sort_values(["image_id", "class_id"]).reset_index(drop=True)


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A tiny trained project (best checkpoint evaluated, no metrics.parquet) with an external evaluation on
    ``synth_ext`` (6 frames, 40x40). Returns the project root; tests copy it with :func:`copy_project`. Both
    commands run in-process (the fixture needs their files; the faults are injected into subprocesses below)."""
    root = tmp_path_factory.mktemp("faults")
    study = _write_project()(root, {"study": "faults", "overrides": {"evaluation": {
        "checkpoint": "best", "compute_metrics": False}}})
    r = _run_in_process()("run", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    (rd,) = run_dirs(root)
    r = _run_in_process()("evaluate", str(rd), "--external", "synth_ext", cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    return root


def run_dirs(root: Path) -> list[Path]:
    """Run folders of the project's study."""
    return [p for p in (root / "runs" / "faults").iterdir() if (p / "config.yaml").is_file()]


def copy_project(src: Path, dst: Path) -> tuple[Path, Path]:
    """Copy configs and runs (datasets are shared, read only); returns (study file, run folder) of the copy."""
    shutil.copytree(src / "configs", dst / "configs")
    shutil.copytree(src / "runs", dst / "runs")
    study = dst / "configs" / "study.yaml"
    spec = yaml.safe_load(study.read_text())
    spec["run_root"] = str(dst / "runs")
    study.write_text(yaml.safe_dump(spec, sort_keys=False))
    (rd,) = run_dirs(dst)
    from msb.config.generate import generate_runs, write_run_config

    for run in generate_runs(study):  # config.yaml names run_root: as msb run would rewrite it for the copy
        write_run_config(run, dst / "runs" / "faults" / run.run_id)
    return study, rd


# ------------------------------------------------------------------------- item 2: no half-done evaluation
@pytest.mark.parametrize("point", ["evaluate.prediction@3", "evaluate.staged"])
def test_killed_force_reevaluation_keeps_the_old_evaluation(project: Path, tmp_path: Path, point: str):
    """``msb evaluate RUN --checkpoint best --force`` killed after 3 of 6 prediction files (or with the new
    folder complete but not swapped in): the old evaluation is untouched, byte for byte, ``DONE`` included; the
    next ``msb run`` removes the staging folder, skips the (complete) evaluation, and ``msb metrics`` writes
    one row per count row."""
    study, rd = copy_project(project, tmp_path)
    before = tree_hashes(rd)
    r = msb("evaluate", str(rd), "--checkpoint", "best", "--force", kill_at=point)
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert tree_hashes(rd) == before  # nothing of the old evaluation deleted or changed
    assert [p for p in leftovers(rd) if ".best.staging-" in p]  # the unfinished new one is aside
    r = msb("run", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "evaluation of 'best' already done, skipped" in r.stdout and "leftover" in r.stdout, r.stdout
    assert leftovers(rd) == [] and tree_hashes(rd) == before
    eval_dir = rd / "evaluation" / "best"
    n_counts = len(pd.read_parquet(eval_dir / "counts.parquet"))
    assert n_counts == 6 and len(list((eval_dir / "predictions").glob("*.npz"))) == n_counts
    r = msb("metrics", str(rd))
    assert r.returncode == 0, r.stdout + r.stderr
    assert len(pd.read_parquet(eval_dir / "metrics.parquet")) == n_counts


def test_killed_after_the_swap_leaves_the_new_complete_evaluation(project: Path, tmp_path: Path):
    """Killed after the new folder is swapped in and before ``DONE``: the folder is the new complete evaluation
    (same counts, every prediction, digests matching) without ``DONE``, so the next ``msb run`` evaluates again
    instead of skipping; the counts equal the uninterrupted ones."""
    study, rd = copy_project(project, tmp_path)
    eval_dir = rd / "evaluation" / "best"
    old = counts_table(eval_dir)
    r = msb("evaluate", str(rd), "--checkpoint", "best", "--force", kill_at="evaluate.swapped")
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert not (eval_dir / "DONE").exists() and leftovers(rd) == []
    pd.testing.assert_frame_equal(counts_table(eval_dir), old)
    assert len(list((eval_dir / "predictions").glob("*.npz"))) == len(old)
    r = msb("run", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "evaluated 'best'" in r.stdout and "evaluation of 'best' already done" not in r.stdout, r.stdout
    assert (eval_dir / "DONE").is_file()
    pd.testing.assert_frame_equal(counts_table(eval_dir), old)


def test_killed_external_reevaluation_keeps_the_old_one(project: Path, tmp_path: Path):
    """The same for ``msb evaluate RUN --external synth_ext --force`` killed after 2 of 6 predictions."""
    _, rd = copy_project(project, tmp_path)
    before = tree_hashes(rd)
    r = msb("evaluate", str(rd), "--external", "synth_ext", "--force", cwd=tmp_path, kill_at="evaluate.prediction@2")
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert tree_hashes(rd) == before
    r = msb("evaluate", str(rd), "--external", "synth_ext", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "already done, skipped" in r.stderr and leftovers(rd) == [] and tree_hashes(rd) == before  # status: stderr


def _ensemble_members(root: Path) -> list[Path]:
    """Three hand-made fold evaluation folders of two 4x4 images (as tests/study/test_ensemble.py builds them)."""
    from msb.evaluation.counts import compute_confusion_counts, counts_rows, write_counts

    rng = np.random.default_rng(0)
    refs = {sid: rng.random((1, 4, 4)) > 0.5 for sid in ("a", "b")}
    members = []
    for k in range(3):
        d = root / f"fold{k}" / "evaluation" / "best"
        (d / "predictions").mkdir(parents=True)
        frames = []
        for sid, ref in refs.items():
            pred = rng.random((1, 4, 4)) > 0.5
            np.savez_compressed(d / "predictions" / f"{sid}.npz", pred=pred, ref=ref, spacing=np.ones(2),
                                class_ids=np.array([1]))
            ctx = {"dataset": "d", "split": "test", "fold": k, "run_id": f"r-fold{k}", "model": "unet",
                   "checkpoint_role": "best", "checkpoint_sha256": f"{k}" * 64, "config_hash": "h" * 64,
                   "threshold": 0.5, "threshold_on": "probability"}
            frames.append(counts_rows(ctx, compute_confusion_counts(pred[None], ref[None]), image_ids=[sid],
                                      class_ids=[1], class_names=["fg"], heights=4, widths=4, sources="s"))
        write_counts(pd.concat(frames, ignore_index=True), d / "counts.parquet")
        (d / "DONE").write_text(f"{k}" * 64)
        members.append(d)
    return members


_ENSEMBLE_SCRIPT = """
import sys
from pathlib import Path
from msb.study.ensemble import ensemble_evaluation
members = [Path(p) for p in sys.argv[2:]]
ensemble_evaluation(members, Path(sys.argv[1]), "r-ensemble", "unet-ensemble3", force=True)
"""


def test_killed_ensemble_rebuild_keeps_the_old_ensemble(tmp_path: Path):
    """A forced rebuild of a fold ensemble killed after its first voted image: the old ensemble folder is
    untouched (``DONE`` included) and the leftover staging folder is removed by the next build."""
    from msb.study.ensemble import ensemble_evaluation

    members = _ensemble_members(tmp_path)
    out = tmp_path / "r-ensemble" / "evaluation" / "best"
    ensemble_evaluation(members, out, "r-ensemble", "unet-ensemble3")
    assert (out / "digests.json").is_file() and (out / "DONE").is_file()
    before = tree_hashes(out.parent)
    env = dict(os.environ, MSB_FAULT_KILL_AT="ensemble.prediction@1")
    r = subprocess.run([sys.executable, "-c", _ENSEMBLE_SCRIPT, str(out), *map(str, members)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert tree_hashes(out.parent) == before and leftovers(out.parent)
    r = subprocess.run([sys.executable, "-c", _ENSEMBLE_SCRIPT, str(out), *map(str, members)],
                       env={k: v for k, v in os.environ.items() if k != "MSB_FAULT_KILL_AT"},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert leftovers(out.parent) == [] and len(list((out / "predictions").glob("*.npz"))) == 2


def test_ensemble_refuses_a_member_prediction_changed_after_evaluation(tmp_path: Path):
    """A member's prediction rewritten after its evaluation (a valid file, other values) differs from the
    member's digest: the ensemble refuses it instead of voting with it."""
    from msb.errors import MSBError
    from msb.study.ensemble import ensemble_evaluation
    from msb.utils.evaluation_folder import seal_folder

    members = _ensemble_members(tmp_path)
    for d in members:
        seal_folder(d, "msb evaluate FOLD --checkpoint best --force")
    victim = members[1] / "predictions" / "a.npz"
    with np.load(victim) as z:
        arrays = dict(z)
    arrays["pred"] = ~arrays["pred"]
    np.savez_compressed(victim, **arrays)
    with pytest.raises(MSBError, match=r"fold1/evaluation/best/predictions/a\.npz: SHA-256 .* differs.*"
                                       r"msb evaluate FOLD --checkpoint best --force"):
        ensemble_evaluation(members, tmp_path / "ens" / "evaluation" / "best", "r-ensemble", "unet-ensemble3")
    assert not (tmp_path / "ens").exists() or leftovers(tmp_path / "ens") == []


# ------------------------------------------------------------------------------- item 7: digests of counts
def _edit_counts_consistently(path: Path) -> None:
    """Move 1 px of every row from fn to tp (derived columns kept consistent): a valid counts file with a
    better Dice, written with pyarrow."""
    table = pq.read_table(path)
    df = table.to_pandas()
    move = (df["fn"] > 0).astype("int64")
    df["tp"] += move
    df["fn"] -= move
    df["intersection"] = df["tp"]
    df["predicted"] = df["tp"] + df["fp"]
    assert move.sum() > 0
    pq.write_table(table.from_pandas(df, schema=table.schema, preserve_index=False), path)


def test_edited_counts_are_refused_by_every_reader(project: Path, tmp_path: Path):
    """A self-consistent edit of tp/fn in counts.parquet passes every row check; its SHA-256 differs from
    digests.json, so ``msb reaggregate``, ``msb metrics`` and ``msb run`` refuse it with one line naming the file
    and ``msb evaluate RUN --checkpoint best --force``; nothing is written."""
    study, rd = copy_project(project, tmp_path)
    counts = rd / "evaluation" / "best" / "counts.parquet"
    _edit_counts_consistently(counts)
    before = tree_hashes(rd)
    fix = f"msb evaluate {rd} --checkpoint best --force"
    for args in (("reaggregate", str(rd)), ("metrics", str(rd)), ("run", str(study))):
        line = one_error_line(msb(*args))
        assert f"{counts}: SHA-256" in line and "differs" in line and line.endswith(fix), (args, line)
        assert tree_hashes(rd) == before, args
    r = msb("evaluate", str(rd), "--checkpoint", "best", "--force")  # the command named regenerates it
    assert r.returncode == 0, r.stdout + r.stderr
    pd.testing.assert_frame_equal(counts_table(counts.parent), counts_table(project_eval_dir(project)))


def project_eval_dir(project: Path) -> Path:
    """``evaluation/best`` of the module's (untouched) run."""
    (rd,) = run_dirs(project)
    return rd / "evaluation" / "best"


@pytest.mark.parametrize("with_digests", [True, False])
def test_truncated_counts_name_the_regenerate_command(project: Path, tmp_path: Path, with_digests: bool):
    """A truncated counts.parquet (item 10): ``msb run`` refuses it with one line naming
    ``msb evaluate RUN --checkpoint best --force``: as a digest mismatch, and for a folder written before digests
    (no digests.json) as an unreadable Parquet file."""
    study, rd = copy_project(project, tmp_path)
    eval_dir = rd / "evaluation" / "best"
    if not with_digests:
        (eval_dir / "digests.json").unlink(missing_ok=True)
    data = (eval_dir / "counts.parquet").read_bytes()
    (eval_dir / "counts.parquet").write_bytes(data[: len(data) // 2])
    before = tree_hashes(rd)
    line = one_error_line(msb("run", str(study)))
    assert str(eval_dir / "counts.parquet") in line, line
    assert line.endswith(f"msb evaluate {rd} --checkpoint best --force"), line
    assert ("SHA-256" in line) == with_digests and ("cannot read as Parquet" in line) != with_digests, line
    assert tree_hashes(rd) == before


def test_folder_without_digests_is_read_with_one_note(project: Path, tmp_path: Path):
    """An evaluation written before digests existed (no digests.json) is still read: exit 0 and one note
    line saying it is unverified."""
    _, rd = copy_project(project, tmp_path)
    (rd / "evaluation" / "best" / "digests.json").unlink()
    r = msb("reaggregate", str(rd / "evaluation" / "best"))
    assert r.returncode == 0, r.stdout + r.stderr
    notes = [ln for ln in (r.stdout + r.stderr).splitlines() if "unverified" in ln]
    assert len(notes) == 1 and "no digests.json" in notes[0], r.stdout + r.stderr


# --------------------------------------------------------------- item 4: predictions cover the counts
@pytest.mark.parametrize("with_digests", [True, False])
def test_metrics_refuses_a_missing_prediction(project: Path, tmp_path: Path, with_digests: bool):
    """One prediction file deleted: ``msb metrics`` refuses with one line naming the missing id and the command
    that regenerates the evaluation, and writes nothing (with or without digests.json)."""
    _, rd = copy_project(project, tmp_path)
    eval_dir = rd / "evaluation" / "best"
    if not with_digests:
        (eval_dir / "digests.json").unlink()
    victim = sorted((eval_dir / "predictions").glob("*.npz"))[2]
    victim.unlink()
    before = tree_hashes(rd)
    line = one_error_line(msb("metrics", str(rd)))
    assert "1 of 6 image(s)" in line and victim.stem in line, line
    assert line.endswith(f"msb evaluate {rd} --checkpoint best --force"), line
    assert tree_hashes(rd) == before and not (eval_dir / "metrics.parquet").exists()


def test_metrics_refuses_a_changed_prediction(project: Path, tmp_path: Path):
    """A prediction file rewritten with other values (valid npz): its digest differs, ``msb metrics`` refuses."""
    _, rd = copy_project(project, tmp_path)
    victim = sorted((rd / "evaluation" / "best" / "predictions").glob("*.npz"))[0]
    with np.load(victim) as z:
        arrays = dict(z)
    arrays["pred"] = ~arrays["pred"]
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    victim.write_bytes(buf.getvalue())
    before = tree_hashes(rd)
    line = one_error_line(msb("metrics", str(rd)))
    assert f"{victim}: SHA-256" in line and line.endswith(f"msb evaluate {rd} --checkpoint best --force"), line
    assert tree_hashes(rd) == before


# -------------------------------------------------------------------- item 10: advice that leads somewhere
def test_deleted_records_advice(project: Path, tmp_path: Path):
    """``checkpoints/records.json`` deleted while best.pt exists: ``msb run`` and ``msb evaluate`` say what
    happened (the record is gone, the weights cannot be verified) and what to do, never "train the run first"
    (training is finished: msb run would only say so again); nothing changes."""
    study, rd = copy_project(project, tmp_path)
    (rd / "checkpoints" / "records.json").unlink()
    before = tree_hashes(rd)
    for args in (("run", str(study)), ("evaluate", str(rd), "--checkpoint", "best", "--force")):
        line = one_error_line(msb(*args))
        assert "records.json" in line and "best.pt exists" in line and "train the run first" not in line, line
        assert "restore" in line and f"delete {rd}" in line, line
        assert tree_hashes(rd) == before, args


# ------------------------------------------------------------- item 11: temp files of interrupted writes
@pytest.mark.parametrize("point,pattern", [("atomic.latest.pt", "checkpoints/.latest.pt.*"),
                                           ("atomic.train_state.pt", "state/.train_state.pt.*")])
def test_temp_files_of_a_killed_training_are_removed(project: Path, tmp_path: Path, point: str, pattern: str):
    """Training killed with its checkpoint (or resume state) fully written to the temporary file but not yet
    renamed: the temp file is left; the rerun of ``msb run`` finishes, removes it, and gives the counts of the
    uninterrupted run."""
    study, rd = copy_project(project, tmp_path)
    shutil.rmtree(rd)
    r = msb("run", str(study), kill_at=point)
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert list(rd.glob(pattern)), leftovers(rd)
    r = msb("run", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    assert leftovers(rd) == [], leftovers(rd)
    pd.testing.assert_frame_equal(counts_table(rd / "evaluation" / "best"), counts_table(project_eval_dir(project)))


def test_staging_of_a_killed_counts_write_is_removed(project: Path, tmp_path: Path):
    """``msb evaluate --force`` killed inside the counts write (``.counts.parquet.*`` temp in the staging
    folder): the old evaluation is unchanged; the next ``msb evaluate`` removes the staging folder."""
    _, rd = copy_project(project, tmp_path)
    before = tree_hashes(rd)
    r = msb("evaluate", str(rd), "--checkpoint", "best", "--force", kill_at="atomic.counts.parquet")
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert [p for p in leftovers(rd) if "/.counts.parquet." in p], leftovers(rd)
    assert tree_hashes(rd) == before
    r = msb("evaluate", str(rd), "--checkpoint", "best")
    assert r.returncode == 0, r.stdout + r.stderr
    assert leftovers(rd) == [] and tree_hashes(rd) == before


_REPLACE_SCRIPT = """
import sys
import msb.utils.atomic as atomic
atomic._exchange = lambda a, b: False  # a system without renameat2: the two-rename fallback
atomic.replace_dir(sys.argv[1], sys.argv[2])
"""


def test_replace_dir_killed_between_renames_is_put_back(tmp_path: Path):
    """Without an atomic exchange, ``replace_dir`` renames the old folder aside before renaming the new one in;
    killed in between, the destination is missing. The next cleanup puts the old complete folder back."""
    from msb.utils.interrupted import clean_interrupted_writes

    dst, src = tmp_path / "best", tmp_path / ".best.staging-abcd1234"
    for d, text in ((dst, "old"), (src, "new")):
        (d / "predictions").mkdir(parents=True)
        (d / "predictions" / "a.npz").write_text(text)
        (d / "DONE").write_text(text)
    before = tree_hashes(dst)
    env = dict(os.environ, MSB_FAULT_KILL_AT="replace_dir.moved_aside")
    r = subprocess.run([sys.executable, "-c", _REPLACE_SCRIPT, str(src), str(dst)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == KILLED, r.stdout + r.stderr
    assert not dst.exists()  # the window the cleanup repairs
    removed = clean_interrupted_writes(tmp_path, before=time.time() + 1)
    assert tree_hashes(dst) == before and leftovers(tmp_path) == [] and len(removed) == 2


def test_cleanup_touches_only_old_leftovers_of_our_names(tmp_path: Path):
    """Only temp names of msb.utils.atomic older than the given time are removed; other files never."""
    from msb.utils.interrupted import clean_interrupted_writes

    ck = tmp_path / "checkpoints"
    ck.mkdir()
    temp = ck / ".latest.pt.k2x8a0qe.pt"
    keep = [ck / "latest.pt", ck / ".latest.pt.notes", ck / ".hidden", ck / ".latest.pt.k2x8a0qe.json",
            ck / "records.json.pending"]
    for p in [temp, *keep]:
        p.write_text("x")
    now = time.time()
    assert clean_interrupted_writes(tmp_path, before=now - 60) == []  # younger than the limit: a live write
    assert clean_interrupted_writes(tmp_path, before=now + 1) == [temp]
    assert all(p.exists() for p in keep)
