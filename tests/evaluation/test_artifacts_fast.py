"""The evaluator's fast prediction files and background writers: the ``.npz`` written at zlib level 1 reads back
(``np.load``) exactly as ``np.savez_compressed``'s, in place or atomically; the writer threads lower their own
priority, not the process's."""

from __future__ import annotations

import os
import sys
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest

from msb.evaluation.artifacts import write_prediction_file


def _arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    pred = rng.random((2, 37, 53)) < 0.3
    ref = rng.random((2, 37, 53)) < 0.3
    return {"pred": pred, "ref": ref, "prob": rng.integers(0, 256, (2, 37, 53), dtype=np.uint8)}


@pytest.mark.parametrize("atomic", [True, False])
def test_prediction_file_reads_back_as_savez_compressed(tmp_path: Path, atomic: bool) -> None:
    a = _arrays(np.random.default_rng(0))
    path = write_prediction_file(tmp_path, "img_1", a["pred"], a["ref"], (0.5, 0.25), np.array([1, 2]), a["prob"],
                                 atomic=atomic)
    assert path == tmp_path / "img_1.npz" and sorted(p.name for p in tmp_path.iterdir()) == ["img_1.npz"]
    ref_path = tmp_path / "numpy.npz"
    np.savez_compressed(ref_path, pred=a["pred"], ref=a["ref"], spacing=np.array([0.5, 0.25]),
                        class_ids=np.array([1, 2], dtype=np.int64), prob=a["prob"])
    with np.load(path) as got, np.load(ref_path) as want:
        assert sorted(got.files) == sorted(want.files)
        for k in want.files:
            assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k])
    with zipfile.ZipFile(path) as zf:
        assert {i.compress_type for i in zf.infolist()} == {zipfile.ZIP_DEFLATED}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux behaviour")
def test_background_threads_lower_only_their_own_priority() -> None:
    from msb.evaluation.background import BackgroundJobs

    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen = []
    with BackgroundJobs(1, 7, 10, 1 << 20) as jobs:
        jobs.submit(lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
        jobs.finish()
    assert seen and seen[0] in (min(19, before + 7), before)  # the job ran in the thread (niced) or in the caller
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # the caller unchanged


def test_background_jobs_run_all_once_help_when_full_and_raise_the_first_error() -> None:
    """Every job runs exactly once (by a thread or by the caller); with the threads blocked the caller runs the
    queued jobs itself once over max_jobs, and at finish; the error of the earliest failing job is raised."""
    from msb.evaluation.background import BackgroundJobs

    gate = threading.Event()
    ran: list[tuple[int, str]] = []

    def job(k: int) -> None:
        if threading.current_thread() is not threading.main_thread():
            gate.wait()  # the background thread is stuck until released
        ran.append((k, threading.current_thread().name))

    with BackgroundJobs(1, 0, 3, 1 << 30) as jobs:
        for k in range(8):
            jobs.submit(job, k)
        by_caller = [k for k, t in ran if t == threading.main_thread().name]
        assert len(by_caller) >= 4  # the stuck thread holds one job; the caller kept the queue within 3
        gate.set()
        jobs.finish()
    assert sorted(k for k, _ in ran) == list(range(8))

    def fail(k: int) -> None:
        raise ValueError(f"job {k}")

    with BackgroundJobs(2, 0, 100, 1 << 30) as jobs, pytest.raises(ValueError, match="job 2"):
        for k in range(5):  # a submit after job 2 failed raises it, else finish does (never job 4's)
            jobs.submit(fail if k in (2, 4) else (lambda k: None), k)
        jobs.finish()
