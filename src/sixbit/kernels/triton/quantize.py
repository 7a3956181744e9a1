"""Fused per-token INT8 quantization of a linear layer's input, optionally rotated first.

``quantize_rows_int8(x, hadamard)`` returns what ``sixbit.formats.integer.quantize(x·H, bits=8,
granularity="token")`` returns — codes ``(M, K)`` int8 and scales ``(M, 1)`` fp32 (an all-zero
row gets scale 1) — in one kernel: each program takes 16 rows, reads them twice (abs-max, then
codes), and applies the block-diagonal rotation ``H`` (its ``b × b`` block) tile by tile on
the fly, so the rotated input never goes to memory. 16-bit inputs multiply ``√b·H`` (±1, exact
in their dtype) on tensor cores, the exact products summed in fp32, then scale by ``1/√b``;
fp32 inputs multiply ``H`` in fp32 on CUDA cores (:func:`signs_rotation`). Rounding is to
nearest, ties to even, like ``torch.round``. Without a rotation the result is bit-identical to
the reference; with one, the rotation sums in another order than torch's matmul (and scales
once, after), so a code can differ by one where the value sits on a rounding boundary.
"""

from __future__ import annotations

import torch

from ...transforms import hadamard
from ..cpu import quantize_rows_reference
from . import jit, require

_ROWS = 16  # rows per program (tl.dot needs ≥ 16)


def quantize_rows_int8_reference(x: torch.Tensor, hadamard_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference twin: ``(codes (M, K) int8, scale (M, 1) fp32)`` of ``x`` (2-D), rotated when asked."""
    x = x.float()
    if hadamard_block is not None:
        x = hadamard.rotate(x, hadamard_block)
    return quantize_rows_reference(x)


def signs_rotation(dtype: torch.dtype) -> bool:
    """Whether the kernel rotates inputs of ``dtype`` on tensor cores: 16-bit inputs times the
    ±1 Hadamard in the same dtype, every product exact, summed in fp32 and scaled once after;
    fp32 inputs multiply the normalized matrix in fp32 (CUDA cores)."""
    return dtype in (torch.bfloat16, torch.float16)


def int8_rows_constants(k: int, hadamard_block: int | None, dtype: torch.dtype = torch.bfloat16) -> dict:
    """The ``int8_rows`` kernel's compile-time constants for ``dtype`` inputs ``K`` wide (what
    :func:`quantize_rows_int8` launches and :mod:`.aot` compiles)."""
    block = hadamard_block or min(64, 1 << max(4, (k - 1).bit_length()))
    rotate = hadamard_block is not None
    return dict(ROWS=_ROWS, BLOCK=block, ROTATE=rotate, SIGNS=rotate and signs_rotation(dtype))


def quantize_rows_int8(x: torch.Tensor, hadamard_block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton kernel: per-token INT8 codes and scales of ``x`` (2-D, any float dtype), with the
    block-diagonal Hadamard rotation of size ``hadamard_block`` fused in when given."""
    require(x.device)
    if x.dim() != 2:
        raise ValueError(f"quantize_rows_int8 needs a 2-D input, got shape {tuple(x.shape)}")
    m, k = x.shape
    constants = int8_rows_constants(k, hadamard_block, x.dtype)
    h, h_scale = torch.empty(0, device=x.device), 1.0
    if hadamard_block is not None:
        hadamard.check_block(k, hadamard_block)
        h = hadamard.hadamard_matrix(hadamard_block, torch.float32, x.device)
        if constants["SIGNS"]:  # ±1 (exact in any float dtype); the 1/√b after the fp32 sums
            h, h_scale = torch.sign(h).to(x.dtype), hadamard_block ** -0.5
        h = h.contiguous()
    x = x.contiguous()
    codes = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scale = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        jit().int8_rows[(-(-m // _ROWS),)](x, h, codes, scale, m, k, h_scale, **constants)
    return codes, scale
