"""Reading conversion configs: preset names, JSON files, and the two JSON shapes.

:func:`resolve` turns what a user passes as ``quant_config`` — a preset name, a JSON file, a
dict, a :class:`~sixbit.config.ConvertConfig` or a :class:`~sixbit.QuantConfig` — into a
validated config, reporting every problem at once. JSON files are read strictly
(:func:`read_json`). A JSON object is either the full schema (``ConvertConfig.to_dict()``) or
the seed's short shape, which maps onto the ``"balanced"`` preset::

    {"attention": {"bits": 8, "symmetric": false},   # attention weights: int8-asym (per channel)
     "residual": {"bits": 4, "group_size": 64},      # cached block residuals: int4-g64
     "threshold": 0.01}                               # delta-cache skip threshold

``attention.bits`` (2…8) and ``symmetric`` (default true) choose the attention layers' weight
format ``int{bits}`` / ``int{bits}-asym``; ``residual`` chooses the delta cache's storage
(``bits`` 4 with ``group_size`` 64 → ``"int4-g64"``, ``bits`` 8 → ``"int8"``, ``bits`` 16 or 32
→ ``"fp"``); ``threshold`` is the delta cache's stability threshold. Any key may be left out.
Both shapes have an ``"attention"`` key: the short shape's holds ``bits``/``symmetric`` (weights),
the full schema's ``blocks``/``steps`` (quantized attention, :class:`~sixbit.AttentionQuantConfig`)
or ``null``; the other keys (or, alone, these) tell the shapes apart.

Example:
    >>> resolve("balanced").activations
    'dynamic'
    >>> resolve({"attention": {"bits": 8, "symmetric": False}}).weights.role_formats["attention"]
    'int8-asym'
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from .validate import report, show, unknown_keys
from .attention import AttentionQuantConfig
from .convert import ConvertConfig
from .delta_cache import DeltaCacheConfig
from .presets import PRESETS, preset
from .quant import QuantConfig

_SEED_KEYS = {"attention", "residual", "threshold"}
_SEED_ATTENTION_KEYS = {"bits", "symmetric"}
_SEED_RESIDUAL_KEYS = {"bits", "group_size"}
_RESIDUAL_FORMATS = {(4, 64): "int4-g64", (8, None): "int8", (16, None): "fp", (32, None): "fp"}


def _seed_attention(attention: Any, problems: list[str]) -> str | None:
    """The attention weights' format of the short shape's ``"attention"`` object, or ``None``
    with every problem of it (unknown keys, ``bits``, ``symmetric``) added to ``problems``."""
    if not isinstance(attention, dict):
        problems.append(f'"attention" must be {{"bits": 2…8, "symmetric": true|false}}, got {show(attention)}')
        return None
    before = len(problems)
    if set(attention) - _SEED_ATTENTION_KEYS:
        problems.append(f'"attention": {unknown_keys(set(attention) - _SEED_ATTENTION_KEYS, _SEED_ATTENTION_KEYS)}')
    bits, symmetric = attention.get("bits", 8), attention.get("symmetric", True)
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        problems.append(f'"attention.bits" must be an integer 2…8, got {show(bits)}')
    if not isinstance(symmetric, bool):
        problems.append(f'"attention.symmetric" must be true or false, got {show(symmetric)}')
    return None if len(problems) > before else f"int{bits}" + ("" if symmetric else "-asym")


def _seed_residual(residual: Any, problems: list[str]) -> str | None:
    """The delta cache's storage format of the short shape's ``"residual"`` object, or ``None``
    with its problems added to ``problems``."""
    choices = ('{"bits": 4, "group_size": 64}, {"bits": 8}, {"bits": 16}, {"bits": 32}')
    if not isinstance(residual, dict):
        problems.append(f'"residual" must be one of {choices}, got {show(residual)}')
        return None
    if set(residual) - _SEED_RESIDUAL_KEYS:
        problems.append(f'"residual": {unknown_keys(set(residual) - _SEED_RESIDUAL_KEYS, _SEED_RESIDUAL_KEYS)}')
        return None
    key = (residual.get("bits"), residual.get("group_size"))
    fmt = next((f for k, f in _RESIDUAL_FORMATS.items() if k == key and all(type(a) is type(b) for a, b in zip(k, key))),
               None)  # compared, not hashed (a list is not hashable), and 4.0 or true is not 4
    if fmt is None:
        problems.append(f'"residual" must be one of {choices}, got {show(residual)}')
    return fmt


def _from_seed_shape(data: dict[str, Any]) -> ConvertConfig:
    """The ``"balanced"`` preset edited by the short shape ``data``; every problem (unknown keys
    with the closest valid one, at the top and inside ``attention``/``residual``, types, ranges)
    in one ``ValueError``."""
    problems = []
    if set(data) - _SEED_KEYS:
        problems.append(unknown_keys(set(data) - _SEED_KEYS, _SEED_KEYS))
    cfg = preset("balanced")
    if data.get("attention") is not None:
        attention = _seed_attention(data["attention"], problems)
        if attention is not None:
            cfg.weights.role_formats["attention"] = attention
    if data.get("residual") is not None:
        residual = _seed_residual(data["residual"], problems)
        if residual is not None:
            cfg.cache.cache_format = residual
    if "threshold" in data:
        t = data["threshold"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t < float("inf"):
            problems.append(f'"threshold" must be a finite number ≥ 0, got {show(t)}')
        else:
            cfg.cache.threshold = float(t)
    if problems:
        raise ValueError(report("invalid conversion config (short shape)", problems))
    cfg.description = "from the short JSON shape: " + json.dumps(data, sort_keys=True)
    try:  # re-validate the edited parts
        QuantConfig.from_dict(cfg.weights.to_dict())
        DeltaCacheConfig.from_dict(cfg.cache.to_dict())
    except ValueError as e:
        raise ValueError(f"invalid conversion config: {e}") from None
    return cfg


def from_json_dict(data: Any) -> ConvertConfig:
    """A config from parsed JSON: the full schema (``to_dict()``) or the seed's short shape.

    The shape is told by the keys: a key of the short shape and none of the full schema is the
    short shape (an unknown key there is reported with the closest short-shape key); keys of
    both shapes, or none, are refused."""
    if not isinstance(data, dict):
        raise ValueError(f"a conversion config must be a JSON object, got {type(data).__name__}")
    if not data:
        raise ValueError(f"the conversion config is empty: name a preset ({', '.join(PRESETS)}), or give at "
                         "least \"weights\" and \"activations\" (preset(name).to_dict() shows complete ones)")
    seed, full = _shape_keys(data)
    if seed and full:
        raise ValueError(f"the config mixes the short shape's keys {sorted(seed)} with the full "
                         f"schema's {sorted(full)}: use one shape")
    if seed:
        return _from_seed_shape(data)
    return ConvertConfig.from_dict(data)


def _shape_keys(data: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(keys of the short shape, keys of the full schema) in ``data``. ``"attention"`` is in both:
    with ``bits``/``symmetric`` it is the short shape's, with ``blocks``/``steps`` the full
    schema's; otherwise (``null``, ``{}``) it goes with the other keys, and alone with the short
    shape (as before the full schema had it)."""
    full_fields = {f.name for f in dataclasses.fields(ConvertConfig)} - {"attention"}
    seed, full = set(data) & (_SEED_KEYS - {"attention"}), set(data) & full_fields
    if "attention" in data:
        attention = data["attention"]
        if isinstance(attention, dict) and set(attention) & _SEED_ATTENTION_KEYS:
            seed.add("attention")
        elif isinstance(attention, dict) and set(attention) & {f.name for f in dataclasses.fields(AttentionQuantConfig)}:
            full.add("attention")
        else:
            (full if full else seed).add("attention")
    return seed, full


