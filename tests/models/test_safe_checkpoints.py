"""Issue 37: opening someone else's run folder never runs their code.

A tiny real run (tests/study/conftest.py ``write_project``: 24 synthetic frames, a 0.3 M-parameter U-Net, 2
epochs) is trained once; each test copies its project. Crafted files are pickles whose loading calls
``builtins.open(MARKER, "w")`` (so it would create a marker file); the test first proves that with PyTorch's full
unpickler in a separate process, then shows that ``msb evaluate``, ``msb explain`` and ``msb run`` (resume)
refuse the file in one line with its digest recorded as msb would, and that the marker never appears.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def _conftest():
    spec = importlib.util.spec_from_file_location("_study_conftest_safe", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_C = _conftest()
# keep_resume_state: the full resume state (weights, optimizer, RNG) stays after training, as an older msb left it
STUDY: dict[str, Any] = {"study": "s", "overrides": {"train": {"epochs": 2}, "checkpoint": {"keep_resume_state": True}}}


def _msb(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=cwd, env=_C.msb_env(), capture_output=True,
                          text=True, timeout=600)


def _one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


class _Opener:
    """Pickles as a call of ``open(path, "w")``: unpickling it with the full unpickler creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _crafted_bytes(payload: dict[str, Any], marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({**payload, "note": _Opener(marker)}, buf)
    return buf.getvalue()


def _full_unpickler_creates(data: bytes, marker: Path, tmp: Path) -> bool:
    """Load ``data`` with ``weights_only=False`` in a child process; True when that created ``marker``."""
    probe = tmp / "probe.pt"
    probe.write_bytes(data)
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(probe)!r}, weights_only=False)"],
                   capture_output=True, timeout=120)
    made = marker.exists()
    marker.unlink(missing_ok=True)
    return made


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A project root holding one trained and evaluated run (runs/s/<run>); ``msb run`` in-process (the tests run
    the commands that read or refuse its files as subprocesses)."""
    root = tmp_path_factory.mktemp("safe")
    study = _C.write_project(root, STUDY, data_root=root / "data")
    r = _C.run_msb_in_process("run", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    return root


def _copy(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the trained project: its root and its run folder."""
    root = tmp_path / "p"
    shutil.copytree(trained, root, symlinks=True)
    runs = [d for d in (root / "runs" / "s").iterdir() if d.is_dir() and not d.name.startswith("_")]
    assert len(runs) == 1, runs
    return root, runs[0]


def _study_file(root: Path) -> Path:
    cands = [p for p in root.rglob("*.yaml") if "study:" in p.read_text() and "runs" not in p.parts]
    assert len(cands) == 1, cands
    return cands[0]


def _counts(run_dir: Path, role: str = "best") -> pd.DataFrame:
    df = pd.read_parquet(run_dir / "evaluation" / role / "counts.parquet")
    return df.sort_values(["image_id", "class_id"]).reset_index(drop=True)


def test_written_files_load_weights_only(trained: Path):
    run = next(d for d in (trained / "runs" / "s").iterdir() if d.is_dir() and not d.name.startswith("_"))
    for f in ("checkpoints/best.pt", "checkpoints/latest.pt", "state/train_state.pt"):
        obj = torch.load(run / f, map_location="cpu", weights_only=True)  # raises on any non-plain object
        assert isinstance(obj, dict) and isinstance(obj["model"], dict)
    state = torch.load(run / "state" / "train_state.pt", weights_only=True)
    assert isinstance(state["rng"]["numpy"]["key"], torch.Tensor) and state["rng"]["numpy"]["key"].numel() == 624


def test_numpy_rng_state_round_trips_exactly():
    from msb.engine.determinism import get_rng_state, set_rng_state

    np.random.seed(1234)
    np.random.standard_normal()  # leaves a cached Gaussian (has_gauss = 1)
    before = np.random.get_state()
    plain = get_rng_state()
    buf = io.BytesIO()
    torch.save(plain, buf)
    back = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    expected = (np.random.random(5), random.random())
    np.random.seed(0)
    random.seed(0)
    set_rng_state(back)
    after = np.random.get_state()
    assert after[0] == before[0] and np.array_equal(after[1], before[1]) and after[1].dtype == np.uint32
    assert after[2:] == before[2:]
    assert np.array_equal(np.random.random(5), expected[0]) and random.random() == expected[1]


