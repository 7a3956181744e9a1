"""LoRAs on converted models: each adapter becomes a 16-bit low-rank side branch of the layers it
targets, beside the packed weight (never merged into it: re-quantizing would lose the LoRA's
small update in the 4-bit rounding, and scale changes would need the original weights).

:func:`load_lora` reads a LoRA file in diffusers / PEFT layout (``<module>.lora_A.weight`` and
``<module>.lora_B.weight``, optionally prefixed with ``transformer.``; the scale ``alpha / r``
from PEFT's ``lora_adapter_metadata`` or per-module ``.alpha`` entries, else 1), read and checked
by :mod:`sixbit.lora.files`. Quantized layers (:class:`~sixbit.nn.QuantLinear`) carry the
branch themselves; full-precision ``nn.Linear`` layers a LoRA also targets get it through a
diffusers hook (the innermost of the layer's). Several adapters may be loaded at
once, each with its own scale (:func:`set_lora_scale`; 0 switches one off exactly) and
removed again (:func:`unload_lora`).

diffusers' own entry points work on a converted transformer and go through here
(:mod:`sixbit.integrations.diffusers.lora`): ``pipe.load_lora_weights(...)``, ``pipe.set_adapters(names,
weights)``, ``pipe.disable_lora()`` / ``enable_lora()``, ``pipe.delete_adapters(...)`` and
``pipe.unload_lora_weights()``; ``pipe.fuse_lora()`` is refused (a packed weight cannot absorb a
LoRA without requantizing it).

Example:
    >>> sixbit.load_lora(pipe, "my_lora.safetensors", scale=0.8)          # doctest: +SKIP
    >>> sixbit.set_lora_scale(pipe, 0.0)                                   # doctest: +SKIP
    >>> sixbit.unload_lora(pipe)                                           # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import weakref

import torch
from diffusers.hooks import ModelHook
from torch import nn

from . import files
from ..models import transformer_of
from ..nn import QuantLinear
from ..nn.lowrank import branch_factors, low_rank
from ..runtime import hooks
from ..runtime.wrapped import changes_model, check_not_driven, wrapper_of
from ..config.validate import show

# full-precision nn.Linear targets: {layer: {adapter: [down, up, scale]}}, and one hook each (HOOK_NAME)
_LINEAR: "weakref.WeakKeyDictionary[nn.Linear, dict[str, list]]" = weakref.WeakKeyDictionary()
HOOK_NAME = "sixbit_lora"


def checked_scale(value, what: str = "scale") -> float:
    """A LoRA scale as a float: a finite real number (NaN or inf would turn every output into NaN)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number, got {show(value)}: e.g. 1.0 (full strength) or 0 (off)")
    return float(value)


def load_lora(model_or_pipe, lora, scale: float = 1.0, adapter_name: str = "default"):
    """Load a LoRA onto a (converted) transformer as 16-bit side branches.

    Args:
        model_or_pipe: the transformer or its pipeline.
        lora: a ``.safetensors`` file or a state dict in diffusers / PEFT layout.
        scale: multiplies the LoRA's own ``alpha / r`` (default 1.0; 0 loads it switched off).
        adapter_name: its name, for :func:`set_lora_scale` / :func:`unload_lora` (default
            ``"default"``); loading a second adapter under another name stacks them.

    Everything is checked (every targeted module exists and is a linear layer of the LoRA's
    shape; the name is free) before any layer changes. Returns ``model_or_pipe``.
    """
    load_factors(transformer_of(model_or_pipe), *files.read(lora), checked_scale(scale), adapter_name)
    return model_or_pipe


def check_not_split(model: nn.Module) -> None:
    """Refuse a LoRA on a model a TensorParallelWrapper has cut into row shards (tensor mode):
    its layers hold 1/N of their rows, which no LoRA file fits, however right the file is."""
    check_not_driven(model, "load the LoRA")
    wrapper = wrapper_of(model)
    if wrapper is not None and wrapper.mode == "tensor" and wrapper.shards is not None:
        raise ValueError(f"this model is already split across {wrapper.world} ranks by a TensorParallelWrapper "
                         "(mode='tensor'), so each layer holds only its rank's rows: load the LoRA before wrapping "
                         "(every rank loads it, then wraps; the split carries it into each rank's shards)")


