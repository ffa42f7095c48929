"""DDP on CPU (gloo): the batch sharding, the 1-process equivalence, a 2-process ``msb run --nproc-per-node 2``
with one set of artifacts, and kill -9 of one rank followed by a resuming rerun (issue 19).

Why 2 processes are not bitwise equal to 1 process on CPU: ``SyncBatchNorm`` runs on CUDA only, so each rank
normalises with the statistics of its half of the batch (and rank 0's running statistics are kept); the images of
each step and the weighting of the loss are the same. With 2-image half-batches that BatchNorm difference is large
(see ``REL_TOL``). A world of one process goes through the same DDP code path and *is* bitwise equal.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from msb.engine.sampling import EpochBatchSampler

REPO = Path(__file__).resolve().parents[2]
#: 2-process vs 1-process parameters after 2 epochs (6 steps) on the tiny set: relative L2 difference (measured 0.019;
#: it comes from per-rank BatchNorm statistics of 2-image half-batches on CPU, where there is no SyncBatchNorm, and is
#: about 1.3 x the distance the weights moved from their initial values in those 6 steps: on CPU the 2-process run is
#: a different trajectory of the same size, not a rounding-level copy; the DDP mechanics themselves are checked
#: bitwise by the world-of-one test)
REL_TOL = 0.05


def _conftest():
    spec = importlib.util.spec_from_file_location("_study_conftest_ddp", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_C = _conftest()
STUDY = {"study": "d", "overrides": {"train": {"epochs": 2, "batch_size": 4, "augment": {"hflip": 0.0, "vflip": 0.0}}}}


def test_batch_shards_are_the_single_process_batches():
    """The ranks' slices of each step, put together, are exactly the batches the single-process DataLoader draws
    with the same generator seed (checked against torch's DataLoader itself), and every item carries one seed."""
    n, bs, seed = 13, 4, 1234
    want = [b.tolist() for b in DataLoader(range(n), batch_size=bs, shuffle=True, drop_last=True,
                                           generator=torch.Generator().manual_seed(seed))]
    ranks = []
    for r in range(2):
        s = EpochBatchSampler(n, bs, r, 2, drop_last=True)
        s.set_epoch(seed)
        ranks.append(list(s))
    assert len(ranks[0]) == len(ranks[1]) == len(want) == 3
    for k, b in enumerate(want):
        got = [i for i, _ in ranks[0][k]] + [i for i, _ in ranks[1][k]]
        assert got == b and len(ranks[0][k]) == 2
    seeds = {i: sd for part in ranks for batch in part for i, sd in batch}
    assert len(set(seeds.values())) == len(seeds)  # one augmentation seed per image, whichever rank draws it
    s3 = EpochBatchSampler(10, 4, 2, 3)  # 10 = 4 + 4 + 2: a trailing batch smaller than 3 processes is dropped
    s3.set_epoch(0)
    assert [len(b) for b in s3] == [1, 1] and s3.global_sizes == [4, 4]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _params(sd: dict) -> dict:
    return {k: v.float() for k, v in sd.items() if "running_" not in k and "num_batches" not in k}


def test_world_of_one_is_bitwise_the_plain_trainer(tmp_path: Path, monkeypatch):
    """The DDP path (gloo, 1 process: EpochBatchSampler, DistributedDataParallel, all-reduced loss, the rank-0
    bookkeeping) ends with bitwise the weights of the plain single-process trainer (full_determinism, CPU)."""
    import torch.distributed as tdist

    from msb.config.generate import generate_runs
    from msb.data.prepare import ensure_dataset
    from msb.engine import distributed
    from msb.engine.runner import train_run

    one_epoch = {**STUDY, "overrides": {"train": {**STUDY["overrides"]["train"], "epochs": 1}}}
    study = _C.write_project(tmp_path, one_epoch)  # 1 epoch keeps it fast; test_kill_one_rank covers 2 epochs
    run = generate_runs(study)[0]
    ds = ensure_dataset(run.config)
    train_run(run, tmp_path / "plain", ds)
    monkeypatch.setenv("MSB_FORCE_DIST", "1")
    monkeypatch.setattr(distributed, "_CURRENT", None)  # teardown restores None, never the destroyed group
    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(k, v)
    ctx = distributed.init_from_env("cpu")
    try:
        assert ctx is not None and ctx.backend == "gloo" and distributed.current() is ctx
        train_run(run, tmp_path / "ddp", ds)
    finally:
        tdist.destroy_process_group()
        distributed._CURRENT = None  # later tests in this process are single-process runs again
    a = torch.load(tmp_path / "plain" / "checkpoints" / "latest.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "ddp" / "checkpoints" / "latest.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    rt = json.loads((tmp_path / "ddp" / "train_runtime.json").read_text())
    assert (rt["world_size"], rt["backend"], rt["global_batch"], rt["per_process_batch"]) == (1, "gloo", 4, 4)
    assert rt["precision"] == "fp32" and rt["precision_requested"] == "auto"


def _msb(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=REPO, env={**_C.msb_env(), **(env or {})},
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory) -> dict:
    """The tiny study trained by ``msb run --nproc-per-node 2`` (gloo), and by a single process in-process."""
    from msb.config.generate import generate_runs
    from msb.data.prepare import ensure_dataset
    from msb.engine.determinism import seed_everything
    from msb.engine.runner import train_run
    from msb.models.registry import build_model

    root = tmp_path_factory.mktemp("ddp")
    data = root / "data"
    study = _C.write_project(root / "two", STUDY, data_root=data)
    r = _msb("run", str(study), "--nproc-per-node", "2")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = generate_runs(study)[0]
    ds = ensure_dataset(run.config)
    train_run(run, root / "single", ds)
    seed_everything(run.config.random_seed)
    init = build_model(run.config.model, len(ds.foreground_classes)).state_dict()
    return {"root": root, "data": data, "run": run, "out": r.stdout, "init": init,
            "run_dir": root / "two" / "runs" / "d" / run.run_id, "single": root / "single"}


@pytest.mark.slow
def test_two_processes_one_set_of_artifacts_close_to_one_process(two_process_run):
    """2 gloo processes: one run folder, one checkpoint pair, one counts table, the manifest records 2 processes
    of 2 images (global batch 4); the parameters are within the documented relative tolerance of a 1-process run."""
    d = two_process_run
    runs = [p.name for p in d["run_dir"].parent.iterdir() if not p.name.startswith("_") and p.is_dir()]
    assert runs == [d["run"].run_id]
    assert sorted(p.name for p in (d["run_dir"] / "checkpoints").iterdir()) == ["best.pt", "latest.pt", "records.json"]
    assert (d["run_dir"] / "evaluation" / "best" / "counts.parquet").is_file()
    assert d["out"].count("epoch 2/2:") == 1  # rank 0 alone logs
    m = json.loads((d["run_dir"] / "manifest.json").read_text())["training"]
    assert (m["world_size"], m["backend"], m["global_batch"], m["per_process_batch"]) == (2, "gloo", 4, 2)
    a = _params(torch.load(d["single"] / "checkpoints" / "latest.pt", weights_only=False)["model"])
    b = _params(torch.load(d["run_dir"] / "checkpoints" / "latest.pt", weights_only=False)["model"])
    w0 = _params(d["init"])
    diff = math.sqrt(sum(float((a[k] - b[k]).pow(2).sum()) for k in a))
    norm = math.sqrt(sum(float(a[k].pow(2).sum()) for k in a))
    moved = math.sqrt(sum(float((a[k] - w0[k]).pow(2).sum()) for k in a))
    print(f"2 vs 1 process: relative L2 {diff / norm:.4f}, difference / distance moved {diff / moved:.4f}")
    assert 0 < diff / norm < REL_TOL


@pytest.mark.slow
def test_kill_one_rank_then_rerun_resumes_and_finishes(two_process_run, tmp_path: Path):
    """kill -9 of rank 1 right after epoch 1 is saved: the job fails, the resume state holds epoch 1; the rerun
    resumes from epoch 2 on both ranks and ends with bitwise the weights of the uninterrupted 2-process run."""
    d = two_process_run
    study = _C.write_project(tmp_path, STUDY, data_root=d["data"])
    r = _msb("run", str(study), "--nproc-per-node", "2", env={"MSB_FAULT_KILL_AT": "ddp.rank1.epoch_saved@1"})
    assert r.returncode != 0
    run_dir = tmp_path / "runs" / "d" / d["run"].run_id
    state = torch.load(run_dir / "state" / "train_state.pt", weights_only=False)
    assert state["epoch"] == 1 and not state["finished"]
    r2 = _msb("run", str(study), "--nproc-per-node", "2")
    assert r2.returncode == 0, r2.stdout[-3000:] + r2.stderr[-3000:]
    assert "resuming from epoch 2" in r2.stdout
    a = torch.load(d["run_dir"] / "checkpoints" / "latest.pt", weights_only=False)["model"]
    b = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