def _craft_checkpoint(run_dir: Path, marker: Path, tmp: Path) -> None:
    ckpt = run_dir / "checkpoints" / "best.pt"
    payload = torch.load(ckpt, weights_only=True)
    data = _crafted_bytes(payload, marker)
    assert _full_unpickler_creates(data, marker, tmp)  # the crafted file really runs code under full pickle
    ckpt.write_bytes(data)
    rec_path = run_dir / "checkpoints" / "records.json"
    recs = json.loads(rec_path.read_text())
    recs["best"]["sha256"] = hashlib.sha256(data).hexdigest()  # its digest recorded as msb would
    rec_path.write_text(json.dumps(recs, indent=2))


def test_crafted_checkpoint_is_refused_by_evaluate_and_explain(trained: Path, tmp_path: Path):
    root, run_dir = _copy(trained, tmp_path)
    marker = tmp_path / "MARKER"
    _craft_checkpoint(run_dir, marker, tmp_path)
    line = _one_line_error(_msb("evaluate", str(run_dir), "--checkpoint", "best", "--force", cwd=root))
    assert "best.pt" in line and "msb checkpoints upgrade" in line and "--trust-pickle" in line
    assert not marker.exists()
    sid = pd.read_csv(run_dir / "split.csv").query("split == 'test'")["sample_id"].iloc[0]
    line = _one_line_error(_msb("explain", str(run_dir), "--images", str(sid), "--device", "cpu", cwd=root))
    assert "best.pt" in line and "--trust-pickle" in line
    assert not marker.exists()


def test_crafted_resume_state_is_refused_by_run(trained: Path, tmp_path: Path):
    root, run_dir = _copy(trained, tmp_path)
    marker = tmp_path / "MARKER"
    spath = run_dir / "state" / "train_state.pt"
    state = torch.load(spath, weights_only=True)
    data = _crafted_bytes({**state, "finished": False}, marker)
    assert _full_unpickler_creates(data, marker, tmp_path)
    spath.write_bytes(data)
    (run_dir / "state" / "train_state.sha256").write_text(hashlib.sha256(data).hexdigest() + "\n")
    line = _one_line_error(_msb("run", str(_study_file(root)), "--run-root", str(root / "runs"), cwd=root))
    assert "train_state.pt" in line and "--trust-pickle" in line
    assert not marker.exists()


