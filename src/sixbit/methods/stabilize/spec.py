"""Registers the ``stabilize`` method in :mod:`sixbit.methods.registry`: how a conversion chooses,
fits, installs and stores it."""

from __future__ import annotations

from torch import nn

from ...config.convert import Activations
from ...models import spec_for
from ...runtime import hooks
from ..registry import MethodSpec, register_method
from .method import (
    GRID_HOOK_NAME,
    StabilizeConfig,
    apply_stabilizer,
    remove_stabilizer,
)

#: The activations a stabilizer acts on (it splits dynamically quantized inputs).
DYNAMIC_ACTIVATIONS = (Activations.INT8, Activations.NVFP4, Activations.DYNAMIC)


def _check(model: nn.Module, config: StabilizeConfig, convert_config) -> None:
    if convert_config.activations not in DYNAMIC_ACTIVATIONS:
        raise ValueError(
            f"stabilize_frames acts on dynamically quantized activations, which activations={convert_config.activations!r} "
            "does not have: choose a preset with int8, nvfp4 or dynamic activations (e.g. 'balanced')"
        )
    if spec_for(model).video_grid is None:
        raise ValueError(f"stabilize_frames is not available for {type(model).__name__}: its token grid is unknown")


def _load(deadzone, model: nn.Module, modules: dict[str, nn.Module]) -> StabilizeConfig:
    if isinstance(deadzone, bool) or not isinstance(deadzone, (int, float)) or not deadzone >= 0:
        raise ValueError(f"the conversion state has an invalid stabilize_frames value {deadzone!r}")
    return StabilizeConfig(deadzone)


def _installed(model: nn.Module) -> StabilizeConfig | None:
    hook = hooks.get(model, GRID_HOOK_NAME)
    return None if hook is None else StabilizeConfig(hook.state.deadzone)


SPEC = register_method(MethodSpec(
    name="stabilize",
    config_type=StabilizeConfig,
    order=30,
    attribute="stabilizer",
    select=lambda config, extra: extra.get("stabilize"),
    apply=apply_stabilizer,
    remove=remove_stabilizer,
    check=_check,
    state_key="stabilize_frames",
    dump=lambda config: config.deadzone,
    load=_load,
    installed=_installed,
    chunkable="the frame stabilizer (stabilize_frames) splits each call's video tokens by frame: chunks would "
              "change the video",
))
