"""User models without editing the package: ``model.target: my_pkg.module:MyNet`` or the entry point group
``msb.models``.

The target is an importable class or factory, called as ``target(num_classes=C, **model.params)``; it returns

- a :class:`~msb.models.base.Segmentor` (used as is), or
- any ``torch.nn.Module`` whose ``forward(x)`` maps float images (N, 3, H, W) to logits (N, C, h, w) or to a
  list/tuple of such maps (final output first, then deep-supervision outputs): it is wrapped by
  :class:`UserSegmentor`, which returns a list, as the :class:`Segmentor` contract requires.

Optional class attributes of the target (read from the returned module, else the defaults):
``test_time_rule`` (``first`` = final output only, default; ``sum`` = sum of all upsampled logit maps) and
``size_divisor`` (H and W must be multiples of it; default 32). Logits, not probabilities: the trainer applies
the sigmoid inside its loss and the evaluator thresholds ``sigmoid(logits)``.

An installed package registers models by name in its metadata::

    [project.entry-points."msb.models"]
    my_net = "my_pkg.module:MyNet"

and a config then says ``model.arch: my_net``.
"""

from __future__ import annotations

import importlib
import inspect
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

from msb.errors import MSBError
from msb.models.base import Segmentor

if TYPE_CHECKING:
    from msb.config.schema import ModelConfig

__all__ = ["resolve_target", "build_user_model", "UserSegmentor", "entry_point_adapter", "target_size_divisor"]


def resolve_target(target: str, where: str = "model.target") -> Callable[..., Any]:
    """Import ``package.module:Name`` (``Name`` may be dotted: ``module:Outer.make``).

    Raises:
        MSBError: not of the form ``module:name``, the module cannot be imported (its error is named), or it has
            no such attribute; the message says to put the module's folder on ``PYTHONPATH``.
    """
    mod_name, sep, attr = target.partition(":")
    if not sep or not mod_name or not attr:
        raise MSBError(f"{where}: '{target}' is not of the form 'package.module:ClassOrFactory'")
    try:
        obj: Any = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - any import failure of user code is the user's to fix
        raise MSBError(f"{where}: cannot import module '{mod_name}' ({type(exc).__name__}: {exc}); put its folder "
                       f"on PYTHONPATH or install the package") from exc
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise MSBError(f"{where}: module '{mod_name}' has no '{attr}'")
        obj = getattr(obj, part)
    if not callable(obj):
        raise MSBError(f"{where}: '{target}' is not a class or function")
    return obj


class UserSegmentor(Segmentor):
    """Adapter of a plain ``nn.Module``: ``forward(x)`` -> list of logit maps (N, C, h_i, w_i), final first.

    ``test_time_rule`` and ``size_divisor`` are taken from the wrapped module when it defines them. The wrapped
    module is ``self.net`` (state-dict keys ``net.*``).
    """

    def __init__(self, net: nn.Module, name: str) -> None:
        super().__init__()
        self.net = net
        self.arch_name = name
        rule = getattr(net, "test_time_rule", "first")
        if rule not in ("first", "sum"):
            raise MSBError(f"model.target: {name}.test_time_rule must be 'first' or 'sum', got {rule!r}")
        self.test_time_rule = rule  # type: ignore[misc]
        self.size_divisor = int(getattr(net, "size_divisor", 32))  # type: ignore[misc]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = self.net(x)
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        if not outs or not all(isinstance(o, torch.Tensor) and o.dim() == 4 for o in outs):
            raise MSBError(f"model.target: {self.arch_name}.forward must return logits (N, C, H, W) or a list of "
                           f"them, got {type(out).__name__}")
        return outs


def build_user_model(target: str, cfg: "ModelConfig", num_classes: int) -> Segmentor:
    """``target(num_classes=num_classes, **cfg.params)``, wrapped by :class:`UserSegmentor` unless it already
    is a :class:`Segmentor`.

    Raises:
        MSBError: the target cannot be imported (:func:`resolve_target`), refuses the arguments (the keys are
            named), or returns no ``nn.Module``.
    """
    factory = resolve_target(target)
    try:
        sig = inspect.signature(factory)
        sig.bind(num_classes=num_classes, **cfg.params)
    except TypeError as exc:
        raise MSBError(f"model.params: {target} does not accept num_classes={num_classes} and "
                       f"{sorted(cfg.params)} ({exc})") from exc
    except ValueError:  # no signature (a builtin): just call it
        pass
    net = factory(num_classes=num_classes, **cfg.params)
    if isinstance(net, Segmentor):
        return net
    if not isinstance(net, nn.Module):
        raise MSBError(f"model.target: {target} returned {type(net).__name__}, not a torch.nn.Module")
    return UserSegmentor(net, cfg.arch)


def target_size_divisor(target: str) -> int:
    """``size_divisor`` of a target class (32 when it does not say, or for a factory function)."""
    return int(getattr(resolve_target(target), "size_divisor", 32))


def entry_point_adapter(name: str, value: str) -> type:
    """A :class:`Segmentor` subclass registered as ``name`` whose ``from_config`` builds ``value`` (an entry
    point ``module:attr`` of the group ``msb.models``) with :func:`build_user_model`."""

    class _EntryPoint(Segmentor):
        arch_name = name
        target = value

        @classmethod
        def from_config(cls, cfg: "ModelConfig", num_classes: int) -> Segmentor:
            return build_user_model(value, cfg, num_classes)

    _EntryPoint.__name__ = f"EntryPoint_{name}"
    with_div = getattr(_safe_resolve(value), "size_divisor", 32)
    _EntryPoint.size_divisor = int(with_div)
    return _EntryPoint


def _safe_resolve(value: str) -> Any:
    try:
        return resolve_target(value, where=f"entry point msb.models '{value}'")
    except MSBError:
        return None
