"""Config of the training strategy (``train.strategy``) and of the two-prediction test-time rule
(``evaluation.two_prediction``): semi-supervised training with unlabelled images (docs/training.md,
"Semi-supervised strategies").

``train.strategy`` is left out of ``config.yaml`` and the config hash while it has its defaults
(``name: supervised``), and ``evaluation.two_prediction`` while unset, so run ids of existing studies do not
change.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field

from msb.config.strict import StrictModel

__all__ = ["StrategyConfig", "STRATEGY_DEFAULT", "TWO_PREDICTION_RULES", "check_strategy", "two_prediction_rule"]

#: the rules of ``evaluation.two_prediction`` each strategy accepts (the first is the default)
TWO_PREDICTION_RULES: dict[str, tuple[str, ...]] = {
    "supervised": (), "mean_teacher": ("average", "student", "teacher"), "cps": ("average", "a", "b")}


class StrategyConfig(StrictModel):
    """How one optimisation step is made (``msb.engine.strategies``).

    ``name``: ``supervised`` (the labelled images only; the trainer's original loop, bit-identical to runs made
    before strategies existed), ``mean_teacher`` (Tarvainen & Valpola, NeurIPS 2017) or ``cps`` (cross pseudo
    supervision, Chen et al., CVPR 2021). The semi-supervised methods need a labelled subset
    (``data.labelled_fraction`` or ``data.labelled_ids``): the unlabelled pool is the training split minus
    ``labelled.csv``.

    Batches: each iteration takes ``train.batch_size`` labelled images and ``unlabelled_ratio`` times as many
    unlabelled images (images only); one epoch is ``iterations_per_epoch`` iterations (``None``: as many as
    the labelled images fill, ``ceil(n_labelled / batch_size)``).

    Mean teacher: the teacher is an exponential moving average of the student, after every optimizer step
    ``θ'_t = ema_decay · θ'_{t-1} + (1 − ema_decay) · θ_t`` (floating-point buffers likewise). The loss is
    ``L_sup(student) + w(t) · MSE(σ(student(strong(u))), σ(teacher(weak(u))))`` with the ramp-up
    ``w(t) = consistency_weight · exp(−5 (1 − t)²)``, ``t = min(iteration / rampup_iterations, 1)``
    (Laine & Aila, ICLR 2017; ``rampup_iterations: 0`` = no ramp-up). ``weak`` = the training augmentation
    (``train.augment``), ``strong`` = weak plus a per-image photometric perturbation of the normalised image:
    ``x · c + b + n`` with ``c ~ U[1 − strong_contrast, 1 + strong_contrast]``,
    ``b ~ U[−strong_brightness, strong_brightness]``, ``n ~ N(0, strong_noise_std²)`` per pixel.

    CPS: two networks of the same architecture (``b`` initialised from ``random_seed + 1``), each with its own
    optimizer and schedule; loss ``L_sup(a) + L_sup(b) + cps_weight · (BCE(a(u), [σ(b(u)) > 0.5]) +
    BCE(b(u), [σ(a(u)) > 0.5]))``, pseudo-labels detached (Chen et al. 2021, eq. 3 with λ = ``cps_weight``).
    """

    name: Literal["supervised", "mean_teacher", "cps"] = "supervised"
    unlabelled_ratio: int = Field(1, ge=1)
    iterations_per_epoch: Optional[int] = Field(None, gt=0)
    ema_decay: float = Field(0.99, ge=0, lt=1)
    consistency_weight: float = Field(1.0, ge=0)
    rampup_iterations: int = Field(0, ge=0)
    strong_brightness: float = Field(0.2, ge=0)
    strong_contrast: float = Field(0.2, ge=0, lt=1)
    strong_noise_std: float = Field(0.1, ge=0)
    cps_weight: float = Field(1.5, ge=0)


#: the default strategy as ``config.yaml`` would write it (left out of the dump and the hash when equal)
STRATEGY_DEFAULT: dict[str, Any] = StrategyConfig().model_dump()


def two_prediction_rule(strategy: str, rule: Optional[str]) -> Optional[str]:
    """The resolved two-prediction rule: ``None`` for ``supervised``; the given rule, or ``average`` when unset,
    for ``mean_teacher`` and ``cps``."""
    if strategy == "supervised":
        return None
    return rule or TWO_PREDICTION_RULES[strategy][0]


def check_strategy(strategy: StrategyConfig, rule: Optional[str], labelled_policy: bool) -> None:
    """Check ``train.strategy`` against ``evaluation.two_prediction`` and the labelled subset.

    Raises:
        ValueError: a semi-supervised strategy without ``data.labelled_fraction``/``labelled_ids``; a
            ``two_prediction`` rule the strategy does not have (naming the valid ones).
    """
    name = strategy.name
    if name != "supervised" and not labelled_policy:
        raise ValueError(f"train.strategy.name {name!r} trains on unlabelled images: declare the labelled subset "
                         f"with data.labelled_fraction (e.g. 0.1) or data.labelled_ids")
    if rule is not None and rule not in TWO_PREDICTION_RULES[name]:
        valid = ", ".join(TWO_PREDICTION_RULES[name]) or "none (remove the key)"
        raise ValueError(f"evaluation.two_prediction {rule!r} does not exist for train.strategy.name {name!r}; "
                         f"valid: {valid}")

