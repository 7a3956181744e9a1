"""The fixed activation precision's policy: :func:`apply_default_precision` / :func:`remove_default_precision`."""

from __future__ import annotations

from torch import nn

from ...config.convert import Activations
from ...nn.precision import ActMode, Level, act_mode
from ...runtime.context import track_steps, tracker_of
from ...runtime.wrapped import changes_model

#: The ``activations`` values that are a fixed precision (the others choose a method).
FIXED = (Activations.INT8, Activations.NVFP4, Activations.FP)


class DefaultPrecision:
    """Precision policy of a conversion's fixed activations: every quantized linear runs at ``mode``
    unless a method of higher precedence (PDR) decides otherwise."""

    def __init__(self, mode: ActMode | str):
        self.mode = act_mode(mode)

    def __call__(self, layer: nn.Module, x) -> ActMode:
        return self.mode


@changes_model("set a default precision")
def apply_default_precision(model: nn.Module, mode: ActMode | str) -> DefaultPrecision:
    """Run ``model``'s quantized linears at ``mode`` by default (replacing a default set before)."""
    remove_default_precision(model)
    policy = DefaultPrecision(mode)
    track_steps(model).precision.register(Level.DEFAULT, policy)
    return policy


@changes_model("remove the default precision")
def remove_default_precision(model: nn.Module) -> None:
    """Remove the default precision set by :func:`apply_default_precision` (no-op when none is)."""
    tracker = tracker_of(model)
    policy = None if tracker is None else tracker.precision.policy(Level.DEFAULT)
    if isinstance(policy, DefaultPrecision):
        tracker.precision.unregister(policy)
