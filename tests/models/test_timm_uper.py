"""``arch: timm_uper`` (issue 36): any timm ``features_only`` backbone + UPerNet head, with two backbones at 3
classes; the UPerNet head's MACs against fvcore and a hand formula; config errors; local backbone weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models import build_model
from msb.models.generic.uper import UPerHead
from msb.profiling.flops import count_flops
from tests.models.test_paper_archs_c import uper_head_params

SMALL = {"head_channels": 32}  # a narrow head keeps the CPU test fast; the default (512) is checked by count


@pytest.mark.parametrize("backbone,widths", [("resnet18", (64, 128, 256, 512)),
                                             ("convnext_tiny", (96, 192, 384, 768))])
def test_builds_from_the_backbone_widths_and_trains_one_step(backbone: str, widths: tuple[int, ...]):
    """3 classes: logits (2, 3, 64, 64); parameters = timm's features_only backbone + UPerHead by hand; one AdamW
    step changes the weights of the first backbone layer and of the classifier."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="timm_uper", encoder=backbone, params=SMALL), 3)
    assert model.channels == widths and model.reductions == (4, 8, 16, 32) and model.size_divisor == 32
    ref = timm.create_model(backbone, features_only=True, out_indices=(-4, -3, -2, -1))
    n_backbone = sum(p.numel() for p in ref.parameters())
    assert sum(p.numel() for p in model.parameters()) == n_backbone + uper_head_params(widths, 3, ch=32)
    full = build_model(ModelConfig(arch="timm_uper", encoder=backbone), 3)  # default 512-channel head
    assert sum(p.numel() for p in full.head.parameters()) == uper_head_params(widths, 3)
    x = torch.randn(2, 3, 64, 64)
    y = (torch.rand(2, 3, 64, 64) > 0.5).float()
    model.train()
    outs = model(x)
    assert len(outs) == 1 and tuple(outs[0].shape) == (2, 3, 64, 64)
    first = next(model.backbone.parameters())
    before = [first.detach().clone(), model.head.conv_seg.weight.detach().clone()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    torch.nn.functional.binary_cross_entropy_with_logits(outs[0], y).backward()
    opt.step()
    assert not torch.equal(before[0], first) and not torch.equal(before[1], model.head.conv_seg.weight)
    model.eval()
    with torch.no_grad():
        assert tuple(model.predict_logits(torch.randn(1, 3, 96, 64)).shape) == (1, 3, 96, 64)


def test_head_macs_equal_fvcore_and_the_hand_formula():
    """UPerHead on 4 maps of a 128² input (strides 4-32), 64 channels: count_flops == fvcore (which counts one
    MAC per multiply-add of a convolution) == the sum over convolutions of C_in·C_out·k²·H·W."""
    from fvcore.nn import FlopCountAnalysis

    widths, ch, k = (8, 16, 32, 64), 64, 3
    head = UPerHead(widths, k, channels=ch).eval()
    sizes = [32, 16, 8, 4]
    feats = [torch.randn(1, c, s, s) for c, s in zip(widths, sizes)]
    wrapped = _Wrap(head).eval()
    ours = count_flops(wrapped, feats).macs
    fv = FlopCountAnalysis(wrapped, (feats,))
    fv.unsupported_ops_warnings(False).uncalled_modules_warnings(False)
    conv_macs = sum(v for op, v in fv.by_operator().items() if op == "conv")
    hand = (sum(widths[3] * ch * p * p for p in (1, 2, 3, 6))  # pyramid pooling 1×1 convs on s×s maps
            + (widths[3] + 4 * ch) * ch * 9 * 4 * 4  # PPM bottleneck at stride 32
            + sum(c * ch * s * s for c, s in zip(widths[:3], sizes[:3]))  # laterals
            + sum(ch * ch * 9 * s * s for s in sizes[:3])  # FPN convs
            + 4 * ch * ch * 9 * 32 * 32  # fusion
            + ch * k * 32 * 32)  # classifier
    assert ours == conv_macs == hand


class _Wrap(torch.nn.Module):
    def __init__(self, head: UPerHead) -> None:
        super().__init__()
        self.head = head

    def forward(self, feats):
        return self.head(feats)


def test_config_errors_are_one_clear_line():
    with pytest.raises(MSBError, match=r"model.encoder: 'resnet_18' is not a timm model"):
        build_model(ModelConfig(arch="timm_uper", encoder="resnet_18"), 3)
    with pytest.raises(MSBError, match=r"model.params.out_indices: give >= 2 distinct"):
        build_model(ModelConfig(arch="timm_uper", encoder="resnet18", params={"out_indices": [3]}), 3)
    with pytest.raises(MSBError, match=r"model.params.out_indices: \[1, 9\] is not valid for timm model 'resnet18'"):
        build_model(ModelConfig(arch="timm_uper", encoder="resnet18", params={"out_indices": [1, 9]}), 3)
    with pytest.raises(MSBError, match=r"model.params.head_channels: a positive integer"):
        build_model(ModelConfig(arch="timm_uper", encoder="resnet18", params={"head_channels": 0}), 3)
    with pytest.raises(MSBError, match=r"model.params.backbone_kwargs: timm model 'resnet18' does not accept \['depht'\]"):
        build_model(ModelConfig(arch="timm_uper", encoder="resnet18", params={"backbone_kwargs": {"depht": 3}}), 3)
    with pytest.raises(MSBError, match=r"unknown key\(s\) \['channels'\]"):
        build_model(ModelConfig(arch="timm_uper", encoder="resnet18", params={"channels": 8}), 3)


def test_local_backbone_weights_load_and_a_mismatch_is_refused(tmp_path: Path):
    """A timm classification state dict (classifier included) loads into the features_only backbone: its
    stage tensors equal the file's; a file of another model is refused with one line."""
    torch.manual_seed(3)
    src = timm.create_model("resnet18")
    path = tmp_path / "r18.pth"
    torch.save(src.state_dict(), path)
    model = build_model(ModelConfig(arch="timm_uper", encoder="resnet18", encoder_weights=str(path), params=SMALL), 3)
    got = model.backbone.state_dict()
    assert torch.equal(got["layer4.1.conv2.weight"], src.state_dict()["layer4.1.conv2.weight"])
    assert torch.equal(got["conv1.weight"], src.state_dict()["conv1.weight"])
    other = tmp_path / "r34.pth"
    torch.save(timm.create_model("resnet34").state_dict(), other)
    with pytest.raises(MSBError, match=r"r34.pth: weights do not match ResNet: .*unexpected key\(s\): layer1.2"):
        build_model(ModelConfig(arch="timm_uper", encoder="resnet18", encoder_weights=str(other)), 3)
    with pytest.raises(MSBError, match=r"model.encoder_weights: file '.*missing.pth' does not exist"):
        build_model(ModelConfig(arch="timm_uper", encoder="resnet18", encoder_weights=str(tmp_path / "missing.pth")), 3)
