"""``msb submit``: a study's workers as one Slurm job array, from a generated sbatch script.

Why a generated script and not ``submitit``: the job is an ordinary shell script under
``runs/<study>/_study/slurm/workers.sh`` that a user can read, edit and resubmit with ``sbatch`` alone; it runs
the same ``msb run --worker`` command a user would type (no pickled Python function, no second Python process
around it, so msb's own SIGTERM handling, which re-opens the running trial, sees Slurm's signals first);
``--dry-run`` writes exactly what would be submitted; and the compute nodes need nothing but msb itself.
submitit's strengths (pickled callables, its own requeue-by-checkpoint protocol) buy nothing here: the study's
state already lives in the optuna storage and the run folders.

Every array task is one worker; ``--array=0-(N-1)``; its log is ``_study/logs/worker-<job id>_<task>.log``
(opened in append mode, so a requeued task continues its own log). The workers share the study through the
optuna RDB storage (:mod:`msb.study.coord`): a worker killed by Slurm loses at most its current trial, which is
re-opened (SIGTERM: time limit, ``scancel``, preemption) or failed and retried by another worker (SIGKILL, a
lost node: the heartbeat rule).
"""

from __future__ import annotations

import datetime
import os
import shlex
import shutil
import subprocess
import sys
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from pydantic import ValidationError

from msb.config.cluster_schema import ClusterConfig
from msb.errors import MSBError
from msb.study.manifest import read_json, safe_url, write_json
from msb.utils.atomic import atomic_write_text

if TYPE_CHECKING:
    from msb.study.units import StudyUnit

__all__ = ["SubmitResult", "parse_slurm_args", "resolve_cluster", "check_storage", "render_script", "submit",
           "slurm_dir", "logs_dir", "has_password"]


@dataclass
class SubmitResult:
    """What :func:`submit` did: the script, the job id (None for ``--dry-run``) and the worker log pattern."""

    script: Path
    job_id: str | None
    logs: Path
    workers: int


def slurm_dir(root: Path) -> Path:
    """``<root>/_study/slurm``: the generated script and the record of submissions (``jobs.json``)."""
    return Path(root) / "_study" / "slurm"


def logs_dir(root: Path) -> Path:
    """``<root>/_study/logs``: one log file per worker."""
    return Path(root) / "_study" / "logs"


def parse_slurm_args(pairs: list[str]) -> dict[str, Any]:
    """``["partition=gpu", "cpus_per_task=4", "sbatch=--constraint=a100"]`` -> a partial :class:`ClusterConfig`
    mapping. Keys are the section's keys (``-`` may stand for ``_``); integer keys are parsed as integers;
    ``sbatch`` may be given several times (one line each).

    Raises:
        MSBError: not ``KEY=VALUE``, an unknown key, or a non-integer value for an integer key.
    """
    fields = ClusterConfig.model_fields
    hints = typing.get_type_hints(ClusterConfig)
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise MSBError(f"--slurm '{pair}': expected KEY=VALUE, e.g. --slurm partition=gpu")
        if key not in fields:
            raise MSBError(f"--slurm '{pair}': unknown key '{key}'; known keys: {', '.join(fields)} "
                           f"(docs/studies.md, 'On a Slurm cluster')")
        if key == "sbatch":
            out.setdefault("sbatch", []).append(value)
        elif hints[key] is int:
            try:
                out[key] = int(value)
            except ValueError:
                raise MSBError(f"--slurm '{pair}': {key} takes an integer") from None
        else:
            out[key] = value
    return out


def resolve_cluster(unit: StudyUnit, over: dict[str, Any]) -> ClusterConfig:
    """The ``cluster`` section of a study: ``global.yaml`` and the study's ``overrides`` (the run config's
    ``cluster``), then the study file's top-level ``cluster:`` keys, then ``over`` (the ``--slurm`` pairs,
    :func:`parse_slurm_args`); later wins, ``sbatch`` lines add up.

    Raises:
        MSBError: a bad ``--slurm`` pair or value (one line naming the key).
    """
    data = unit.cfg.cluster.model_dump()
    if unit.spec.cluster is not None:
        top = unit.spec.cluster.model_dump(exclude_unset=True)
        data.update({**top, "sbatch": data["sbatch"] + top.get("sbatch", [])})
    data.update({**over, "sbatch": data["sbatch"] + over.get("sbatch", [])})
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        msg = e["msg"].removeprefix("Value error, ")
        raise MSBError(f"--slurm / cluster: {'.'.join(str(p) for p in e['loc'])}: {msg}") from None


