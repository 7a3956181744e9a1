"""Static, timestep-aware W8A8: every activation scale fixed offline, per time range.

Registered as the method ``"static_w8a8"``: chosen by ``activations="static"`` (its
:class:`StaticW8A8Config`), fitted on the calibration runs (it quantizes the weights itself);
its per-range parameters are a checkpoint extension of their own, restored before the
conversion record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from ...calibration import calibrate
from ...config.convert import Activations
from ...config.static_w8a8 import PRESETS, Outliers, Smoothing, StaticW8A8Config
from ..registry import MethodSpec, register_method
from .layers import StaticActQuantizer, StaticW8A8Info, StaticW8A8State, _export, _prepare, range_parameters, static_w8a8_info
from .method import apply_static_w8a8

logger = logging.getLogger(__name__)


def _fit(model: nn.Module, config: StaticW8A8Config, run: Callable[[], object], calibration: dict | None) -> None:
    """Record the calibration runs' statistics and quantize ``model`` to static W8A8 with them."""
    logger.info("calibrating static W8A8 ranges")
    apply_static_w8a8(model, config, calibrate(model, run))


register_method(MethodSpec(
    name="static_w8a8",
    config_type=StaticW8A8Config,
    order=0,
    attribute=None,
    select=lambda config, extra: config.static if config.activations == Activations.STATIC else None,
    needs_calibration=True,
    fit=_fit,
    export=_export,
    prepare=_prepare,
))

__all__ = [
    "PRESETS",
    "Outliers",
    "Smoothing",
    "StaticActQuantizer",
    "StaticW8A8Config",
    "StaticW8A8Info",
    "StaticW8A8State",
    "apply_static_w8a8",
    "range_parameters",
    "static_w8a8_info",
]
