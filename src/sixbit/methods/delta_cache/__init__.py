"""The delta cache (TDC + PDR): skip blocks whose residual is stable, replay it with its drift.

Registered as the method ``"cache"``: chosen by ``ConvertConfig.cache`` (a
:class:`DeltaCacheConfig`, stored with the config).
"""

import dataclasses

from ...config.delta_cache import CACHE_FORMATS, DeltaCacheConfig
from ...models import spec_for
from ...runtime import blocks
from ..registry import MethodSpec, register_method
from .method import (
    DeltaCache,
    DeltaCacheReport,
    PurifiedRefresh,
    apply_delta_cache,
    check_no_diffusers_cache,
    disable_delta_cache,
    enable_delta_cache,
    remove_delta_cache,
)

register_method(MethodSpec(
    name="cache",
    config_type=DeltaCacheConfig,
    order=40,
    attribute="cache",
    select=lambda config, extra: config.cache,
    apply=apply_delta_cache,
    remove=remove_delta_cache,
    # an unsupported architecture, or a diffusers cache already enabled, fails here
    check=lambda model, config, convert_config: (spec_for(model), check_no_diffusers_cache(model)),
    installed=lambda model: getattr(next(blocks.attached(model, DeltaCache), None), "config", None),
    record=lambda config, applied: dataclasses.replace(config, cache=applied),
))

__all__ = [
    "CACHE_FORMATS",
    "DeltaCache",
    "DeltaCacheConfig",
    "DeltaCacheReport",
    "PurifiedRefresh",
    "apply_delta_cache",
    "check_no_diffusers_cache",
    "disable_delta_cache",
    "enable_delta_cache",
    "remove_delta_cache",
]
