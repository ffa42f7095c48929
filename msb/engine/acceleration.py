"""Device-side set-up of one training run: the network that is stepped (DDP, SyncBatchNorm, ``torch.compile``),
the training DataLoader (pinned memory, workers, per-rank batches), cuDNN autotuning, and the one-line
out-of-memory error.

Sources: PyTorch's DDP notes (``DistributedDataParallel`` broadcasts rank 0's parameters and buffers, averages
gradients in backward), ``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` (CUDA only: on CPU each rank normalises
with its own batch statistics), the DataLoader reference (``pin_memory``, ``persistent_workers``,
``prefetch_factor``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from msb.config.schema import RunConfig
from msb.engine.distributed import DistContext, per_rank_batch
from msb.engine.sampling import EpochBatchSampler
from msb.errors import MSBError
from msb.utils.atomic import atomic_write_text
from msb.utils.io_errors import write_guard

__all__ = ["OutOfDeviceMemory", "prepare_network", "train_loader", "apply_cudnn_settings", "oom_error", "runtime_record", "write_runtime"]


class OutOfDeviceMemory(MSBError):
    """Training ran out of GPU memory (one line naming architecture, input size, batch and precision); a study
    records the run as excluded with this reason instead of stopping (:mod:`msb.study.pipeline`)."""


def prepare_network(model: torch.nn.Module, cfg: RunConfig, device: torch.device,
                    dist: DistContext | None) -> torch.nn.Module:
    """The module whose forward the training step calls (``model`` itself stays the one saved and validated).

    On CUDA with ``train.channels_last`` the weights are stored channels-last as well (PyTorch's
    channels-last recipe; on CPU they stay as they are, so CPU results are unchanged). Under DDP the BatchNorm layers of ``model`` become ``SyncBatchNorm`` on CUDA (in place; same state-dict
    keys) and the model is wrapped in ``DistributedDataParallel``; with ``train.compile`` the result is wrapped
    in ``torch.compile``.
    """
    net: torch.nn.Module = model
    if device.type == "cuda" and cfg.train.channels_last:
        model.to(memory_format=torch.channels_last)  # NHWC weights too: no layout copies in cuDNN or DDP buckets
    if dist is not None:
        if device.type == "cuda":
            torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)  # replaces the BatchNorm children in place
            model.to(device)
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    if cfg.train.compile:
        net = torch.compile(net)
    return net


def apply_cudnn_settings(cfg: RunConfig) -> bool:
    """``torch.backends.cudnn.benchmark`` = ``train.cudnn_benchmark`` unless ``full_determinism`` (then off,
    set by :func:`msb.engine.determinism.set_full_determinism`); returns the value in effect."""
    if not cfg.full_determinism:
        torch.backends.cudnn.benchmark = cfg.train.cudnn_benchmark
    return bool(torch.backends.cudnn.benchmark)


def train_loader(ds: Dataset, cfg: RunConfig, device: torch.device, seed: int, dist: DistContext | None,
                 cached: DataLoader | None = None) -> DataLoader:
    """The training DataLoader of one epoch seeded by ``seed``.

    A single process without workers keeps the original loader (``shuffle=True`` from a generator seeded by
    ``seed``; augmentation from one stream per epoch), so results of existing studies do not change. With DDP or
    ``data.num_workers > 0`` the batches come from :class:`~msb.engine.sampling.EpochBatchSampler` (the same
    global batches, per-item augmentation seeds); ``cached`` (a loader of an earlier epoch) is reused with
    ``train.persistent_workers``. Pinned memory on CUDA when ``train.pin_memory``.

    Raises:
        MSBError: the global ``train.batch_size`` is not a multiple of the number of processes.
    """
    n, bs = len(ds), cfg.train.batch_size
    workers = cfg.data.num_workers
    drop_last = n % bs == 1 and n > 1
    pin = device.type == "cuda" and cfg.train.pin_memory
    if dist is None and workers == 0:
        return DataLoader(ds, batch_size=bs, shuffle=True, generator=torch.Generator().manual_seed(seed),
                          num_workers=0, drop_last=drop_last, pin_memory=pin)
    if cached is not None:
        cached.batch_sampler.set_epoch(seed)
        return cached
    rank, world = (dist.rank, dist.world_size) if dist is not None else (0, 1)
    try:
        per_rank_batch(bs, world)
    except ValueError as exc:
        raise MSBError(str(exc)) from None
    sampler = EpochBatchSampler(n, bs, rank, world, drop_last)
    sampler.set_epoch(seed)
    extra: dict[str, Any] = {}
    if workers > 0:
        extra = {"persistent_workers": cfg.train.persistent_workers}
        if cfg.train.prefetch_factor is not None:
            extra["prefetch_factor"] = cfg.train.prefetch_factor
    return DataLoader(ds, batch_sampler=sampler, num_workers=workers, pin_memory=pin, **extra)


def oom_error(cfg: RunConfig, run_dir: Any, precision: str, world: int, where: str) -> OutOfDeviceMemory:
    """The one-line error of a run that ran out of device memory (naming architecture, input size, batch)."""
    h, w = cfg.data.input_size
    bs = cfg.train.batch_size
    per = f", {bs // world} per process x {world}" if world > 1 else ""
    return OutOfDeviceMemory(f"{run_dir}: out of GPU memory during {where}: {cfg.model.arch} at {h}x{w} px, batch {bs}{per}, "
                    f"{precision}; lower train.batch_size or data.input_size (or use train.precision bf16/fp16)")


def runtime_record(cfg: RunConfig, device: torch.device, precision: Any, dist: DistContext | None,
                   cudnn_benchmark: bool) -> dict[str, Any]:
    """What the run was trained with (``manifest.json`` ``training``): the resolved precision, the processes,
    the global and per-process batch, the backend and the speed switches."""
    world = dist.world_size if dist is not None else 1
    return {"precision": precision.name, "precision_requested": precision.requested,
            "grad_scaler": precision.use_scaler, "device": str(device), "world_size": world,
            "backend": dist.backend if dist is not None else None, "global_batch": cfg.train.batch_size,
            "per_process_batch": cfg.train.batch_size // world, "channels_last": cfg.train.channels_last,
            "cudnn_benchmark": cudnn_benchmark if device.type == "cuda" else None, "compile": cfg.train.compile,
            "num_workers": cfg.data.num_workers}


def write_runtime(run_dir: Path, record: dict[str, Any]) -> None:
    """``train_runtime.json``: how the run is trained (resolved precision, processes, batches; read into
    ``manifest.json`` by :func:`msb.engine.runner.write_manifest`), written atomically at each (re)start."""
    with write_guard(run_dir / "train_runtime.json", "training runtime record"):
        atomic_write_text(run_dir / "train_runtime.json", json.dumps(record, indent=2))
