"""Quantized attention (INT8 Q·Kᵀ with smoothed K, FP16 P·V) per block and step.

Registered as the method ``"attention"``: chosen by ``ConvertConfig.attention`` (an
:class:`AttentionQuantConfig`, stored with the config).
"""

from ...config.attention import AttentionQuantConfig
from .method import (
    AttentionQuantState,
    apply_attention_quant,
    attention_modules,
    attention_quant_of,
    check_attention,
    remove_attention_quant,
)
from .spec import SPEC  # registers the method

__all__ = [
    "SPEC", "AttentionQuantConfig", "AttentionQuantState", "apply_attention_quant", "attention_modules",
    "attention_quant_of", "check_attention", "remove_attention_quant"
]
