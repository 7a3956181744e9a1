"""Quantized attention (INT8 Q·Kᵀ with smoothed K, FP16 P·V) per block and step.

Registered as the method ``"attention"``: chosen by ``ConvertConfig.attention`` (an
:class:`AttentionQuantConfig`, stored with the config).
"""

import dataclasses

from ...config.attention import AttentionQuantConfig
from ..registry import MethodSpec, register_method
from .method import (
    AttentionQuantState,
    apply_attention_quant,
    attention_modules,
    attention_quant_of,
    check_attention,
    remove_attention_quant,
)

register_method(MethodSpec(
    name="attention",
    config_type=AttentionQuantConfig,
    order=50,
    attribute="attention",
    select=lambda config, extra: config.attention,
    apply=apply_attention_quant,
    remove=remove_attention_quant,
    check=lambda model, config, convert_config: check_attention(model, config),  # no processors, or blocks past the model
    installed=lambda model: getattr(attention_quant_of(model), "config", None),
    record=lambda config, applied: dataclasses.replace(config, attention=applied),
))

__all__ = ["AttentionQuantConfig", "AttentionQuantState", "apply_attention_quant", "attention_modules",
           "attention_quant_of", "check_attention", "remove_attention_quant"]
