"""``encoder_weights: imagenet`` through timm/smp's own Hugging Face cache, offline (HF_HUB_OFFLINE=1, set by
conftest): the one-line error naming the file and ``msb weights fetch``, and the local-cache path with files this
test writes in the hub cache layout. Nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models import build_model
from msb.models.backbones import build_backbone
from msb.models.pretrained import imagenet_files


@pytest.fixture()
def hub(tmp_path: Path, monkeypatch) -> Path:
    """An empty hub cache in use (what HF_HOME=tmp_path gives: ``tmp_path/hub``)."""
    from huggingface_hub import constants

    path = tmp_path / "hub"
    path.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return path


def _put(hub: Path, repo_id: str, revision: str, files: dict[str, bytes], ref: bool) -> Path:
    """Write files as huggingface_hub's cache keeps them: models--<org>--<name>/snapshots/<revision>/<file>
    (and refs/main = revision when the library asks for ``main``)."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / revision
    snap.mkdir(parents=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision)
    return snap


def _random_like(sd: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()).contiguous()
            for k, v in sd.items()}


def test_offline_without_cache_is_one_line_naming_file_and_fetch(hub: Path):
    with pytest.raises(MSBError) as err:
        build_model(ModelConfig(arch="unet", encoder="resnet18", encoder_weights="imagenet"), 1)
    msg = str(err.value)
    assert "\n" not in msg
    assert "smp-hub/resnet18.imagenet/config.json@3f2325ff" in msg
    assert "smp-hub/resnet18.imagenet/model.safetensors@3f2325ff" in msg
    assert f"not in the hub cache {hub}" in msg and "(HF_HUB_OFFLINE=1)" in msg
    assert "msb weights fetch unet --to DIR" in msg and "HF_HOME=DIR" in msg
    with pytest.raises(MSBError, match=r"timm/pvt_v2_b2\.in1k/model\.safetensors is not in the hub cache .* run "
                                       r"`msb weights fetch pvt_v2_b2 --to DIR`"):
        build_backbone("pvt_v2_b2", "imagenet")


def test_smp_encoder_from_local_cache(hub: Path):
    (f_cfg, f_w) = imagenet_files("unet", "resnet18")
    assert (f_cfg.filename, f_w.filename) == ("config.json", "model.safetensors")
    import segmentation_models_pytorch as smp

    sd = _random_like(smp.Unet("resnet18", encoder_weights=None).encoder.state_dict(), seed=1)
    snap = _put(hub, f_w.repo_id, f_w.revision, {"config.json": b"{}"}, ref=False)
    save_file(sd, str(snap / "model.safetensors"))
    model = build_model(ModelConfig(arch="unet", encoder="resnet18", encoder_weights="imagenet"), 1)
    got = model.net.encoder.state_dict()
    assert got.keys() == sd.keys()
    for k in sd:
        assert torch.equal(got[k], sd[k]), k


def test_timm_backbone_from_local_cache_drops_classifier(hub: Path):
    (f,) = imagenet_files("sanet")
    assert (f.repo_id, f.filename, f.revision) == ("timm/res2net50d.in1k", "model.safetensors", None)
    sd = _random_like(build_backbone("res2net50_v1b").model.state_dict(), seed=2)
    sd["fc.weight"], sd["fc.bias"] = torch.zeros(1000, 2048), torch.zeros(1000)
    snap = _put(hub, f.repo_id, "0" * 40, {}, ref=True)
    save_file(sd, str(snap / "model.safetensors"))
    (snap / "config.json").write_text(json.dumps({"architecture": "res2net50d", "num_classes": 1000}))
    got = build_backbone("res2net50_v1b", "imagenet").model.state_dict()
    assert "fc.weight" not in got
    for k, v in got.items():
        assert torch.equal(v, sd[k]), k


def test_weights_list_shows_files_and_cached_digest(hub: Path, monkeypatch):
    import hashlib

    from msb.cli.app import app
    from msb.cli.common import console

    monkeypatch.setattr(console, "width", 400)  # one table row per line

    (f,) = imagenet_files("polyp_pvt")
    snap = _put(hub, f.repo_id, "1" * 40, {"model.safetensors": b"not really weights"}, ref=True)
    configs = Path(__file__).resolve().parents[2] / "configs"
    res = CliRunner().invoke(app, ["weights", "list", "polyp_pvt", "unet_r18", "--configs", str(configs)])
    assert res.exit_code == 0, res.output
    assert "timm/pvt_v2_b2.in1k/model.safetensors" in res.output
    assert hashlib.sha256(b"not really weights").hexdigest() in res.output
    assert "smp-hub/resnet18.imagenet/model.safetensors" in res.output and "- (not cached)" in res.output
    assert snap.is_dir()
    res = CliRunner().invoke(app, ["weights", "fetch", "unet_r18", "--to", str(hub.parent / "w"),
                                   "--configs", str(configs)])
    assert isinstance(res.exception, MSBError)  # main() prints it as one line and exits 2
    assert str(res.exception).startswith("smp-hub/resnet18.imagenet/config.json: download failed")
