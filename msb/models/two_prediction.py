"""Two-prediction inference: the declared test-time rule of semi-supervised runs (``evaluation.two_prediction``).

A mean-teacher run has a student and a teacher, a CPS run two networks ``a`` and ``b``. The rule says which
make the prediction: ``average`` = the mean of the two networks' probability maps, ``p = (σ(l₁) + σ(l₂)) / 2``
(each network's logits upsampled to the evaluation size and passed through its own test-time adjustment
first), or one of them alone (``student``/``teacher``, ``a``/``b``). Unset = ``average``. The rule is recorded
in ``prediction_semantics.json`` (``two_prediction``) and in the counts' ``test_time_rule`` column
(:func:`test_time_rule_name`, e.g. ``first+mean_teacher:average``), so results under different rules are never
pooled (``msb reaggregate`` refuses).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import nn

from msb.config.strategy_schema import two_prediction_rule
from msb.errors import MSBError

if TYPE_CHECKING:
    from msb.config.schema import RunConfig

__all__ = ["select_networks", "built_for_loading", "combine_probabilities", "test_time_rule_name", "CHECKPOINT_KEYS",
           "checkpoint_networks"]

#: checkpoint key of each network name of a rule
CHECKPOINT_KEYS: dict[str, dict[str, str]] = {"mean_teacher": {"student": "model", "teacher": "teacher"},
                                              "cps": {"a": "model", "b": "model_b"}}


def _names(cfg: "RunConfig") -> list[str]:
    strategy = cfg.train.strategy.name
    rule = two_prediction_rule(strategy, cfg.evaluation.two_prediction)
    if rule is None:
        return []
    return list(CHECKPOINT_KEYS[strategy]) if rule == "average" else [rule]


def select_networks(cfg: "RunConfig", named: dict[str, nn.Module]) -> list[nn.Module]:
    """The networks of the run's rule, from ``named`` (``{"student": .., "teacher": ..}`` or ``{"a": .., "b": ..}``);
    the first of ``named`` for a supervised run."""
    names = _names(cfg)
    return [named[n] for n in names] if names else [next(iter(named.values()))]


def checkpoint_networks(cfg: "RunConfig", payload: dict[str, Any], build: Any, where: str) -> list[nn.Module]:
    """Build and load the networks of the run's rule from a checkpoint ``payload``; ``build()`` returns a fresh
    network. A supervised run gives ``[model]``.

    Raises:
        MSBError: the checkpoint lacks a network the rule needs (naming the file ``where`` and the key)."""
    keys = [CHECKPOINT_KEYS[cfg.train.strategy.name][n] for n in _names(cfg)] or ["model"]
    nets = []
    for key in keys:
        if key not in payload:
            raise MSBError(f"{where}: no '{key}' network in the checkpoint (needed by evaluation.two_prediction "
                           f"{cfg.evaluation.two_prediction or 'average'!r}); retrain the run with this version")
        nets.append(built_for_loading(build, payload[key]))
    return nets


def built_for_loading(build: Any, state: dict[str, torch.Tensor]) -> nn.Module:
    """``build()`` with every parameter and buffer loaded from ``state`` (``load_state_dict``, strict).

    The network is first built on PyTorch's ``meta`` device, so that no random initialisation runs (~0.1 s for
    a ResNet-18 U-Net on CPU, all overwritten by the load), then given empty CPU storage and loaded. Where that
    cannot give the same network it is built the plain way instead: the constructor fails on ``meta`` (e.g. it
    reads a tensor's value), the network has a buffer the state dict does not hold (a non-persistent buffer
    would stay uninitialised), or the state dict's keys differ (the strict load then raises its usual error).

    Args:
        build: returns a fresh network.
        state: the checkpoint's ``state_dict`` of that network.

    Returns:
        The loaded network, on the CPU.

    Raises:
        RuntimeError: as ``load_state_dict`` (missing / unexpected keys, shapes).
    """
    try:
        with torch.device("meta"):
            net = build()
    except Exception:  # noqa: BLE001 - any constructor that cannot run on meta: the plain way
        net = None
    if net is not None:
        keys = set(net.state_dict().keys())
        names = {n for n, _ in net.named_parameters(remove_duplicate=False)} | {
            n for n, _ in net.named_buffers(remove_duplicate=False)}
        if names <= keys and keys == set(state.keys()):
            net = net.to_empty(device="cpu")
            net.load_state_dict(state)
            return net
    net = build()
    net.load_state_dict(state)
    return net


def combine_probabilities(logits: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities and logits of one or two networks' logit maps (same shape, float).

    One map: ``(σ(l), l)`` unchanged. Several: ``p = mean_k σ(l_k)`` and ``logit(p) = log p − log(1 − p)``
    (the logit whose sigmoid is ``p``, for ``threshold_on: logit``)."""
    if len(logits) == 1:
        return torch.sigmoid(logits[0]), logits[0]
    prob = torch.stack([torch.sigmoid(l) for l in logits]).mean(0)
    return prob, torch.log(prob) - torch.log1p(-prob)


def test_time_rule_name(base_rule: str, cfg: "RunConfig") -> str:
    """The counts' ``test_time_rule``: ``base_rule`` (the architecture's ``first``/``sum``) for a supervised run,
    else ``<base_rule>+<strategy>:<rule>`` (e.g. ``first+cps:average``)."""
    rule = two_prediction_rule(cfg.train.strategy.name, cfg.evaluation.two_prediction)
    return base_rule if rule is None else f"{base_rule}+{cfg.train.strategy.name}:{rule}"
