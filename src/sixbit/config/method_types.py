"""The config types of the registered runtime methods, by method name.

A method registered in :mod:`sixbit.methods.registry` is chosen by the type of its config: a
:class:`~sixbit.ConvertConfig` holding an instance of that type runs it. The built-in methods'
configs have fields of their own (``dmpq``, ``static``, ``cache``, ``attention``); any other
method's config goes in ``ConvertConfig.methods`` and is stored in JSON and checkpoints under the
method's name (``{"methods": {"my_method": {...}}}``), which this table turns back into its type.
"""

from __future__ import annotations

import dataclasses

_TYPES: dict[str, type] = {}


def register_config_type(name: str, config_type: type) -> None:
    """Store configs of ``config_type`` (a dataclass) under the method name ``name``."""
    if not (isinstance(config_type, type) and dataclasses.is_dataclass(config_type)):
        raise ValueError(f"method {name!r}: its config type must be a dataclass, got {config_type!r}")
    _TYPES[name] = config_type


def unregister_config_type(name: str) -> None:
    """Forget the config type of ``name`` (a no-op when unknown)."""
    _TYPES.pop(name, None)


def config_type_of(name: str) -> type:
    """The config type registered under ``name``."""
    if name not in _TYPES:
        raise ValueError(f"no registered runtime method is called {name!r} (registered: {sorted(_TYPES)}): import "
                         "the package that registers it (sixbit.methods.registry.register_method) before reading it")
    return _TYPES[name]


def name_of(config_type: type) -> str | None:
    """The method name ``config_type`` is registered under, or ``None``."""
    return next((name for name, tp in _TYPES.items() if tp is config_type), None)


__all__ = ["config_type_of", "name_of", "register_config_type", "unregister_config_type"]
