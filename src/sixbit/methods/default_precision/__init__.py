"""The conversion's fixed activation precision (``activations="int8"``, ``"nvfp4"``, ``"fp"``).

Every quantized linear runs at the configured mode unless a policy of higher precedence
(PDR's refreshes) decides otherwise: a policy at :attr:`~sixbit.nn.precision.Level.DEFAULT`.
"""

from __future__ import annotations

from torch import nn

from ...config.convert import Activations
from ...nn.precision import ActMode, Level, act_mode
from ...runtime.context import track_steps, tracker_of
from ..registry import MethodSpec, register_method

#: The ``activations`` values that are a fixed precision (the others choose a method).
FIXED = (Activations.INT8, Activations.NVFP4, Activations.FP)


class DefaultPrecision:
    """Precision policy of a conversion's fixed activations: every quantized linear runs at ``mode``
    unless a method of higher precedence (PDR) decides otherwise."""

    def __init__(self, mode: ActMode | str):
        self.mode = act_mode(mode)

    def __call__(self, layer: nn.Module, x) -> ActMode:
        return self.mode


def apply_default_precision(model: nn.Module, mode: ActMode | str) -> DefaultPrecision:
    """Run ``model``'s quantized linears at ``mode`` by default (replacing a default set before)."""
    remove_default_precision(model)
    policy = DefaultPrecision(mode)
    track_steps(model).precision.register(Level.DEFAULT, policy)
    return policy


def remove_default_precision(model: nn.Module) -> None:
    """Remove the default precision set by :func:`apply_default_precision` (no-op when none is)."""
    tracker = tracker_of(model)
    policy = None if tracker is None else tracker.precision.policy(Level.DEFAULT)
    if isinstance(policy, DefaultPrecision):
        tracker.precision.unregister(policy)


def _installed(model: nn.Module) -> Activations | None:
    tracker = tracker_of(model)
    policy = None if tracker is None else tracker.precision.policy(Level.DEFAULT)
    return Activations(policy.mode.value) if isinstance(policy, DefaultPrecision) else None


register_method(MethodSpec(
    name="default_precision",
    config_type=ActMode,
    order=10,
    attribute="default",
    select=lambda config, extra: config.activations if config.activations in FIXED else None,
    apply=apply_default_precision,
    remove=remove_default_precision,
    installed=_installed,
))

__all__ = ["FIXED", "DefaultPrecision", "apply_default_precision", "remove_default_precision"]
