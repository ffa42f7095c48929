"""Architecture registry: ``@register("unet")`` on a :class:`~msb.models.base.Segmentor` subclass.

Adapters are imported lazily by :func:`build_model` from ``msb.models.<module>`` listed in
``_BUILTIN_MODULES``, so importing the package stays cheap.
"""

from __future__ import annotations

import difflib
import importlib
from typing import TYPE_CHECKING, Callable

from msb.errors import MSBError

if TYPE_CHECKING:
    from msb.config.schema import ModelConfig
    from msb.models.base import Segmentor

__all__ = ["register", "available_architectures", "architecture_class", "build_model"]

_REGISTRY: dict[str, type] = {}
_BUILTIN_MODULES = ("msb.models.zoo.unet", "msb.models.zoo.pranet", "msb.models.zoo.polyp_pvt", "msb.models.zoo.sanet",
                    "msb.models.zoo.pvt_cascade", "msb.models.zoo.g_cascade", "msb.models.zoo.segformer",
                    "msb.models.paper.unet_classic",
                    "msb.models.paper.segformer_b3",
                    "msb.models.paper.vwformer",
                    "msb.models.paper.cenet",
                    "msb.models.paper.segnext",
                    "msb.models.paper.missformer",
                    "msb.models.paper.hiformer",
                    "msb.models.paper.swin_umamba",
                    "msb.models.generic.timm_uper",
                    "msb.models.paper.transnext",
                    "msb.models.paper.internimage",
                    "msb.models.generic.smp_any",
                    )


def register(name: str) -> Callable[[type], type]:
    """Class decorator registering a Segmentor under ``name``. Raises ValueError on a duplicate name."""

    def deco(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"architecture '{name}' is registered twice ({_REGISTRY[name]} and {cls})")
        _REGISTRY[name] = cls
        cls.arch_name = name
        return cls

    return deco


def _load_builtins() -> None:
    for mod in _BUILTIN_MODULES:
        importlib.import_module(mod)
    _load_entry_points()


def _user_entry_points() -> list:
    """The installed entry points of the group ``msb.models``."""
    from importlib.metadata import entry_points

    return list(entry_points(group="msb.models"))


def _load_entry_points() -> None:
    """Register the user models of the entry point group ``msb.models`` (``name = "pkg.module:Class"`` in a
    package's metadata), each under its entry point name, wrapped by :func:`msb.models.user.wrap_user_model`."""
    for ep in _user_entry_points():
        if ep.name not in _REGISTRY:
            from msb.models.user import entry_point_adapter

            _REGISTRY[ep.name] = entry_point_adapter(ep.name, ep.value)


def available_architectures() -> list[str]:
    """Sorted names of all registered architectures."""
    _load_builtins()
    return sorted(_REGISTRY)


def architecture_class(name: str, where: str = "model.arch") -> type:
    """The registered :class:`Segmentor` subclass for ``name``.

    Raises:
        MSBError: unknown name; the message starts with ``where`` (e.g. the config file that set the key)
            and gives the closest registered name.
    """
    _load_builtins()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise MSBError(f"{where}: unknown architecture '{name}'{hint} "
                       f"(available: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name]


def build_model(cfg: "ModelConfig", num_classes: int) -> "Segmentor":
    """Build ``cfg.arch`` (or the user model ``cfg.target``) with ``num_classes`` output channels (foreground
    classes; sigmoid per channel), then load ``cfg.checkpoint`` (whole-model weights; official releases of the
    polyp adapters are renamed, :mod:`msb.models.released`) when set.

    Raises:
        MSBError: unknown name (with the closest one); a target that cannot be imported or built; a checkpoint
            that is missing or does not match (missing/unexpected keys listed).
    """
    if cfg.target:
        from msb.models.user import build_user_model

        model = build_user_model(cfg.target, cfg, num_classes)
    else:
        model = architecture_class(cfg.arch).from_config(cfg, num_classes)
    if cfg.checkpoint:
        from msb.models.released import load_released

        load_released(model, cfg.checkpoint, cfg.arch)
    return model
