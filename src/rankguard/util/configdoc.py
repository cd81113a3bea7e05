"""Config documents into typed dataclasses, strictly: :func:`build` and the value
coercion under it, and YAML read with a nesting limit.

At the bottom of the import graph, so that a component can decode its own section of
the run's config (:meth:`rankguard.rank.runenv.RunEnv.section`) without importing the root
config, which imports every component's. :mod:`rankguard.config` composes the sections.
"""

from __future__ import annotations

import dataclasses
import reprlib
import types
import typing
from typing import Any, TypeVar, Union

__all__ = ["MAX_DEPTH", "ConfigError", "FrozenDict", "build", "load_yaml", "short"]

T = TypeVar("T")

MAX_DEPTH = 32
"""Deepest nesting of mappings and lists a config document (file or override) may have;
the real layout needs five levels."""


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names it."""


class FrozenDict(dict[str, Any]):
    """A mapping of a frozen configuration: read as a dict (equality, JSON,
    :func:`dataclasses.asdict`), never changed (every write raises ``TypeError``); a change
    makes a new configuration (:func:`dataclasses.replace` with a new mapping)."""

    __slots__ = ()

    def _frozen(self, *args: Any, **kwargs: Any) -> typing.NoReturn:
        raise TypeError(f"{type(self).__name__} is read-only: replace the configuration")

    __setitem__ = __delitem__ = __ior__ = _frozen
    clear = pop = popitem = setdefault = update = _frozen

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (dict(self),))


_UNSET = ("none", "null", "~")


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if type(None) in args and (
            value is None or (isinstance(value, str) and value.strip().lower() in _UNSET)
        ):
            return None  # "none"/"null" on a command line unsets an optional setting
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        allowed = " or ".join(_type_name(a) for a in args)
        raise ConfigError(f"{key}: expected {allowed}, got {short(value)}")
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(
                f"{key}: expected a mapping of {_type_name(tp)} keys, got {short(value)}"
            )
        return build(tp, value, prefix=f"{key}.")  # type: ignore[arg-type]
    if origin is typing.Literal:
        allowed_values = typing.get_args(tp)
        if value not in allowed_values:
            raise ConfigError(f"{key}: expected one of {list(allowed_values)}, got {short(value)}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {short(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {short(value)}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                return float(value)
            except OverflowError:
                raise ConfigError(f"{key}: must be a finite number, got {short(value)}") from None
        raise ConfigError(f"{key}: expected a number, got {short(value)}")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {short(value)}")
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if isinstance(value, str):  # a command line: "a,b" (empty: none)
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list (or 'a,b'), got {short(value)}")
        return [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, value_tp = typing.get_args(tp)
        if isinstance(value, str):
            value = _parse_mapping(value, key)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping (or 'a:1,b:2'), got {short(value)}")
        return {
            _coerce(k, key_tp, f"{key}.<key>"): _coerce(v, value_tp, f"{key}.{k}")
            for k, v in value.items()
        }
    raise ConfigError(f"{key}: unsupported config type {tp!r}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 2, 80, 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


def short(value: Any) -> str:
    """``repr(value)`` bounded in depth and length, for error messages (a document can
    be deep, long, or share one node many times through YAML aliases)."""
    text = _REPR.repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


def _yaml_depth_error(text: str, limit: int) -> str | None:
    """Where ``text`` nests mappings/lists deeper than ``limit``, or None. Reads the
    parser's events (no recursion), so a pathological document cannot overflow the stack
    before it is refused."""
    import yaml  # only where a document is read: a rank decodes its config from JSON

    depth = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > limit:
                    mark = event.start_mark
                    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
                    return f"nested deeper than {limit} levels{where}"
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.YAMLError:
        return None  # safe_load reports it with its own message
    return None


def load_yaml(text: str, limit: int = MAX_DEPTH) -> Any:
    """``yaml.safe_load`` with a nesting limit (ConfigError past it)."""
    import yaml

    problem = _yaml_depth_error(text, limit)
    if problem is not None:
        raise ConfigError(problem)
    return yaml.safe_load(text)


def _parse_mapping(text: str, key: str) -> dict[str, object]:
    """``"setup:600,step:180"`` (NVRx's command-line form) -> ``{"setup": 600, ...}``."""
    import yaml

    out: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, raw = item.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"{key}: expected NAME:VALUE items separated by commas, got {text!r}")
        try:
            out[name.strip()] = load_yaml(raw)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{key}.{name.strip()}: cannot parse value: {exc}") from exc
    return out


def build(cls: type[T], data: dict[str, object] | None, *, prefix: str = "") -> T:
    """Construct config dataclass ``cls`` from ``data``, strictly.

    Unknown keys raise :class:`ConfigError` listing the allowed ones; ``ValueError`` from
    a component's own validation is re-raised with the dotted prefix.
    """
    data = data or {}
    if not isinstance(data, dict):
        where = prefix.rstrip(".") or "<root>"
        raise ConfigError(f"{where}: expected a mapping, got {short(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"unknown config key(s) {', '.join(prefix + str(k) for k in unknown)}; "
            f"allowed under {prefix.rstrip('.') or '<root>'}: {', '.join(sorted(fields))}"
        )
    kwargs = {name: _coerce(value, hints[name], prefix + name) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(f"{prefix}{exc}" if prefix else str(exc)) from exc
