"""Registers the ``static_w8a8`` method in :mod:`sixbit.methods.registry`: how a conversion chooses,
fits, installs and stores it."""

from __future__ import annotations

import logging
from collections.abc import Callable

from torch import nn

from ...calibration import calibrate
from ...config.static_w8a8 import StaticW8A8Config
from ..registry import MethodSpec, register_method
from .layers import (
    _export,
    _prepare,
)
from .method import apply_static_w8a8

logger = logging.getLogger(__name__)


def _fit(model: nn.Module, config: StaticW8A8Config, run: Callable[[], object], calibration: dict | None) -> None:
    """Record the calibration runs' statistics and quantize ``model`` to static W8A8 with them."""
    logger.info("calibrating static W8A8 ranges")
    apply_static_w8a8(model, config, calibrate(model, run))


SPEC = register_method(MethodSpec(
    name="static_w8a8",
    config_type=StaticW8A8Config,
    order=0,
    attribute=None,
    needs_calibration=True,
    fit=_fit,
    export=_export,
    prepare=_prepare,
))
