"""Quantized modules: drop-in replacements for ``torch.nn`` layers (linears, and pointwise convs
as the linears they are: :mod:`~sixbit.nn.pointwise_conv`), activation precision, and how each
call runs (:mod:`~sixbit.nn.execution`)."""

from . import execution, precision
from .precision import ActMode
from .pointwise_conv import QuantPointwiseConv
from .quant_linear import QuantLinear, debug_checks

__all__ = ["ActMode", "QuantLinear", "QuantPointwiseConv", "debug_checks", "execution", "precision"]
