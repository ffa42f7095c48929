"""Profile models: parameters, GMACs, latency, throughput and peak memory, one row per model x input size x
timing protocol (``msb profile``).

Every row carries its timing protocol (:class:`~msb.profiling.timing.TimingProtocol`), the device and library
versions (:func:`~msb.profiling.environment.environment_info`) and the operators the MAC count leaves out, so a
table row is interpretable on its own. Columns (:data:`PROFILE_COLUMNS`):

``model`` (label, :func:`model_label`), ``arch``, ``encoder``, ``model_params`` (JSON of ``model.params``),
``num_classes``, ``input_h``, ``input_w`` (pixels), ``batch_size``, ``precision`` (``fp32``/``amp``),
``amp_dtype``, ``params`` (number of parameters, int), ``params_m`` (millions), ``gmacs`` (GMACs per image =
one forward pass at batch 1 under the named convention ``conv+linear`` of :mod:`msb.profiling.flops`:
convolutions and linear layers, FlopCounterMode FLOPs / 2 / 1e9), ``gflops`` (2 x gmacs), ``gmacs_attention``
(attention matrix products, not in ``gmacs``), ``gmacs_convention`` (``conv+linear``), ``gmacs_calflops``
(the counting of calflops, which MSB Table 3 follows: conv / linear / ``torch.matmul`` / ``addmm`` / ``baddbmm``
calls summed over the module tree by registered name, with the reference implementation's duplicate
registrations: :mod:`msb.profiling.tree_macs`),
``uncounted_ops`` (comma-separated ATen operators that ran but count 0), ``latency_ms_median``,
``latency_ms_sd`` (per forward pass of one batch, over repeats), ``latency_ms_repeats`` (JSON list),
``throughput_ips`` (images/s), ``peak_mem_mib``, ``peak_mem_delta_mib``, ``nvml_used_mib``, ``mem_method``
(:mod:`msb.profiling.memory`), ``warmup``, ``timed_passes``, ``repeats``, ``cudnn_benchmark``, ``timer``,
``timed_region``, ``flop_counter``, ``device``, ``device_name``, ``num_threads``, ``driver_version``,
``cuda_runtime``, ``cudnn_version``, ``python``, ``torch``, ``segmentation_models_pytorch``, ``timm``,
``platform``, ``status`` (``ok`` or ``out of memory``), ``measured_at`` (UTC, ISO 8601).
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Sequence

import pandas as pd
import torch
from torch import nn

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.registry import build_model
from msb.profiling.environment import environment_info, nvml_used_bytes
from msb.profiling.flops import CONVENTION, count_flops
from msb.profiling.memory import cpu_peak_rss, cuda_peak
from msb.profiling.timing import TimingProtocol, autocast_context, time_forward
from msb.profiling.tree_macs import count_tree_macs
from msb.utils.hashing import sha256_json

__all__ = ["ProfileTarget", "PROFILE_COLUMNS", "TIMED_REGION", "model_label", "parse_input_size",
           "profile_module", "profile_targets", "takes_img_size"]

#: What the latency figures time (recorded in every row).
TIMED_REGION = ("model forward only (Segmentor.forward, all outputs; no host-device copy, no test-time "
                "combination, no sigmoid/threshold, no data loading)")
_FLOP_COUNTER = ("torch.utils.flop_counter.FlopCounterMode (MACs = FLOPs / 2; bias adds not counted; gmacs: "
                 "convolutions + linear layers, gmacs_attention: attention matrix products)")
_MIB = 1024.0 * 1024.0

PROFILE_COLUMNS: tuple[str, ...] = (
    "model", "arch", "encoder", "model_params", "num_classes", "input_h", "input_w", "batch_size", "precision",
    "amp_dtype", "params", "params_m", "gmacs", "gflops", "gmacs_attention", "gmacs_convention", "gmacs_calflops",
    "uncounted_ops", "latency_ms_median", "latency_ms_sd",
    "latency_ms_repeats", "throughput_ips", "peak_mem_mib", "peak_mem_delta_mib", "nvml_used_mib", "mem_method",
    "warmup", "timed_passes", "repeats", "cudnn_benchmark", "timer", "timed_region", "flop_counter", "device",
    "device_name", "num_threads", "driver_version", "cuda_runtime", "cudnn_version", "python", "torch",
    "segmentation_models_pytorch", "timm", "platform", "status", "measured_at",
)


@dataclass(frozen=True)
class ProfileTarget:
    """One model to profile.

    Attributes:
        label: name in the tables (see :func:`model_label`).
        model: the model config (registry name, encoder, params); weights are random (cost does not depend
            on them).
        num_classes: output channels (foreground classes).
        sizes: extra (height, width) input sizes for this target, e.g. a study run's training size.
    """

    label: str
    model: ModelConfig
    num_classes: int = 1
    sizes: tuple[tuple[int, int], ...] = ()


def model_label(cfg: ModelConfig) -> str:
    """``arch`` or ``arch-encoder``, plus the first 6 hex of the SHA-256 of ``params`` when params are set
    (e.g. ``unet-resnet18``, ``unet-resnet34-3fa2c1``)."""
    label = cfg.arch if not cfg.encoder else f"{cfg.arch}-{cfg.encoder}"
    if cfg.params:
        label += "-" + sha256_json(cfg.params)[:6]
    return label


def parse_input_size(text: str) -> tuple[int, int]:
    """``"256"`` -> (256, 256); ``"256x320"`` -> (256, 320) as (height, width) in pixels.

    Raises:
        MSBError: not a positive integer or ``HxW``.
    """
    parts = str(text).lower().replace("×", "x").split("x")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        vals = []
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2 or min(vals) <= 0:
        raise MSBError(f"--input-size '{text}': give a positive integer (square, e.g. 256) or HxW (e.g. 256x320)")
    return vals[0], vals[1]


def _size_divisor(model: nn.Module) -> int:
    return int(getattr(model, "size_divisor", 1) or 1)


def profile_module(model: nn.Module, size: tuple[int, int], device: torch.device,
                   protocols: Sequence[TimingProtocol], env: dict[str, Any] | None = None,
                   label: str = "model", model_cfg: ModelConfig | None = None,
                   num_classes: int = 1) -> list[dict[str, Any]]:
    """Profile one built model at one input size under each protocol; one row (dict) per protocol.

    Args:
        model: the model (moved to ``device`` here; left there).
        size: (height, width) in pixels; must be a multiple of ``model.size_divisor`` when it has one.
        device: ``cpu`` or ``cuda``.
        protocols: timing protocols (e.g. fp32 and AMP).
        env: :func:`~msb.profiling.environment.environment_info` (computed when None).
        label, model_cfg, num_classes: recorded in the row.

    Raises:
        MSBError: ``size`` is not a multiple of the model's size divisor.
    """
    h, w = size
    div = _size_divisor(model)
    if h % div or w % div:
        up = (math.ceil(h / div) * div, math.ceil(w / div) * div)
        raise MSBError(f"--input-size {h}x{w}: model '{label}' needs height and width divisible by {div}; "
                       f"use e.g. {up[0]}x{up[1]}")
    env = env or environment_info(device)
    model = model.to(device).eval()
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(0)
    x1 = torch.randn(1, 3, h, w, generator=gen).to(device)
    fc = count_flops(model, x1)
    tree = count_tree_macs(model, x1)
    del x1
    rows = []
    for proto in protocols:
        x = torch.randn(proto.batch_size, 3, h, w, generator=gen).to(device)
        prev_bench = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = proto.cudnn_benchmark
        status = "ok"
        try:
            timing = time_forward(model, x, proto)

            def one_pass() -> object:
                with torch.inference_mode(), autocast_context(device, proto.precision):
                    return model(x)

            mem = cuda_peak(one_pass, device) if device.type == "cuda" else cpu_peak_rss(one_pass)
            nvml = nvml_used_bytes(device)
        except torch.cuda.OutOfMemoryError:
            status = "out of memory"
            timing = None
            mem = None
            nvml = float("nan")
            torch.cuda.empty_cache()
        finally:
            torch.backends.cudnn.benchmark = prev_bench
        del x
        nan = float("nan")
        cfg = model_cfg
        rows.append({
            "model": label, "arch": cfg.arch if cfg else type(model).__name__,
            "encoder": (cfg.encoder or "") if cfg else "",
            "model_params": json.dumps(cfg.params, sort_keys=True) if cfg else "{}",
            "num_classes": int(num_classes), "input_h": int(h), "input_w": int(w),
            "batch_size": proto.batch_size, "precision": proto.precision,
            "amp_dtype": timing.amp_dtype if timing else "",
            "params": int(n_params), "params_m": n_params / 1e6, "gmacs": fc.gmacs, "gflops": 2 * fc.gmacs,
            "gmacs_attention": fc.gmacs_attention, "gmacs_convention": CONVENTION,
            "gmacs_calflops": tree.gmacs, "uncounted_ops": ", ".join(fc.uncounted_ops),
            "latency_ms_median": timing.median_ms if timing else nan,
            "latency_ms_sd": timing.sd_ms if timing else nan,
            "latency_ms_repeats": json.dumps([round(v, 6) for v in timing.per_repeat_ms]) if timing else "[]",
            "throughput_ips": timing.throughput_ips if timing else nan,
            "peak_mem_mib": mem.peak_bytes / _MIB if mem else nan,
            "peak_mem_delta_mib": mem.delta_bytes / _MIB if mem else nan,
            "nvml_used_mib": nvml / _MIB, "mem_method": mem.method if mem else "",
            "warmup": proto.warmup, "timed_passes": proto.timed_passes, "repeats": proto.repeats,
            "cudnn_benchmark": bool(proto.cudnn_benchmark),
            "timer": timing.timer if timing else ("cuda_events" if device.type == "cuda" else "perf_counter"),
            "timed_region": TIMED_REGION, "flop_counter": _FLOP_COUNTER,
            **{k: env[k] for k in ("device", "device_name", "num_threads", "driver_version", "cuda_runtime",
                                   "cudnn_version", "python", "torch", "segmentation_models_pytorch", "timm",
                                   "platform")},
            "status": status, "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        })
    return rows


def _unique(items: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for it in items:
        if it not in out:
            out.append(it)
    return out


def takes_img_size(model: nn.Module) -> bool:
    """True when the model's constructor has an ``img_size`` argument: its graph or position terms are built
    for one input size (e.g. ``g_cascade``), so it must be rebuilt for each profiled size."""
    try:
        return "img_size" in inspect.signature(type(model).__init__).parameters
    except (TypeError, ValueError):
        return False


def profile_targets(targets: Sequence[ProfileTarget], sizes: Sequence[tuple[int, int]], device: torch.device,
                    protocols: Sequence[TimingProtocol], log: Callable[[str], None] = lambda m: None,
                    seed: int = 0) -> pd.DataFrame:
    """Profile every target at ``sizes`` (plus each target's own ``sizes``) under every protocol.

    Models are built one at a time with random weights (seeded with ``seed``) and freed after use. A model
    whose constructor takes ``img_size`` (:func:`takes_img_size`) is rebuilt for each size with
    ``model.params.img_size = [H, W]``.

    Returns:
        DataFrame with :data:`PROFILE_COLUMNS`, one row per target x size x protocol, in that order.

    Raises:
        MSBError: no targets; no sizes; unknown architecture (from the registry); a size the model cannot take.
    """
    if not targets:
        raise MSBError("nothing to profile: give --arch NAME or --study STUDY_DIR (or leave both out for all "
                       "registered architectures)")
    env = environment_info(device)
    rows: list[dict[str, Any]] = []
    for t in targets:
        t_sizes = _unique([*t.sizes, *sizes])
        if not t_sizes:
            raise MSBError(f"no input size for '{t.label}': give --input-size")
        torch.manual_seed(seed)
        model = build_model(t.model, t.num_classes)
        sized = takes_img_size(model)
        built_for = tuple(int(v) for v in t.model.params["img_size"]) if sized and isinstance(
            t.model.params.get("img_size"), (list, tuple)) else None
        for size in t_sizes:
            cfg = t.model
            if sized:
                cfg = t.model.model_copy(update={"params": {**t.model.params, "img_size": [size[0], size[1]]}})
                if built_for != size:
                    del model
                    torch.manual_seed(seed)
                    model = build_model(cfg, t.num_classes)
                    built_for = size
            log(f"profiling {t.label} at {size[0]}x{size[1]} on {device} "
                f"({', '.join(p.precision for p in protocols)})")
            rows.extend(profile_module(model, size, device, protocols, env, t.label, cfg, t.num_classes))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return pd.DataFrame.from_records(rows, columns=list(PROFILE_COLUMNS))
