"""The delta cache (TDC + PDR): skip blocks whose residual is stable, replay it with its drift."""

from ...config.delta_cache import CACHE_FORMATS, DeltaCacheConfig
from .method import (
    DeltaCache,
    DeltaCacheReport,
    PurifiedRefresh,
    disable_delta_cache,
    enable_delta_cache,
)

__all__ = [
    "CACHE_FORMATS",
    "DeltaCache",
    "DeltaCacheConfig",
    "DeltaCacheReport",
    "PurifiedRefresh",
    "disable_delta_cache",
    "enable_delta_cache",
]
