"""The MSB paper's SegNeXt-L, MISSFormer, HiFormer-B and Swin-UMamba (issue 32, part b): Table 3's parameters and
GMACs, the selective scan, output semantics, and two training steps + evaluation in a study on synthetic data.

Table 3 of the MedSegBenchmarker paper (``../shared/reference/papers/001_*.txt``; 3 output classes, batch 1):
params (M), GMACs at 256² and 512². Its GMACs follow one convention, which these rows pin down: the
multiply-accumulates of convolutions (transposed included) and linear layers, once per call, without biases,
norms, activations, or the matrix products of attention / NMF / the selective scan. Evidence: MISSFormer's and
SegFormer's rows scale exactly ×4 from 256² to 512² although their attention is quadratic in the tokens, and
MISSFormer's 9.36 is reached only with the official double call of fc1 in its enhanced Mix-FFN. In
``torch.utils.flop_counter`` terms that is ``convolution + mm + addmm`` (a linear layer lowers to mm/addmm,
attention and ``einsum`` over heads/directions to bmm); :func:`_paper_gmacs` takes those from
:func:`msb.profiling.flops.count_flops`, and :func:`test_convention_equals_module_hooks` checks them against an
independent count by forward hooks on every Conv2d/ConvTranspose2d/Linear.

HiFormer-B*: the official HiFormer-B code with a ResNet-101 (our default ``cnn: resnet101``). Its GMACs were
counted by calflops, which sums conv/linear MACs over the module tree by registered name; the official code
registers ResNet layer2/layer3 and the decoder convolutions under two names each, so they are counted twice
(:mod:`msb.profiling.tree_macs`). calflops 0.3.2 run on the official code (amirhossein-kz/HiFormer HEAD 6726d28,
``cnn_backbone = "resnet101"``, ``image_size`` = the input size, Swin windows padded as timm pads them, 3
classes) gave 25,520,762,880 MACs at 256² and 100,025,044,992 at 512²; the MACs that run are 16.70 / 64.74 G.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from torch import nn

from msb.config.schema import ModelConfig
from msb.models import build_model
from msb.profiling.flops import count_flops
from msb.profiling.tree_macs import count_tree_macs

REPO = Path(__file__).resolve().parents[2]
ARCHS = ["segnext_l", "missformer", "hiformer_b", "swin_umamba"]
#: MSB paper Table 3: (params at 256, params at 512) in M, GMACs at 256, GMACs at 512
TABLE3 = {
    "missformer": ((42.46, 42.46), 9.36, 37.43),
    "hiformer_b": ((44.62, 46.09), 25.52, 100.03),
    "segnext_l": ((48.78, 48.78), 16.05, 64.19),
    "swin_umamba": ((59.89, 59.89), 39.74, 158.97),
}
#: calflops 0.3.2 MACs of the official HiFormer code with ResNet-101 (see the module docstring), per input size
HIFORMER_CALFLOPS = {256: 25_520_762_880, 512: 100_025_044_992}


def _params(arch: str, size: int) -> dict:
    return {"img_size": size} if arch == "hiformer_b" else {}


def _meta_model(arch: str, size: int, num_classes: int = 3) -> nn.Module:
    with torch.device("meta"):
        return build_model(ModelConfig(arch=arch, params=_params(arch, size)), num_classes)


def _paper_gmacs(model: nn.Module, x: torch.Tensor) -> float:
    ops = count_flops(model, x).by_operator
    return sum(ops.get(k, 0) for k in ("convolution", "mm", "addmm")) / 2e9


def _no_scan(monkeypatch) -> None:
    """Replace Swin-UMamba's selective scan by zeros of its output shape: it adds no counted operation
    (test_selective_scan_adds_no_counted_operation) and its pure-PyTorch loop is slow under the counter."""
    import msb.models.paper.swin_umamba as su

    monkeypatch.setattr(su, "selective_scan", lambda u, *a, **k: torch.zeros_like(u))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("size", [256, 512])
def test_table3_params_and_gmacs(arch: str, size: int, monkeypatch):
    """sum(p.numel()) within 0.5 % and GMACs within 3 % of Table 3 (meta tensors: shapes only, no compute).
    HiFormer-B*: GMACs by registered name as calflops counts them (module docstring)."""
    _no_scan(monkeypatch)
    (p256, p512), g256, g512 = TABLE3[arch]
    model = _meta_model(arch, size)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    x = torch.empty(1, 3, size, size, device="meta")
    gmacs = count_tree_macs(model, x).gmacs if arch == "hiformer_b" else _paper_gmacs(model, x)
    want_p, want_g = (p256, g256) if size == 256 else (p512, g512)
    assert abs(params / want_p - 1) < 0.005, (arch, size, params, want_p)
    assert abs(gmacs / want_g - 1) < 0.03, (arch, size, gmacs, want_g)


def test_exact_counts_of_this_implementation(monkeypatch):
    """The exact figures, so that any change to a module is noticed (HiFormer-B*: MACs that run). MISSFormer:
    Table 3's 42.46 M = ours + the 131 072 parameters of the LayerNorms the official Mix-FFN builds and never calls
    (2 per FFN of hidden width h, 2h each: encoder and decoder blocks, bridge FFNs), which we do not build."""
    _no_scan(monkeypatch)
    exact = {("segnext_l", 256): (48_775_875, 16_047_783_936), ("missformer", 256): (42_331_075, 9_358_540_800),
             ("swin_umamba", 256): (59_887_068, 39_743_520_768), ("hiformer_b", 256): (44_618_573, 16_700_141_568),
             ("hiformer_b", 512): (46_093_133, 64_742_559_744)}
    for (arch, size), (n, macs) in exact.items():
        model = _meta_model(arch, size)
        assert sum(p.numel() for p in model.parameters()) == n, arch
        assert round(_paper_gmacs(model, torch.empty(1, 3, size, size, device="meta")) * 1e9) == macs, arch
    hidden = [256, 512, 1280, 2048] * 2 + [256, 512, 1280, 2048] * 4 + [1280, 512, 256, 2048] * 2  # enc, bridge, dec
    assert 42_331_075 + sum(2 * 2 * h for h in hidden) == 42_462_147  # the official count (6 dp: 42.462147 M)


@pytest.mark.parametrize("size", [256, 512])
def test_hiformer_counts_as_calflops_on_the_official_code(size: int):
    """Our HiFormer-B* counted by registered name = calflops on the official code, to the MAC; the part
    counted twice is exactly the MACs of ResNet layer2 + layer3 and the decoder convolutions (hooks)."""
    model = _meta_model("hiformer_b", size)
    x = torch.empty(1, 3, size, size, device="meta")
    tree = count_tree_macs(model, x)
    assert tree.macs == HIFORMER_CALFLOPS[size]
    assert tree.run_macs == round(_paper_gmacs(model, x) * 1e9)  # each call once = conv+linear
    twice = {"backbone.resnet.layer2", "backbone.resnet.layer3", "conv_up_l", "conv_up_s"}
    assert model.official_registrations == dict.fromkeys(twice, 2)
    assert tree.macs - tree.run_macs == sum(_hook_macs(model, x, within=p) for p in twice)
    assert count_tree_macs(model, x, registrations={}).macs == tree.run_macs


def test_hiformer_official_switch():
    """``cnn: resnet50`` is the official HiFormer-B (25.63 M at 256², 27.10 M at 512²); ResNet-101 adds 17
    layer3 bottlenecks of 1024·256 + 9·256² + 256·1024 weights + 3 BN (2·256, 2·256, 2·1024) = 1 117 184
    parameters each."""
    per_block = 1024 * 256 + 9 * 256 * 256 + 256 * 1024 + 2 * (256 + 256 + 1024)
    assert per_block == 1_117_184
    for size, n50, macs50 in ((256, 25_626_445, 11_851_526_144), (512, 27_101_005, 45_348_098_048)):
        with torch.device("meta"):
            model = build_model(ModelConfig(arch="hiformer_b", params={"img_size": size, "cnn": "resnet50"}), 3)
        assert sum(p.numel() for p in model.parameters()) == n50
        assert n50 + 17 * per_block == sum(p.numel() for p in _meta_model("hiformer_b", size).parameters())
        assert round(_paper_gmacs(model, torch.empty(1, 3, size, size, device="meta")) * 1e9) == macs50


def _hook_macs(model: nn.Module, x: torch.Tensor, within: str = "") -> int:
    """Independent MAC count: forward hooks on Conv2d (out positions × C_in/groups × k²), ConvTranspose2d
    (in positions × C_out/groups × k²) and Linear (out elements × in_features), every call, of the modules
    inside the submodule ``within`` ("" = all) while ``model(x)`` runs."""
    total = [0]

    def hook(mod, inp, out):
        if isinstance(mod, nn.ConvTranspose2d):
            total[0] += inp[0].numel() * mod.out_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
        elif isinstance(mod, nn.Conv2d):
            total[0] += out.numel() * mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
        elif isinstance(mod, nn.Linear):
            total[0] += out.numel() * mod.in_features

    handles = [m.register_forward_hook(hook) for m in model.get_submodule(within).modules()
               if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear))]
    try:
        with torch.no_grad():
            model.eval()(x)
    finally:
        for h in handles:
            h.remove()
    return total[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_convention_equals_module_hooks(arch: str, monkeypatch):
    """convolution + mm + addmm of FlopCounterMode == the forward-hook count of conv/linear modules, exactly,
    at 64² (Swin-UMamba's einsum projections are not nn.Linear and lower to bmm: excluded on both sides)."""
    _no_scan(monkeypatch)
    model = _meta_model(arch, 64)
    x = torch.empty(1, 3, 64, 64, device="meta")
    assert round(_paper_gmacs(model, x) * 2e9) == 2 * _hook_macs(model, x)


def test_selective_scan_adds_no_counted_operation(monkeypatch):
    """The real pure-PyTorch scan and the zero stub give the same convention count (64², CPU)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="swin_umamba"), 3)
    x = torch.randn(1, 3, 64, 64)
    real = _paper_gmacs(model, x)
    _no_scan(monkeypatch)
    assert _paper_gmacs(model, x) == real


def _scan_numpy(u, delta, A, B, C, D, delta_bias):
    """Float64 NumPy loop of the recurrence (Mamba eq. 2 with ZOH for A, Euler for B; softplus on Δ)."""
    import numpy as np

    u, delta, A, B, C, D, bias = (t.double().numpy() for t in (u, delta, A, B, C, D, delta_bias))
    b, d, length = u.shape
    g = B.shape[1]
    y = np.zeros((b, d, length))
    for i in range(b):
        for c in range(d):
            grp = c // (d // g)
            h = np.zeros(A.shape[1])
            for t in range(length):
                dt = np.log1p(np.exp(delta[i, c, t] + bias[c]))
                h = np.exp(dt * A[c]) * h + dt * B[i, grp, :, t] * u[i, c, t]
                y[i, c, t] = h @ C[i, grp, :, t] + D[c] * u[i, c, t]
    return torch.from_numpy(y)


def _scan_inputs(b=2, groups=4, per=3, n=5, length=37, device="cpu"):
    g = torch.Generator().manual_seed(0)
    d = groups * per
    t = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    A = -torch.exp(t(d, n))
    return t(b, d, length), t(b, d, length), A, t(b, groups, n, length), t(b, groups, n, length), t(d), t(d)


def test_pure_selective_scan_matches_a_numpy_loop():
    from msb.models.ops.selective_scan import selective_scan_torch

    u, delta, A, B, C, D, bias = _scan_inputs()
    want = _scan_numpy(u, delta, A, B, C, D, bias)
    for grad in (False, True):  # without autograd: the step loop; with it: closed-form chunks
        for chunk in (None, 1, 5, 64):  # chunking (64 > L = one chunk) does not change the result
            with torch.set_grad_enabled(grad):
                got = selective_scan_torch(u, delta, A, B, C, D, delta_bias=bias, delta_softplus=True, chunk=chunk)
            assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-5)


def test_compiled_selective_scan_equals_the_pure_one():
    """mamba_ssm's CUDA kernel vs the pure version (needs the package and a GPU)."""
    from msb.models.ops.selective_scan import mamba_kernel_available, selective_scan

    if not (mamba_kernel_available() and torch.cuda.is_available()):
        pytest.skip("mamba_ssm is not installed or no CUDA device: the compiled selective scan cannot be compared")
    args = _scan_inputs(device="cuda")
    u, delta, A, B, C, D, bias = args
    kern = selective_scan(u, delta, A, B, C, D, delta_bias=bias, delta_softplus=True, use_kernel=True)
    pure = selective_scan(u, delta, A, B, C, D, delta_bias=bias, delta_softplus=True, use_kernel=False)
    assert torch.allclose(kern, pure, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_three_class_logits_at_input_resolution(arch: str):
    """3 classes: one logit map per class at the input size, finite, different per class (eval, 64²)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch, params=_params(arch, 64)), 3).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    assert len(outs) == 1 and tuple(outs[0].shape) == (1, 3, 64, 64) and torch.isfinite(outs[0]).all()
    assert not torch.equal(outs[0][:, 0], outs[0][:, 1])
    with torch.no_grad():  # deterministic in evaluation (SegNeXt's NMF bases come from a fixed seed there)
        assert torch.equal(model.predict_logits(torch.ones(1, 3, 64, 64)), model.predict_logits(torch.ones(1, 3, 64, 64)))


def test_swin_umamba_deep_supervision_outputs():
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="swin_umamba", params={"deep_supervision": True}), 2).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 64, 64))
    assert [tuple(o.shape) for o in outs] == [(1, 2, 64, 64), (1, 2, 32, 32), (1, 2, 16, 16), (1, 2, 8, 8)]


def test_hiformer_refuses_another_input_size():
    from msb.errors import MSBError

    model = build_model(ModelConfig(arch="hiformer_b", params={"img_size": 64}), 1)
    with pytest.raises(MSBError, match=r"hiformer_b was built for 64x64 inputs .* but got 96x96"):
        model(torch.randn(1, 3, 96, 96))


def test_two_training_steps_and_evaluation_in_a_study(tmp_path: Path):
    """One study, the four architectures on a synthetic 32² dataset: 1 epoch of 2 steps (4 training images,
    batch 2), then evaluation; every test image gets counts over all its pixels."""
    from msb.study.pipeline import run_study

    cfg = tmp_path / "configs"
    (cfg / "datasets").mkdir(parents=True)
    (cfg / "architectures").mkdir()
    (cfg / "global.yaml").write_text((REPO / "configs" / "global.yaml").read_text())
    (cfg / "datasets" / "synthetic.yaml").write_text(yaml.safe_dump({"data": {
        "name": "synthetic", "root": str(tmp_path / "datasets" / "synthetic"),
        "prepare": {"converter": "synthetic", "options": {"n_samples": 8, "seed": 0, "size": [32, 32],
                                                          "n_groups": 8}},
        "split": {"mode": "random", "val_fraction": 0.25, "test_fraction": 0.25, "seed": 0, "group_column": "group"},
        "input_size": [32, 32]}}))
    for arch in ARCHS:
        layer = yaml.safe_load((REPO / "configs" / "architectures" / f"{arch}.yaml").read_text())
        if arch == "hiformer_b":
            layer["model"]["params"]["img_size"] = [32, 32]
        layer.pop("data", None)
        (cfg / "architectures" / f"{arch}.yaml").write_text(yaml.safe_dump(layer))
    study = cfg / "study.yaml"
    study.write_text(yaml.safe_dump({
        "study": "paper_b", "run_root": str(tmp_path / "runs"), "datasets": ["synthetic"], "architectures": ARCHS,
        "overrides": {"train": {"epochs": 1, "batch_size": 2, "device": "cpu", "precision": "fp32"},
                      "evaluation": {"compute_metrics": False}}}))
    torch.set_num_threads(1)
    run_study(study)
    for arch in ARCHS:
        (run,) = [p for p in (tmp_path / "runs" / "paper_b").iterdir() if p.name.startswith(f"synthetic-{arch}-")]
        split = pd.read_csv(run / "split.csv")
        assert int((split["split"] == "train").sum()) == 4
        counts = pd.read_parquet(run / "evaluation" / "best" / "counts.parquet")
        assert len(counts) == int((split["split"] == "test").sum()) > 0 and set(counts["model"]) == {arch}
        assert ((counts["tp"] + counts["fp"] + counts["fn"] + counts["tn"]) == 32 * 32).all()


def test_swin_umamba_decoder_blocks_equal_monai():
    """Our residual and up blocks give MONAI's UnetResBlock / UnetrUpBlock output with the same weights (the
    official Swin-UMamba decoder is built from them; InstanceNorm without affine, LeakyReLU 0.01)."""
    blocks = pytest.importorskip("monai.networks.blocks.dynunet_block")
    unetr = pytest.importorskip("monai.networks.blocks.unetr_block")
    from msb.models.paper.swin_umamba import _ResBlock, _UpBlock

    torch.manual_seed(0)
    ref = blocks.UnetResBlock(2, 48, 96, 3, 1, "instance").eval()
    ours = _ResBlock(48, 96).eval()
    ours.load_state_dict({k.replace(".conv.", "."): v for k, v in ref.state_dict().items()})
    x = torch.randn(2, 48, 16, 16)
    assert torch.allclose(ours(x), ref(x), atol=1e-6)
    ref_up = unetr.UnetrUpBlock(2, 96, 48, 3, 2, "instance", res_block=True).eval()
    up = _UpBlock(96, 48).eval()
    up.load_state_dict({k.replace(".conv.", ".").replace("transp_conv.conv", "transp_conv"): v
                        for k, v in ref_up.state_dict().items()})
    y, skip = torch.randn(2, 96, 8, 8), torch.randn(2, 48, 16, 16)
    assert torch.allclose(up(y, skip), ref_up(y, skip), atol=1e-6)


def test_msb_profile_row_of_hiformer_gives_table3_in_its_calflops_column(tmp_path: Path):
    """``msb profile --arch hiformer_b --input-size 256`` (the CLI, 3 classes, 1 timed pass): params within 0.5 %
    and the ``GMACs calflops`` column within 3 % of Table 3 (44.62 M, 25.52); the ``GMACs`` column (conv+linear,
    FlopCounterMode) is the MACs that run, counted independently by forward hooks here (each call once)."""
    from typer.testing import CliRunner

    from msb.cli.app import app
    from msb.profiling.tree_macs import call_macs

    out = tmp_path / "profiles"
    res = CliRunner().invoke(app, ["profile", "--configs", str(REPO / "configs"), "--arch", "hiformer_b",
                                   "--input-size", "256", "--num-classes", "3", "--warmup", "0", "--timed-passes",
                                   "1", "--repeats", "1", "--out", str(out), "--format", "csv"])
    assert res.exit_code == 0, res.output
    row = pd.read_csv(out / "profile_cpu.csv").iloc[0]
    assert abs(row["params_m"] / 44.62 - 1) < 0.005 and abs(row["gmacs_calflops"] / 25.52 - 1) < 0.03, row
    model = _meta_model("hiformer_b", 256)
    run = []
    hooks = [m.register_forward_hook(lambda m, a, o: run.append(call_macs(m, a[0], o))) for m in model.modules()]
    with torch.no_grad():
        model.eval()(torch.empty(1, 3, 256, 256, device="meta"))
    for h in hooks:
        h.remove()
    assert round(row["gmacs"] * 1e9) == sum(run)
