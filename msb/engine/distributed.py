"""Multi-process (DDP) training with PyTorch's own engine: ``torchrun`` + ``DistributedDataParallel``.

``msb run STUDY --nproc-per-node N`` re-launches itself through ``torch.distributed.run`` (torchrun); a plain
``torchrun --nproc-per-node N -m msb run STUDY`` does the same. Under torchrun (``WORLD_SIZE`` > 1 in the
environment) :func:`init_from_env` joins the process group: ``nccl`` when CUDA is available, ``gloo`` on CPU.

Roles: rank 0 runs the whole study pipeline exactly as a single process does (plan, search, folds, evaluation,
every write). Whenever it trains a run (:func:`msb.engine.runner.train_run`) it first sends the run to the
other ranks (:func:`send_work`) over a separate gloo control group, and all ranks then train that run together
(:class:`msb.engine.trainer.Trainer` with a :class:`DistContext`); ranks > 0 wait for the next run in
:func:`serve` and return when rank 0 sends ``stop`` (:func:`stop_followers`). Evaluation runs on rank 0 alone:
the evaluator writes one prediction file per image and one counts table through a staging folder; sharding it
would need the predictions gathered back onto rank 0 anyway, and evaluation is a small part of a run's time.

Only rank 0 writes checkpoints, logs, the resume state and counts (atomically, as a single process does); all
ranks read the same resume state, so they resume from the same epoch with the same weights.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["DistContext", "init_from_env", "current", "send_work", "serve", "stop_followers", "per_rank_batch",
           "relaunch_with_torchrun", "CONTROL_TIMEOUT"]

#: how long ranks > 0 wait for rank 0 between two runs (it may be evaluating or searching meanwhile)
CONTROL_TIMEOUT = datetime.timedelta(days=7)


@dataclass(frozen=True)
class DistContext:
    """One process of a DDP job.

    Attributes:
        rank, world_size, local_rank: from torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``.
        backend: ``nccl`` (CUDA) or ``gloo`` (CPU).
        control: the gloo process group that carries work orders (pickled objects) from rank 0.
    """

    rank: int
    world_size: int
    local_rank: int
    backend: str
    control: Any = None

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that writes files."""
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """This rank's device: ``cuda:<local_rank>`` for a CUDA device, else ``device``."""
        return torch.device("cuda", self.local_rank) if device.type == "cuda" else device

    def barrier(self) -> None:
        """Wait until every rank arrives (on the control group, so no device memory is touched)."""
        dist.barrier(group=self.control)

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled; small objects only)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]


_CURRENT: DistContext | None = None


def current() -> DistContext | None:
    """The process's :class:`DistContext` after :func:`init_from_env`, None in a single-process run."""
    return _CURRENT


def init_from_env(device_name: str = "auto") -> DistContext | None:
    """Join the process group torchrun describes in the environment; None outside torchrun (``WORLD_SIZE`` unset
    or 1 and no ``TORCHELASTIC_RUN_ID``; ``MSB_FORCE_DIST`` forces a group, for tests).

    ``nccl`` when ``device_name`` is not ``cpu`` and CUDA is available (each rank on ``cuda:LOCAL_RANK``),
    otherwise ``gloo``. ``MSB_DIST_BACKEND`` overrides the choice.
    """
    global _CURRENT
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 and "TORCHELASTIC_RUN_ID" not in os.environ and "MSB_FORCE_DIST" not in os.environ:
        return None  # a plain process (torchrun sets TORCHELASTIC_RUN_ID: one process under it is a DDP job too)
    if _CURRENT is not None:
        return _CURRENT
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device_name != "cpu" and torch.cuda.is_available()
    backend = os.environ.get("MSB_DIST_BACKEND") or ("nccl" if cuda else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(local)
    dist.init_process_group(backend=backend, rank=rank, world_size=world)
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    _CURRENT = DistContext(rank, world, local, backend, control)
    return _CURRENT


def per_rank_batch(global_batch: int, world_size: int) -> int:
    """The per-process batch of a global ``train.batch_size``.

    Raises:
        ValueError: ``global_batch`` is not a multiple of ``world_size`` (the message names both).
    """
    if global_batch % world_size:
        raise ValueError(f"train.batch_size {global_batch} is the global batch; it must be a multiple of the "
                         f"{world_size} processes (e.g. {max(world_size, global_batch // world_size * world_size)})")
    return global_batch // world_size


def send_work(ctx: DistContext, order: dict[str, Any]) -> None:
    """Rank 0: send one work order (``{"op": "train", ...}``) to the other ranks."""
    ctx.broadcast(order)


def stop_followers(ctx: DistContext) -> None:
    """Rank 0: tell the other ranks that the study is over (they return from :func:`serve`)."""
    ctx.broadcast({"op": "stop"})


def serve(ctx: DistContext, train: Callable[[dict[str, Any]], Any]) -> None:
    """Ranks > 0: run ``train(order)`` for every ``train`` order from rank 0 until ``stop``."""
    while True:
        order = ctx.broadcast(None)
        if order["op"] == "stop":
            return
        train(order)


def relaunch_with_torchrun(nproc: int, argv: list[str]) -> int:
    """Run ``torchrun --standalone --nproc-per-node nproc -m msb ARGV`` (``argv`` without ``--nproc-per-node``)
    in this process (PyTorch's launcher, :mod:`torch.distributed.run`) and return the exit status: 0, or the
    first failed rank's status (2 for an input error)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    rest, skip = [], False
    for tok in argv:
        if skip:
            skip = False
        elif tok == "--nproc-per-node":
            skip = True
        elif not tok.startswith("--nproc-per-node="):
            rest.append(tok)
    try:
        torchrun(["--standalone", f"--nproc-per-node={nproc}", "-m", "msb", *rest])
    except ChildFailedError as exc:
        codes = [f.exitcode for f in exc.failures.values()]
        return next((c for c in codes if c > 0), 1)
    return 0
