"""Model stage: the Segmentor interface, the registry and the adapters."""

from msb.models.base import Segmentor
from msb.models.registry import available_architectures, build_model, register

__all__ = ["Segmentor", "available_architectures", "build_model", "register"]
