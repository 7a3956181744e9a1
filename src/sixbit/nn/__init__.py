"""Quantized modules: drop-in replacements for ``torch.nn`` layers, and activation precision."""

from . import precision
from .precision import ActMode
from .quant_linear import QuantLinear, debug_checks

__all__ = ["ActMode", "QuantLinear", "debug_checks", "precision"]
