"""OCP Microscaling (MX v1.0): 32 elements share one power-of-two E8M0 scale.

Scale rule of the spec: ``X = 2^(floor(log2(amax)) - emax_elem)`` with ``emax_elem`` the
exponent of the element format's largest normal; elements are ``RNE(v / X)`` saturated at the
element max (so the largest values of a block may clip: that is the spec's rule, kept as is).
A block that is all zero gets the smallest scale, 2^-127 (E8M0 code 0). The exponent is
clamped to [-127, 127]; code 0xFF (NaN) is never produced.

Element codes are bit-packed: FP8 one per byte, FP6 four values in three bytes, FP4 two per
byte (element 2i in the low nibble). Scales are stored as ``uint8`` E8M0 codes (bias 127).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .base import Quantized, check_finite, split_blocks, to_float32
from .constants import E8M0_BIAS, E8M0_MAX_EXP, E8M0_MIN_EXP, EMAX_ELEM, MX_BLOCK
from .minifloat import element
from .packing import code_group, pack_bits, unpack_bits
from .registry import Format, register_format

# registry name → element format
MX_FORMATS = {
    "mxfp8_e4m3": "e4m3",
    "mxfp8_e5m2": "e5m2",
    "mxfp6_e2m3": "e2m3",
    "mxfp6_e3m2": "e3m2",
    "mxfp4": "e2m1",
}


@dataclasses.dataclass
class MXQuantized(Quantized):
    """Packed element ``codes`` (flat ``uint8``), E8M0 ``scales`` (``uint8``, ``(..., K/32)``)."""

    codes: torch.Tensor
    scales: torch.Tensor
    element: str
    shape: tuple

    def __post_init__(self):
        self.shape = tuple(self.shape)

    def element_values(self) -> torch.Tensor:
        fmt = element(self.element)
        numel = self.scales.numel() * MX_BLOCK
        return fmt.decode(unpack_bits(self.codes, fmt.bits, numel)).reshape(self.shape)

    def scale_values(self) -> torch.Tensor:
        """fp32 power-of-two scales, shape ``(..., K/32)``."""
        exp = self.scales.to(torch.int32) - E8M0_BIAS
        return torch.ldexp(torch.ones(exp.shape, device=exp.device), exp)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        blocks = split_blocks(self.element_values(), MX_BLOCK, "MX")
        return (blocks * self.scale_values().unsqueeze(-1)).reshape(self.shape).to(dtype)

    def rows(self, start: int, stop: int) -> "MXQuantized":
        n, k = self.shape
        values, nbytes = code_group(element(self.element).bits)
        if k % values:
            raise NotImplementedError(f"rows of MX codes need K a multiple of {values}, got {k}")
        per_row = k // values * nbytes
        return MXQuantized(self.codes[start * per_row:stop * per_row], self.scales[start:stop], self.element,
                           (stop - start, k))


def quantize(x: torch.Tensor, element_name: str = "e4m3") -> MXQuantized:
    """Quantize ``x`` (last dimension a multiple of 32) to an MX format.

    Args:
        x: floating-point tensor (finite).
        element_name: ``"e4m3"``/``"e5m2"`` (MXFP8), ``"e2m3"``/``"e3m2"`` (MXFP6) or
            ``"e2m1"`` (MXFP4). More mantissa bits: finer steps; more exponent bits: less
            clipping of the block's largest values.

    Example:
        >>> q = quantize(torch.randn(2, 64), "e2m3")
        >>> q.codes.numel(), q.scales.shape   # 128 six-bit codes in 96 bytes
        (96, torch.Size([2, 2]))
    """
    fmt = element(element_name)
    x = to_float32(x)
    blocks = split_blocks(x, MX_BLOCK, "MX")
    amax = blocks.abs().amax(dim=-1)
    check_finite(x, stat=amax)
    exp = scale_exponents(amax, fmt.name)
    scale = torch.ldexp(torch.ones_like(amax), exp)
    codes = fmt.encode(blocks / scale.unsqueeze(-1))  # exact division by a power of two
    return MXQuantized(
        pack_bits(codes, fmt.bits), (exp + E8M0_BIAS).to(torch.uint8), fmt.name, tuple(x.shape)
    )


def scale_exponents(amax: torch.Tensor, element_name: str) -> torch.Tensor:
    """The spec's E8M0 exponent of blocks whose largest magnitude is ``amax``:
    ``floor(log2 amax) − emax_elem``, −127 for an all-zero block, clamped to [−127, 127]."""
    _, e = torch.frexp(amax)  # amax = m·2^e, m in [0.5, 1): floor(log2 amax) = e - 1
    exp = torch.where(amax > 0, e - 1 - EMAX_ELEM[element_name], E8M0_MIN_EXP)
    return exp.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP)


def round_blocks(x: torch.Tensor, element_name: str) -> torch.Tensor:
    """``quantize(x, element_name).dequantize()`` without packing codes (fp32, ``x``'s shape):
    each block of 32 along the last dimension (a multiple of 32) rounded onto its own
    power-of-two-scaled element grid.

    Example:
        >>> x = torch.linspace(0, 1, 64).reshape(2, 32)
        >>> torch.equal(round_blocks(x, "e2m3"), quantize(x, "e2m3").dequantize())
        True
    """
    fmt = element(element_name)
    blocks = split_blocks(to_float32(x), MX_BLOCK, "MX")
    exp = scale_exponents(blocks.abs().amax(dim=-1, keepdim=True), fmt.name)
    scale = torch.ldexp(torch.ones(exp.shape, device=exp.device), exp)
    return (fmt.round(blocks / scale) * scale).reshape(x.shape)


for _name, _el in MX_FORMATS.items():
    register_format(
        Format(
            name=_name,
            family="mx",
            element_bits=element(_el).bits,
            block_size=MX_BLOCK,
            scale_bits=8,
            description=f"OCP MX {_el.upper()}, E8M0 scale per 32",
            quantize_fn=functools.partial(quantize, element_name=_el),
            container=MXQuantized,
        )
    )