def check_storage(url: str | None, workers: int) -> None:
    """Refuse SQLite (the default storage) for more than one worker.

    Raises:
        MSBError: ``workers > 1`` with a ``sqlite`` URL or none. Several nodes writing one SQLite file on a shared
            file system is unsafe (its locks rely on the file system's POSIX locks, which NFS does not keep
            reliably; https://www.sqlite.org/faq.html#q5); PostgreSQL locks rows on its server.
    """
    if workers < 1:
        raise MSBError(f"--workers must be at least 1, not {workers}")
    if workers > 1 and (url is None or url.startswith("sqlite")):
        what = f"--storage {url}" if url else "the default storage (SQLite in the study folder)"
        raise MSBError(f"{what} with {workers} workers is refused: SQLite on a shared file system is not safe for "
                       f"several nodes; give --storage postgresql://user@host/db (docs/studies.md) or --workers 1")


def render_script(study_path: Path, cluster: ClusterConfig, workers: int, url: str | None, logs: Path,
                  job_name: str, requeue: bool, run_root: str | None = None, workdir: Path | None = None) -> str:
    """The sbatch script of ``workers`` array tasks, each running ``python -m msb run STUDY --worker``.

    ``#SBATCH`` lines: job name, array, output (``worker-%A_%a.log`` in ``logs``, append mode), partition,
    account, qos, time, cpus/gpus per task, memory, ``--requeue`` or ``--no-requeue``, working directory, then
    ``cluster.sbatch``. The body exports ``OMP_NUM_THREADS`` = CPUs per task and ``HF_HUB_OFFLINE=1`` (compute
    nodes load weights from the cache, ``msb weights fetch``), runs ``cluster.setup`` and execs msb (so Slurm's
    signals reach msb directly).
    """
    c = cluster
    lines = ["#!/bin/bash",
             f"# msb submit: {workers} worker(s) of {study_path} (written {datetime.datetime.now():%Y-%m-%d %H:%M});",
             "# resubmit with: sbatch THIS_FILE (the study continues where it stopped)",
             f"#SBATCH --job-name={job_name}", f"#SBATCH --array=0-{workers - 1}",
             f"#SBATCH --output={logs}/worker-%A_%a.log", "#SBATCH --open-mode=append"]
    for opt, value in (("partition", c.partition), ("account", c.account), ("qos", c.qos), ("time", c.time),
                       ("mem", c.mem)):
        if value is not None:
            lines.append(f"#SBATCH --{opt}={value}")
    lines.append(f"#SBATCH --cpus-per-task={c.cpus_per_task}")
    if c.gpus_per_task:
        lines.append(f"#SBATCH --gpus-per-task={c.gpus_per_task}")
    lines.append("#SBATCH --requeue" if requeue else "#SBATCH --no-requeue")
    lines.append(f"#SBATCH --chdir={workdir or Path.cwd()}")
    lines += [f"#SBATCH {s}" for s in c.sbatch]
    cmd = [c.python or sys.executable, "-m", "msb", "run", str(study_path), "--worker",
           "--heartbeat-interval", str(c.heartbeat_interval), "--grace-period", str(c.grace_period)]
    if url:
        cmd += ["--storage", url]
    if run_root:
        cmd += ["--run-root", run_root]
    lines += ["", "set -eo pipefail",
              'echo "msb worker ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} on $(hostname), start '
              '$((${SLURM_RESTART_COUNT:-0} + 1)), $(date -u +%Y-%m-%dT%H:%M:%SZ)"',
              f"export OMP_NUM_THREADS={c.cpus_per_task} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1"]
    if c.setup:
        lines += ["# setup (cluster.setup)", c.setup.rstrip()]
    lines += ["exec " + " ".join(shlex.quote(a) for a in cmd), ""]
    return "\n".join(lines)


def has_password(url: str | None) -> bool:
    """Whether a storage URL carries a password (``scheme://user:password@host/db``)."""
    if not url or "://" not in url or "@" not in url:
        return False
    return ":" in url.split("://", 1)[1].rsplit("@", 1)[0]


