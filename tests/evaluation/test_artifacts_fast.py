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
def test_writer_threads_lower_only_their_own_priority() -> None:
    from msb.evaluation.evaluator import _WRITER_NICE, _background_priority

    before = os.getpriority(os.PRIO_PROCESS, 0)
    seen = {}

    def job():
        _background_priority()
        seen["thread"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    t = threading.Thread(target=job)
    t.start()
    t.join()
    assert seen["thread"] == min(19, before + _WRITER_NICE)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # the calling thread unchanged
