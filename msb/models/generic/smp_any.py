"""``arch: smp``: every architecture segmentation-models-pytorch 0.6 exports, with any of its encoders, by config.

Config (``model:``)::

    model: {arch: smp, smp_arch: DeepLabV3Plus, encoder: resnet50, encoder_weights: null,
            params: {encoder_output_stride: 16, decoder_channels: 256}}

``smp_arch`` is the smp class name (:data:`SMP_ARCHS`: Unet, UnetPlusPlus, FPN, PSPNet, DeepLabV3,
DeepLabV3Plus, Linknet, MAnet, PAN, UPerNet, Segformer, DPT; case-insensitive; unset = Unet), ``encoder`` any smp
encoder name (``resnet18``, ``mit_b2``, ``tu-convnext_tiny`` for a timm backbone, ...; default
:data:`DEFAULT_ENCODER`),
``params`` the class's keyword arguments. ``encoder_name``, ``encoder_weights`` and ``classes`` are set by msb
(``classes`` = the dataset's foreground classes, sigmoid per channel) and are refused in ``params``; any other
key must be an argument of that smp class, except that with a timm encoder (``tu-``) unknown keys are passed
to ``timm.create_model`` (smp forwards ``**kwargs`` there). A key neither accepts is refused in one line
naming the valid ones. smp's own ``activation`` and ``aux_params`` are refused: msb wants raw logits and one
output.

DPT takes only timm Vision Transformer encoders (``tu-vit_...``; default ``tu-vit_base_patch16_224.augreg_in21k``,
smp's default); without ``params.img_size`` the ViT is built with ``dynamic_img_size=True`` so that it runs at any
input size that is a multiple of its patch size (a given ``img_size`` fixes it, and follows a study's
``data.input_size`` axis like G-CASCADE's graph size).

Weights: ``encoder_weights`` is ``None`` (random init), ``imagenet`` (smp's own Hugging Face download and
cache; offline nodes: ``msb weights fetch``, :mod:`msb.models.pretrained`) or a local state dict of the encoder.
Input H and W: multiples of 32 (the 5-stage encoders; :attr:`SmpModel.size_divisor`, conservative for
PSPNet's and DPT's smaller strides). One output; test-time rule ``first``.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Any, ClassVar

import segmentation_models_pytorch as smp
import torch

from msb.config.schema import ModelConfig
from msb.errors import MSBError
from msb.models.backbones import is_none
from msb.models.base import Segmentor
from msb.models.pretrained import IMAGENET, pretrained_guard
from msb.models.registry import register
from msb.models.weights import load_local_weights

__all__ = ["SmpModel", "SMP_ARCHS", "DEFAULT_SMP_ARCH", "DEFAULT_ENCODER", "smp_class", "smp_kwargs"]

#: the smp architectures this adapter builds (smp 0.6 class names)
SMP_ARCHS: tuple[str, ...] = ("Unet", "UnetPlusPlus", "FPN", "PSPNet", "DeepLabV3", "DeepLabV3Plus", "Linknet",
                              "MAnet", "PAN", "UPerNet", "Segformer", "DPT")
#: class when ``model.smp_arch`` is unset (so that ``model: {arch: smp}`` alone builds, like every registry name)
DEFAULT_SMP_ARCH = "Unet"
#: encoder when ``model.encoder`` is unset (smp's own defaults)
DEFAULT_ENCODER: dict[str, str] = {**{a: "resnet34" for a in SMP_ARCHS}, "Segformer": "mit_b0",
                                   "DPT": "tu-vit_base_patch16_224.augreg_in21k"}
#: keys msb sets itself (never in ``model.params``)
_FIXED = ("encoder_name", "encoder_weights", "classes")
_REFUSED = {"activation": "msb applies the sigmoid itself and needs raw logits",
            "aux_params": "msb trains one output (no classification head)"}


def smp_class(name: str | None, where: str = "model.smp_arch") -> type:
    """The smp class for ``name`` (case-insensitive member of :data:`SMP_ARCHS`; None = :data:`DEFAULT_SMP_ARCH`).

    Raises:
        MSBError: unknown name (one line listing the valid ones).
    """
    by_lower = {a.lower(): a for a in SMP_ARCHS}
    name = DEFAULT_SMP_ARCH if name is None else name
    if str(name).lower() not in by_lower:
        raise MSBError(f"{where}: arch smp needs smp_arch, one of {', '.join(SMP_ARCHS)}; got '{name}'")
    return getattr(smp, by_lower[str(name).lower()])


def smp_kwargs(cls: type, encoder: str, params: dict[str, Any], where: str = "model.params") -> dict[str, Any]:
    """Check ``params`` against the signature of the smp class ``cls`` and return the keyword arguments to pass.

    Args:
        cls: an smp model class; encoder: the encoder name (``tu-`` = timm: unknown keys go to timm);
        params: ``model.params``; where: prefix of error messages.

    Returns:
        ``params`` plus, for DPT without ``img_size``, ``dynamic_img_size=True`` (module docstring).

    Raises:
        MSBError: a key msb sets itself (``encoder_name``, ``encoder_weights``, ``classes``), a refused key
            (``activation``, ``aux_params``), or a key that is not an argument of ``cls`` (with a non-timm encoder).
    """
    sig = [n for n in inspect.signature(cls.__init__).parameters if n not in ("self", "kwargs")]
    valid = [n for n in sig if n not in _FIXED and n not in _REFUSED]
    for key in params:
        if key in _FIXED:
            raise MSBError(f"{where}: '{key}' is set by msb (model.encoder / model.encoder_weights / the dataset's "
                           f"classes); remove it from model.params")
        if key in _REFUSED:
            raise MSBError(f"{where}: '{key}' is not accepted for arch smp: {_REFUSED[key]}")
    unknown = sorted(k for k in params if k not in valid)
    if unknown and not str(encoder).startswith("tu-"):
        raise MSBError(f"{where}: unknown key(s) {unknown} for smp.{cls.__name__}; valid keys: {', '.join(valid)}")
    out = dict(params)
    if cls is smp.DPT and "img_size" not in out and "dynamic_img_size" not in out:
        out["dynamic_img_size"] = True
    return out


@register("smp")
class SmpModel(Segmentor):
    """Any smp architecture (module docstring) as a :class:`Segmentor`: ``forward(x)`` -> ``[logits]``,
    logits (N, C, H, W)."""

    test_time_rule = "first"
    size_divisor = 32
    #: shown by ``msb models``
    config_example: ClassVar[str] = ("model: {arch: smp, smp_arch: DeepLabV3Plus, encoder: resnet50, params: "
                                     "{encoder_output_stride: 16}}  (configs/architectures/deeplabv3plus_r50.yaml)")

    def __init__(self, num_classes: int, smp_arch: str | None = None, encoder: str | None = None,
                 encoder_weights: str | None = None, **params: Any) -> None:
        super().__init__()
        cls = smp_class(smp_arch)
        encoder = encoder or DEFAULT_ENCODER[cls.__name__]
        kwargs = smp_kwargs(cls, encoder, params)
        imagenet = str(encoder_weights).strip().lower() == IMAGENET
        if cls is smp.DPT and not str(encoder).startswith("tu-"):
            raise MSBError(f"model.encoder: smp.DPT takes only timm Vision Transformer encoders "
                           f"('tu-vit_...', e.g. tu-vit_small_patch16_224), got '{encoder}'")
        guard = pretrained_guard("smp", encoder) if imagenet else contextlib.nullcontext()
        try:
            with guard, warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # DPT's readout hint for encoders without cls token
                self.net = cls(encoder_name=encoder, encoder_weights=IMAGENET if imagenet else None,
                               classes=num_classes, **kwargs)
        except (TypeError, ValueError, KeyError, RuntimeError) as exc:
            if isinstance(exc, MSBError):
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise MSBError(f"model: smp.{cls.__name__} with encoder '{encoder}' and params {sorted(kwargs)} cannot "
                           f"be built: {first}") from None
        if not imagenet and not is_none(encoder_weights):
            load_local_weights(self.net.encoder, encoder_weights)

    @classmethod
    def from_config(cls, cfg: ModelConfig, num_classes: int) -> "SmpModel":
        """Build from ``model.smp_arch``, ``model.encoder``, ``model.encoder_weights`` and ``model.params``.

        Raises:
            MSBError: unknown smp_arch, a refused or unknown params key, an encoder smp cannot build, a weights
                file that does not match.
        """
        return cls(num_classes, smp_arch=cfg.smp_arch, encoder=cfg.encoder, encoder_weights=cfg.encoder_weights,
                   **cfg.params)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """``x`` float (N, 3, H, W), H and W multiples of 32 -> ``[logits]``, logits (N, C, H, W)."""
        return [self.net(x)]
