"""Peak memory of one forward pass.

CUDA
    ``torch.cuda.reset_peak_memory_stats`` then ``torch.cuda.max_memory_allocated`` after the pass (bytes held
    by PyTorch tensors: weights, input, activations, cuDNN workspaces allocated through PyTorch). The delta
    subtracts ``torch.cuda.memory_allocated`` just before the pass (weights and input). NVML's
    ``used`` memory (:func:`~msb.profiling.environment.nvml_used_bytes`) is recorded as the device's view: it
    also holds the CUDA context, PyTorch's cached-but-free blocks and other processes.

CPU
    Peak resident set size (RSS) delta, from Linux ``/proc/self/status``: the process's RSS high-water mark
    ``VmHWM`` is reset to the current RSS by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0,
    ``proc(5)``), the pass runs, and the delta is ``VmHWM - VmRSS(before)``. Before the reset, ``gc.collect()``
    and glibc's ``malloc_trim(0)`` return freed heap pages to the OS so that memory freed by an earlier model is
    not silently reused (which would hide part of this pass's peak). Limits: it is a whole-process measure
    (other threads, oneDNN scratch buffers and allocator caching count; granularity is a page), it excludes
    the weights and the input (already resident), and memory the allocator keeps mapped after the previous
    pass (not returned by ``malloc_trim``) can make it an underestimate. ``tracemalloc`` is not used: it sees
    only Python-level allocations, not PyTorch's C++ tensor memory. Where ``/proc/self/clear_refs`` cannot be
    written (non-Linux, restricted containers) the values are NaN and the method says why.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["MemoryPeak", "cpu_peak_rss", "cuda_peak", "read_proc_status_kib"]

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


@dataclass(frozen=True)
class MemoryPeak:
    """Peak memory of one pass, in bytes (NaN when not measurable).

    Attributes:
        peak_bytes: CUDA: ``max_memory_allocated`` during the pass (absolute). CPU: ``VmHWM`` (peak RSS of the
            whole process) during the pass.
        delta_bytes: the peak minus the level just before the pass (activations + workspaces).
        method: how it was measured (recorded with the result).
    """

    peak_bytes: float
    delta_bytes: float
    method: str


def read_proc_status_kib(field: str) -> int | None:
    """Value of ``field`` (e.g. ``"VmRSS"``, ``"VmHWM"``) from ``/proc/self/status`` in KiB, or None."""
    try:
        with open(_STATUS, encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _malloc_trim() -> None:
    name = ctypes.util.find_library("c")
    if not name:
        return
    try:
        libc = ctypes.CDLL(name)
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)
    except OSError:
        pass


def cpu_peak_rss(fn: Callable[[], object]) -> MemoryPeak:
    """Run ``fn()`` once and measure the process's peak RSS delta (see module docstring).

    Returns:
        :class:`MemoryPeak` with bytes (KiB from ``/proc`` x 1024), or NaN values and the reason in ``method``.
    """
    gc.collect()
    _malloc_trim()
    try:
        with open(_CLEAR_REFS, "w", encoding="ascii") as f:
            f.write("5")
    except OSError as exc:
        fn()
        return MemoryPeak(float("nan"), float("nan"), f"unavailable: cannot reset VmHWM ({exc.strerror or exc})")
    before = read_proc_status_kib("VmRSS")
    out = fn()
    peak = read_proc_status_kib("VmHWM")
    del out
    if before is None or peak is None:
        return MemoryPeak(float("nan"), float("nan"), "unavailable: /proc/self/status has no VmRSS/VmHWM")
    return MemoryPeak(peak * 1024.0, max(peak - before, 0) * 1024.0,
                      "peak RSS delta (VmHWM after /proc/self/clear_refs reset, minus VmRSS before)")


def cuda_peak(fn: Callable[[], object], device: torch.device) -> MemoryPeak:
    """Run ``fn()`` once on ``device`` and read PyTorch's CUDA allocator peak (see module docstring)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del out
    return MemoryPeak(float(peak), float(peak - before), "torch.cuda.max_memory_allocated (absolute) and minus "
                      "memory_allocated before the pass")
