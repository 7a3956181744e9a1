"""LoRAs on converted models (:mod:`~sixbit.lora.adapters`), read from diffusers / PEFT files
(:mod:`~sixbit.lora.files`). diffusers' own LoRA entry points on a converted transformer live in
:mod:`sixbit.integrations.diffusers.lora`."""

from .adapters import (
    HOOK_NAME,
    LoraState,
    check_no_loras,
    checked_scale,
    check_not_split,
    linear_factors,
    linear_up_factors,
    load_factors,
    load_lora,
    lora_state,
    loras,
    set_linear_factors,
    set_linear_up,
    set_lora_scale,
    set_loras_enabled,
    unload_lora,
)

__all__ = ["HOOK_NAME", "LoraState", "check_no_loras", "checked_scale", "check_not_split", "linear_factors", "linear_up_factors", "load_factors", "load_lora",
           "lora_state", "loras", "set_linear_factors", "set_linear_up", "set_lora_scale", "set_loras_enabled",
           "unload_lora"]
