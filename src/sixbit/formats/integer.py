"""Integer formats INT2…INT8: symmetric or asymmetric, per tensor, per row or per group.

Symmetric: ``s = amax / (2^(b-1) - 1)``, ``q = clamp(round(x / s), -(2^(b-1)-1), 2^(b-1)-1)``
(the code -2^(b-1) is left unused so the grid is symmetric around zero).
Asymmetric: the range is widened to include zero (so zero, e.g. padding, stays exact), then
``s = (max - min) / (2^b - 1)``, ``z = round(-min / s)``, ``q = clamp(round(x / s) + z, 0, 2^b - 1)``.
Rounding is to nearest, ties to even. A block that is all zero gets scale 1 (codes 0).
Codes are stored bit-packed (``packing.pack_bits``); symmetric codes in two's complement.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from .base import Granularity, Quantized, check_finite, parse_granularity, split_blocks, to_float32
from .packing import code_group, pack_bits, unpack_bits
from .registry import Format, register_format

GROUP_SIZES = (16, 32, 64, 128, 256)


@dataclasses.dataclass
class IntQuantized(Quantized):
    """Packed integer codes with fp32 scales (and ``uint8`` zero points when asymmetric).

    ``scale``/``zero_point`` broadcast against the input reshaped to ``(..., K/g, g)`` for
    groups, or against the input itself otherwise.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    shape: tuple
    bits: int
    symmetric: bool
    granularity: str
    group_size: int | None = None
    zero_point: torch.Tensor | None = None

    def __post_init__(self):
        self.shape = tuple(self.shape)

    def values(self) -> torch.Tensor:
        """The integer codes, unpacked, in the input's shape (``int8`` if symmetric, else ``int16``)."""
        numel = 1
        for d in self.shape:
            numel *= d
        raw = unpack_bits(self.codes, self.bits, numel).reshape(self.shape)
        if not self.symmetric:
            return raw.to(torch.int16)
        if self.bits == 8:
            return raw.view(torch.int8)
        signed = raw.to(torch.int16)
        return torch.where(signed >= 1 << (self.bits - 1), signed - (1 << self.bits), signed).to(torch.int8)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        q = self.values().float()
        if self.granularity == Granularity.GROUP.value:
            q = split_blocks(q, self.group_size, "group dequantization")
        if self.zero_point is not None:
            q = q - self.zero_point.float()
        return (q * self.scale).reshape(self.shape).to(dtype)

    def rows(self, start: int, stop: int) -> "IntQuantized":
        n, k = self.shape
        values, nbytes = code_group(self.bits)
        if k % values:
            raise NotImplementedError(f"rows of {self.bits}-bit codes need K a multiple of {values}, got {k}")
        per_row = k // values * nbytes
        per_tensor = self.granularity == Granularity.TENSOR.value
        pick = (lambda t: t) if per_tensor else (lambda t: t[start:stop])
        zero = None if self.zero_point is None else pick(self.zero_point)
        return IntQuantized(self.codes[start * per_row:stop * per_row], pick(self.scale), (stop - start, k),
                            self.bits, self.symmetric, self.granularity, self.group_size, zero)


def _reduce(x: torch.Tensor, gran: Granularity, fn) -> torch.Tensor:
    return fn(x) if gran is Granularity.TENSOR else fn(x, dim=-1, keepdim=True)


