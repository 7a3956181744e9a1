"""One dataclass ↔ dict serializer for every config: the JSON form checkpoints and files store.

:func:`to_dict` writes nested dataclasses as objects, enums as their values and tuples as lists,
everything else as it is. :func:`from_dict` reads that form back: a field typed with a dataclass
(or ``None``) is built from its object, an enum field from its value, a list into a tuple field;
the dataclass's own ``__post_init__`` checks the rest. Unknown keys (with the closest valid key),
wrong nested objects and the config's own problems come together in one ``ValueError``, so a
user fixes a config file in one pass.

Example:
    >>> from sixbit.config import ConvertConfig
    >>> from_dict(ConvertConfig, to_dict(ConvertConfig(weights=None, activations="fp"))).activations
    'fp'
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, TypeVar

from .validate import report, show, unknown_keys

T = TypeVar("T")


class Serializable:
    """Mixin of the config dataclasses: :meth:`to_dict` / :meth:`from_dict` through this module."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (plain dicts, lists, strings and numbers); ``from_dict`` reads it back equal."""
        return to_dict(self)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        """Build from :meth:`to_dict`'s shape; every problem (unknown keys included) in one ``ValueError``."""
        return from_dict(cls, data)


def to_dict(config) -> dict[str, Any]:
    """The dataclass instance ``config`` as plain JSON-ready data, field by field in declaration order."""
    return {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)}


def _plain(value):
    if isinstance(value, Serializable):  # a config may write its own form (e.g. leave out a field added later)
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_dict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    return value


def from_dict(cls: type[T], data: Any) -> T:
    """An instance of the dataclass ``cls`` from its :func:`to_dict` form.

    A missing key takes the field's default. Problems of nested configs are prefixed with their
    field's name; if any field cannot be read, ``cls`` is not built (its cross-field checks would
    only repeat them), otherwise its own checks are reported together with the unknown keys.
    """
    if not isinstance(data, dict):
        raise ValueError(f"a {cls.__name__} must be a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.init]
    problems, kwargs = [], {}
    for name in fields:
        if name in data:
            try:
                kwargs[name] = _read(name, hints[name], data[name])
            except ValueError as e:
                problems.append(str(e))
    extra = set(data) - set(fields)
    unknown = [unknown_keys(extra, fields)] if extra else []
    if problems:
        raise ValueError(report(f"invalid {cls.__name__}", problems + unknown))
    try:
        config = cls(**kwargs)
    except ValueError as e:
        raise ValueError("".join([str(e)] + [f"\n  - {p}" for p in unknown])) from None
    if unknown:
        raise ValueError(report(f"invalid {cls.__name__}", unknown))
    return config


def _read(name: str, tp, value):
    """``value`` of the field ``name`` typed ``tp``, with nested configs and enums built."""
    if value is None:
        return None  # None where it does not belong is the dataclass's own type check
    for kind in _options(tp):
        if dataclasses.is_dataclass(kind):
            if isinstance(value, kind):
                return value
            if not isinstance(value, dict):
                raise ValueError(f"{name} must be an object or null, got {show(value)}")
            try:  # a config may read its own form (Serializable.from_dict, overridden)
                return kind.from_dict(value) if issubclass(kind, Serializable) else from_dict(kind, value)
            except (ValueError, TypeError) as e:
                raise ValueError(f"{name}: " + str(e).replace("\n", "\n    ")) from None
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            try:
                return kind(value)
            except (ValueError, TypeError):
                raise ValueError(f"{name}={show(value)} is not one of {[m.value for m in kind]}") from None
        if typing.get_origin(kind) is tuple and isinstance(value, list):
            return tuple(value)
    return value


def _options(tp) -> tuple:
    """The types a field annotated ``tp`` may hold, ``None`` left out (``X | None`` → ``(X,)``)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(tp) if a is not type(None))
    return (tp,)