def resolve(spec: str | os.PathLike | dict | ConvertConfig | QuantConfig) -> ConvertConfig:
    """Turn what a user passes as ``quant_config`` into a validated :class:`ConvertConfig`.

    ``spec``: a preset name (:data:`PRESETS`), a path to a ``.json`` file, a dict in either JSON
    shape, a :class:`ConvertConfig`, or a :class:`~sixbit.QuantConfig` (weights only; its
    ``act_mode`` becomes ``activations``).
    """
    if isinstance(spec, ConvertConfig):
        return spec
    if isinstance(spec, QuantConfig):
        return ConvertConfig(weights=spec, activations=spec.act_mode)
    if isinstance(spec, dict):
        return from_json_dict(spec)
    if isinstance(spec, (str, os.PathLike)):
        if isinstance(spec, str) and spec in PRESETS:
            return preset(spec)
        path = Path(spec)
        if path.suffix.lower() == ".json" or path.is_file():
            data = read_json(path, "config file")
            try:
                return from_json_dict(data)
            except ValueError as e:
                raise ValueError(f"{str(path)!r}: {e}") from None
        raise ValueError(f"unknown preset {str(spec)!r}; choose one of {sorted(PRESETS)}, or a path to a .json file")
    raise ValueError(
        f"quant_config must be a preset name, a .json path, a dict, a ConvertConfig or a QuantConfig, "
        f"got {type(spec).__name__}"
    )


_MAX_JSON = 1 << 20  # bytes: a conversion config is a few hundred


def read_json(path: Path, what: str) -> Any:
    """Parse the JSON file ``path`` strictly: at most 1 MiB, no ``NaN``/``Infinity`` (not JSON),
    nesting within Python's limits; every problem a one-line ``ValueError``."""
    if not path.is_file():
        raise ValueError(f"{what} {str(path)!r} does not exist" + (" (it is a folder)" if path.is_dir() else ""))
    if path.stat().st_size > _MAX_JSON:
        raise ValueError(f"{what} {str(path)!r} is {path.stat().st_size} bytes; a config is at most {_MAX_JSON}: wrong file?")

    def refuse(constant):
        raise ValueError(f"{constant} is not standard JSON: write a finite number")

    try:
        return json.loads(path.read_text(), parse_constant=refuse)
    except RecursionError:
        raise ValueError(f"{what} {str(path)!r} is nested too deeply to be a config") from None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{what} {str(path)!r} is not valid JSON: {show(str(e), 200)}") from None
