"""Registers the ``default_precision`` method in :mod:`sixbit.methods.registry`: how a conversion chooses,
fits, installs and stores it."""

from __future__ import annotations

from torch import nn

from ...config.convert import Activations
from ...nn.precision import ActMode, Level
from ...runtime.context import tracker_of
from ..registry import MethodSpec, register_method
from .method import FIXED, DefaultPrecision, apply_default_precision, remove_default_precision

def _installed(model: nn.Module) -> Activations | None:
    tracker = tracker_of(model)
    policy = None if tracker is None else tracker.precision.policy(Level.DEFAULT)
    return Activations(policy.mode.value) if isinstance(policy, DefaultPrecision) else None


SPEC = register_method(MethodSpec(
    name="default_precision",
    config_type=ActMode,
    order=10,
    attribute="default",
    select=lambda config, extra: config.activations if config.activations in FIXED else None,
    apply=apply_default_precision,
    remove=remove_default_precision,
    installed=_installed,
))
