"""train.budget (msb.engine.budget): the epoch plan of equal optimizer steps, checked by hand. The e2e test
tests/e2e/test_reuse_contrast_ci.py counts the steps actually taken with a torch optimizer hook."""

from __future__ import annotations

import pytest

from msb.config.schema import RunConfig
from msb.engine.budget import batches_per_epoch, effective_config, plan_budget, steps_after


def _cfg(budget=None, batch=8, multiscale=None) -> RunConfig:
    train = {"batch_size": batch, "epochs": 7}
    if budget:
        train["budget"] = budget
    if multiscale:
        train["multiscale"] = multiscale
    return RunConfig.model_validate({"data": {"name": "d", "root": "r"}, "model": {"arch": "unet"}, "train": train})


@pytest.mark.parametrize("n,batch,want", [(18, 8, 3), (16, 8, 2), (17, 8, 2), (1, 8, 1), (290, 8, 37), (9, 8, 1)])
def test_batches_per_epoch(n, batch, want):
    # ceil(n / batch), except that a trailing batch of exactly one image is dropped (n % batch == 1, n > 1)
    assert batches_per_epoch(n, batch) == want


def test_equal_steps_plans_for_two_pool_sizes():
    cfg = _cfg({"unit": "steps", "value": 120})
    big, small, odd = plan_budget(cfg, 290), plan_budget(cfg, 186), plan_budget(cfg, 185)
    # 290 images: 37 batches/epoch -> 4 epochs, the last cut to 120 - 3 * 37 = 9 batches
    assert (big.batches_per_epoch, big.epochs, big.last_epoch_batches, big.optimizer_steps) == (37, 4, 9, 120)
    # 186 images: 24 batches/epoch -> 5 full epochs
    assert (small.batches_per_epoch, small.epochs, small.last_epoch_batches, small.optimizer_steps) == (24, 5, 24, 120)
    # 185 images: 185 % 8 == 1, the single trailing image is dropped: 23 batches -> 6 epochs, the last 120 - 115 = 5
    assert (odd.batches_per_epoch, odd.epochs, odd.last_epoch_batches, odd.optimizer_steps) == (23, 6, 5, 120)
    assert steps_after(big, 2) == 74 and steps_after(big, 4) == 120 and steps_after(big, 0) == 0
    assert effective_config(cfg, big).train.epochs == 4 and cfg.train.epochs == 7


def test_epoch_budget_and_multiscale_steps():
    e = plan_budget(_cfg({"unit": "epochs", "value": 3}), 20)
    assert (e.epochs, e.last_epoch_batches, e.optimizer_steps) == (3, 3, 9)
    ms = plan_budget(_cfg({"unit": "steps", "value": 30}, multiscale={"rates": [0.75, 1.0, 1.25]}), 20)
    # 3 steps per batch (one per rate): 10 batches = 3 full epochs of 3 batches + 1 batch
    assert (ms.steps_per_batch, ms.epochs, ms.last_epoch_batches, ms.optimizer_steps) == (3, 4, 1, 30)
    assert plan_budget(_cfg(), 20) is None