def _as_previous_release(run_dir: Path) -> None:
    """Rewrite the run's files as the previous msb wrote them: the resume state's NumPy RNG state as the
    ``np.random.get_state()`` tuple (an ndarray inside), NumPy scalars in the checkpoint; digests updated."""
    from msb.engine.determinism import numpy_state_tuple

    spath = run_dir / "state" / "train_state.pt"
    state = torch.load(spath, weights_only=True)
    state["rng"]["numpy"] = numpy_state_tuple(state["rng"]["numpy"])
    state["best"] = {k: (np.float64(v) if isinstance(v, float) else v) for k, v in state["best"].items()}
    buf = io.BytesIO()
    torch.save(state, buf)
    spath.write_bytes(buf.getvalue())
    (run_dir / "state" / "train_state.sha256").write_text(hashlib.sha256(buf.getvalue()).hexdigest() + "\n")
    recs = json.loads((run_dir / "checkpoints" / "records.json").read_text())
    for role in ("best", "latest"):
        p = run_dir / "checkpoints" / f"{role}.pt"
        payload = torch.load(p, weights_only=True)
        payload["num_classes"] = np.int64(payload["num_classes"])
        buf = io.BytesIO()
        torch.save(payload, buf)
        p.write_bytes(buf.getvalue())
        recs[role]["sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    (run_dir / "checkpoints" / "records.json").write_text(json.dumps(recs, indent=2))


def test_previous_release_folder_is_upgraded_and_evaluates_identically(trained: Path, tmp_path: Path):
    root, run_dir = _copy(trained, tmp_path)
    reference = _counts(run_dir)
    weights = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)["model"]
    rng = torch.load(run_dir / "state" / "train_state.pt", weights_only=True)["rng"]
    _as_previous_release(run_dir)
    with pytest.raises(Exception):
        torch.load(run_dir / "state" / "train_state.pt", weights_only=True)
    line = _one_line_error(_msb("evaluate", str(run_dir), "--force", cwd=root))
    assert "msb checkpoints upgrade" in line
    line = _one_line_error(_msb("checkpoints", "upgrade", str(run_dir.parent), cwd=root))
    assert "--trust-pickle" in line
    r = _msb("checkpoints", "upgrade", str(run_dir.parent), "--trust-pickle", cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"1 run folder\(s\): 3 file\(s\) upgraded, 0 already weights-only", r.stdout), r.stdout
    upgraded = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=True)
    assert upgraded["num_classes"] == 1 and type(upgraded["num_classes"]) is int
    assert all(torch.equal(upgraded["model"][k], weights[k]) for k in weights)
    r = _msb("evaluate", str(run_dir), "--force", cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    cols = ["image_id", "class_id", "tp", "fp", "fn", "tn"]
    pd.testing.assert_frame_equal(_counts(run_dir)[cols], reference[cols])
    from msb.engine.determinism import numpy_state_tuple
    from msb.models.checkpoint import load_state

    st = load_state(run_dir)  # the upgraded resume state: the same RNG states, plain
    a, b = numpy_state_tuple(st["rng"]["numpy"]), numpy_state_tuple(rng["numpy"])
    assert a[0] == b[0] and np.array_equal(a[1], b[1]) and a[2:] == b[2:]
    assert torch.equal(st["rng"]["torch"], rng["torch"]) and tuple(st["rng"]["python"]) == tuple(rng["python"])
    r = _msb("checkpoints", "upgrade", str(run_dir), "--trust-pickle", cwd=root)  # idempotent
    assert "0 file(s) upgraded, 3 already weights-only" in r.stdout, r.stdout


def test_no_full_unpickler_outside_the_trusted_path():
    # `grep -rn "weights_only=False" msb`: only msb/models/safe_io.py, and there the one call is in trusted_load
    hits = [(p.relative_to(REPO).as_posix(), ln) for p in (REPO / "msb").rglob("*.py")
            for ln in p.read_text().splitlines() if "weights_only=False" in ln]
    assert hits and {f for f, _ in hits} == {"msb/models/safe_io.py"}, hits
    src = (REPO / "msb" / "models" / "safe_io.py").read_text()
    calls = [m.start() for m in re.finditer(r"torch\.load\(.*weights_only=False", src)]
    body = src[src.index("def trusted_load"):]
    assert len(calls) == 1 and src.index("def trusted_load") < calls[0] < src.index("def trusted_load") + len(body)


def test_to_safe_keeps_state_dict_metadata_and_size():
    from msb.models.safe_io import to_safe

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    sd = net.state_dict()
    plain, safe = io.BytesIO(), io.BytesIO()
    torch.save(sd, plain)
    torch.save(to_safe({"model": sd, "value": np.float64(0.25), "n": np.int64(3)}), safe)
    back = torch.load(io.BytesIO(safe.getvalue()), weights_only=True)
    assert back["model"]._metadata == sd._metadata  # BatchNorm's version 2 survives
    assert (back["value"], back["n"]) == (0.25, 3) and type(back["value"]) is float and type(back["n"]) is int
    assert all(torch.equal(back["model"][k], sd[k]) for k in sd)
    again = io.BytesIO()
    torch.save(to_safe(sd), again)
    assert len(again.getvalue()) == len(plain.getvalue())
