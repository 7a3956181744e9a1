"""Checks shared by the configuration dataclasses and the readers of user files (checkpoint
headers, JSON configs): every field's value against its annotation, unknown keys with a "did you
mean", and problem reports that name each wrong value once.

A config's ``__post_init__`` calls :func:`type_problems` first and goes on with its own range
checks, so one ``ValueError`` names every wrong field at once (a string where a number belongs,
one string where a list belongs, ``"no"`` for a boolean, NaN), each with what it must be.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from typing import Any


def show(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters (a huge value is not echoed back whole)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


_LONG_QUOTE = re.compile(r"'[^']{60,}'|\"[^\"]{60,}\"")


def report(title: str, problems: list[str]) -> str:
    """``title:`` and one ``- problem`` line each; a quoted value past 60 characters is cut
    (a huge string in a config is named, not echoed back)."""
    lines = [_LONG_QUOTE.sub(lambda m: m.group(0)[:50] + "…" + m.group(0)[-1], p) for p in problems]
    return f"{title}:\n  - " + "\n  - ".join(lines)


def unknown_keys(unknown, valid) -> str:
    """``unknown keys [...]`` with the closest valid key for each, and the valid keys."""
    valid = sorted(valid)
    guesses = []
    for key in sorted(unknown, key=str)[:10]:
        close = difflib.get_close_matches(str(key), valid, n=1)
        guesses.append(f"{show(key, 40)}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"unknown keys {', '.join(guesses)}; valid: {valid}"


def type_problems(obj) -> list[str]:
    """One message per field of the dataclass ``obj`` whose value does not have its annotated type.

    A wrong field is set back to its default (the caller refuses ``obj`` anyway), so the
    caller's range checks that follow see only well-typed values and add their own problems
    to the same report."""
    hints = typing.get_type_hints(type(obj))
    problems = []
    for f in dataclasses.fields(obj):
        tp = hints.get(f.name, Any)
        value = getattr(obj, f.name)
        if _matches(value, tp):
            continue
        hint = ""
        if isinstance(value, str) and _wants(tp, (int, float, bool, list)):
            hint = " (a string: write the value without quotes, a list as [...])"
        problems.append(f"{f.name} must be {_describe(tp)}, got {show(value)}{hint}")
        if f.default is not dataclasses.MISSING:
            object.__setattr__(obj, f.name, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            object.__setattr__(obj, f.name, f.default_factory())
    return problems


def field_problems(where: str, obj: dict, fields: dict) -> list[str]:
    """One message per key of ``fields`` (name → annotation) that the JSON object ``obj`` lacks
    or holds with another type; ``where`` prefixes each name."""
    return [f"{where}{key} is missing" if key not in obj else
            f"{where}{key} must be {_describe(tp)}, got {show(obj[key], 40)}"
            for key, tp in fields.items() if key not in obj or not _matches(obj[key], tp)]


def _args(tp) -> tuple:
    return typing.get_args(tp)


def _is_union(tp) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _matches(value, tp) -> bool:
    if tp is Any:
        return True
    if _is_union(tp):
        return any(_matches(value, a) for a in _args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            return False
        args = _args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(_matches(v, a) for v, a in zip(value, args))
        return not args or all(_matches(v, args[0]) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            return False
        key, val = _args(tp) or (Any, Any)
        return all(_matches(k, key) and _matches(v, val) for k, v in value.items())
    if origin is typing.Literal:
        return value in _args(tp)
    if isinstance(tp, type):
        return isinstance(value, tp)
    return True


def _wants(tp, kinds) -> bool:
    if _is_union(tp):
        return any(_wants(a, kinds) for a in _args(tp))
    return tp in kinds or typing.get_origin(tp) in kinds


def _describe(tp) -> str:
    if _is_union(tp):
        return " or ".join(_describe(a) for a in _args(tp))
    names = {type(None): "None", bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}
    if tp in names:
        return names[tp]
    origin = typing.get_origin(tp)
    if origin in (list, tuple):
        args = _args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a pair/tuple of ({', '.join(_describe(a) for a in args)})"
        return "a list" + (f" of ({_describe(args[0])})" if args and args[0] is not Any else "")
    if origin is dict:
        key, val = _args(tp) or (Any, Any)
        return f"an object of {_describe(key)} → ({_describe(val)})"
    if origin is typing.Literal:
        return f"one of {list(_args(tp))}"
    return f"a {getattr(tp, '__name__', str(tp))}"