def _sbatch_error(stderr: str) -> str:
    errs = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    specific = [ln for ln in errs if "error" in ln.lower() and "submission failed" not in ln.lower()]
    return (specific or errs or ["no message"])[0].removeprefix("sbatch: ").removeprefix("error: ")


def submit(study_path: str | Path, storage: str | None = None, workers: int = 1, slurm: list[str] | None = None,
           dry_run: bool = False, requeue: bool = False, run_root: str | None = None,
           log: Callable[[str], None] = lambda _m: None) -> SubmitResult:
    """Write the sbatch script of a study's workers and (unless ``dry_run``) submit it with ``sbatch``.

    Checks come first and write nothing: the storage (:func:`check_storage`), the ``slurm`` pairs
    (:func:`parse_slurm_args`), the study file (every run config, as ``msb run`` checks it), the ``cluster``
    section with the pairs (:func:`resolve_cluster`), that ``sbatch`` exists, that a server storage opens from
    here (:func:`msb.study.storage.open_storage`; the compute nodes must reach it too). A submission is recorded in
    ``_study/slurm/jobs.json`` (job id, workers, storage URL without password, time). The script holds the
    storage URL: it is written with mode 0600.

    Args:
        study_path: the study YAML; storage: optuna RDB URL (None: SQLite in the study folder, one worker only);
        workers: array tasks; slurm: ``KEY=VALUE`` pairs; dry_run: write, do not submit; requeue: ``#SBATCH
        --requeue``; run_root: overrides ``run_root``; log: status lines.

    Raises:
        MSBError: any check above (an unreachable storage names the URL without its password); ``sbatch``
            refusing the job (its error line, e.g. an invalid partition; the script is removed, nothing is
            recorded).
    """
    study_path = Path(study_path).resolve()
    check_storage(storage, workers)
    over = parse_slurm_args(slurm or [])  # the cheap checks first: the study's run configs import torch
    from msb.study.units import study_units

    units = study_units(study_path, run_root)
    if not units:
        raise MSBError(f"{study_path}: the study has no unit to run (every architecture excluded)")
    cluster = resolve_cluster(units[0], over)
    sbatch = shutil.which("sbatch")
    if not dry_run and sbatch is None:
        raise MSBError("sbatch not found on PATH: run msb submit on a Slurm login node (or --dry-run to write the "
                       "script only)")
    if not dry_run and storage and not storage.startswith("sqlite"):  # a bad URL fails here, not in every worker
        from msb.study.storage import close_storage, open_storage

        close_storage(open_storage(storage))
    root = units[0].root.resolve()
    script, logs = slurm_dir(root) / "workers.sh", logs_dir(root)
    text = render_script(study_path, cluster, workers, storage, logs, f"msb-{units[0].spec.study}", requeue,
                         run_root)
    logs.mkdir(parents=True, exist_ok=True)
    atomic_write_text(script, text)
    os.chmod(script, 0o600)
    if dry_run:
        log(f"wrote {script} ({workers} worker(s)); not submitted (--dry-run); submit it with: sbatch {script}")
        return SubmitResult(script, None, logs, workers)
    r = subprocess.run([sbatch, "--parsable", str(script)], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        script.unlink(missing_ok=True)
        raise MSBError(f"sbatch refused the job: {_sbatch_error(r.stderr)}; nothing was submitted (check --slurm "
                       f"and the cluster section)")
    job_id = r.stdout.strip().split(";")[0]
    jobs_file = slurm_dir(root) / "jobs.json"
    jobs = (read_json(jobs_file) or {}).get("jobs", [])
    secret = has_password(storage)  # the record keeps a URL without password as it is (msb status reuses it)
    jobs.append({"job_id": job_id, "workers": workers, "storage": safe_url(storage) if secret else storage,
                 "password": secret,
                 "requeue": requeue, "submitted": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds"), "script": str(script)})
    write_json(jobs_file, {"jobs": jobs})
    log(f"submitted job array {job_id}: {workers} worker(s) of {units[0].spec.study} ({script})")
    log(f"follow it: squeue -j {job_id}; tail -f {logs}/worker-{job_id}_*.log; msb status {study_path}"
        + (" --storage URL" if has_password(storage) else ""))
    return SubmitResult(script, job_id, logs, workers)
