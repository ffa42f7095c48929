"""The MSB paper's TransNeXt-Tiny + UPerHead and InternImage-T + UPerHead (issue 32, Table 3 of the paper in
``../shared/reference/papers/``): sizes as the table, output semantics, two training steps and an evaluation on
synthetic data on CPU.

Table 3 (3 output classes): TransNeXt 57.74 M, 59.60 / 238.43 GMACs at 256² / 512²; InternImage 58.37 M,
58.57 / 234.25 GMACs. GMACs: :func:`msb.profiling.flops.count_flops` (FlopCounterMode; convolutions, linear
layers and attention matrix products, MACs = FLOPs / 2). The head's count is checked against fvcore and a hand
formula in ``test_timm_uper.py``; here the head's parameters are recomputed by hand.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from msb.config.generate import GeneratedRun, config_hash
from msb.config.schema import ModelConfig, RunConfig
from msb.data.schema import load_prepared_dataset
from msb.data.synth import make_synthetic_dataset
from msb.engine.runner import evaluate_run, train_run
from msb.errors import MSBError
from msb.models import build_model
from msb.profiling.flops import count_flops

# arch -> (params M, GMACs 256, GMACs 512) of the paper's Table 3
TABLE3 = {"transnext_t_uper": (57.74, 59.60, 238.43), "internimage_t_uper": (58.37, 58.57, 234.25)}
# backbone widths (official configs: decode_head in_channels)
WIDTHS = {"transnext_t_uper": (72, 144, 288, 576), "internimage_t_uper": (64, 128, 256, 512)}


def uper_head_params(widths: tuple[int, ...], classes: int, ch: int = 512, scales: int = 4) -> int:
    """UPerHead parameters by hand: bias-free convs + BN (2·ch each), classifier conv with bias."""
    *fine, top = widths
    psp = scales * (top * ch + 2 * ch)
    bottleneck = (top + scales * ch) * ch * 9 + 2 * ch
    lateral = sum(c * ch + 2 * ch for c in fine)
    fpn = len(fine) * (ch * ch * 9 + 2 * ch)
    fuse = len(widths) * ch * ch * 9 + 2 * ch
    return psp + bottleneck + lateral + fpn + fuse + ch * classes + classes


_MODELS: dict[str, torch.nn.Module] = {}


def _model(arch: str) -> torch.nn.Module:
    if arch not in _MODELS:
        torch.manual_seed(0)
        _MODELS[arch] = build_model(ModelConfig(arch=arch), 3)
    return _MODELS[arch]


@pytest.mark.parametrize("arch", sorted(TABLE3))
def test_parameters_match_table3(arch: str):
    """sum(p.numel()) within 0.5 % of Table 3; the head equals the hand count of UPerHead at 512 channels, so the
    auxiliary FCN head of the official training configs is not in the table's figure."""
    model = _model(arch)
    n = sum(p.numel() for p in model.parameters())
    assert abs(n / (TABLE3[arch][0] * 1e6) - 1) < 0.005, n
    assert sum(p.numel() for p in model.head.parameters()) == uper_head_params(WIDTHS[arch], 3)
    assert model.backbone.channels == WIDTHS[arch]


def test_transnext_backbone_matches_the_published_classifier_size():
    """TransNeXt-Tiny is published at 28.2 M parameters (paper Table, ImageNet-1K, 1000-class linear head on the
    576-channel pooled feature): our backbone + that head is within 0.5 % of it."""
    n = sum(p.numel() for p in _model("transnext_t_uper").backbone.parameters()) + 576 * 1000 + 1000
    assert abs(n / 28.2e6 - 1) < 0.005  # 28.26 M: the published figure is given to one decimal


@pytest.mark.parametrize("arch", sorted(TABLE3))
def test_gmacs_match_table3(arch: str):
    """Within 3 % of Table 3 at 256² and 512², each size built as ``msb profile --input-size`` builds it (a model
    taking ``img_size``, TransNeXt, is rebuilt with img_size = the size). Counted on PyTorch's meta device (shapes
    only, no arithmetic): the same count as on CPU tensors (checked at 64²)."""
    from msb.profiling.measure import takes_img_size

    for size, published in zip((256, 512), TABLE3[arch][1:]):
        if takes_img_size(_model(arch)) and size != 256:
            torch.manual_seed(0)
            meta = build_model(ModelConfig(arch=arch, params={"img_size": [size, size]}), 3).to("meta")
        else:
            meta = copy.deepcopy(_model(arch)).to("meta")
        got = count_flops(meta, torch.empty(1, 3, size, size, device="meta")).gmacs
        assert abs(got / published - 1) < 0.03, (size, got)
    small = count_flops(copy.deepcopy(_model(arch)).to("meta"), torch.empty(1, 3, 64, 64, device="meta")).flops
    assert count_flops(_model(arch), torch.randn(1, 3, 64, 64)).flops == small


