"""The one place that touches diffusers' hook registry (``module._diffusers_hook``).

sixbit's runtime methods, parallel routing and offloading are diffusers ``ModelHook`` objects
registered by name on a module (:class:`diffusers.hooks.HookRegistry`). The registry is stored
in a private attribute of the module, and diffusers wraps each later hook around the earlier
ones. Reading it is written once here, so a change in diffusers is fixed in one file.
"""

from __future__ import annotations

from collections.abc import Iterator

from diffusers.hooks import HookRegistry, ModelHook
from torch import nn

_ATTRIBUTE = "_diffusers_hook"  # where diffusers keeps a module's HookRegistry


def register(module: nn.Module, hook: ModelHook, name: str) -> ModelHook:
    """Register ``hook`` on ``module`` under ``name`` (outermost: it wraps the hooks already there)."""
    HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, name)
    return hook


def get(module: nn.Module, name: str) -> ModelHook | None:
    """The hook named ``name`` on ``module``, or ``None`` (also when ``module`` has no hooks)."""
    registry = getattr(module, _ATTRIBUTE, None)
    return registry.get_hook(name) if registry is not None else None


def remove(module: nn.Module, name: str) -> bool:
    """Remove the hook named ``name`` from ``module`` alone (not its children); whether there was one."""
    registry = getattr(module, _ATTRIBUTE, None)
    if registry is None or registry.get_hook(name) is None:
        return False
    registry.remove_hook(name, recurse=False)
    return True


def names(module: nn.Module) -> list[str]:
    """The names of ``module``'s hooks, innermost first (the order diffusers wraps them in)."""
    registry = getattr(module, _ATTRIBUTE, None)
    return [] if registry is None else list(registry._hook_order)


def hooks_of(module: nn.Module) -> Iterator[ModelHook]:
    """Every hook on ``module``, innermost first."""
    registry = getattr(module, _ATTRIBUTE, None)
    if registry is not None:
        yield from (registry.get_hook(name) for name in list(registry._hook_order))


def diffusers_cache(model: nn.Module) -> str | None:
    """The config class name of the diffusers cache ``model.enable_cache(...)`` enabled
    (``"FirstBlockCacheConfig"``, ``"PyramidAttentionBroadcastConfig"``…), or ``None``."""
    config = getattr(model, "_cache_config", None)  # diffusers' CacheMixin keeps the enabled config here
    return None if config is None else type(config).__name__


def register_innermost(module: nn.Module, hook: ModelHook, name: str) -> None:
    """Register ``hook`` under every hook already on ``module``, so its ``pre_forward`` sees the
    state the other hooks set up (diffusers only adds hooks outermost: the others are taken off
    and put back around it, in their order)."""
    registry = HookRegistry.check_if_exists_or_initialize(module)
    existing = [(n, registry.get_hook(n)) for n in list(registry._hook_order)]
    for n, _ in reversed(existing):
        registry.remove_hook(n, recurse=False)
    registry.register_hook(hook, name)
    for n, h in existing:
        registry.register_hook(h, n)


__all__ = ["diffusers_cache", "get", "hooks_of", "names", "register", "register_innermost", "remove"]
