"""Forward-pass latency under a recorded timing protocol.

Protocol (CPU defaults follow the benchmark's profiling tool: 10 warm-up passes, 300 timed images; on CUDA the
defaults are the MSB paper's 100 warm-up + 5 x 1,000 timed passes at 256 and 512, :func:`protocol_defaults`): ``warmup``
untimed passes, then ``repeats`` x ``timed_passes`` timed passes of the model's ``forward`` on one fixed
random input batch already on the device, under ``torch.inference_mode()`` (and ``torch.autocast`` for AMP).
The timed region is the forward call only: no host-to-device copy, no test-time combination of outputs, no
sigmoid/threshold, no data loading. Each repeat gives the mean latency per forward pass; the result reports the
median and the sample standard deviation (ddof = 1) over repeats, and throughput = batch size / median latency.

CPU timing uses ``time.perf_counter``. CUDA timing uses ``torch.cuda.Event(enable_timing=True)`` recorded
around each repeat's passes, with ``torch.cuda.synchronize`` before the start event and after the end event.
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from msb.errors import MSBError

__all__ = ["TimingProtocol", "TimingResult", "autocast_context", "time_forward", "protocol_defaults",
           "CUDA_PROTOCOL", "CPU_PROTOCOL"]

#: the MSB paper's GPU protocol: device-resident input, batch 1, 100 warm-up + 5 repeats x 1,000 timed passes,
#: CUDA events, at 256 x 256 and 512 x 512 (``msb profile --device cuda`` without options)
CUDA_PROTOCOL = {"warmup": 100, "timed_passes": 1000, "repeats": 5, "sizes": ("256", "512")}
#: CPU defaults (the benchmark tool's 10 warm-ups and 300 timed images; the paper protocol takes hours on a CPU)
CPU_PROTOCOL = {"warmup": 10, "timed_passes": 100, "repeats": 3, "sizes": ()}


def protocol_defaults(device: str) -> dict[str, Any]:
    """Default ``warmup``, ``timed_passes``, ``repeats`` and input ``sizes`` (px, strings as on the command line;
    empty = the pipeline's default) of ``msb profile --device DEVICE``: :data:`CUDA_PROTOCOL` for ``cuda``, else
    :data:`CPU_PROTOCOL`."""
    return dict(CUDA_PROTOCOL if device == "cuda" else CPU_PROTOCOL)


@dataclass(frozen=True)
class TimingProtocol:
    """How latency is measured (recorded with every result).

    Attributes:
        warmup: untimed passes before timing (lets cuDNN autotune and caches warm up).
        timed_passes: timed passes per repeat.
        repeats: number of repeats (the median and SD are taken over repeats).
        batch_size: images per forward pass.
        precision: ``fp32`` or ``amp`` (``torch.autocast``: float16 on CUDA, bfloat16 on CPU).
        cudnn_benchmark: value of ``torch.backends.cudnn.benchmark`` during the measurement (CUDA only;
            recorded as given on CPU, where it has no effect).
    """

    warmup: int = 10
    timed_passes: int = 100
    repeats: int = 3
    batch_size: int = 1
    precision: Literal["fp32", "amp"] = "fp32"
    cudnn_benchmark: bool = True

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise MSBError(f"--warmup must be >= 0, not {self.warmup}")
        if self.timed_passes < 1:
            raise MSBError(f"--timed-passes must be >= 1, not {self.timed_passes}")
        if self.repeats < 1:
            raise MSBError(f"--repeats must be >= 1, not {self.repeats}")
        if self.batch_size < 1:
            raise MSBError(f"--batch-size must be >= 1, not {self.batch_size}")
        if self.precision not in ("fp32", "amp"):
            raise MSBError(f"--precision must be fp32 or amp, not '{self.precision}'")

    def as_dict(self) -> dict[str, Any]:
        """Plain dict of the fields."""
        return asdict(self)


@dataclass(frozen=True)
class TimingResult:
    """Latency in milliseconds per forward pass (one batch).

    Attributes:
        per_repeat_ms: mean latency of each repeat (ms).
        median_ms: median over repeats.
        sd_ms: sample SD over repeats (NaN with one repeat).
        throughput_ips: images per second = batch_size / (median_ms / 1000).
        timer: ``perf_counter`` or ``cuda_events``.
        amp_dtype: ``float16``/``bfloat16`` under AMP, ``""`` for fp32.
    """

    per_repeat_ms: tuple[float, ...]
    median_ms: float
    sd_ms: float
    throughput_ips: float
    timer: str
    amp_dtype: str


def autocast_context(device: torch.device, precision: str):
    """``torch.autocast`` for ``amp`` (float16 on CUDA, bfloat16 on CPU), a null context for ``fp32``."""
    if precision != "amp":
        return nullcontext()
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    return torch.autocast(device_type=device.type, dtype=dtype)


def time_forward(model: nn.Module, x: torch.Tensor, protocol: TimingProtocol) -> TimingResult:
    """Time ``model(x)`` under ``protocol`` (see module docstring). ``model`` and ``x`` must already be on the
    same device; ``x`` is (batch_size, 3, H, W). The caller sets ``torch.backends.cudnn.benchmark``.

    Returns:
        :class:`TimingResult` (milliseconds per forward pass).
    """
    device = x.device
    model.eval()
    cuda = device.type == "cuda"
    amp_dtype = "" if protocol.precision != "amp" else ("float16" if cuda else "bfloat16")
    per_repeat: list[float] = []
    with torch.inference_mode(), autocast_context(device, protocol.precision):
        for _ in range(protocol.warmup):
            model(x)
        if cuda:
            torch.cuda.synchronize(device)
        for _ in range(protocol.repeats):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                for _ in range(protocol.timed_passes):
                    model(x)
                end.record()
                torch.cuda.synchronize(device)
                per_repeat.append(start.elapsed_time(end) / protocol.timed_passes)
            else:
                t0 = time.perf_counter()
                for _ in range(protocol.timed_passes):
                    model(x)
                per_repeat.append((time.perf_counter() - t0) * 1000.0 / protocol.timed_passes)
    median = statistics.median(per_repeat)
    sd = statistics.stdev(per_repeat) if len(per_repeat) > 1 else float("nan")
    return TimingResult(tuple(per_repeat), median, sd, protocol.batch_size / (median / 1000.0),
                        "cuda_events" if cuda else "perf_counter", amp_dtype)