@pytest.mark.parametrize("arch", sorted(TABLE3))
def test_logits_one_map_per_class_at_input_resolution(arch: str):
    """Eval: one logit map per class at the input size (also for a size other than the CPB grid of TransNeXt)
    and a non-square input; the batch items are independent (item 0 alone gives the same logits)."""
    model = _model(arch).eval()
    x = torch.randn(2, 3, 64, 96, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        outs = model(x)
        single = model.predict_logits(x[:1])
    assert len(outs) == 1 and tuple(outs[0].shape) == (2, 3, 64, 96) and torch.isfinite(outs[0]).all()
    assert torch.allclose(single, outs[0][:1], atol=1e-4)


def test_wrong_encoder_and_params_are_clear_errors():
    with pytest.raises(MSBError, match="transnext_t_uper uses TransNeXt-Tiny"):
        build_model(ModelConfig(arch="transnext_t_uper", encoder="resnet18"), 1)
    with pytest.raises(MSBError, match=r"img_size: an int or \[H, W\], multiples of 32"):
        build_model(ModelConfig(arch="transnext_t_uper", params={"img_size": 100}), 1)
    with pytest.raises(MSBError, match=r"unknown key\(s\) \['depth'\]"):
        build_model(ModelConfig(arch="internimage_t_uper", params={"depth": 3}), 1)


@pytest.fixture(scope="module")
def synth_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "synthetic"
    make_synthetic_dataset(root, n_samples=10, size=(64, 64), seed=0, n_groups=10)
    return root


@pytest.mark.parametrize("arch", sorted(TABLE3))
def test_two_training_steps_and_evaluation(arch: str, tmp_path: Path, synth_root: Path):
    """6 training images, batch 3, one epoch = 2 optimiser steps at 64×64 on CPU; losses and weights stay finite,
    and the evaluation writes one count row per test image whose pixel counts add up to the image."""
    cfg = RunConfig.model_validate({
        "study": "t", "run_root": str(tmp_path / "runs"), "random_seed": 1,
        "data": {"name": "synthetic", "root": str(synth_root), "input_size": [64, 64],
                 "cache_dir": str(tmp_path / "c"),
                 "split": {"mode": "random", "val_fraction": 0.2, "test_fraction": 0.2, "seed": 0}},
        "model": {"arch": arch},
        "train": {"epochs": 1, "batch_size": 3, "device": "cpu", "optimizer": {"name": "adamw", "lr": 1e-4},
                  "augment": {"hflip": 0, "vflip": 0}},
    })
    ds = load_prepared_dataset(synth_root)
    run_dir = tmp_path / "run"
    res = train_run(GeneratedRun("run", cfg, config_hash(cfg), "synthetic", arch), run_dir, ds)
    assert res.finished and res.epochs_done == 1
    (h,) = res.history
    assert round(h["train_images_per_s"] * h["train_seconds"]) == 6  # 6 images seen = 2 steps of 3
    assert all(map(lambda v: v == v and abs(v) < 1e6, (h["train_loss"], h["val_loss"])))  # finite losses
    state = torch.load(run_dir / "checkpoints" / "latest.pt", weights_only=False)["model"]
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    counts = pd.read_parquet(evaluate_run(run_dir, ["best"], ds)[0])
    assert counts["image_id"].nunique() == 2 and set(counts["split"]) == {"test"}  # 20 % of 10 images
    assert ((counts["tp"] + counts["fp"] + counts["fn"] + counts["tn"]) == 64 * 64).all()
    assert set(counts["test_time_rule"]) == {"first"}


def _stub_openmmlab(monkeypatch) -> None:
    """Empty stand-ins for the mmcv/mmseg/DCNv3 imports of the official backbone files (only the backbones run)."""
    import types

    class _Registry:
        def register_module(self, *args, **kwargs):
            return args[0] if args and callable(args[0]) else (lambda cls: cls)

    names = {"mmcv": {}, "mmcv.cnn": {"constant_init": None, "trunc_normal_init": None},
             "mmcv.runner": {"_load_checkpoint": None, "load_checkpoint": None}, "mmseg": {}, "mmseg.models": {},
             "mmseg.models.builder": {"BACKBONES": _Registry()},
             "mmseg.utils": {"get_root_logger": lambda: logging.getLogger("official")},
             "DCNv3": {}}
    for name, attrs in names.items():
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, mod)


