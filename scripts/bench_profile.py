"""Cross-check of the MAC count: PyTorch's FlopCounterMode (what ``msb profile`` reports) against ptflops.

Model: smp U-Net with a ResNet-34 encoder, 1 class, random weights, input 1 x 3 x 352 x 352. Prints

- FlopCounterMode FLOPs and MACs (= FLOPs / 2) and the operators it counted;
- ptflops 'aten' backend MACs (counts aten convolution / matrix products, like FlopCounterMode, plus bias);
- ptflops 'pytorch' backend MACs (module hooks: also counts BatchNorm, ReLU, pooling and biases; its functional
  patches add F.interpolate and count F.relu / F.max_pool2d a second time), with and without the functional
  patches, each difference checked against element counts taken with forward hooks.

Usage: ``.venv/bin/python scripts/bench_profile.py [--size 352] [--encoder resnet34]``
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from msb.config.schema import ModelConfig  # noqa: E402
from msb.models import build_model  # noqa: E402
from msb.profiling import count_flops  # noqa: E402


def _ptflops(model: nn.Module, size: int, backend: str, functional: bool = True) -> int:
    from ptflops import get_model_complexity_info

    macs, _ = get_model_complexity_info(model, (3, size, size), as_strings=False, print_per_layer_stat=False,
                                        backend=backend, verbose=False,
                                        backend_specific_config={} if functional else {"count_functional": False})
    return int(macs)


def _hand_counts(model: nn.Module, size: int) -> dict[str, int]:
    """Element counts by forward hooks (independent of ptflops): conv/linear bias outputs, 2 x BatchNorm inputs
    (scale + shift), ReLU outputs, MaxPool inputs, nearest-upsampling outputs (F.interpolate)."""
    acc = {"bias": 0, "bn": 0, "relu": 0, "pool": 0, "upsample": 0}

    def hook(mod, inp, out):
        if isinstance(mod, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)) and mod.bias is not None:
            acc["bias"] += out.numel()
        elif isinstance(mod, nn.BatchNorm2d):
            acc["bn"] += 2 * inp[0].numel()
        elif isinstance(mod, nn.ReLU):
            acc["relu"] += out.numel()
        elif isinstance(mod, nn.MaxPool2d):
            acc["pool"] += inp[0].numel()

    hooks = [m.register_forward_hook(hook) for m in model.modules()]
    real_interpolate = torch.nn.functional.interpolate

    def counting_interpolate(*a, **k):
        out = real_interpolate(*a, **k)
        acc["upsample"] += out.numel()
        return out

    torch.nn.functional.interpolate = counting_interpolate
    try:
        with torch.no_grad():
            model(torch.randn(1, 3, size, size))
    finally:
        torch.nn.functional.interpolate = real_interpolate
        for h in hooks:
            h.remove()
    return acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=352)
    ap.add_argument("--encoder", default="resnet34")
    args = ap.parse_args()
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="unet", encoder=args.encoder), 1).eval()
    params = sum(p.numel() for p in model.parameters())
    fc = count_flops(model, torch.randn(1, 3, args.size, args.size))
    hand = _hand_counts(model, args.size)
    print(f"U-Net {args.encoder}, 1 class, {args.size}x{args.size}, {params:,} parameters")
    print(f"FlopCounterMode: {fc.flops:,} FLOPs = {fc.macs:,} MACs ({fc.gmacs:.4f} GMACs); counted: "
          f"{', '.join(f'{k} {v:,} FLOPs' for k, v in fc.by_operator.items())}")
    print(f"  not counted: {', '.join(fc.uncounted_ops)}")
    print(f"hand counts (elements): {', '.join(f'{k} {v:,}' for k, v in hand.items())}")
    aten = _ptflops(model, args.size, "aten")
    print(f"ptflops aten backend:    {aten:,} MACs = FlopCounterMode + {aten - fc.macs:,} "
          f"(conv biases: {hand['bias']:,})")
    modules = _ptflops(model, args.size, "pytorch", functional=False)
    full = _ptflops(model, args.size, "pytorch")
    expect_mod = fc.macs + hand["bias"] + hand["bn"] + hand["relu"] + hand["pool"]
    print(f"ptflops pytorch backend, module hooks only: {modules:,} MACs = FlopCounterMode + "
          f"{modules - fc.macs:,}; hand: biases + BN + ReLU + MaxPool = {expect_mod - fc.macs:,}")
    expect_fn = hand["upsample"] + hand["relu"] + hand["pool"]
    print(f"ptflops pytorch backend (default, + functional patches): {full:,} MACs ({full / 1e9:.4f} GMACs); "
          f"functional part {full - modules:,}; hand: F.interpolate outputs + F.relu + F.max_pool2d again "
          f"(nn.ReLU/nn.MaxPool2d call them: counted twice) = {expect_fn:,}")


if __name__ == "__main__":
    main()