def load_factors(model: nn.Module, tensors: dict[str, torch.Tensor], meta: dict, scale: float, adapter_name: str) -> None:
    """Load a LoRA already read into ``(tensors, meta)`` (:func:`sixbit.lora.files.read`) onto ``model``."""
    check_not_split(model)
    if not isinstance(adapter_name, str) or not adapter_name.isidentifier():
        raise ValueError(f"adapter_name must be a Python identifier, got {show(adapter_name)}")
    if adapter_name in loras(model):
        raise ValueError(f"a LoRA called {adapter_name!r} is already loaded: unload it or choose another adapter_name")
    if peft_layers(model):  # its layers are PEFT's wrappers now, which sixbit's branches do not go on
        raise ValueError(f"LoRA(s) {list(getattr(model, 'peft_config', None) or {})} are loaded through PEFT "
                         "(load_lora_adapter / pipe.load_lora_weights) on this full-precision model: load every LoRA "
                         "the same way, or unload them (pipe.unload_lora_weights()) and load this one with sixbit")
    pairs = files.pairs(tensors, meta)
    modules = dict(model.named_modules())
    problems = []
    for name, (down, up, _) in pairs.items():
        layer = modules.get(name)
        if not isinstance(layer, (nn.Linear, QuantLinear)):
            problems.append(f"{show(name, 80)}: {'not in the model' if layer is None else type(layer).__name__ + ', not a linear layer'}")
        elif down.dim() != 2 or up.dim() != 2 or down.shape[1] != layer.in_features or up.shape != (layer.out_features, down.shape[0]):
            problems.append(f"{show(name, 80)}: LoRA {tuple(down.shape)}/{tuple(up.shape)} vs layer {layer.in_features}→{layer.out_features}")
    if problems:
        raise ValueError(f"this LoRA does not fit {type(model).__name__}: {problems[:5]} (was it made for another model?)")
    broken = [p for name, (down, up, _) in pairs.items() for p in files.factor_problems(name, down, up)]
    if broken:
        raise ValueError(f"this LoRA's weights cannot run: {broken[:5]}; the file is damaged or was saved "
                         "from a diverged training run")
    state = _state(model)
    applied = scale if state.enabled else 0.0  # loaded while LoRAs are switched off: off as well
    for name, (down, up, factor) in pairs.items():
        layer = modules[name]
        if isinstance(layer, QuantLinear):
            layer.add_lora(adapter_name, down, up, applied * factor)
        else:
            _LINEAR.setdefault(layer, {})[adapter_name] = [*branch_factors(down, up), applied * factor]
            if hooks.get(layer, HOOK_NAME) is None:
                hooks.register_innermost(layer, _LinearLora(), HOOK_NAME)
    state.factors[adapter_name] = {n: f for n, (_, _, f) in pairs.items()}
    state.scales[adapter_name] = scale


def linear_factors(model: nn.Module) -> dict[str, dict[str, list]]:
    """The LoRA terms of ``model``'s full-precision linears by layer name. They are kept beside the
    layers, not in them, so a copy of the model made by pickling (the workers of a
    TensorParallelWrapper) needs them again: :func:`set_linear_factors`."""
    return {name: {adapter: list(entry) for adapter, entry in _LINEAR[m].items()}
            for name, m in model.named_modules() if m in _LINEAR}


def set_linear_factors(model: nn.Module, factors: dict[str, dict[str, list]]) -> None:
    """Give the full-precision linears of a copy of a model the LoRA terms :func:`linear_factors`
    read from the original (the copy's hooks are already in place)."""
    modules = dict(model.named_modules())
    for name, entries in factors.items():
        _LINEAR[modules[name]] = {adapter: list(entry) for adapter, entry in entries.items()}


def linear_up_factors(layer: nn.Linear) -> dict[str, torch.Tensor]:
    """The up factor (one row per output row) of each LoRA on a full-precision ``nn.Linear``, by
    adapter name: what a tensor-parallel split cuts with the layer's rows."""
    return {adapter: entry[1] for adapter, entry in _LINEAR.get(layer, {}).items()}


def set_linear_up(layer: nn.Linear, adapter_name: str, up: torch.Tensor) -> None:
    """Replace the up factor of LoRA ``adapter_name`` on ``layer`` (a row shard's, or the joined rows)."""
    _LINEAR[layer][adapter_name][1] = up


class _LinearLora(ModelHook):
    """A full-precision linear's LoRA terms, added to its own output. The innermost of the layer's
    diffusers hooks, so it sees the input and output the layer itself computes with: a
    sequence-parallel split gathers the output of some layers (``proj_out``) in a hook around it,
    and a tensor-parallel one gathers inputs before and outputs after it."""

    def new_forward(self, module: nn.Linear, *args, **kwargs):
        output = self.fn_ref.original_forward(*args, **kwargs)
        x = args[0] if args else kwargs["input"]
        for down, up, scale in _LINEAR.get(module, {}).values():
            if scale:
                output = output + scale * low_rank(x, down, up)
        return output


@dataclasses.dataclass
class LoraState:
    """The LoRAs loaded on one transformer.

    ``factors``: ``{adapter: {module: alpha / r}}``, in load order; ``scales``: each adapter's
    scale as last set (``load_lora``'s ``scale``, :func:`set_lora_scale`); ``enabled``: ``False``
    while :func:`set_loras_enabled` has switched every adapter off (its scale is kept).
    """

    factors: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    scales: dict[str, float] = dataclasses.field(default_factory=dict)
    enabled: bool = True


