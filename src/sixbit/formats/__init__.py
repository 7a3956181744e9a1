"""Exact low-bit number formats, one module per family, and a registry by name.

Example:
    >>> import torch
    >>> from sixbit import formats
    >>> from sixbit.formats import nvfp4
    >>> q = nvfp4.quantize(torch.randn(8, 64))
    >>> q.codes.shape, q.scales.dtype
    (torch.Size([8, 32]), torch.float8_e4m3fn)
    >>> formats.get("int4-g64").bits_per_element
    4.5
"""

from . import minifloat, nvfp4, mx, integer  # noqa: F401, I001  (import order = listing order)
from .base import Granularity, Quantized, check_finite
from .registry import Format, available, get, register_format

__all__ = [
    "Format",
    "Granularity",
    "Quantized",
    "available",
    "check_finite",
    "get",
    "integer",
    "minifloat",
    "mx",
    "nvfp4",
    "register_format",
]
