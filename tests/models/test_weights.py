"""Local backbone weights (``model.encoder_weights``: none | PATH): a saved state dict loads, official PVTv2 key
names are remapped, a mismatched file is refused with the keys named, nothing is downloaded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models import build_model
from msb.models.backbones import build_backbone


def _random_like(sd: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()) for k, v in sd.items()}


@pytest.fixture(scope="module")
def res2net_file(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A Res2Net-50 v1b state dict (random values) plus a 1000-class ``fc`` head, saved as .pth."""
    sd = _random_like(build_backbone("res2net50_v1b").model.state_dict(), seed=3)
    sd["fc.weight"], sd["fc.bias"] = torch.zeros(1000, 2048), torch.zeros(1000)
    path = tmp_path_factory.mktemp("w") / "res2net50_v1b_26w_4s.pth"
    torch.save(sd, path)
    return path, sd


def test_pranet_loads_backbone_file_and_ignores_classifier(res2net_file):
    path, sd = res2net_file
    model = build_model(ModelConfig(arch="pranet", encoder_weights=str(path)), 1)
    own = model.backbone.model.state_dict()
    for k, v in own.items():
        assert torch.equal(v, sd[k]), k


def test_none_string_means_random_init(res2net_file):
    cfg = ModelConfig(arch="sanet", encoder_weights="none")
    assert cfg.encoder_weights is None
    model = build_model(cfg, 1)
    path, sd = res2net_file
    assert not torch.equal(model.backbone.model.state_dict()["conv1.0.weight"], sd["conv1.0.weight"])


def test_mismatched_file_names_the_keys(tmp_path: Path, res2net_file):
    _, sd = res2net_file
    bad = dict(sd)
    del bad["layer4.2.bn3.running_var"]
    bad["layer9.0.conv1.weight"] = torch.zeros(3)
    bad["conv1.0.weight"] = torch.zeros(32, 3, 5, 5)
    path = tmp_path / "bad.pth"
    torch.save(bad, path)
    with pytest.raises(MSBError) as err:
        build_model(ModelConfig(arch="sanet", encoder_weights=str(path)), 1)
    msg = str(err.value)
    assert str(path) in msg
    assert "1 missing key(s): layer4.2.bn3.running_var" in msg
    assert "1 unexpected key(s): layer9.0.conv1.weight" in msg
    assert "conv1.0.weight (32, 3, 5, 5) vs (32, 3, 3, 3)" in msg


def test_missing_file_is_a_clear_error(tmp_path: Path):
    with pytest.raises(MSBError, match=r"weights file not found; give a local \.pth"):
        build_model(ModelConfig(arch="pvt_cascade", encoder_weights=str(tmp_path / "nope.pth")), 1)


def _to_official_pvt(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm PVTv2 names -> the names of the official ``pvt_v2_b2.pth`` (whitsonw/PVT ``pvt_v2.py``):
    ``patch_embed{1..4}``, ``block{i}.{j}``, ``norm{i}``, ``mlp.dwconv.dwconv``; written independently of timm's
    filter (which maps the other way)."""
    out = {}
    for k, v in sd.items():
        k = k.replace("mlp.dwconv.", "mlp.dwconv.dwconv.")
        k = re.sub(r"^patch_embed\.", "patch_embed1.", k)
        k = re.sub(r"^stages\.(\d)\.downsample\.", lambda m: f"patch_embed{int(m.group(1)) + 1}.", k)
        k = re.sub(r"^stages\.(\d)\.blocks\.(\d+)\.", lambda m: f"block{int(m.group(1)) + 1}.{m.group(2)}.", k)
        k = re.sub(r"^stages\.(\d)\.norm\.", lambda m: f"norm{int(m.group(1)) + 1}.", k)
        out[k] = v
    out["head.weight"], out["head.bias"] = torch.zeros(1000, 512), torch.zeros(1000)
    return out


def test_pvt_official_keys_as_safetensors_load_into_all_pvt_models(tmp_path: Path):
    """One official-format PVTv2-B2 file (.safetensors) loads into Polyp-PVT, PVT-CASCADE and G-CASCADE."""
    timm_sd = _random_like(build_backbone("pvt_v2_b2").model.state_dict(), seed=5)
    official = _to_official_pvt(timm_sd)
    assert "block1.0.attn.q.weight" in official and "patch_embed4.proj.weight" in official
    path = tmp_path / "pvt_v2_b2.safetensors"
    save_file({k: v.contiguous() for k, v in official.items()}, str(path))
    for arch, params in (("polyp_pvt", {}), ("pvt_cascade", {}), ("g_cascade", {"img_size": 128})):
        model = build_model(ModelConfig(arch=arch, encoder_weights=str(path), params=params), 1)
        got = model.backbone.model.state_dict()
        assert got.keys() == timm_sd.keys()
        for k in got:
            assert torch.equal(got[k], timm_sd[k]), (arch, k)


def test_adapter_backbone_state_dict_round_trip(tmp_path: Path):
    """``adapter.backbone.state_dict()`` (keys ``model.*``) saved and loaded into a fresh adapter."""
    a = build_model(ModelConfig(arch="pvt_cascade"), 1)
    path = tmp_path / "bb.pth"
    torch.save(a.backbone.state_dict(), path)
    torch.manual_seed(123)
    b = build_model(ModelConfig(arch="pvt_cascade", encoder_weights=str(path)), 1)
    for (k, v), (_, w) in zip(a.backbone.state_dict().items(), b.backbone.state_dict().items()):
        assert torch.equal(v, w), k


def test_segformer_encoder_weights(tmp_path: Path):
    a = build_model(ModelConfig(arch="segformer", encoder="mit_b0"), 1)
    sd = _random_like(a.net.encoder.state_dict(), seed=2)
    path = tmp_path / "mit_b0.pth"
    torch.save(sd, path)
    b = build_model(ModelConfig(arch="segformer", encoder="mit_b0", encoder_weights=str(path)), 1)
    for k, v in b.net.encoder.state_dict().items():
        assert torch.equal(v, sd[k]), k
    torch.save({k: v for k, v in sd.items() if not k.startswith("patch_embed1.")}, path)
    with pytest.raises(MSBError, match=r"missing key\(s\): patch_embed1\."):
        build_model(ModelConfig(arch="segformer", encoder="mit_b0", encoder_weights=str(path)), 1)