_STATES: "weakref.WeakKeyDictionary[nn.Module, LoraState]" = weakref.WeakKeyDictionary()


def _state(model: nn.Module) -> LoraState:
    return _STATES.setdefault(model, LoraState())


def lora_state(model_or_pipe) -> LoraState:
    """The :class:`LoraState` of the transformer (live: it changes as LoRAs are loaded and set)."""
    return _state(transformer_of(model_or_pipe))


def loras(model_or_pipe) -> list[str]:
    """Names of the LoRAs loaded on the transformer, in load order."""
    return list(_state(transformer_of(model_or_pipe)).factors)


def peft_layers(model: nn.Module) -> list[str]:
    """Names of ``model``'s layers wrapped by PEFT: a LoRA loaded onto the full-precision model by
    diffusers (``load_lora_adapter``, what ``pipe.load_lora_weights`` calls) or ``add_adapter``."""
    return [name for name, m in model.named_modules() if type(m).__module__.startswith("peft.tuners.")]


def check_no_loras(model: nn.Module, action: str) -> None:
    """Refuse ``action`` (a conversion, ``sixbit.quantize`` or a checkpoint load) on a model with
    LoRAs loaded: it replaces the layers they are attached to, and they would silently stop acting.
    A PEFT LoRA's wrapper layers would be left around a quantized layer that PEFT cannot run."""
    wrapped = peft_layers(model)
    if wrapped:
        adapters = list(getattr(model, "peft_config", None) or {})
        raise ValueError(f"{action} replaces layers PEFT has wrapped for LoRA(s) {adapters} (loaded by "
                         f"load_lora_adapter / pipe.load_lora_weights; {len(wrapped)} layers, e.g. {wrapped[0]!r}), "
                         "which PEFT cannot run once quantized: fuse the LoRA into the full-precision weights first "
                         "(pipe.fuse_lora(), then pipe.unload_lora_weights()), or convert first and load the LoRA "
                         "afterwards (pipe.load_lora_weights on the converted model runs it beside the packed weights)")
    if loras(model):
        raise ValueError(f"{action} replaces the layers that LoRA(s) {loras(model)} are attached to: unload them "
                         "first (sixbit.unload_lora) and load them again afterwards")


def _adapters(model: nn.Module, adapter_name: str | None) -> list[str]:
    names = loras(model) if adapter_name is None else [adapter_name]
    missing = [n for n in names if n not in _state(model).factors]
    if missing:
        raise ValueError(f"no LoRA called {missing[0]!r} is loaded (loaded: {loras(model)})")
    return names


def _apply_scales(model: nn.Module, adapters: list[str]) -> None:
    """Give the layers of ``adapters`` their scale (0 while LoRAs are switched off)."""
    state = _state(model)
    modules = dict(model.named_modules())
    for adapter in adapters:
        scale = state.scales[adapter] if state.enabled else 0.0
        for name, factor in state.factors[adapter].items():
            layer = modules[name]
            if isinstance(layer, QuantLinear):
                layer.set_lora_scale(adapter, scale * factor)
            else:
                _LINEAR[layer][adapter][2] = scale * factor


@changes_model("set_lora_scale")
def set_lora_scale(model_or_pipe, scale: float, adapter_name: str | None = None) -> None:
    """Set the scale of one LoRA (or of all, ``adapter_name=None``); 0 switches it off exactly.
    While LoRAs are switched off (:func:`set_loras_enabled`) the scale is kept for when they are
    switched on again."""
    scale = checked_scale(scale)
    model = transformer_of(model_or_pipe)
    adapters = _adapters(model, adapter_name)
    for adapter in adapters:
        _state(model).scales[adapter] = scale
    _apply_scales(model, adapters)


@changes_model("switch LoRAs on or off")
def set_loras_enabled(model_or_pipe, enabled: bool) -> None:
    """Switch every loaded LoRA off (``False``: the layers compute exactly as without them) or
    back on at the scales they had (``True``); LoRAs loaded while off stay off until then."""
    model = transformer_of(model_or_pipe)
    _state(model).enabled = bool(enabled)
    _apply_scales(model, loras(model))


@changes_model("unload_lora")
def unload_lora(model_or_pipe, adapter_name: str | None = None) -> None:
    """Remove one LoRA (or all, ``adapter_name=None``): the layers compute exactly as before it."""
    model = transformer_of(model_or_pipe)
    modules = dict(model.named_modules())
    state = _state(model)
    for adapter in _adapters(model, adapter_name):
        state.scales.pop(adapter)
        for name in state.factors.pop(adapter):
            layer = modules[name]
            if isinstance(layer, QuantLinear):
                layer.remove_lora(adapter)
                continue
            del _LINEAR[layer][adapter]
            if not _LINEAR[layer]:
                del _LINEAR[layer]
                hooks.remove(layer, HOOK_NAME)
    if not state.factors:  # nothing left: a LoRA loaded next starts switched on
        state.enabled = True
