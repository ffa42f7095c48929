"""Profiling device checks and the environment description recorded with every result.

:func:`resolve_profile_device` turns ``--device cpu|cuda`` into a :class:`torch.device`; for ``cuda`` it checks
``torch.cuda.is_available()`` and initialises NVML (``pynvml``, package ``nvidia-ml-py``) and, when there is no
usable GPU, raises one :class:`~msb.errors.MSBError` line that names both findings (never a traceback).
:func:`environment_info` collects the device name, driver and library versions.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata
from typing import Any

import torch

from msb.errors import MSBError

__all__ = ["resolve_profile_device", "nvml_status", "environment_info", "nvml_used_bytes", "cpu_name"]


def nvml_status() -> tuple[bool, str]:
    """Initialise NVML. Returns ``(True, "driver <version>")`` or ``(False, "<NVMLError text>")``.

    Never raises: ``pynvml.NVMLError`` (e.g. ``NVML Shared Library Not Found`` without an NVIDIA driver) and a
    missing ``pynvml`` module are reported in the text.
    """
    try:
        import pynvml
    except ImportError:
        return False, "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
    except pynvml.NVMLError as exc:
        return False, f"NVML: {exc}"
    if isinstance(driver, bytes):
        driver = driver.decode()
    return True, f"driver {driver}"


def resolve_profile_device(name: str) -> torch.device:
    """``cpu`` or ``cuda`` (the current CUDA device) for profiling.

    Raises:
        MSBError: ``name`` is neither ``cpu`` nor ``cuda``; or ``cuda`` is requested and
            ``torch.cuda.is_available()`` is False (the message also gives NVML's view, e.g.
            ``NVML Shared Library Not Found``). When PyTorch sees a GPU but NVML does not, profiling proceeds
            and the NVML memory column is left empty.
    """
    if name not in ("cpu", "cuda"):
        raise MSBError(f"--device must be 'cpu' or 'cuda', not '{name}'")
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        ok, nvml = nvml_status()
        built = torch.version.cuda or "none (CPU-only build)"
        raise MSBError(f"--device cuda: no usable CUDA GPU on this machine (torch.cuda.is_available() is False, "
                       f"PyTorch CUDA build: {built}; {nvml if not ok else 'NVML ' + nvml}); "
                       f"profile with --device cpu or run on a machine with an NVIDIA GPU")
    return torch.device("cuda", torch.cuda.current_device())


def nvml_used_bytes(device: torch.device) -> float:
    """Device memory in use as NVML sees it (``nvmlDeviceGetMemoryInfo(...).used``, bytes: every process,
    the CUDA context and PyTorch's cached blocks); NaN when NVML is unavailable or ``device`` is not CUDA.

    NVML indexes devices physically; with ``CUDA_VISIBLE_DEVICES`` set, the index is mapped through it when
    it holds plain integers.
    """
    if device.type != "cuda":
        return float("nan")
    try:
        import os

        import pynvml

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        parts = [p.strip() for p in visible.split(",") if p.strip()]
        if parts and all(p.isdigit() for p in parts) and index < len(parts):
            index = int(parts[index])
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        return float(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # NVMLError, ImportError: the column is optional
        return float("nan")


def cpu_name() -> str:
    """CPU model name from ``/proc/cpuinfo`` (Linux), else ``platform.processor()`` or ``platform.machine()``."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_info(device: torch.device) -> dict[str, Any]:
    """What a latency figure depends on besides the model: device name, threads, driver and library versions.

    Returns:
        dict with ``device`` (``cpu``/``cuda``), ``device_name``, ``num_threads`` (``torch.get_num_threads()``),
        ``driver_version`` (NVIDIA driver via NVML; ``""`` on CPU), ``cuda_runtime`` (``torch.version.cuda``),
        ``cudnn_version``, ``python``, ``torch``, ``segmentation_models_pytorch``, ``timm``, ``platform``.
    """
    info: dict[str, Any] = {"device": device.type}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        ok, drv = nvml_status()
        info["driver_version"] = drv.removeprefix("driver ") if ok else ""
        info["cudnn_version"] = str(torch.backends.cudnn.version() or "")
    else:
        info["device_name"] = cpu_name()
        info["driver_version"] = ""
        info["cudnn_version"] = ""
    info["cuda_runtime"] = torch.version.cuda or ""
    info["num_threads"] = int(torch.get_num_threads())
    info["python"] = sys.version.split()[0]
    info["torch"] = torch.__version__
    info["segmentation_models_pytorch"] = _version("segmentation-models-pytorch")
    info["timm"] = _version("timm")
    info["platform"] = platform.platform()
    return info
