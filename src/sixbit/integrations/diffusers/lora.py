"""diffusers' LoRA entry points on a converted transformer, routed to :mod:`sixbit.lora`.

PEFT cannot wrap a :class:`~sixbit.nn.QuantLinear`, and diffusers' own ``PeftAdapterMixin``
methods only act on PEFT layers: on a converted transformer they would silently do nothing.
:func:`attach_diffusers_methods` (run on every converted, loaded or ``from_pretrained``-quantized
transformer) replaces them with methods acting on sixbit's 16-bit side branches:

========================================  ==============================================================
transformer method (pipeline method)      what it does here
========================================  ==============================================================
``load_lora_adapter``                     :func:`sixbit.load_lora` (``pipe.load_lora_weights``)
``set_adapters`` / ``set_adapter``        each named adapter's scale; the others off (``pipe.set_adapters``)
``disable_lora`` / ``enable_lora``        every adapter off / back at its scale (``pipe.disable_lora``)
``delete_adapters``                       :func:`sixbit.unload_lora` of those (``pipe.delete_adapters``)
``unload_lora``                           every adapter removed (``pipe.unload_lora_weights``)
``active_adapters``                       the adapters whose scale is not 0 while LoRAs are on
``fuse_lora``                             refused: :func:`fuse_lora` (``pipe.fuse_lora``)
``save_lora_adapter``                     refused: save the LoRA file that was loaded
========================================  ==============================================================

``unfuse_lora`` stays diffusers' (nothing is ever fused, so it changes nothing). ``peft_config``
is the live ``{adapter: {module: alpha / r}}`` of the loaded LoRAs: pipelines list adapters
through it (``pipe.get_list_adapters()``, which ``pipe.set_adapters`` checks names against).

Two pipeline-level features look for PEFT layers themselves and do not see these LoRAs:
``pipe.get_active_adapters()`` returns ``[]`` (ask ``pipe.transformer.active_adapters()``), and a
per-call LoRA scale (``attention_kwargs={"scale": s}``) is not applied (set it with
``pipe.set_adapters(name, s)``).
"""

from __future__ import annotations

import os
import types

import torch
from torch import nn

from ...config.validate import show
from ...lora import files as lora_files
from ...lora import checked_scale, load_factors, lora_state, loras, set_lora_scale, set_loras_enabled, unload_lora


def load_lora_adapter(self, pretrained_model_name_or_path_or_dict, prefix="transformer", adapter_name=None,
                      metadata=None, network_alphas=None, weight_name=None, hotswap=False, **kwargs):
    """diffusers' ``load_lora_adapter``: :func:`sixbit.load_lora` of a file, folder or state dict."""
    if hotswap:
        raise ValueError("hotswap=True is not supported on a converted transformer: unload the LoRA "
                         "(pipe.delete_adapters(name)) and load the new one")
    source = pretrained_model_name_or_path_or_dict
    if isinstance(source, (str, os.PathLike)) and os.path.isdir(source):  # diffusers' folder + weight_name
        source = os.path.join(source, weight_name or "pytorch_lora_weights.safetensors")
    tensors, meta = lora_files.read(source)
    alphas = {k: torch.tensor(checked_scale(v, f"network_alphas[{k!r}]")) for k, v in (network_alphas or {}).items()}
    tensors = {**tensors, **alphas}
    if prefix and any(k.startswith(f"{prefix}.") for k in tensors):
        tensors = {k.removeprefix(f"{prefix}."): v for k, v in tensors.items() if k.startswith(f"{prefix}.")}
    meta = lora_files.own_metadata(metadata, prefix) if metadata else meta
    load_factors(self, tensors, meta, 1.0, adapter_name or f"default_{len(loras(self))}")


def set_adapters(self, adapter_names, weights=None):
    """diffusers' ``set_adapters``: the named adapters at ``weights`` (default 1), the others off."""
    names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
    unknown = [n for n in names if n not in loras(self)]
    if unknown:  # as diffusers: an unknown name is an error, not "switch everything off"
        raise ValueError(f"adapter name(s) {unknown} are not loaded; loaded adapters: {loras(self)}")
    weights = list(weights) if isinstance(weights, (list, tuple)) else [weights] * len(names)  # as diffusers
    if len(weights) != len(names):
        raise ValueError(f"set_adapters got {len(names)} adapter names but {len(weights)} weights: give one per name")
    for name, w in zip(names, weights):
        if isinstance(w, dict):  # diffusers reads a dict as {layer name part: weight}
            raise ValueError(f"the weight of adapter {name!r} is {show(w)}, a dict of per-layer weights, which a "
                             "converted transformer does not take (it scales each adapter as a whole): give one "
                             f"number per adapter, e.g. set_adapters({names!r}, {[1.0] * len(names)!r})")
    weights = [checked_scale(1.0 if w is None else w, f"the weight of adapter {name!r}") for name, w in zip(names, weights)]
    for name in loras(self):  # diffusers: the adapters not named are switched off
        set_lora_scale(self, weights[names.index(name)] if name in names else 0.0, name)