def _official(env: str, rel: str, monkeypatch):
    root = os.environ.get(env)
    if not root or not (Path(root) / rel).is_file():
        pytest.skip(f"set {env} to a checkout of the official repository (with {rel}) to compare against it")
    _stub_openmmlab(monkeypatch)
    spec = importlib.util.spec_from_file_location(f"official_{env.lower()}", Path(root) / rel)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.syspath_prepend(str(Path(root) / "segmentation"))  # InternImage: the ops_dcnv3 package
    spec.loader.exec_module(mod)
    return mod


def _randomise(net: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_transnext_backbone_equals_the_official_code(monkeypatch):
    """Our TransNeXt-Tiny and the official ``transnext_native.transnext_tiny`` (non-extrapolation, img_size 256)
    with the same random weights (strict load of our state dict): same 4 feature maps at 256² and at 128×192.
    Run once (2026-12-03, official commit in the mirror): max |diff| 0.0 and 1.8e-7."""
    off_mod = _official("MSB_OFFICIAL_TRANSNEXT", "segmentation/upernet/transnext_native.py", monkeypatch)
    from msb.models.paper.transnext import TransNeXt

    ours = TransNeXt((256, 256)).eval()
    _randomise(ours)
    off = off_mod.transnext_tiny(pretrained=None, img_size=256, pretrain_size=224, is_extrapolation=False).eval()
    off.load_state_dict(ours.state_dict(), strict=True)
    for shape in [(1, 3, 256, 256), (2, 3, 128, 192)]:
        x = torch.randn(*shape)
        with torch.no_grad():
            for a, b in zip(ours(x), off(x)):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_internimage_backbone_equals_the_official_code(monkeypatch):
    """Our InternImage-T and the official ``InternImage`` (T settings, its ``dcnv3_core_pytorch`` in place of the
    CUDA op) with the same random weights: same 4 feature maps. Run once: max |diff| 1.9e-7."""
    off_mod = _official("MSB_OFFICIAL_INTERNIMAGE", "segmentation/mmseg_custom/models/backbones/intern_image.py",
                        monkeypatch)
    import ops_dcnv3.modules.dcnv3 as off_dcn  # from the official checkout (syspath_prepend above)

    core = off_dcn.dcnv3_core_pytorch
    monkeypatch.setattr(off_dcn, "DCNv3Function", type("F", (), {"apply": staticmethod(lambda *a: core(*a[:14]))}))
    from msb.models.paper.internimage import InternImage

    ours = InternImage().eval()
    _randomise(ours)
    off = off_mod.InternImage(core_op="DCNv3", channels=64, depths=[4, 4, 18, 4], groups=[4, 8, 16, 32],
                              layer_scale=1.0, offset_scale=1.0, post_norm=False, out_indices=(0, 1, 2, 3))
    off.eval()
    off.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 3, 96, 128)
    with torch.no_grad():
        for a, b in zip(ours(x), off(x)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_recipes_controlled_and_official(tmp_path: Path):
    """Both recipes generate: the architecture config sets the model; the official overlay sets the UPerNet
    ADE20K optimiser (AdamW 6e-5, weight decay 0.05, batch 16; official configs in the recipe comments)."""
    import yaml

    from msb.config.generate import generate_runs

    configs = Path(__file__).resolve().parents[2] / "configs"
    runs = {}
    for recipe in ("controlled", "official"):
        study = tmp_path / f"{recipe}.yaml"
        study.write_text(yaml.safe_dump({"study": recipe, "configs_root": str(configs), "recipe": recipe,
                                         "datasets": ["kvasir_seg"], "architectures": sorted(TABLE3)}))
        runs[recipe] = {r.architecture: r.config for r in generate_runs(study)}
    for arch in TABLE3:
        c, o = runs["controlled"][arch], runs["official"][arch]
        assert c.model.arch == o.model.arch == arch
        assert (o.train.optimizer.name, o.train.optimizer.lr, o.train.optimizer.weight_decay,
                o.train.batch_size) == ("adamw", 6e-5, 0.05, 16)
    assert runs["controlled"]["transnext_t_uper"].model.params["img_size"] == 256
