"""``scripts/gpu_check.py --dry-run``: every section runs on CPU at toy sizes (no CUDA call), so the GPU check
cannot rot between GPU sessions."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--dry-run", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "gpu_check.md").read_text()
    rows = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
            for ln in md.splitlines() if ln.startswith("| unet_r18/")}
    assert set(rows) == {"unet_r18/bf16", "unet_r18/fp16", "unet_r18/fp32", "unet_r18/bf16 batch 8"}, md
    assert [rows[f"unet_r18/{p}"][0] for p in ("bf16", "fp16", "fp32")] == ["bf16", "fp32", "fp32"]  # ran as (CPU)
    # achieved TFLOP/s = 3 x forward FLOPs (counted here with torch's FlopCounterMode) x images/s
    from msb.models.registry import build_model
    from msb.config.schema import ModelConfig

    model_cfg = yaml.safe_load((REPO / "configs" / "architectures" / "unet_r18.yaml").read_text())["model"]
    model = build_model(ModelConfig.model_validate(model_cfg), 1).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        model(torch.zeros(1, 3, 32, 32))
    fwd = fc.get_total_flops()
    ips, tflops = float(rows["unet_r18/fp32"][1]), float(rows["unet_r18/fp32"][3])
    assert tflops == pytest.approx(3 * fwd * ips / 1e12, rel=2e-3)  # 4 significant digits in the table
    assert "weights identical" in md
    assert "| unet | 32 |" in md and (tmp_path / "profile" / "profile_cpu.csv").is_file()
    assert "--nproc-per-node 1`: exit 0, backend gloo" in md and "OK" in md
