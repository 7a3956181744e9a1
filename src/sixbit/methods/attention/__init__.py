"""Quantized attention (INT8 Q·Kᵀ with smoothed K, FP16 P·V) per block and step."""

from ...config.attention import AttentionQuantConfig
from .method import (
    AttentionQuantState,
    apply_attention_quant,
    attention_modules,
    attention_quant_of,
    remove_attention_quant,
)

__all__ = ["AttentionQuantConfig", "AttentionQuantState", "apply_attention_quant", "attention_modules",
           "attention_quant_of", "remove_attention_quant"]
