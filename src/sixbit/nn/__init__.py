"""Quantized modules: drop-in replacements for ``torch.nn`` layers."""

from .quant_linear import ActMode, QuantLinear

__all__ = ["ActMode", "QuantLinear"]
