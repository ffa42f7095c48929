"""Fault injection for training (issue 17 items 1, 5, 6, 8, 12): each case runs ``python -m msb`` in a
subprocess on a tiny project (tests/study/conftest.py ``write_project``: 24 synthetic frames, a 0.3 M-parameter
U-Net, 1-2 epochs, one thread) and asserts exit 2, one line on stderr, no traceback, and, where something was
on disk before, that nothing changed (SHA-256 of every file of the run folder before/after).

Kill points are named (``MSB_FAULT_KILL_AT``, :mod:`msb.utils.fault_points`): the process kills itself with
SIGKILL exactly there, no sleeping or polling.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

REPO = Path(__file__).resolve().parents[2]


def _conftest():
    """tests/study/conftest.py, loaded by path (test folders are not packages)."""
    spec = importlib.util.spec_from_file_location("_study_conftest_faults", REPO / "tests" / "study" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_C = _conftest()
STUDY: dict[str, Any] = {"study": "f", "overrides": {"train": {"epochs": 2}}}


def _project(root: Path, data_root: Path, study: dict[str, Any] | None = None,
             native_size: int | None = None) -> Path:
    """A tiny project (``write_project``); ``native_size`` makes the synthetic frames that size (the run still
    trains at 32x32, so masks are resized)."""
    path = _C.write_project(root, study or STUDY, data_root=data_root)
    if native_size is not None:
        ds_file = root / "configs" / "datasets" / "synthetic.yaml"
        cfg = yaml.safe_load(ds_file.read_text())
        cfg["data"]["prepare"]["options"]["size"] = [native_size, native_size]
        ds_file.write_text(yaml.safe_dump(cfg))
    return path


def _msb(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python -m msb ARGS`` (captured), one thread, extra environment ``env``."""
    return subprocess.run([sys.executable, "-m", "msb", *args], cwd=REPO, env={**_C.msb_env(), **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def _one_line_error(r: subprocess.CompletedProcess) -> str:
    """Assert exit 2, one stderr line, no traceback; return that line."""
    assert r.returncode == 2, f"rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


def _killed(r: subprocess.CompletedProcess) -> None:
    assert r.returncode == -9, f"expected SIGKILL at the fault point, rc {r.returncode}\n{r.stdout}\n{r.stderr}"


def _hashes(folder: Path) -> dict[str, str]:
    """SHA-256 of every file below ``folder`` (relative POSIX path -> digest)."""
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _run_dir(root: Path) -> Path:
    dirs = [d for d in (root / "runs" / "f").iterdir() if d.is_dir() and not d.name.startswith("_")]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["model"]


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def _flip_tensor_byte(path: Path) -> None:
    """Flip one byte in the middle of the largest tensor record of a ``torch.save`` zip, in place (the file still
    unpickles: only a weight changes)."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset)
        header = f.read(30)
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        pos = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    """Datasets shared by the tests that do not damage them (prepared by the first run)."""
    return tmp_path_factory.mktemp("data")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, data_root: Path) -> dict[str, torch.Tensor]:
    """Final weights of an uninterrupted 2-epoch run."""
    root = tmp_path_factory.mktemp("ref")
    r = _msb("run", str(_project(root, data_root)))
    assert r.returncode == 0, r.stdout + r.stderr
    return _weights(_run_dir(root))


@pytest.fixture(scope="module")
def killed_after_epoch_1(tmp_path_factory, data_root: Path) -> Path:
    """``runs/`` of a project killed right after epoch 1's state and digest were installed, copied by the disk-full
    tests (the run ids do not depend on the project folder; the copy's first run rewrites ``config.yaml`` with its
    own ``run_root``, which those tests do not compare)."""
    root = tmp_path_factory.mktemp("killed")
    _killed(_msb("run", str(_project(root, data_root)), env={"MSB_FAULT_KILL_AT": "save_state:digest_installed"}))
    return root / "runs"


# ------------------------------------------------------------------------------------------------ item 1
def test_corrupt_resume_state_is_refused_and_its_digest_kept(tmp_path: Path, data_root: Path):
    """Killed after the first epoch's state and digest, one byte flipped inside ``train_state.pt`` in place (the
    state is newer than its digest and still unpickles): the rerun refuses it, naming the file and the fix, and
    changes nothing (the digest is not rewritten from the corrupt file)."""
    study = _project(tmp_path, data_root)
    _killed(_msb("run", str(study), env={"MSB_FAULT_KILL_AT": "save_state:digest_installed"}))
    run_dir = _run_dir(tmp_path)
    state = run_dir / "state" / "train_state.pt"
    _flip_tensor_byte(state)
    torch.load(state, weights_only=False)  # still loads: only the digest can tell
    before = _hashes(run_dir)
    r = _msb("run", str(study))
    line = _one_line_error(r)
    assert "train_state.pt: resume state is corrupt" in line and "delete" in line and str(state.parent) in line
    assert "resuming" not in r.stdout
    assert _hashes(run_dir) == before


@pytest.mark.parametrize("point", ["save_state:digest_pending", "save_state:state_installed",
                                   "save_state:digest_installed", "save_checkpoint:records_pending",
                                   "save_checkpoint:file_installed"])
def test_kill_at_every_write_point_resumes_identically(tmp_path: Path, data_root: Path, reference, point: str):
    """kill -9 at each point of the state and checkpoint writes (before the new digest/record is installed,
    between the file and its digest, after both): the rerun resumes (or restarts) without a refusal and ends
    with bitwise the weights of the uninterrupted run, with no pending digest left behind."""
    study = _project(tmp_path, data_root)
    _killed(_msb("run", str(study), env={"MSB_FAULT_KILL_AT": point}))
    r = _msb("run", str(study))
    assert r.returncode == 0, r.stdout + r.stderr
    run_dir = _run_dir(tmp_path)
    _assert_same_weights(_weights(run_dir), reference)
    assert not list(run_dir.rglob("*.pending"))
    records = json.loads((run_dir / "checkpoints" / "records.json").read_text())
    for role, rec in records.items():
        assert hashlib.sha256((run_dir / rec["path"]).read_bytes()).hexdigest() == rec["sha256"], role
    assert (run_dir / "state" / "train_state.sha256").read_text().strip() == \
        hashlib.sha256((run_dir / "state" / "train_state.pt").read_bytes()).hexdigest()


# ------------------------------------------------------------------------------------------------ item 5
def _split_of(dataset: Path, study: Path) -> dict[str, str]:
    """The split the run will draw (the same call as ``ensure_split``)."""
    from msb.data.schema import load_prepared_dataset
    from msb.data.splits import resolve_splits

    s = yaml.safe_load((study.parent / "datasets" / "synthetic.yaml").read_text())["data"]["split"]
    ds = load_prepared_dataset(dataset)
    return {str(k): v for k, v in resolve_splits(ds.index, s["mode"], s["val_fraction"], s["test_fraction"],
                                                 s["seed"], s["group_column"]).items()}


def _prepare(study: Path) -> Path:
    """Prepare the project's synthetic dataset with the converter and options its dataset config names (as
    ``msb run`` would on first use); returns the dataset folder."""
    from msb.data.converters.fetch import prepare_from_source

    cfg = yaml.safe_load((study.parent / "datasets" / "synthetic.yaml").read_text())["data"]
    root = Path(cfg["root"])
    prepare_from_source(cfg["prepare"]["converter"], None, root, **cfg["prepare"]["options"])
    return root


def _file_of(dataset: Path, sid: str, kind: str) -> Path:
    import pandas as pd

    idx = pd.read_csv(dataset / "index.csv", dtype=str, keep_default_na=False).set_index("sample_id")
    return dataset / idx.loc[sid, f"{kind}_path"]


@pytest.mark.parametrize("split", ["train", "test"])
def test_bad_mask_value_is_refused_before_training(tmp_path: Path, split: str):
    """A 1-px value 7 (not in classes.csv) in one mask of the ``train`` (or ``test``) split, at a pixel that the
    nearest-neighbour resize to the training size drops: ``msb run`` stops before the first epoch, naming the
    file, the value and its pixel count at native resolution (1 px); nothing is trained."""
    study = _project(tmp_path, tmp_path / "data", native_size=64)
    dataset = _prepare(study)
    sid = sorted(k for k, v in _split_of(dataset, study).items() if v == split)[0]
    mask_file = _file_of(dataset, sid, "mask")
    mask = np.array(Image.open(mask_file))
    assert mask.shape == (64, 64)
    mask[1, 1] = 7  # odd coordinates: INTER_NEAREST 64 -> 32 keeps the even ones only
    Image.fromarray(mask).save(mask_file)
    r = _msb("run", str(study))
    line = _one_line_error(r)
    assert str(mask_file) in line and "7 (1 px)" in line, line
    runs = tmp_path / "runs" / "f"
    assert not list(runs.rglob("train_state.pt")) and not list(runs.rglob("*.pt"))
    assert not list(runs.rglob("train_log.csv"))


def test_data_check_is_cached_and_rechecks_changed_files(tmp_path: Path):
    """The native-resolution check decodes every file once; a second check decodes nothing; a changed file is
    decoded again (and a bad value in it is found)."""
    from msb.data.schema import load_prepared_dataset
    from msb.data.synth import make_synthetic_dataset
    from msb.data.verify import verify_files
    from msb.errors import MSBError

    root = tmp_path / "synthetic"
    make_synthetic_dataset(root, n_samples=6, size=(32, 32), seed=0)
    ds = load_prepared_dataset(root)
    assert verify_files(ds, cache_dir=tmp_path / "cache") == 12
    assert verify_files(ds, cache_dir=tmp_path / "cache") == 0
    victim = ds.mask_path(ds.sample_ids[2])
    mask = np.array(Image.open(victim))
    mask[3, 5] = 9
    Image.fromarray(mask).save(victim)
    with pytest.raises(MSBError, match=r"9 \(1 px\)") as exc:
        verify_files(ds, cache_dir=tmp_path / "cache")
    assert str(victim) in str(exc.value) and "\n" not in str(exc.value)


def _truncate_png(path: Path) -> None:
    """Cut the end marker (IEND chunk, 12 bytes) off a PNG: PIL still decodes the pixels without complaint."""
    data = path.read_bytes()
    assert data[-8:-4] == b"IEND"
    path.write_bytes(data[:-12])


@pytest.mark.parametrize("kind", ["image", "mask"])
def test_truncated_png_is_refused_by_data_validate_and_run(tmp_path: Path, kind: str):
    """A truncated PNG (image or mask) is refused by ``msb data validate`` (which decodes every file) and by
    ``msb run`` before training, naming the file."""
    study = _project(tmp_path, tmp_path / "data")
    dataset = _prepare(study)
    victim = _file_of(dataset, sorted(_split_of(dataset, study))[3], kind)
    _truncate_png(victim)
    line = _one_line_error(_msb("data", "validate", str(dataset)))
    assert str(victim) in line and "truncated" in line.lower(), line
    line = _one_line_error(_msb("run", str(study)))
    assert str(victim) in line, line
    assert not list((tmp_path / "runs").rglob("*.pt"))


# ------------------------------------------------------------------------------------------------ item 6
def test_diverged_training_stops_naming_epoch_and_step(tmp_path: Path, data_root: Path):
    """``lr: 1e6`` makes the loss non-finite: training stops with one line naming the epoch and the step; no
    checkpoint of a diverged epoch is saved and nothing is evaluated."""
    study = _project(tmp_path, data_root, {"study": "f", "overrides": {"train": {"epochs": 3, "optimizer":
                                                                                 {"lr": 1e6}}}})
    line = _one_line_error(_msb("run", str(study)))
    assert "training diverged at epoch 1 step " in line and "non-finite" in line, line
    assert "train.optimizer.lr" in line
    assert not list((tmp_path / "runs").rglob("counts.parquet"))


@pytest.mark.parametrize("key,value", [("train.optimizer.lr", float("inf")),
                                       ("evaluation.threshold", float("nan")),
                                       ("train.grad_clip.max", float("-inf"))])
def test_non_finite_config_value_is_a_validation_error(tmp_path: Path, data_root: Path, key: str, value: float):
    """``.inf`` / ``.nan`` in the study file: one line naming the file and the key; nothing is run."""
    over: dict[str, Any] = {"train": {"epochs": 1}}
    node = over
    *parents, leaf = key.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    study = _project(tmp_path, data_root, {"study": "f", "overrides": over})
    assert (".inf" if value > 0 else ".nan" if value != value else "-.inf") in study.read_text()
    line = _one_line_error(_msb("run", str(study)))
    assert str(study) in line and key in line and "finite" in line, line
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("config.yaml"))


def test_nonfinite_patience_with_the_fp16_scaler(tmp_path: Path):
    """AMP path (a stand-in scaler, no GPU needed): steps the scaler skips are tolerated up to
    ``train.nonfinite_patience`` in a row, a finite step resets the count, one more than the patience stops
    training naming the epoch and step; without AMP the first non-finite loss stops it."""
    from msb.config.schema import RunConfig
    from msb.engine.trainer import Trainer
    from msb.errors import MSBError

    cfg = RunConfig.model_validate({"data": {"name": "x", "root": str(tmp_path)}, "model": {"arch": "unet"},
                                    "train": {"nonfinite_patience": 2, "device": "cpu"}})
    assert cfg.model_dump()["train"]["nonfinite_patience"] == 2
    assert "nonfinite_patience" not in RunConfig.model_validate(
        {"data": {"name": "x", "root": "y"}, "model": {"arch": "unet"}}).model_dump()["train"]  # hash unchanged

    class Scaler:
        def __init__(self):
            self.scale, self.skip = 1024.0, False

        def get_scale(self):
            return self.scale

        def step(self, opt):
            pass

        def update(self):
            if self.skip:
                self.scale /= 2

    t = Trainer.__new__(Trainer)
    t.cfg, t.run_dir, t.use_amp, t.optimizer, t.nonfinite_streak = cfg, tmp_path, True, None, 0
    t.scaler = Scaler()
    t.scaler.skip = True
    t._optimizer_step(1, 1, 9, None, None)
    t._optimizer_step(1, 2, 9, None, None)
    assert t.nonfinite_streak == 2
    t.scaler.skip = False
    t._optimizer_step(1, 3, 9, None, None)
    assert t.nonfinite_streak == 0
    t.scaler.skip = True
    t._optimizer_step(1, 4, 9, None, None)
    t._optimizer_step(1, 5, 9, float("nan"), None)
    with pytest.raises(MSBError, match=r"diverged at epoch 2 step 6 of 9: .*3 non-finite step\(s\) in a row "
                                       r"\(train.nonfinite_patience 2\)"):
        t._optimizer_step(2, 6, 9, None, None)
    t.use_amp = False
    with pytest.raises(MSBError, match=r"diverged at epoch 1 step 1 of 9: the training loss is nan"):
        t._optimizer_step(1, 1, 9, float("nan"), None)
    with pytest.raises(MSBError, match=r"diverged at epoch 1 step 2 of 9: the gradient norm is inf"):
        t._optimizer_step(1, 2, 9, None, torch.tensor(float("inf")))


# ----------------------------------------------------------------------------------------------- item 12
def test_duplicate_yaml_key_is_an_error(tmp_path: Path, data_root: Path):
    """A key given twice in one mapping: one line naming the file, the key and both lines."""
    study = _project(tmp_path, data_root, {"study": "f", "overrides": {"train": {"epochs": 1}}})
    text = study.read_text()
    assert "    epochs: 1\n" in text
    study.write_text(text.replace("    epochs: 1\n", "    epochs: 1\n    epochs: 2\n", 1))
    line = _one_line_error(_msb("run", str(study)))
    dup_line = study.read_text().splitlines().index("    epochs: 2") + 1
    assert str(study) in line and "duplicate key 'epochs'" in line and f"line {dup_line}" in line, line
    assert f"first set on line {dup_line - 1}" in line
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("config.yaml"))


@pytest.mark.parametrize("overrides,key", [({"train": {"epochs": True}}, "train.epochs"),
                                          ({"evaluation": {"metrics": {"min_lesion_area": True}}},
                                           "evaluation.metrics.min_lesion_area")])
def test_boolean_is_not_an_integer(tmp_path: Path, data_root: Path, overrides, key):
    """``epochs: true`` is refused (it used to be taken as 1), naming the file and the key; the metrics and
    notification schemas share the same strict base."""
    study = _project(tmp_path, data_root, {"study": "f", "overrides": overrides})
    line = _one_line_error(_msb("run", str(study)))
    assert str(study) in line and key in line and "boolean" in line, line


# ------------------------------------------------------------------------------------------------ item 8
_SITECUSTOMIZE = '''
import errno, os, pathlib
_target = os.environ.get("MSB_TEST_ENOSPC")
if _target:
    def _guard(orig):
        def write(self, *a, **k):
            if _target in self.name:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return orig(self, *a, **k)
        return write
    pathlib.Path.write_bytes = _guard(pathlib.Path.write_bytes)
    pathlib.Path.write_text = _guard(pathlib.Path.write_text)
'''


@pytest.mark.parametrize("target,what", [("train_state.pt", "resume state"),
                                         ("train_state.sha256.pending", "resume-state digest"),
                                         ("latest.pt", "checkpoint"), ("train_log.csv", "training log")])
def test_disk_full_is_one_line_and_keeps_the_state(tmp_path: Path, data_root: Path, reference, killed_after_epoch_1,
                                                   target: str, what: str):
    """Epoch 1 saved (killed right after), then the disk is full when epoch 2 writes ``target`` (every write of
    that file raises ``OSError(ENOSPC)``): one line naming the file and the free space, exit 2; the resume state
    and the file are unchanged and no temporary or pending file is left; after the disk is freed the rerun
    resumes at epoch 2 and ends with bitwise the weights of the uninterrupted run."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    study = _project(tmp_path, data_root)
    shutil.copytree(killed_after_epoch_1, tmp_path / "runs", symlinks=True)  # killed after epoch 1
    run_dir = _run_dir(tmp_path)
    before = _hashes(run_dir)
    r = _msb("run", str(study), env={"MSB_TEST_ENOSPC": target, "PYTHONPATH": str(site)})
    line = _one_line_error(r)
    assert target.split(".pending")[0] in line and what in line and "No space left on device" in line, line
    assert "ENOSPC" in line and "free on the disk holding" in line, line
    after = _hashes(run_dir)
    for name in before:
        if name.startswith("state/") or Path(name).name == target:
            assert after.get(name) == before[name], name
    assert not [p for p in run_dir.rglob("*") if p.name.startswith(".") or p.name.endswith(".pending")]
    r = _msb("run", str(study))
    assert r.returncode == 0 and "resuming from epoch 2" in r.stdout, r.stdout + r.stderr
    _assert_same_weights(_weights(run_dir), reference)


