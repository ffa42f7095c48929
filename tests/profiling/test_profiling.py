"""msb profile: GMACs of hand-derivable models (exact), a cross-check against ptflops, the timing protocol, peak
memory, every registered architecture, a study's accuracy-vs-cost scatter, and user errors (one line, nothing
half-written; --device cuda without a GPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from msb.config.generate import run_config_to_yaml
from msb.config.schema import ModelConfig, RunConfig
from msb.errors import MSBError
from msb.models import available_architectures, build_model
from msb.profiling import TimingProtocol, count_flops, profile_module, run_profile
from msb.profiling.environment import resolve_profile_device
from msb.profiling.measure import parse_input_size, takes_img_size
from msb.profiling.memory import cpu_peak_rss

REPO = Path(__file__).resolve().parents[2]
FAST = TimingProtocol(warmup=1, timed_passes=1, repeats=2)
#: one timed forward pass, no warm-up: the all-architectures test checks counts and the row's fields, not speed
ONE_PASS = TimingProtocol(warmup=0, timed_passes=1, repeats=1)


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread: these tests check values, not speed, and 2 OpenMP threads on a busy 2-core machine
    spin-wait (several times slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ------------------------------------------------------------------------------------------------- GMACs
def test_single_conv_macs_by_hand():
    """Conv2d 3->8, 3x3, padding 1, on 32x32: MACs = C_out * H_out * W_out * C_in * k_h * k_w
    = 8 * 32 * 32 * 3 * 9 = 221 184 (the bias add is not counted by FlopCounterMode); FLOPs = 2 * MACs."""
    conv = nn.Conv2d(3, 8, 3, padding=1, bias=True)
    fc = count_flops(conv, torch.randn(1, 3, 32, 32))
    assert fc.macs == 8 * 32 * 32 * 3 * 9 == 221_184
    assert fc.flops == 442_368
    assert fc.gmacs == pytest.approx(221_184 / 1e9, abs=0, rel=1e-15)
    assert fc.uncounted_ops == ()  # the convolution is the only arithmetic operator


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)                        # 32x32 out
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)  # 16x16 out
        self.bn = nn.BatchNorm2d(16)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)            # depthwise, 16x16 out
        self.pw = nn.Conv2d(16, 4, 1)                                   # 1x1, 16x16 out
        self.up = nn.ConvTranspose2d(4, 2, 2, stride=2)                 # 16x16 -> 32x32
        self.fc = nn.Linear(2, 5)                                       # on the global average (N, 2)

    def forward(self, x):
        y = torch.relu(self.c1(x))
        y = torch.relu(self.bn(self.c2(y)))
        y = self.up(self.pw(self.dw(y)))
        return [y, self.fc(y.mean(dim=(2, 3)))]


def test_conv_stack_macs_by_hand():
    """MACs per layer (N = 1), each C_out * H_out * W_out * (C_in / groups) * k_h * k_w:
    c1 8*32*32*3*9 = 221 184; c2 16*16*16*8*9 = 294 912; dw 16*16*16*1*9 = 36 864; pw 4*16*16*16*1 = 16 384;
    transposed conv: every input pixel scatters C_in*C_out*k*k: 16*16*4*2*2*2 = 8 192; linear 2*5 = 10.
    Total 577 546. Batch 3 triples it."""
    expected = 221_184 + 294_912 + 36_864 + 16_384 + 8_192 + 10
    assert expected == 577_546
    model = _Stack()
    fc = count_flops(model, torch.randn(1, 3, 32, 32))
    assert fc.macs == expected
    assert fc.by_operator["convolution"] == 2 * (expected - 10)
    assert count_flops(model, torch.randn(3, 3, 32, 32)).macs == 3 * expected
    # BN, ReLU and the mean are computed but not counted, and are listed as such
    assert {"native_batch_norm", "relu", "mean"} <= set(fc.uncounted_ops) or \
        {"_native_batch_norm_legit_no_training", "relu", "mean"} <= set(fc.uncounted_ops)
    assert model.training  # count_flops restores the mode


class _Attention(nn.Module):
    def forward(self, x):
        q = k = v = x.reshape(1, 2, 16, 8)  # (batch, heads, tokens, head dim)
        return [torch.nn.functional.scaled_dot_product_attention(q, k, v)]


def test_attention_is_counted_on_cpu():
    """Q K^T: heads * L_q * L_k * d = 2 * 16 * 16 * 8 = 4096 MACs, A V another 4096 (softmax not counted).
    PyTorch's CPU attention kernel is not in FlopCounterMode's registry; count_flops counts with the math
    backend, so attention is counted on CPU as on CUDA."""
    fc = count_flops(_Attention(), torch.randn(256))
    assert fc.macs == 2 * (2 * 16 * 16 * 8) == 8192
    assert "_scaled_dot_product_flash_attention_for_cpu" not in fc.uncounted_ops


def test_unet_macs_match_ptflops_aten_backend():
    """Independent counter: ptflops' ATen backend counts convolutions and matrix products like FlopCounterMode
    but adds each convolution's bias (one MAC per output element). In smp's U-Net only the segmentation head
    conv (16 -> 1, 3x3) has a bias, so ptflops = ours + 1 * 64 * 64 at 64x64."""
    ptflops = pytest.importorskip("ptflops")
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="unet", encoder="resnet34"), 1).eval()
    ours = count_flops(model, torch.randn(1, 3, 64, 64)).macs
    theirs, _ = ptflops.get_model_complexity_info(model, (3, 64, 64), as_strings=False, backend="aten",
                                                  print_per_layer_stat=False, verbose=False)
    biased = [m for m in model.modules() if isinstance(m, nn.Conv2d) and m.bias is not None]
    assert len(biased) == 1 and biased[0].out_channels == 1
    assert theirs == ours + 64 * 64


# ------------------------------------------------------------------------------------------------ timing
class _Counting(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return [self.conv(x)]


def test_profile_row_records_protocol_and_exact_values():
    model = _Counting()
    proto = TimingProtocol(warmup=3, timed_passes=4, repeats=5, batch_size=2)
    rows = profile_module(model, (32, 32), torch.device("cpu"), [proto], label="conv")
    assert len(rows) == 1
    r = rows[0]
    # calls: 1 FLOP count + 1 module-tree count + warm-up 3 + 5 x 4 timed + 1 memory pass
    assert model.calls == 1 + 1 + 3 + 20 + 1
    assert r["params"] == 3 * 8 * 9 + 8 == 224
    assert r["gmacs"] == r["gmacs_calflops"] == 8 * 32 * 32 * 3 * 9 / 1e9  # no module registered twice
    assert (r["warmup"], r["timed_passes"], r["repeats"], r["batch_size"]) == (3, 4, 5, 2)
    assert r["precision"] == "fp32" and r["device"] == "cpu" and r["timer"] == "perf_counter"
    assert "forward only" in r["timed_region"] and r["cudnn_benchmark"] is True
    reps = json.loads(r["latency_ms_repeats"])
    assert len(reps) == 5 and all(v > 0 for v in reps)
    assert r["latency_ms_median"] == pytest.approx(float(np.median(reps)), rel=1e-5)
    assert r["latency_ms_sd"] == pytest.approx(float(np.std(reps, ddof=1)), rel=1e-4, abs=1e-5)
    assert r["throughput_ips"] == pytest.approx(2 / (r["latency_ms_median"] / 1000), rel=1e-9)
    assert r["torch"] == torch.__version__ and r["num_threads"] == torch.get_num_threads()
    assert r["status"] == "ok"


def test_amp_on_cpu_uses_bfloat16():
    rows = profile_module(_Counting(), (16, 16), torch.device("cpu"),
                          [TimingProtocol(0, 1, 1, 1, "amp")], label="conv")
    assert rows[0]["precision"] == "amp" and rows[0]["amp_dtype"] == "bfloat16"


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc/self/clear_refs")
def test_cpu_peak_rss_sees_a_64_mib_allocation():
    """Touching a 64 MiB buffer inside the measured call raises the RSS high-water mark by >= ~64 MiB even
    though the buffer is freed before the measurement returns."""
    def alloc():
        t = torch.ones(16 * 1024 * 1024, dtype=torch.float32)  # 64 MiB, every page written
        return float(t[0])

    m = cpu_peak_rss(alloc)
    assert m.delta_bytes >= 60 * 1024 * 1024
    assert m.delta_bytes < 200 * 1024 * 1024
    assert "VmHWM" in m.method


# ------------------------------------------------------------------------------------- all architectures
def _smallest_model(arch: str) -> tuple[nn.Module, int]:
    """The model for the smallest square input >= 64 it accepts: 64 for most; a size-bound model (constructor
    argument ``img_size``, e.g. g_cascade's graphs) is built for 64, 96, ... until its constructor accepts it."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch=arch), 1)
    div = int(getattr(model, "size_divisor", 1) or 1)
    if not takes_img_size(model):
        return model, -(-64 // div) * div
    del model
    for size in range(-(-64 // div) * div, 257, div):
        try:
            torch.manual_seed(0)
            return build_model(ModelConfig(arch=arch, params={"img_size": [size, size]}), 1), size
        except MSBError:
            continue
    raise AssertionError(f"{arch}: no input size in 64..256 accepted")


def _ptflops_aten_macs(model: nn.Module, size: int) -> int:
    """MACs of one forward pass counted by ptflops' ATen backend (its own TorchDispatchMode and formulas for
    convolution, mm/addmm/bmm), with attention decomposed by the math SDPA backend as count_flops does."""
    ptflops = pytest.importorskip("ptflops")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(0)
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        macs, _ = ptflops.get_model_complexity_info(model, (3, size, size), as_strings=False, backend="aten",
                                                    print_per_layer_stat=False, verbose=False,
                                                    input_constructor=lambda res: torch.randn(1, *res))
    assert macs is not None, "ptflops failed on the model"
    return int(macs)


def _bias_outputs(model: nn.Module, size: int) -> int:
    """Output elements of every convolution / linear layer that has a bias, in one forward pass: the most bias
    adds (one MAC each) a counter that includes biases can add to a bias-free count."""
    total = 0

    def hook(_mod, _inp, out):
        nonlocal total
        total += out.numel()

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.ConvTranspose2d, nn.Linear)) and m.bias is not None]
    try:
        with torch.no_grad():
            model.eval()(torch.randn(1, 3, size, size))
    finally:
        for h in handles:
            h.remove()
    return total


def test_every_registered_architecture_profiles(tmp_path: Path):
    """CPU, smallest valid size >= 64 per architecture, no warm-up, 1 timed pass (:data:`ONE_PASS`: the asserted
    values are counts and row fields, not latencies); one model built per arch.

    GMACs against an independent counter, ptflops' ATen backend (its own dispatch mode and per-operator
    formulas, not torch's FlopCounterMode). It counts the same operators (convolution, mm/addmm/bmm) but adds
    one MAC per output element for the bias of a convolution and of a linear layer lowered to aten.addmm (a
    linear layer on a 3-D token tensor is lowered to matmul + add, whose bias ptflops does not count), while
    FlopCounterMode counts no bias. Tolerance, hence: with B = the output elements of all biased conv / linear
    layers (forward hooks), ``0 <= ptflops - ours <= B``, and for the convolution-only architectures (no
    nn.Linear) every bias is counted, so ``ptflops == ours + B`` exactly. B is at most 0.7 % of the MACs here;
    a missed or miscounted convolution would be off by C_in * k_h * k_w times its own bias term."""
    from msb.profiling.report import write_profile_table

    archs = available_architectures()
    rows = []
    for arch in archs:
        model, size = _smallest_model(arch)
        rows += profile_module(model, (size, size), torch.device("cpu"), [ONE_PASS], label=arch,
                               model_cfg=ModelConfig(arch=arch))
        assert rows[-1]["params"] == sum(p.numel() for p in model.parameters())
        # exact: gmacs = macs / 1e9 and macs < 2**53; ptflops' ATen backend counts the attention products too
        ours = round(rows[-1]["gmacs"] * 1e9) + round(rows[-1]["gmacs_attention"] * 1e9)
        bias = _bias_outputs(model, size)
        theirs = _ptflops_aten_macs(model, size)
        assert 0 <= theirs - ours <= bias, (arch, ours, theirs, bias)
        if not any(isinstance(m, nn.Linear) for m in model.modules()):
            assert theirs == ours + bias, (arch, ours, theirs, bias)
        del model
    table = pd.DataFrame(rows)
    assert list(table["model"]) == archs
    assert (table["gmacs"] > 0).all() and (table["params"] > 0).all()
    assert table["latency_ms_median"].notna().all() and (table["status"] == "ok").all()
    assert table["uncounted_ops"].str.len().gt(0).all()  # every real model has uncounted ops (BN, activations)
    assert (table["gflops"] == 2 * table["gmacs"]).all()
    paths = write_profile_table(table, tmp_path, "profile_cpu")
    assert [p.name for p in paths] == ["profile_cpu.parquet", "profile_cpu.csv", "profile_cpu.tex"]
    tex = paths[2].read_text()
    assert "\\begin{tabular}" in tex and "FlopCounterMode" in tex and tex.count("\\\\") == len(archs) + 1
    back = pd.read_parquet(paths[0])
    assert list(back.columns) == list(table.columns) and len(back) == len(archs)


class _SizeBound(nn.Module):
    """Stands in for a model whose constructor fixes the input size (like g_cascade)."""

    size_divisor = 16

    def __init__(self, num_classes: int, img_size=(352, 352)) -> None:
        super().__init__()
        self.img_size = tuple(img_size)
        self.conv = nn.Conv2d(3, num_classes, 1)

    def forward(self, x):
        assert tuple(x.shape[-2:]) == self.img_size, "built for another size"
        return [self.conv(x)]


def test_size_bound_models_are_rebuilt_per_size(monkeypatch):
    from msb.profiling import measure

    built = []

    def fake_build(cfg, n):
        built.append(cfg.params.get("img_size"))
        return _SizeBound(n, **cfg.params)

    monkeypatch.setattr(measure, "build_model", fake_build)
    t = measure.ProfileTarget("sb", ModelConfig(arch="sb"), 2)
    table = measure.profile_targets([t], [(32, 32), (16, 48)], torch.device("cpu"), [FAST])
    assert built == [None, [32, 32], [16, 48]]
    assert list(table["model_params"]) == ['{"img_size": [32, 32]}', '{"img_size": [16, 48]}']
    assert list(table["gmacs"]) == [2 * 32 * 32 * 3 / 1e9, 2 * 16 * 48 * 3 / 1e9]  # 1x1 conv: C_out*H*W*C_in


# ------------------------------------------------------------------------------------------------- study
def _fake_study(root: Path) -> Path:
    """Two runs of one tiny U-Net (folds) + one with a narrower decoder, each with hand-made counts."""
    from msb.evaluation.counts import compute_confusion_counts, counts_rows, write_counts

    study = root / "runs" / "s"
    data_root = root / "data"
    data_root.mkdir(parents=True)
    (data_root / "classes.csv").write_text("class_id,name,source_values\n0,background,0\n1,lesion,255\n")
    specs = [("r-a0", [16, 8, 8, 8, 8], [(8, 2, 0)]), ("r-a1", [16, 8, 8, 8, 8], [(1, 0, 1)]),
             ("r-b", [8, 8, 8, 8, 8], [(4, 0, 4)])]
    for run_id, dec, counts in specs:
        cfg = RunConfig.model_validate({
            "study": "s", "data": {"name": "toy", "root": str(data_root), "input_size": [32, 32]},
            "model": {"arch": "unet", "encoder": "resnet18", "params": {"decoder_channels": dec}}})
        d = study / run_id
        d.mkdir(parents=True)
        (d / "config.yaml").write_text(run_config_to_yaml(cfg))
        frames = []
        for i, (tp, fp, fn) in enumerate(counts):
            pred = np.zeros((1, 1, 4, 4), bool)
            ref = np.zeros((1, 1, 4, 4), bool)
            flat_p, flat_r = pred.reshape(-1), ref.reshape(-1)
            flat_p[:tp + fp] = True
            flat_r[:tp] = True
            flat_r[tp + fp: tp + fp + fn] = True
            c = compute_confusion_counts(pred, ref)
            ctx = {"dataset": "toy", "split": "test", "fold": -1, "run_id": run_id, "model": "unet",
                   "checkpoint_role": "best", "checkpoint_sha256": "0" * 64, "config_hash": "1" * 64,
                   "threshold": 0.5, "threshold_on": "probability"}
            frames.append(counts_rows(ctx, c, image_ids=[f"{run_id}-img{i}"], class_ids=[1],
                                      class_names=["lesion"], heights=4, widths=4))
        write_counts(pd.concat(frames, ignore_index=True), d / "evaluation" / "best" / "counts.parquet")
    return study


def test_study_scatter_uses_dice_from_counts(tmp_path: Path):
    """Model A (two fold runs pooled): image-macro Dice = mean(2*8/(16+2), 2*1/(2+1)) = (8/9 + 2/3) / 2;
    model B: 2*4/(8+4) = 2/3."""
    from msb.profiling.measure import model_label

    study = _fake_study(tmp_path)
    out = run_profile("cpu", study=study, protocols=[FAST])
    pts = out.points.set_index("model")
    label18 = model_label(ModelConfig(arch="unet", encoder="resnet18", params={"decoder_channels": [16, 8, 8, 8, 8]}))
    label34 = model_label(ModelConfig(arch="unet", encoder="resnet18", params={"decoder_channels": [8, 8, 8, 8, 8]}))
    assert label18 != label34 and label18.startswith("unet-resnet18-")
    assert pts.loc[label18, "value"] == pytest.approx((8 / 9 + 2 / 3) / 2, abs=1e-12)
    assert pts.loc[label34, "value"] == pytest.approx(2 / 3, abs=1e-12)
    assert pts.loc[label18, "n_runs"] == 2
    table = out.table.set_index("model")
    assert pts.loc[label18, "gmacs"] == table.loc[label18, "gmacs"]
    assert (table["input_h"] == 32).all() and len(table) == 2  # profiled once per model, at the training size
    for name in ("profile_cpu.parquet", "profile_cpu.csv", "profile_cpu.tex", "accuracy_vs_cost_cpu.png",
                 "accuracy_vs_cost_cpu.csv"):
        assert (study / "profile" / name).is_file(), name
    assert (study / "profile" / "accuracy_vs_cost_cpu.png").read_bytes()[:4] == b"\x89PNG"


def test_study_without_counts_fails_before_measuring(tmp_path: Path):
    study = _fake_study(tmp_path)
    with pytest.raises(MSBError, match="evaluation/latest/counts.parquet"):
        run_profile("cpu", study=study, protocols=[FAST], role="latest")
    assert not (study / "profile").exists()


# ------------------------------------------------------------------------------------------- user errors
def test_input_size_parsing():
    assert parse_input_size("256") == (256, 256)
    assert parse_input_size("256x320") == (256, 320)
    for bad in ("0", "abc", "1x2x3", "-5"):
        with pytest.raises(MSBError, match="--input-size"):
            parse_input_size(bad)


def test_bad_size_and_unknown_arch_write_nothing(tmp_path: Path):
    with pytest.raises(MSBError, match=r"divisible by 32; use e\.g\. 96x96"):
        run_profile("cpu", ["unet"], sizes=[(70, 70)], protocols=[FAST], out_dir=tmp_path / "o")
    with pytest.raises(MSBError, match="unknown architecture 'unett'; did you mean 'unet'"):
        run_profile("cpu", ["unett"], protocols=[FAST], out_dir=tmp_path / "o")
    with pytest.raises(MSBError, match="either --arch or --study"):
        run_profile("cpu", ["unet"], study=tmp_path, protocols=[FAST], out_dir=tmp_path / "o")
    with pytest.raises(MSBError, match="--timed-passes must be >= 1"):
        TimingProtocol(timed_passes=0)
    assert not (tmp_path / "o").exists()


def test_cuda_unavailable_is_one_clear_error(monkeypatch):
    """Simulated machine without a GPU: torch says no CUDA and NVML cannot load its library."""
    import pynvml

    def no_nvml():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(pynvml, "nvmlInit", no_nvml)
    with pytest.raises(MSBError) as ei:
        resolve_profile_device("cuda")
    msg = str(ei.value)
    assert "torch.cuda.is_available() is False" in msg and "NVML" in msg and "--device cpu" in msg
    assert "\n" not in msg
    with pytest.raises(MSBError, match="'cpu' or 'cuda'"):
        resolve_profile_device("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cli_cuda_without_gpu_one_line_exit_2(tmp_path: Path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", COLUMNS="200", OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "msb", "profile", "--device", "cuda", "--out", str(tmp_path / "o")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --device cuda: no usable CUDA GPU"), r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (tmp_path / "o").exists()


def test_cli_multi_value_options(tmp_path: Path):
    """``--input-size 32 64`` (values after one flag) and ``--precision fp32 amp`` as in the issue (in-process)."""
    from typer.testing import CliRunner

    from msb.cli.app import app

    r = CliRunner().invoke(app, ["profile", "--arch", "unet", "--input-size", "32", "64", "--precision", "fp32",
                                 "amp", "--warmup", "0", "--timed-passes", "1", "--repeats", "1",
                                 "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    t = pd.read_parquet(tmp_path / "profile_cpu.parquet")
    assert sorted(zip(t["input_h"], t["precision"])) == [(32, "amp"), (32, "fp32"), (64, "amp"), (64, "fp32")]
    assert "operators not counted" in r.output
    r = CliRunner().invoke(app, ["profile", "unet"])
    assert isinstance(r.exception, MSBError) and "--arch unet" in str(r.exception)


def test_cli_arch_takes_the_architecture_config_names(tmp_path: Path):
    """``--arch unet_r18`` profiles the model a study naming ``unet_r18`` trains (ResNet-18 encoder: the
    parameter count of smp's own ``Unet("resnet18", classes=1)``), not the adapter's default ResNet-34; a
    misspelt name gets a did-you-mean and both lists."""
    import segmentation_models_pytorch as smp
    from typer.testing import CliRunner

    from msb.cli.app import app

    configs = Path(__file__).resolve().parents[2] / "configs"
    r = CliRunner().invoke(app, ["profile", "--arch", "unet_r18", "--arch", "unet", "--input-size", "32",
                                 "--warmup", "0", "--timed-passes", "1", "--repeats", "1", "--configs", str(configs),
                                 "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    t = pd.read_parquet(tmp_path / "profile_cpu.parquet").set_index("model")
    n18 = sum(p.numel() for p in smp.Unet("resnet18", encoder_weights=None, classes=1).parameters())
    n34 = sum(p.numel() for p in smp.Unet("resnet34", encoder_weights=None, classes=1).parameters())
    assert t.loc["unet_r18", "params_m"] == pytest.approx(n18 / 1e6, abs=5e-3)
    assert t.loc["unet", "params_m"] == pytest.approx(n34 / 1e6, abs=5e-3)
    r = CliRunner().invoke(app, ["profile", "--arch", "unet_r81", "--configs", str(configs)])
    msg = str(r.exception)
    assert isinstance(r.exception, MSBError) and "did you mean 'unet_r18'" in msg
    assert "segformer_b0" in msg and "registry adapters:" in msg
