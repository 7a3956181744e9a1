"""CPU stand-ins for torch's CUDA GEMMs that refuse what CUDA refuses (the messages of
``_int_mm_out_cuda`` and ``_scaled_mm_out_cuda`` / ``meta_scaled_mm``, torch 2.13; see
:mod:`sixbit.kernels.gemm_shapes`) and compute the product on CPU: for tests, and for
``benchmarks/gpu/run.py --dry-run``, which runs the GPU script's every GEMM call through them.

Example:
    >>> import torch
    >>> a, b = torch.ones(4, 16, dtype=torch.int8), torch.ones(16, 8, dtype=torch.int8)
    >>> strict_int_mm(a, b)
    Traceback (most recent call last):
    RuntimeError: self.size(0) needs to be greater than 16, but got 4
"""

from __future__ import annotations

import torch

from . import gemm_shapes, isa
from .cuda import unswizzle_block_scales

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # magnitudes of the 3 low bits of an E2M1 code


def strict_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch._int_mm`` on CPU, refusing what CUDA refuses (the messages of ``_int_mm_out_cuda``),
    exact as CUDA's: where the CPU's own kernel saturates (no VNNI), in float64 (exact integers)."""
    if a.size(0) <= 16:
        raise RuntimeError(f"self.size(0) needs to be greater than 16, but got {a.size(0)}")
    if a.size(1) % gemm_shapes.INT_MM_ALIGN:
        raise RuntimeError(f"self.size(1) needs to be greater than 0 and a multiple of 8, but got {a.size(1)}")
    if b.size(1) % gemm_shapes.INT_MM_ALIGN:
        raise RuntimeError(f"mat2.size(1) needs to be greater than 0 and a multiple of 8, but got {b.size(1)}")
    if not isa.int_mm_exact():  # oneDNN's s8 GEMM saturates in int16 without VNNI
        return (a.double() @ b.double()).to(torch.int32)
    return _CPU_OPS["int_mm"](a, b)


def strict_scaled_mm(a: torch.Tensor, b: torch.Tensor, **kwargs) -> torch.Tensor:
    """``torch._scaled_mm`` refusing what CUDA refuses (layouts and sizes; row-wise FP8 writing
    anything but bf16, which torch's CUDA kernel refuses except with cuBLAS ≥ 12.9 on sm_90),
    computed on CPU: row-wise FP8 by torch's CPU kernel; NVFP4 (``float4_e2m1fn_x2`` with swizzled
    E4M3 block scales, which the CPU kernel does not take) by decoding both operands."""
    if not (a.stride(1) == 1 and a.stride(0) > 1):
        raise RuntimeError(f"self must be row_major, got stride {a.stride()}")
    if not (b.stride(0) == 1 and b.stride(1) > 1):
        raise RuntimeError(f"mat2 must be col_major, got stride {b.stride()}")
    if a.size(1) % gemm_shapes.SCALED_MM_ALIGN:
        raise RuntimeError(f"Expected self.size(1) to be divisible by 16, but got self.size(1)={a.size(1)}")
    if b.size(0) % gemm_shapes.SCALED_MM_ALIGN or b.size(1) % gemm_shapes.SCALED_MM_ALIGN:
        raise RuntimeError(f"Expected both dimensions of mat2 to be divisible by 16 but got {tuple(b.shape)}")
    if a.dtype != torch.float4_e2m1fn_x2:
        if kwargs["scale_a"].numel() > 1 and kwargs.get("out_dtype") != torch.bfloat16:
            raise ValueError("Only bf16 high precision output types are supported for row-wise scaling.")
        return _CPU_OPS["scaled_mm"](a, b, **kwargs)
    y = _nvfp4_values(a, kwargs["scale_a"]) @ _nvfp4_values(b.t(), kwargs["scale_b"]).t()
    return y.to(kwargs.get("out_dtype") or torch.float32)


def _nvfp4_values(codes: torch.Tensor, flat_scales: torch.Tensor) -> torch.Tensor:
    """fp32 values of ``float4_e2m1fn_x2`` codes ``(rows, K/2)`` (low nibble first) times their
    swizzled E4M3 block scales (one per 16 values)."""
    raw = codes.view(torch.uint8).to(torch.int64)
    nibbles = torch.stack([raw & 15, raw >> 4], -1).reshape(codes.shape[0], -1)
    magnitude = torch.tensor(_E2M1)[nibbles & 7]
    values = torch.where(nibbles >= 8, -magnitude, magnitude)
    scales = unswizzle_block_scales(flat_scales, values.shape[0], values.shape[1] // 16).float()
    return values * scales.repeat_interleave(16, dim=1)


_CPU_OPS = {"int_mm": torch._int_mm, "scaled_mm": torch._scaled_mm}  # torch's own, whatever replaces them later
