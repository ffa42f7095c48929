"""msb explain: Grad-CAM against a hand derivation, target layers, and the run-folder pipeline on two tiny
trained "fold" runs (CAM shape = native image shape, range [0, 1], not constant; fold average; user errors)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from msb.config.generate import GeneratedRun, config_hash
from msb.config.schema import ModelConfig, RunConfig
from msb.data.schema import load_prepared_dataset
from msb.data.synth import make_synthetic_dataset
from msb.engine.runner import train_run
from msb.errors import MSBError
from msb.models import build_model
from msb.xai import explain, grad_cam, resolve_layer
from msb.xai.layers import DEFAULT_TARGET_LAYERS, fallback_layer_name

NATIVE = (40, 48)  # (H, W) of the synthetic images; the models run at 32 x 32


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# --------------------------------------------------------------------------------------- Grad-CAM by hand
class _Hand(nn.Module):
    """feat: 3x3 conv 3 -> 4 (the target layer); head: 1x1 conv 4 -> 1 with bias (the logits)."""

    def __init__(self) -> None:
        super().__init__()
        self.feat = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 1, 1)

    def forward(self, x):
        return [self.head(self.feat(x))]


def test_grad_cam_matches_hand_derivation():
    """With logits = sum_k w_k A_k + b and y = sum over the predicted region M of the logits,
    dy/dA_k(i, j) = w_k M(i, j), so alpha_k = w_k |M| / (H W) and
    CAM = ReLU(sum_k alpha_k A_k) = (|M| / (H W)) ReLU(logits - b); grad-cam then min-max scales it:
    (r - min r) / (max(r - min r) + 1e-7)."""
    torch.manual_seed(0)
    model = _Hand().eval()
    x = torch.randn(1, 3, 16, 20)
    res = grad_cam(model, x, ["feat"])
    with torch.no_grad():
        logits = model(x)[0][0, 0]
    assert (logits >= 0).any() and (logits < 0).any()
    r = torch.relu(logits - model.head.bias[0]).detach().numpy()
    expected = (r - r.min()) / ((r - r.min()).max() + 1e-7)
    assert res.cam.shape == (1, 16, 20)
    np.testing.assert_allclose(res.cam[0], expected, atol=1e-5)
    np.testing.assert_allclose(res.logits[0], logits.numpy(), atol=1e-6)
    assert res.region == ["predicted foreground"]


def test_empty_prediction_targets_whole_image():
    torch.manual_seed(0)
    model = _Hand().eval()
    with torch.no_grad():
        model.head.bias.fill_(-1e4)  # every logit is very negative: empty prediction
    res = grad_cam(model, torch.randn(1, 3, 8, 8), ["feat"])
    assert res.region == ["whole image (empty prediction)"]
    assert res.cam.min() >= 0 and res.cam.max() <= 1


def test_layers_resolve_and_fallback():
    torch.manual_seed(0)
    unet = build_model(ModelConfig(arch="unet", encoder="resnet18"), 1)
    assert resolve_layer(unet, DEFAULT_TARGET_LAYERS["unet"][0]) is unet.net.decoder.blocks[-1]
    with pytest.raises(MSBError, match="no sub-module 'decodr'"):
        resolve_layer(unet, "net.decodr")
    assert fallback_layer_name(_Hand(), torch.randn(1, 3, 8, 8), num_classes=1) == "feat"


# ------------------------------------------------------------------------------------ trained tiny runs
@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """Two cross-validation folds laid out as msb.study writes them: run folders ``base-fold0``/``base-fold1``
    with one config (same hash), their own ``split.csv`` and a ``fold.json``; a tiny U-Net trained 3 epochs at
    32 x 32 on synthetic 40 x 48 images. Plus ``base`` (a copy of fold 1 without fold.json), standing in for a
    search trial, which a study-folder explanation must skip."""
    from msb.data.splits import resolve_splits, write_split_file

    tmp = tmp_path_factory.mktemp("xai")
    root = tmp / "data" / "synthetic"
    make_synthetic_dataset(root, n_samples=24, size=NATIVE, seed=0, empty_fraction=0.0)
    ds = load_prepared_dataset(root)
    cfg = RunConfig.model_validate({
        "study": "t", "run_root": str(tmp / "runs"), "random_seed": 1,
        "data": {"name": "synthetic", "root": str(root), "input_size": [32, 32], "cache_dir": str(tmp / "cache")},
        "model": {"arch": "unet", "encoder": "resnet18", "params": {"decoder_channels": [32, 16, 8, 8, 8]}},
        "train": {"epochs": 3, "batch_size": 4, "optimizer": {"lr": 0.003}, "device": "cpu"},
    })
    run = GeneratedRun("base", cfg, config_hash(cfg), "synthetic", "unet")
    study_dir = tmp / "runs" / "t"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for fold in (0, 1):
            run_dir = study_dir / f"base-fold{fold}"
            write_split_file(run_dir / "split.csv", resolve_splits(ds.index, "random", 0.2, 0.2, seed=10 + fold))
            (run_dir / "fold.json").write_text(json.dumps({"fold": fold, "k": 2}))
            train_run(run, run_dir, ds)
    finally:
        torch.set_num_threads(n)
    shutil.copytree(study_dir / "base-fold1", study_dir / "base")
    (study_dir / "base" / "fold.json").unlink()
    return study_dir


def test_single_run_cam_shape_range_not_constant(study: Path):
    run = study / "base-fold1"
    res = explain([run], ["synth_0005"], device="cpu")
    assert res.out_dir == run / "explain"
    npz = np.load(run / "explain" / "base" / "synth_0005" / "cams.npz")
    cam = npz["cam"]
    assert cam.shape == (1, 1, *NATIVE)  # one run, one class, the native image size (not the 32 x 32 input)
    assert cam.dtype == np.float32 and cam.min() >= 0.0 and cam.max() <= 1.0
    assert cam.std() > 0.01 and cam.max() - cam.min() > 0.5  # not constant
    t = res.table
    assert list(t["run"]) == ["base-fold1"] and t["fold"].iloc[0] == 1 and t["model_group"].iloc[0] == "base"
    assert t["target_layers"].iloc[0] == "net.decoder.blocks[-1]"
    assert t["target_region"].iloc[0] == "predicted foreground"
    split = dict(line.split(",") for line in (run / "split.csv").read_text().splitlines()[1:])
    assert t["image_split"].iloc[0] == split["synth_0005"]
    png = Path(t["png"].iloc[0])
    assert png.name == "base-fold1.png" and png.read_bytes()[:4] == b"\x89PNG"
    assert not (png.parent / "fold_average.png").exists()
    assert (run / "explain" / "explain.csv").is_file()


def test_fold_average_over_a_study_folder(study: Path, tmp_path: Path):
    lines = []
    res = explain([study], ["synth_0000", "synth_0010"], out_dir=tmp_path / "x", device="cpu", log=lines.append)
    assert any("1 search-trial run(s) skipped" in ln for ln in lines)
    t = res.table
    assert set(t["model_group"]) == {"base"}
    assert list(t["run"])[:3] == ["base-fold0", "base-fold1", "fold_average"]
    assert list(t["fold"])[:3] == [0, 1, -1]
    for image in ("synth_0000", "synth_0010"):
        folder = tmp_path / "x" / "base" / image
        npz = np.load(folder / "cams.npz")
        assert npz["cam"].shape == (2, 1, *NATIVE) and list(npz["runs"]) == ["base-fold0", "base-fold1"]
        assert not np.allclose(npz["cam"][0], npz["cam"][1])  # the folds were trained on different splits
        np.testing.assert_allclose(npz["cam_fold_average"], npz["cam"].mean(axis=0), atol=1e-7)
        avg = npz["cam_fold_average"]
        assert avg.min() >= 0 and avg.max() <= 1 and avg.std() > 0.01
        for name in ("base-fold0.png", "base-fold1.png", "fold_average.png"):
            assert (folder / name).read_bytes()[:4] == b"\x89PNG"
        rows = t[t["image_id"] == image].set_index("run")
        assert rows.loc["fold_average", "cam_mean"] == pytest.approx(float(avg.mean()), rel=1e-6)


def test_user_errors_write_nothing(study: Path, tmp_path: Path):
    out = tmp_path / "o"
    with pytest.raises(MSBError, match=r"index.csv: no sample_id 'nope'"):
        explain([study], ["synth_0000", "nope"], out_dir=out, device="cpu")
    with pytest.raises(MSBError, match="run folder not found"):
        explain([study / "missing"], ["synth_0000"], out_dir=out, device="cpu")
    with pytest.raises(MSBError, match="--images"):
        explain([study], [], out_dir=out, device="cpu")
    with pytest.raises(MSBError, match="no sub-module 'nothere'"):
        explain([study / "base-fold1"], ["synth_0000"], out_dir=out, target_layers=["nothere"], device="cpu")
    # a checkpoint changed after training is refused (SHA-256 against checkpoints/records.json)
    copy = tmp_path / "copy"
    shutil.copytree(study, copy, ignore=shutil.ignore_patterns("explain"))
    ck = copy / "base-fold1" / "checkpoints" / "best.pt"
    ck.write_bytes(ck.read_bytes() + b"x")
    with pytest.raises(MSBError, match="SHA-256 .* differs from the record"):
        explain([copy], ["synth_0000"], out_dir=out, device="cpu")
    assert not out.exists()


def test_cli_images_after_one_flag(study: Path, tmp_path: Path):
    from typer.testing import CliRunner

    from msb.cli.app import app

    r = CliRunner().invoke(app, ["explain", str(study / "base-fold0"), "--images", "synth_0000", "synth_0001",
                                 "--device", "cpu", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.glob("base/*")) == ["synth_0000", "synth_0001"]
