"""Registers the ``delta_cache`` method in :mod:`sixbit.methods.registry`: how a conversion chooses,
fits, installs and stores it."""


from ...config.delta_cache import DeltaCacheConfig
from ...models import spec_for
from ...runtime import blocks
from ..registry import MethodSpec, register_method
from .calibrate import calibrate_budget
from .method import (
    DeltaCache,
    apply_delta_cache,
    check_no_diffusers_cache,
    describe_delta_cache,
    remove_delta_cache,
)

SPEC = register_method(MethodSpec(
    name="cache",
    config_type=DeltaCacheConfig,
    order=40,
    attribute="cache",
    apply=apply_delta_cache,
    remove=remove_delta_cache,
    # an unsupported architecture, or a diffusers cache already enabled, fails here
    check=lambda model, config, convert_config: (spec_for(model), check_no_diffusers_cache(model)),
    installed=lambda model: getattr(next(blocks.attached(model, DeltaCache), None), "config", None),
    # min_psnr: the budget is calibrated against the full-precision model's calibration videos
    needs_calibration=lambda config: config.needs_calibration,
    fit=lambda model, config, run, calibration, reference: (
        calibrate_budget(model, config, run, reference) if config.needs_calibration else config),
    reference=True,
    describe=describe_delta_cache,
))
