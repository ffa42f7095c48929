"""Trainer: structure loss values, resume equivalence (bitwise), checkpoint records and SHA-256 checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from msb.config.generate import GeneratedRun, config_hash
from msb.config.schema import RunConfig
from msb.data.schema import load_prepared_dataset
from msb.data.synth import make_synthetic_dataset
from msb.engine.losses import structure_loss
from msb.engine.runner import evaluate_run, train_run
from msb.errors import MSBError
from msb.utils.hashing import sha256_file


def test_structure_loss_hand_value():
    """Uniform target y = 0 everywhere: avgpool(y) - y = 0 so w = 1 on every pixel.

    With logits 0: p = 0.5, BCE = ln 2 per pixel, so wBCE = ln 2.
    wIoU = 1 - (Σ w p y + 1) / (Σ w (p + y) - Σ w p y + 1) = 1 - 1 / (16 * 0.5 + 1) = 1 - 1/9 for a 4x4 map.
    """
    logits = torch.zeros(1, 1, 4, 4)
    target = torch.zeros(1, 1, 4, 4)
    expected = torch.log(torch.tensor(2.0)) + (1 - 1 / 9)
    assert torch.isclose(structure_loss(logits, target), expected, atol=1e-6)
    assert torch.isclose(structure_loss(logits, target, "reference"), expected, atol=1e-6)


def test_bce_weighting_modes_differ_on_boundaries():
    """With a boundary in the target, the weighted BCE (published) differs from the reference plain mean."""
    target = torch.zeros(1, 1, 32, 32)
    target[..., 8:24, 8:24] = 1
    logits = torch.randn(1, 1, 32, 32, generator=torch.Generator().manual_seed(0))
    a = structure_loss(logits, target, "weighted")
    b = structure_loss(logits, target, "reference")
    assert abs(float(a - b)) > 1e-4


def _run(tmp_path: Path, data_root: Path, epochs: int, seed: int = 3) -> GeneratedRun:
    cfg = RunConfig.model_validate({
        "study": "t", "run_root": str(tmp_path / "runs"), "random_seed": seed, "full_determinism": True,
        "data": {"name": "synthetic", "root": str(data_root), "input_size": [32, 32],
                 "split": {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.2, "seed": 0},
                 "cache_dir": str(tmp_path / "cache")},
        "model": {"arch": "unet", "encoder": "resnet18", "params": {"decoder_channels": [32, 16, 8, 8, 8]}},
        "train": {"epochs": epochs, "batch_size": 4, "augment": {"hflip": 0.5, "vflip": 0.5},
                  "scheduler": {"name": "cosine"}, "device": "cpu"},
    })
    return GeneratedRun("run", cfg, config_hash(cfg), "synthetic", "unet")


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "synthetic"
    make_synthetic_dataset(root, n_samples=30, size=(32, 32), seed=0)
    return root


def test_resume_is_bitwise_identical(tmp_path: Path, synth_root: Path):
    """3 epochs in one go == 1 epoch, 'interrupt', resume for the remaining 2 (full_determinism, CPU)."""
    ds = load_prepared_dataset(synth_root)
    full = _run(tmp_path / "a", synth_root, epochs=3)
    res_a = train_run(full, tmp_path / "a" / "run", ds)
    assert res_a.finished and res_a.epochs_done == 3

    part = _run(tmp_path / "b", synth_root, epochs=3)
    res_b1 = train_run(part, tmp_path / "b" / "run", ds, stop_after_epoch=1)
    assert not res_b1.finished and res_b1.epochs_done == 1
    state = torch.load(tmp_path / "b" / "run" / "state" / "train_state.pt", weights_only=False)
    # 1-based: one finished epoch is epoch 1, as its train_log.csv row
    assert state["epoch"] == 1 and state["epoch_base"] == 1
    assert [h["epoch"] for h in state["history"]] == [1]
    assert set(state) >= {"model", "optimizer", "scheduler", "scaler", "rng", "early_stopping", "best"}
    res_b2 = train_run(part, tmp_path / "b" / "run", ds)
    assert res_b2.finished and res_b2.epochs_done == 3

    wa = torch.load(tmp_path / "a" / "run" / "checkpoints" / "latest.pt", weights_only=False)["model"]
    wb = torch.load(tmp_path / "b" / "run" / "checkpoints" / "latest.pt", weights_only=False)["model"]
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    # every logged value except the wall-clock timings is the same as in the uninterrupted run
    timing = {"train_seconds", "train_images_per_s"}
    assert [h["epoch"] for h in res_b2.history] == [1, 2, 3]
    assert [{k: v for k, v in h.items() if k not in timing} for h in res_b2.history] == \
        [{k: v for k, v in h.items() if k not in timing} for h in res_a.history]

    # a finished run is not trained again
    res_again = train_run(part, tmp_path / "b" / "run", ds)
    assert res_again.finished and res_again.epochs_done == 3


def test_checkpoint_records_and_sha_verification(tmp_path: Path, synth_root: Path):
    ds = load_prepared_dataset(synth_root)
    run = _run(tmp_path, synth_root, epochs=2)
    run_dir = tmp_path / "run"
    train_run(run, run_dir, ds)
    records = json.loads((run_dir / "checkpoints" / "records.json").read_text())
    assert set(records) == {"best", "latest"}
    for role, rec in records.items():
        assert rec["sha256"] == sha256_file(run_dir / "checkpoints" / f"{role}.pt")
        assert rec["selection_split"] == "val" and rec["metric"] == "dice"
    assert records["latest"]["epoch"] == 2 and records["latest"]["epoch_base"] == 1  # the last of 2 epochs
    paths = evaluate_run(run_dir, ["best"], ds)
    assert paths[0].is_file()
    # tamper with the checkpoint: evaluation must refuse it
    ck = run_dir / "checkpoints" / "latest.pt"
    ck.write_bytes(ck.read_bytes() + b"x")
    with pytest.raises(MSBError, match="SHA-256 .* differs from the record"):
        evaluate_run(run_dir, ["latest"], ds)
    assert not (run_dir / "evaluation" / "latest" / "counts.parquet").exists()


def test_corrupt_resume_state_is_a_clear_error(tmp_path: Path, synth_root: Path):
    """A damaged state file stops the resume with a message naming the file and the fix, whatever the ages of
    the state and digest files (issue 17: a state newer than its digest used to be trusted and its digest
    rewritten); an interrupted write (killed between installing the state and its digest, which was written
    first as ``train_state.sha256.pending``) still resumes."""
    import hashlib
    import os

    ds = load_prepared_dataset(synth_root)
    run = _run(tmp_path, synth_root, epochs=2)
    run_dir = tmp_path / "run"
    train_run(run, run_dir, ds, stop_after_epoch=1)
    state = run_dir / "state" / "train_state.pt"
    sha = run_dir / "state" / "train_state.sha256"
    good = state.read_bytes()

    data = bytearray(good)
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    state.write_bytes(bytes(data))
    os.utime(sha, ns=(state.stat().st_atime_ns, state.stat().st_mtime_ns + 1))
    with pytest.raises(MSBError, match=r"train_state\.pt: resume state is corrupt .*delete .*state"):
        train_run(run, run_dir, ds)

    state.write_text("garbage")
    sha.write_text("0" * 64)  # even with a matching-looking age, unreadable is reported
    os.utime(sha, ns=(state.stat().st_atime_ns, state.stat().st_mtime_ns - 10**9))
    with pytest.raises(MSBError, match=r"resume state is unreadable"):
        train_run(run, run_dir, ds)

    state.write_bytes(good)  # complete state, digest stale and older: no digest vouches for it, refused
    os.utime(sha, ns=(state.stat().st_atime_ns, state.stat().st_mtime_ns - 10**9))
    with pytest.raises(MSBError, match=r"train_state\.pt: resume state is corrupt .*delete .*state"):
        train_run(run, run_dir, ds)
    assert sha.read_text().strip() == "0" * 64  # the digest is never rewritten from the file it guards

    # killed between installing the state and its digest: the pending digest vouches for it, resume proceeds
    (run_dir / "state" / "train_state.sha256.pending").write_text(hashlib.sha256(good).hexdigest() + "\n")
    res = train_run(run, run_dir, ds)
    assert res.finished and res.epochs_done == 2


def test_best_epoch_is_one_based_everywhere(tmp_path: Path, synth_root: Path):
    """2 epochs: the best checkpoint's epoch in records.json, manifest.json, the checkpoint file, the resume
    state and TrainResult is the ``epoch`` of the train_log.csv row with the highest val_dice (checkpoint
    metric dice, no early stopping: the first maximum), and the console marks that row's line ``*best*``;
    latest is epoch 2 (the last)."""
    import re

    import pandas as pd

    from msb.engine.runner import write_manifest

    ds = load_prepared_dataset(synth_root)
    run = _run(tmp_path, synth_root, epochs=2)
    run_dir = tmp_path / "run"
    lines: list[str] = []
    res = train_run(run, run_dir, ds, log=lines.append)
    log = pd.read_csv(run_dir / "train_log.csv")
    assert log["epoch"].tolist() == [1, 2]
    expected_best = int(log["epoch"].iloc[int(log["val_dice"].to_numpy().argmax())])

    records = json.loads((run_dir / "checkpoints" / "records.json").read_text())
    assert records["best"]["epoch"] == expected_best and records["latest"]["epoch"] == 2
    assert {r["epoch_base"] for r in records.values()} == {1}
    assert records["best"]["value"] == pytest.approx(float(log["val_dice"].max()), abs=1e-6)
    assert res.best_epoch == expected_best and res.epochs_done == 2
    best_pt = torch.load(run_dir / "checkpoints" / "best.pt", weights_only=False)
    assert best_pt["epoch"] == expected_best and best_pt["epoch_base"] == 1
    state = torch.load(run_dir / "state" / "train_state.pt", weights_only=False)
    assert (state["epoch"], state["best"]["epoch"], state["epoch_base"]) == (2, expected_best, 1)
    write_manifest(run_dir, run, "cpu")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["checkpoints"]["best"]["epoch"] == expected_best

    epoch_lines = [m for m in (re.match(r"epoch (\d+)/2: .*", ln) for ln in lines) if m]
    assert [int(m.group(1)) for m in epoch_lines] == [1, 2]
    marked = [int(m.group(1)) for m in epoch_lines if m.group(0).endswith("*best*")]
    assert marked[-1] == expected_best
    # a later line is marked only when it improved on the earlier ones
    assert marked == ([1, 2] if expected_best == 2 else [1])


def test_old_zero_based_run_folder_resumes_one_based(tmp_path: Path, synth_root: Path):
    """A run folder interrupted after epoch 1 by an msb that stored 0-based epochs (state epoch 0, best
    epoch 0, records epoch 0, no epoch_base) resumes at epoch 2 and ends with 1-based files: train_log
    epochs [1, 2], latest = epoch 2, best = the argmax row of train_log.csv."""
    import pandas as pd

    from msb.models.checkpoint import save_state

    ds = load_prepared_dataset(synth_root)
    run = _run(tmp_path, synth_root, epochs=2)
    run_dir = tmp_path / "run"
    train_run(run, run_dir, ds, stop_after_epoch=1)
    state = torch.load(run_dir / "state" / "train_state.pt", weights_only=False)
    del state["epoch_base"]
    state["epoch"] -= 1
    state["best"]["epoch"] -= 1
    save_state(run_dir, state)
    rec_path = run_dir / "checkpoints" / "records.json"
    old = {k: {f: v for f, v in r.items() if f != "epoch_base"} | {"epoch": r["epoch"] - 1}
           for k, r in json.loads(rec_path.read_text()).items()}
    assert {r["epoch"] for r in old.values()} == {0}
    rec_path.write_text(json.dumps(old))

    lines: list[str] = []
    res = train_run(run, run_dir, ds, log=lines.append)
    assert any("resuming from epoch 2 (" in ln for ln in lines), lines
    log = pd.read_csv(run_dir / "train_log.csv")
    assert log["epoch"].tolist() == [1, 2] and res.epochs_done == 2 and res.finished
    records = json.loads(rec_path.read_text())
    assert records["latest"]["epoch"] == 2
    assert records["best"]["epoch"] == int(log["epoch"].iloc[int(log["val_dice"].to_numpy().argmax())])
    assert {r["epoch_base"] for r in records.values()} == {1}