def test_disk_error_names_path_and_free_space(tmp_path: Path):
    """In process: EIO and EROFS are reported like ENOSPC; other OSErrors pass unchanged."""
    from msb.errors import MSBError
    from msb.models.checkpoint import load_state, save_state
    import msb.models.checkpoint as ck

    save_state(tmp_path, {"epoch": 1, "epoch_base": 1, "best": {"value": 0.5, "epoch": 1}})
    before = _hashes(tmp_path)
    orig = ck.atomic_write_bytes
    for code in (errno.EIO, errno.EROFS, errno.ENOSPC):
        def fail(path, data, code=code):
            raise OSError(code, os.strerror(code))
        ck.atomic_write_bytes = fail
        try:
            with pytest.raises(MSBError, match=rf"train_state\.pt: cannot write the resume state .*"
                                               rf"{errno.errorcode[code]}\); .* free on the disk holding"):
                save_state(tmp_path, {"epoch": 2, "epoch_base": 1, "best": {"value": 0.6, "epoch": 2}})
        finally:
            ck.atomic_write_bytes = orig
        assert _hashes(tmp_path) == before
    ck.atomic_write_bytes = lambda path, data: (_ for _ in ()).throw(PermissionError(errno.EACCES, "denied"))
    try:
        with pytest.raises(PermissionError):
            save_state(tmp_path, {"epoch": 2, "epoch_base": 1, "best": {"value": 0.6, "epoch": 2}})
    finally:
        ck.atomic_write_bytes = orig
    assert load_state(tmp_path)["epoch"] == 1
