"""The base class of every config schema: unknown keys, non-finite floats and booleans given for numbers are
validation errors (so each is reported with its file and key by :mod:`msb.config.layering`)."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

__all__ = ["StrictModel"]


def _is_number(annotation: Any) -> bool:
    """True when ``annotation`` takes an int or float but not a bool (``int``, ``Optional[float]``, ...)."""
    if annotation in (int, float):
        return True
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _is_number(args[0])
    if args and typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return not any(a is bool or a is Any for a in args) and any(_is_number(a) for a in args)
    return False


def _bool_as_number(annotation: Any, value: Any) -> bool:
    """True when ``value`` (or an element of a list/tuple value) is a bool where ``annotation`` wants a number."""
    if isinstance(value, bool):
        return _is_number(annotation)
    if isinstance(value, (list, tuple)):
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin in (typing.Union, types.UnionType):
            return any(_bool_as_number(a, value) for a in args if a is not type(None))
        if origin in (list, tuple) and args:
            if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
                return any(_bool_as_number(a, v) for a, v in zip(args, value))
            return any(_bool_as_number(args[0], v) for v in value)
    return False


class StrictModel(BaseModel):
    """Base class: unknown keys are errors, values are validated on assignment, floats must be finite
    (``.inf``/``.nan`` are refused) and a boolean is not accepted where a number is expected (``epochs: true``
    would otherwise be taken as 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse a bool (or a list/tuple holding one) for a field that takes a number."""
        field = cls.model_fields.get(info.field_name or "")
        if field is not None and _bool_as_number(field.annotation, value):
            raise ValueError(f"a boolean (true/false) is not a number; write a number (got {value!r})")
        return value
