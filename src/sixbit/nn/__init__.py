"""Quantized modules: drop-in replacements for ``torch.nn`` layers, activation precision, and how
each call runs (:mod:`~sixbit.nn.execution`)."""

from . import execution, precision
from .precision import ActMode
from .quant_linear import QuantLinear, debug_checks

__all__ = ["ActMode", "QuantLinear", "debug_checks", "execution", "precision"]