def disable_lora(self):
    """diffusers' ``disable_lora``: every adapter off (the layers compute as without them), scales kept."""
    set_loras_enabled(self, False)


def enable_lora(self):
    """diffusers' ``enable_lora``: every adapter back at the scale it had."""
    set_loras_enabled(self, True)


def delete_adapters(self, adapter_names):
    """diffusers' ``delete_adapters``: remove the named adapters."""
    names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
    unknown = [n for n in names if n not in loras(self)]
    if unknown:
        raise ValueError(f"adapter name(s) {unknown} are not loaded; loaded adapters: {loras(self)}")
    for name in names:
        unload_lora(self, name)


def unload_all(self):
    """diffusers' ``unload_lora``: remove every adapter."""
    if loras(self):
        unload_lora(self)


def active_adapters(self) -> list[str]:
    """diffusers' ``active_adapters``: the adapters that change the output now."""
    state = lora_state(self)
    return [name for name in loras(self) if state.enabled and state.scales[name] != 0]


def fuse_lora(self, lora_scale=1.0, safe_fusing=False, adapter_names=None):
    """Refused (a no-op when no LoRA is loaded).

    Fusing adds ``scale · up · down`` to a layer's weight. A converted layer's weight is packed
    (INT8 / NVFP4 codes and scales): absorbing the LoRA would mean dequantizing, adding and
    quantizing again, which rounds most of a LoRA's small update away (and NVFP4 re-rounding
    stacks a second quantization error on the first). So the LoRAs keep running as 16-bit side
    branches beside the packed weights — same outputs as a fused full-precision layer up to the
    base weight's quantization, at the cost of a rank-``r`` product per call. To get a fused
    model, fuse the LoRA into the full-precision model and convert that:
    ``pipe.load_lora_weights(...)``, ``pipe.fuse_lora()``, ``pipe.unload_lora_weights()``,
    then ``sixbit.convert_model(pipe, ...)``.

    Raises:
        ValueError: a LoRA is loaded (nothing changes; it keeps running unfused).
    """
    if loras(self):
        raise ValueError(
            f"fuse_lora: LoRA(s) {loras(self)} run as 16-bit side branches beside packed weights, which cannot absorb "
            "them without requantizing (that rounds the LoRA away); they keep running unfused, with the same output; "
            "to fuse, fuse the LoRA into the full-precision model (load_lora_weights, fuse_lora, unload_lora_weights) "
            "and convert that with sixbit.convert_model"
        )


def save_lora_adapter(self, save_directory, adapter_name="default", *args, **kwargs):
    """Refused: sixbit holds a loaded LoRA as factors of its layers, not as a PEFT adapter."""
    raise ValueError(f"save_lora_adapter: a converted transformer holds LoRA(s) {loras(self)} as loaded, not as a "
                     "PEFT adapter to write back; keep the LoRA file that was loaded (or save it from the "
                     "full-precision model)")


_METHODS = {
    "load_lora_adapter": load_lora_adapter, "set_adapters": set_adapters, "set_adapter": set_adapters,
    "disable_lora": disable_lora, "enable_lora": enable_lora, "disable_adapters": disable_lora,
    "enable_adapters": enable_lora, "delete_adapters": delete_adapters, "unload_lora": unload_all,
    "active_adapters": active_adapters, "fuse_lora": fuse_lora, "save_lora_adapter": save_lora_adapter,
}


def attach_diffusers_methods(model: nn.Module) -> None:
    """Route diffusers' LoRA methods on a converted transformer through :mod:`sixbit.lora` (see
    the module doc) and expose the loaded adapters as ``peft_config``."""
    for attr, fn in _METHODS.items():
        setattr(model, attr, types.MethodType(fn, model))
    model.peft_config = lora_state(model).factors
