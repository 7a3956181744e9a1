"""Quantized modules: drop-in replacements for ``torch.nn`` layers (linears, and convs as the
linears they are: pointwise ones, :mod:`~sixbit.nn.pointwise_conv`, and wider kernels on their
unfolded input, :mod:`~sixbit.nn.unfolded_conv`), activation precision, and how each call runs
(:mod:`~sixbit.nn.execution`)."""

from . import execution, precision
from .precision import ActMode
from .pointwise_conv import QuantPointwiseConv
from .quant_linear import QuantLinear, debug_checks
from .unfolded_conv import QuantUnfoldedConv

__all__ = ["ActMode", "QuantLinear", "QuantPointwiseConv", "QuantUnfoldedConv", "debug_checks", "execution", "precision"]
