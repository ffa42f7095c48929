"""The generic segmentation-models-pytorch adapter (``arch: smp``, msb/models/generic/smp_any.py): every smp class
the issue names builds at 3 foreground classes with exactly the parameters of the same smp call made directly,
trains one optimiser step, and refuses an unknown class or keyword in one line."""

from __future__ import annotations

import pytest
import segmentation_models_pytorch as smp
import torch

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models import build_model

# smp class -> (encoder, params) small enough for CPU; DPT needs a timm ViT (dynamic size added by the adapter)
CASES = {
    "Unet": ("resnet18", {"decoder_channels": [64, 32, 16, 8, 8]}),
    "UnetPlusPlus": ("resnet18", {"decoder_channels": [32, 16, 16, 8, 8]}),
    "FPN": ("resnet18", {"decoder_pyramid_channels": 64, "decoder_segmentation_channels": 32}),
    "PSPNet": ("resnet18", {}),
    "DeepLabV3": ("resnet18", {"decoder_channels": 64}),
    "DeepLabV3Plus": ("resnet18", {"encoder_output_stride": 16, "decoder_channels": 64}),
    "Linknet": ("resnet18", {}),
    "MAnet": ("resnet18", {"decoder_channels": [64, 32, 16, 8, 8], "decoder_pab_channels": 16}),
    "PAN": ("resnet18", {"decoder_channels": 32}),
    "UPerNet": ("resnet18", {"decoder_channels": 64}),
    "Segformer": ("mit_b0", {"decoder_segmentation_channels": 64}),
    "DPT": ("tu-vit_tiny_patch16_224", {"decoder_intermediate_channels": [32, 64, 96, 96],
                                        "decoder_fusion_channels": 32}),
}


def _n(m: torch.nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("name", sorted(CASES))
def test_builds_like_smp_and_trains_one_step(name: str):
    """Same parameter count as ``smp.<name>(encoder_name, encoder_weights=None, classes=3, **params)`` (DPT: plus
    ``dynamic_img_size=True``, which adds no parameter); a 2x3xSxS batch (S = 64; PAN 128) gives (2, 3, S, S)
    logits and one AdamW step on BCE lowers nothing to NaN and changes the first encoder weight."""
    encoder, params = CASES[name]
    size = 128 if name == "PAN" else 64  # PAN's feature-pyramid attention pools stride-16 features 3 more times
    model = build_model(ModelConfig(arch="smp", smp_arch=name, encoder=encoder, params=params), 3)
    direct_kw = dict(params, **({"dynamic_img_size": True} if name == "DPT" else {}))
    direct = getattr(smp, name)(encoder_name=encoder, encoder_weights=None, classes=3, **direct_kw)
    assert _n(model) == _n(direct) > 0
    torch.manual_seed(0)
    x = torch.randn(2, 3, size, size)
    y = (torch.rand(2, 3, size, size) > 0.5).float()
    model.train()
    first = next(p for n, p in model.named_parameters() if n.startswith("net.encoder."))
    before = first.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    (logits,) = model(x)
    assert tuple(logits.shape) == (2, 3, size, size)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, y)
    loss.backward()
    opt.step()
    assert torch.isfinite(loss) and not torch.equal(first.detach(), before)


def test_clear_errors_for_unknown_arch_and_keys():
    """Unknown smp_arch, unknown keyword, a key msb sets, smp's activation: one MSBError line each."""
    with pytest.raises(MSBError, match="smp_arch, one of Unet, UnetPlusPlus") as e:
        build_model(ModelConfig(arch="smp", smp_arch="DeepLabV4", encoder="resnet18"), 1)
    assert "\n" not in str(e.value)
    with pytest.raises(MSBError, match=r"unknown key\(s\) \['decoder_chanels'\] for smp.DeepLabV3Plus; valid keys"):
        build_model(ModelConfig(arch="smp", smp_arch="DeepLabV3Plus", encoder="resnet18",
                                params={"decoder_chanels": 64}), 1)
    with pytest.raises(MSBError, match="'classes' is set by msb"):
        build_model(ModelConfig(arch="smp", smp_arch="FPN", encoder="resnet18", params={"classes": 4}), 1)
    with pytest.raises(MSBError, match="raw logits"):
        build_model(ModelConfig(arch="smp", smp_arch="FPN", encoder="resnet18", params={"activation": "sigmoid"}), 1)
    with pytest.raises(MSBError, match="only timm Vision Transformer"):
        build_model(ModelConfig(arch="smp", smp_arch="DPT", encoder="resnet18"), 1)


def test_unset_smp_arch_is_unet():
    """``model: {arch: smp}`` alone builds smp's Unet with its default ResNet-34 (as every registry name builds)."""
    a = build_model(ModelConfig(arch="smp"), 1)
    assert _n(a) == _n(smp.Unet(encoder_name="resnet34", encoder_weights=None, classes=1))


def test_smp_arch_is_left_out_of_other_configs_dump():
    """Config hashes of existing studies stay: smp_arch is dumped only when set."""
    assert "smp_arch" not in ModelConfig(arch="unet").model_dump()
    assert ModelConfig(arch="smp", smp_arch="PAN").model_dump()["smp_arch"] == "PAN"


def test_imagenet_files_for_the_smp_encoder():
    """``msb weights`` resolves arch smp through smp's table of the configured encoder (no network)."""
    from segmentation_models_pytorch.encoders import encoders

    from msb.models.pretrained import imagenet_files

    files = imagenet_files("smp", "resnet50")
    want = encoders["resnet50"]["pretrained_settings"]["imagenet"]["repo_id"]
    assert {f.repo_id for f in files} == {want} and {f.filename for f in files} == {"config.json",
                                                                                    "model.safetensors"}
