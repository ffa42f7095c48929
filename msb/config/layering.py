"""YAML layering: ``_base_`` includes, deep merge with provenance, and key checks that name the file.

Layering follows MMSegmentation's ``_base_`` idea with YAML: a file may list ``_base_: [a.yaml, b.yaml]``
(paths relative to that file); bases are merged first, in order, then the file itself. Later layers win;
mappings merge key by key, every other value (lists included) is replaced. A mapping with ``_delete_: true``
replaces the inherited mapping instead of merging into it.
"""

from __future__ import annotations

import copy
import difflib
import math
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from msb.errors import MSBError

__all__ = ["Layer", "load_yaml", "load_layer", "deep_merge", "check_keys", "check_finite", "validate_layers"]

Provenance = dict[tuple[str, ...], str]


class Layer(typing.NamedTuple):
    """One configuration layer: its data (``_base_`` already resolved) and where each key came from."""

    data: dict[str, Any]
    provenance: Provenance


class _DuplicateKey(yaml.constructor.ConstructorError):
    """A key set twice in one YAML mapping (PyYAML would silently keep the last value)."""

    def __init__(self, key: Any, first_line: int, mark: Any) -> None:
        super().__init__(None, None, f"duplicate key {key!r} (first set on line {first_line})", mark)
        self.key, self.first_line = key, first_line


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (merge keys ``<<`` may still be
    overridden, as YAML intends)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in seen:
                raise _DuplicateKey(key, seen[key], key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        except TypeError:  # unhashable key: SafeLoader reports it
            pass
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read one YAML mapping. Raises :class:`MSBError` naming the file if it is missing, unparsable, holds a
    key twice in one mapping (naming the key and both lines), or is not a mapping at top level. An empty file
    gives ``{}``."""
    path = Path(path)
    if not path.is_file():
        raise MSBError(f"{path}: config file not found; check the path (relative paths are resolved "
                       f"against the file that names them)")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
    except _DuplicateKey as exc:
        raise MSBError(f"{path}: line {exc.problem_mark.line + 1}: duplicate key '{exc.key}' (first set on line "
                       f"{exc.first_line}); YAML would keep only the last value, remove one of them") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise MSBError(f"{path}:{where} is not valid YAML ({getattr(exc, 'problem', exc)}); fix the syntax") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise MSBError(f"{path}: the top level must be a mapping of keys, got {type(data).__name__}")
    return data


def _record(data: Any, file: str, prefix: tuple[str, ...], prov: Provenance) -> None:
    prov[prefix] = file
    if isinstance(data, dict):
        for k, v in data.items():
            _record(v, file, prefix + (str(k),), prov)


def deep_merge(base: dict[str, Any], over: dict[str, Any], over_file: str = "<override>",
               prov: Provenance | None = None, _prefix: tuple[str, ...] = ()) -> dict[str, Any]:
    """Return ``base`` deep-merged with ``over`` (``over`` wins); inputs are not modified.

    Args:
        base: lower layer.
        over: higher layer. A nested mapping holding ``_delete_: true`` replaces ``base``'s mapping.
        over_file: name recorded in ``prov`` for every key ``over`` sets.
        prov: optional provenance map (key path -> file) updated in place.
    """
    out = copy.deepcopy(base)
    for key, value in over.items():
        path = _prefix + (str(key),)
        if isinstance(value, dict):
            value = dict(value)
            delete = bool(value.pop("_delete_", False))
            if isinstance(out.get(key), dict) and not delete:
                if prov is not None:
                    prov[path] = over_file
                out[key] = deep_merge(out[key], value, over_file, prov, path)
                continue
        out[key] = copy.deepcopy(value)
        if prov is not None:
            for p in [p for p in prov if p[: len(path)] == path]:
                del prov[p]
            _record(value, over_file, path, prov)
    return out


def load_layer(path: str | Path, _stack: tuple[Path, ...] = ()) -> Layer:
    """Load a YAML file with its ``_base_`` chain resolved. Raises :class:`MSBError` on a missing file,
    bad YAML or a circular ``_base_``."""
    path = Path(path).resolve()
    if path in _stack:
        chain = " -> ".join(str(p) for p in (*_stack, path))
        raise MSBError(f"{path}: circular _base_ chain ({chain}); remove one of the includes")
    raw = load_yaml(path)
    bases = raw.pop("_base_", [])
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise MSBError(f"{path}: _base_ must be a path or a list of paths")
    merged: dict[str, Any] = {}
    prov: Provenance = {}
    for b in bases:
        layer = load_layer(path.parent / b, (*_stack, path))
        prov.update({k: v for k, v in layer.provenance.items()})
        merged = deep_merge(merged, layer.data, prov=None)
    merged = deep_merge(merged, raw, str(path), prov)
    return Layer(merged, prov)


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (handles Optional/Union), or None for plain values."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def check_keys(data: dict[str, Any], model: type[BaseModel], file: str,
               provenance: Provenance | None = None, _prefix: tuple[str, ...] = ()) -> None:
    """Raise :class:`MSBError` for the first key in ``data`` that ``model`` does not define.

    The message names the file that set the key (from ``provenance`` when given, else ``file``), the dotted
    key and the closest valid key (``difflib``). Free-form mappings (``dict[str, Any]`` fields) are not checked.
    """
    fields = model.model_fields
    for key, value in data.items():
        path = _prefix + (str(key),)
        if key in getattr(model, "LEGACY_KEYS", ()):  # an old key the model still reads (e.g. train.amp)
            continue
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean '{'.'.join(_prefix + (close[0],))}'?" if close else \
                f"; valid keys here: {', '.join(sorted(fields))}"
            where = (provenance or {}).get(path, file)
            raise MSBError(f"{where}: unknown key '{'.'.join(path)}'{hint}")
        sub = _submodel(fields[key].annotation)
        if sub is not None and isinstance(value, dict):
            check_keys(value, sub, file, provenance, path)


def _where(provenance: Provenance, loc: tuple[str, ...], default_file: str) -> str:
    """The file that set ``loc`` (or its nearest parent key), else ``default_file``."""
    for n in range(len(loc), 0, -1):
        if loc[:n] in provenance:
            return provenance[loc[:n]]
    return default_file


def check_finite(data: Any, default_file: str, provenance: Provenance | None = None,
                 _prefix: tuple[str, ...] = (), _label: str = "") -> None:
    """Raise :class:`MSBError` for the first non-finite float (``.inf``, ``-.inf``, ``.nan``) anywhere in
    ``data`` (free-form mappings such as ``model.params`` included), naming the file that set it and the dotted
    key (list items as ``key[i]``)."""
    if isinstance(data, float) and not math.isfinite(data):
        raise MSBError(f"{_where(provenance or {}, _prefix, default_file)}: key '{_label or '<top level>'}': "
                       f"{data} is not a finite number; write a finite value")
    if isinstance(data, dict):
        for k, v in data.items():
            check_finite(v, default_file, provenance, _prefix + (str(k),), f"{_label}.{k}" if _label else str(k))
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            check_finite(v, default_file, provenance, _prefix, f"{_label}[{i}]")


def validate_layers(data: dict[str, Any], model: type[BaseModel], provenance: Provenance,
                    default_file: str) -> BaseModel:
    """Check keys and finite numbers, then validate ``data`` with ``model``; a pydantic error becomes one
    :class:`MSBError` naming the file that set the offending key, the dotted key and pydantic's message."""
    check_keys(data, model, default_file, provenance)
    check_finite(data, default_file, provenance)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(str(p) for p in err["loc"])
        where = _where(provenance, loc, default_file)
        key = ".".join(loc) or "<top level>"
        msg = err["msg"]
        if err["type"] == "missing":
            msg = "required key is missing; add it to the dataset/architecture/study layer"
        more = f" (and {len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
        raise MSBError(f"{where}: key '{key}': {msg}{more}") from exc
