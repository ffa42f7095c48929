"""``train.budget``: equal epochs or equal optimizer steps across training pools of different sizes.

Equal epochs do not mean equal updates: a pool of ``n`` images makes ``ceil(n / batch)`` optimizer steps per
epoch (``floor`` when a trailing batch of one image is dropped, as :func:`msb.engine.acceleration.train_loader`
does), times the steps per batch of multi-scale training with ``step_per_rate`` and ``sampling: all``.
:func:`plan_budget` turns a budget into the epoch count of one run and, for ``unit: steps``, the number of
batches of its last epoch, so that every pool makes exactly ``value`` optimizer steps (rounded down to a whole
batch of multi-scale steps). The effective epoch count replaces ``train.epochs`` in the config the trainer sees
(the cosine schedule runs over it); the run keeps the config hash of its declared config. ``budget.json`` in the
run folder records the plan and, after training, ``epochs_run`` and ``optimizer_steps`` (read into
``manifest.json`` ``budget``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from msb.config.schema import RunConfig
from msb.utils.atomic import atomic_write_text

__all__ = ["BUDGET_FILE", "BudgetPlan", "batches_per_epoch", "steps_per_batch", "plan_budget", "effective_config",
           "steps_after", "write_budget"]

BUDGET_FILE = "budget.json"


@dataclass(frozen=True)
class BudgetPlan:
    """How one run spends its budget.

    Attributes:
        unit, value: the declared budget (``epochs``/``steps``, count).
        n_train: training images of the run (its pool).
        batches_per_epoch: optimizer batches of one full epoch; steps_per_batch: optimizer steps per batch.
        epochs: epochs to run; last_epoch_batches: batches of the last epoch (``batches_per_epoch`` unless the
            step budget ends inside it).
        optimizer_steps: steps of the whole plan.
    """

    unit: str
    value: int
    n_train: int
    batch_size: int
    batches_per_epoch: int
    steps_per_batch: int
    epochs: int
    last_epoch_batches: int
    optimizer_steps: int


def batches_per_epoch(n: int, batch_size: int) -> int:
    """Batches of one single-process epoch of ``n`` images (a trailing batch of one image is dropped)."""
    if n % batch_size == 1 and n > 1:
        return n // batch_size
    return math.ceil(n / batch_size)


def steps_per_batch(cfg: RunConfig) -> int:
    """Optimizer steps per batch: the number of rates with ``multiscale.step_per_rate`` and ``sampling: all``,
    else 1."""
    ms = cfg.train.multiscale
    return len(ms.rates) if ms is not None and ms.step_per_rate and ms.sampling == "all" else 1


def plan_budget(cfg: RunConfig, n_train: int) -> BudgetPlan | None:
    """The plan of ``cfg.train.budget`` for a pool of ``n_train`` images; ``None`` without a budget.

    ``unit: epochs``: ``value`` full epochs. ``unit: steps``: ``B = value // steps_per_batch`` batches in all,
    ``epochs = ceil(B / batches_per_epoch)``, the last epoch cut to ``B - (epochs - 1) · batches_per_epoch``.
    """
    b = cfg.train.budget
    if b is None:
        return None
    bpe, spb = batches_per_epoch(n_train, cfg.train.batch_size), steps_per_batch(cfg)
    if b.unit == "epochs":
        epochs, last = b.value, bpe
    else:
        total = max(1, b.value // spb)
        epochs = math.ceil(total / bpe)
        last = total - (epochs - 1) * bpe
    return BudgetPlan(b.unit, b.value, n_train, cfg.train.batch_size, bpe, spb, epochs, last,
                      ((epochs - 1) * bpe + last) * spb)


def effective_config(cfg: RunConfig, plan: BudgetPlan | None) -> RunConfig:
    """``cfg`` with ``train.epochs`` = the plan's epochs (``cfg`` itself without a plan)."""
    if plan is None:
        return cfg
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"epochs": plan.epochs})})


def steps_after(plan: BudgetPlan, epochs_done: int) -> int:
    """Optimizer steps taken after ``epochs_done`` finished epochs of the plan."""
    if epochs_done <= 0:
        return 0
    full = min(epochs_done, plan.epochs - 1)
    last = plan.last_epoch_batches if epochs_done >= plan.epochs else plan.batches_per_epoch
    return ((full * plan.batches_per_epoch) + (last if epochs_done > full else 0)) * plan.steps_per_batch


def write_budget(run_dir: Path, plan: BudgetPlan, epochs_done: int | None = None) -> dict[str, Any]:
    """Write ``budget.json`` (the plan; with ``epochs_done`` also ``epochs_run`` and ``optimizer_steps``
    actually taken) atomically; returns the record."""
    rec: dict[str, Any] = asdict(plan)
    rec["planned_optimizer_steps"] = rec.pop("optimizer_steps")
    if epochs_done is not None:
        rec["epochs_run"] = int(epochs_done)
        rec["optimizer_steps"] = steps_after(plan, epochs_done)
    atomic_write_text(Path(run_dir) / BUDGET_FILE, json.dumps(rec, indent=2))
    return rec
