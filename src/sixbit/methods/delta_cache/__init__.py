"""The delta cache (TDC + PDR): skip blocks whose residual is stable, replay it with its drift.

Registered as the method ``"cache"``: chosen by ``ConvertConfig.cache`` (a
:class:`DeltaCacheConfig`, stored with the config). With ``min_psnr`` a conversion calibrates its
budget first (:func:`calibrate_budget`) and stores the budget it chose.
"""

from ...config.delta_cache import CACHE_FORMATS, DeltaCacheConfig
from .method import (
    DeltaCache,
    PurifiedRefresh,
    apply_delta_cache,
    check_no_diffusers_cache,
    disable_delta_cache,
    enable_delta_cache,
    remove_delta_cache,
)
from .calibrate import BUDGETS, calibrate_budget
from .state import DeltaCacheReport
from .spec import SPEC  # registers the method

__all__ = [
    "BUDGETS", "SPEC", "CACHE_FORMATS", "DeltaCache", "DeltaCacheConfig", "DeltaCacheReport", "PurifiedRefresh",
    "apply_delta_cache", "calibrate_budget", "check_no_diffusers_cache", "disable_delta_cache", "enable_delta_cache", "remove_delta_cache"
]
