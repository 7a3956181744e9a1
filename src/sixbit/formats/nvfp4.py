"""NVFP4: E2M1 elements, one E4M3 scale per 16 elements along the last dim, one fp32 scale.

Encoding follows torchao's ``nvfp4_quantize`` (two-level scaling) operation for operation,
so codes and scales are bit-identical to it:

1. ``global_scale = amax(|x|) / (448 · 6)`` unless one is passed in (an all-zero tensor
   gets 1.0, so nothing divides by zero);
2. per block: ``scale = clamp(amax(|block|) / 6 / global_scale, 2^-6, 448)`` cast to E4M3;
3. ``codes = RNE_E2M1(clamp(x · ((1 / global_scale) / fp32(scale)), -6, 6))`` — multiplying
   by the reciprocal rather than dividing is torchao's (and its Triton kernel's) choice.

Decoding: ``x = e2m1 · (fp32(scale) · global_scale)``. Codes are packed two per byte,
element 2i in the low nibble. 4.5 bits per element (plus one fp32 per tensor).
"""

from __future__ import annotations

import dataclasses

import torch

from .base import Quantized, check_finite, split_blocks, to_float32
from .constants import E4M3_MIN_NORMAL, F4_E2M1_MAX, F8_E4M3_MAX, NVFP4_BLOCK
from .minifloat import E2M1
from .packing import pack_bits, unpack_bits
from .registry import Format, register_format


@dataclasses.dataclass
class NVFP4Quantized(Quantized):
    """``codes`` (``uint8``, shape ``(..., K/2)``), ``scales`` (E4M3, ``(..., K/16)``), ``global_scale``."""

    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: torch.Tensor

    @property
    def shape(self) -> tuple:
        return (*self.codes.shape[:-1], self.codes.shape[-1] * 2)

    def element_values(self) -> torch.Tensor:
        """The E2M1 values (fp32) before scaling, in the original shape."""
        return E2M1.decode(unpack_bits(self.codes.reshape(-1), 4, self.codes.numel() * 2)).reshape(self.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        blocks = split_blocks(self.element_values(), NVFP4_BLOCK, "NVFP4")
        scale = self.scales.float() * self.global_scale
        return (blocks * scale.unsqueeze(-1)).reshape(self.shape).to(dtype)

    def rows(self, start: int, stop: int) -> "NVFP4Quantized":
        return NVFP4Quantized(self.codes[start:stop], self.scales[start:stop], self.global_scale)


def global_scale_for(amax: torch.Tensor) -> torch.Tensor:
    """The per-tensor scale for an abs-max (calibrated or measured): ``amax / (448 · 6)``."""
    amax = amax.float()
    return torch.where(amax > 0, amax / (F8_E4M3_MAX * F4_E2M1_MAX), torch.ones_like(amax))


def block_scales(x: torch.Tensor, global_scale: torch.Tensor | float | None = None,
                 check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E4M3 block scales, fp32 global scale)`` that :func:`quantize` gives ``x`` (steps 1 and
    2 above) without encoding it: the start of a scale search. Arguments as :func:`quantize`'s."""
    x = to_float32(x)
    block_amax = split_blocks(x, NVFP4_BLOCK, "NVFP4").abs().amax(dim=-1)
    if check:
        check_finite(x, stat=block_amax)
    if global_scale is None:
        global_scale = global_scale_for(block_amax.amax())
    else:
        global_scale = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
        if global_scale.numel() != 1 or not bool(global_scale > 0) or not bool(torch.isfinite(global_scale)):
            raise ValueError(f"global_scale must be one positive finite number, got {global_scale}")
    global_scale = global_scale.reshape(())
    scales = torch.clamp(block_amax / F4_E2M1_MAX / global_scale, min=E4M3_MIN_NORMAL, max=F8_E4M3_MAX)
    return scales.to(torch.float8_e4m3fn), global_scale


def quantize(
    x: torch.Tensor,
    global_scale: torch.Tensor | float | None = None,
    check: bool = True,
    scales: torch.Tensor | None = None,
) -> NVFP4Quantized:
    """Quantize ``x`` (last dimension a multiple of 16) to NVFP4.

    Args:
        x: floating-point tensor (finite).
        global_scale: the fp32 per-tensor scale; ``None`` (default) derives it from
            ``amax(|x|)``. Pass a calibrated one to reuse it across calls (static activations).
        check: raise a ``ValueError`` on NaN/Inf input (default). ``False`` skips the check,
            which reads a value back to the host: the hot path of a linear call, where inputs
            are checked at conversion and in debug mode (:func:`sixbit.nn.debug_checks`).
        scales: ``None`` (default) or the E4M3 block scales to use, shape ``(..., K/16)``,
            instead of ``amax(|block|) / 6``: chosen offline by a scale search or GPTQ
            (:mod:`sixbit.rounding`). Needs ``global_scale``.

    Example:
        >>> q = quantize(torch.randn(4, 32))
        >>> q.codes.dtype, q.codes.shape, q.scales.shape
        (torch.uint8, torch.Size([4, 16]), torch.Size([4, 2]))
    """
    if global_scale is None and scales is not None:
        raise ValueError("scales needs the global_scale they were chosen for")
    x = to_float32(x)
    blocks = split_blocks(x, NVFP4_BLOCK, "NVFP4")
    own, global_scale = block_scales(x, global_scale, check)
    if scales is None:
        scales = own
    elif scales.dtype != torch.float8_e4m3fn or scales.shape != own.shape:
        raise ValueError(f"scales must be float8_e4m3fn of shape {tuple(own.shape)}, "
                         f"got {scales.dtype} {tuple(scales.shape)}")
    reciprocal = (1.0 / global_scale) / scales.float()
    scaled = torch.clamp(blocks * reciprocal.unsqueeze(-1), -F4_E2M1_MAX, F4_E2M1_MAX)
    codes = pack_bits(E2M1.encode(scaled), 4).reshape(*x.shape[:-1], x.shape[-1] // 2)
    return NVFP4Quantized(codes, scales, global_scale)


def round_trip(x: torch.Tensor, global_scale: torch.Tensor | float | None = None, check: bool = True) -> torch.Tensor:
    """``quantize(x, global_scale, check).dequantize()`` (fp32, ``x``'s shape), bit for bit, without
    building codes: each element rounded on its block's E2M1 grid as quanta × quantum
    (:meth:`~sixbit.formats.minifloat.Minifloat.round`). What an emulated NVFP4 GEMM multiplies.

    Example:
        >>> x = torch.randn(4, 32)
        >>> torch.equal(round_trip(x), quantize(x).dequantize())
        True
    """
    x = to_float32(x)
    scales, global_scale = block_scales(x, global_scale, check)
    scale = scales.float()
    scaled = (split_blocks(x, NVFP4_BLOCK, "NVFP4") * ((1.0 / global_scale) / scale).unsqueeze(-1)).clamp_(
        -F4_E2M1_MAX, F4_E2M1_MAX)
    return E2M1.round(scaled).mul_((scale * global_scale).unsqueeze(-1)).reshape(x.shape)


def dequantize(q: NVFP4Quantized, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """fp values of an :class:`NVFP4Quantized`."""
    return q.dequantize(dtype)


register_format(
    Format(
        name="nvfp4",
        family="nvfp4",
        element_bits=4,
        block_size=NVFP4_BLOCK,
        scale_bits=8,
        description="NVFP4: E2M1, E4M3 scale per 16, fp32 per tensor",
        quantize_fn=quantize,
        container=NVFP4Quantized,
    )
)