def quantize(
    x: torch.Tensor,
    bits: int = 8,
    symmetric: bool = True,
    granularity: Granularity | str = "channel",
    group_size: int | None = None,
    check: bool = True,
    scale: torch.Tensor | None = None,
) -> IntQuantized:
    """Quantize ``x`` to ``bits``-bit integers along its last dimension.

    Args:
        x: floating-point tensor (finite), e.g. an ``(N, K)`` weight or ``(M, K)`` activation.
        bits: 2…8. Fewer bits: smaller, coarser (error grows 2× per bit removed).
        symmetric: ``True`` (default) for a zero-centred grid; ``False`` adds a zero point,
            which helps one-sided data (e.g. after GELU) at the cost of 8 more bits per scale.
        granularity: ``"tensor"``, ``"channel"`` (one scale per row, for weights),
            ``"token"`` (the same reduction, for dynamic per-token activations) or ``"group"``.
        group_size: elements per scale along the last dimension when ``granularity="group"``.
        scale: ``None`` (default) or the fp32 scales to use (symmetric only), shaped as the
            result's ``scale``, instead of ``amax / (2^(b-1) - 1)``: chosen offline by a scale
            search or GPTQ (:mod:`sixbit.rounding`).

    Example:
        >>> q = quantize(torch.randn(16, 128), bits=4, granularity="group", group_size=64)
        >>> q.scale.shape
        torch.Size([16, 2, 1])
    """
    if bits not in range(2, 9):
        raise ValueError(f"integer bits must be 2…8, got {bits}")
    gran = parse_granularity(granularity)
    if (gran is Granularity.GROUP) != (group_size is not None):
        raise ValueError("pass group_size exactly when granularity='group'")
    shape = tuple(x.shape)
    x = to_float32(x)
    if gran is Granularity.GROUP:
        if group_size < 2:
            raise ValueError(f"group_size must be ≥ 2, got {group_size}")
        x = split_blocks(x, group_size, f"group size {group_size}")
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        amax = _reduce(x.abs(), gran, torch.amax)
        if check:
            check_finite(x, stat=amax)  # amax propagates NaN/Inf
        if scale is None:
            # an all-zero row gets scale 1; NaN/Inf propagate into the scale (and the output)
            scale = torch.where(amax == 0, torch.ones_like(amax), amax / qmax)
        elif scale.shape != amax.shape or not bool((scale > 0).all()):
            raise ValueError(f"scale must hold positive values of shape {tuple(amax.shape)}, got {tuple(scale.shape)}")
        else:
            scale = scale.float()
        q = torch.round(x / scale).clamp_(-qmax, qmax).to(torch.int8)
        zero = None
    else:
        if scale is not None:
            raise ValueError("fixed scales are supported for symmetric integers only")
        qmax = 2**bits - 1
        lo = _reduce(x, gran, torch.amin).clamp(max=0)
        hi = _reduce(x, gran, torch.amax).clamp(min=0)
        if check:
            check_finite(x, stat=hi - lo)
        scale = torch.where(hi > lo, (hi - lo) / qmax, torch.ones_like(hi))
        zero = torch.clamp(torch.round(-lo / scale), 0, qmax)
        q = torch.clamp(torch.round(x / scale) + zero, 0, qmax).to(torch.int32)
        zero = zero.to(torch.uint8)
    codes = pack_bits(q, bits)  # two's complement for symmetric codes
    return IntQuantized(codes, scale, shape, bits, symmetric, gran.value, group_size, zero)


def _register(bits: int, symmetric: bool, gran: str, group: int | None) -> None:
    name = f"int{bits}" + ("" if symmetric else "-asym")
    name += {"channel": "", "tensor": "-tensor", "group": f"-g{group}"}[gran]
    where = {"channel": "per row", "tensor": "per tensor", "group": f"per {group} elements"}[gran]
    register_format(
        Format(
            name=name,
            family="integer",
            element_bits=bits,
            block_size=group,
            scale_bits=32 if symmetric else 40,
            description=f"INT{bits} {'symmetric' if symmetric else 'asymmetric'}, fp32 scale {where}",
            quantize_fn=functools.partial(
                quantize, bits=bits, symmetric=symmetric, granularity=gran, group_size=group
            ),
            container=IntQuantized,
        )
    )


for _bits in range(8, 1, -1):
    for _sym in (True, False):
        _register(_bits, _sym, "channel", None)
        _register(_bits, _sym, "tensor", None)
        for _g in GROUP_SIZES:
            _register(_bits, _sym, "group", _g)
